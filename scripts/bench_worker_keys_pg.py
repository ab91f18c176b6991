"""What a worker key costs a worker's loop, on PostgreSQL and on SQLite.

    python scripts/bench_worker_keys_pg.py URL [--steps 400] [--rounds 3] [--durability full]

URL is a PostgreSQL server as its superuser (e.g. the one ``scripts/pg_cluster.py start
DIR`` prints); a fresh database is made there per run and dropped after. One worker
claims and completes STEPS one-step messages one call at a time (``claim_step`` then
``complete_step``), without a key and with one, in alternating rounds on fresh ledgers;
the same on SQLite files beside it. Prints, per backend, the best round's steps/s for
each and the ratio signed / unsigned (the baseline is the same loop in the same run).
Durability is ``normal`` unless told (no flush per commit): what a key adds is CPU and
round trips, which a shared disk's flushes would drown.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from catalytic_cassette import MessageCassette
from catalytic_cassette.signing import generate
from catalytic_cassette.worker_keys import WorkerKey

RUN = "bench"


def loop(cassette: MessageCassette, steps: int) -> float:
    """Post STEPS messages, then time claiming and completing each; steps/s."""
    cassette.post_messages([({"n": n}, RUN, "USER", None) for n in range(steps)])
    start = time.perf_counter()
    for _ in range(steps):
        lease = cassette.claim_step(RUN, "w1", 600)
        cassette.complete_step(RUN, lease["step_id"], "w1", lease["fencing_token"], {}, "SUCCESS")
    return steps / (time.perf_counter() - start)


def fresh_database(admin_url: str) -> tuple[str, str]:
    import psycopg

    name = "cassette_bench_" + uuid.uuid4().hex[:12]
    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    return name, urlunsplit(urlsplit(admin_url)._replace(path="/" + name))


def drop_database(admin_url: str, name: str) -> None:
    import psycopg

    with psycopg.connect(admin_url, autocommit=True) as admin:
        admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--steps", type=int, default=400)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--durability", choices=("full", "normal"), default="normal")
    args = parser.parse_args(argv)
    with tempfile.TemporaryDirectory() as folder:
        key_path, _ = generate(str(Path(folder) / "w1"))
        key = WorkerKey.load("w1", key_path)
        best: dict[tuple[str, bool], float] = {}
        for index in range(args.rounds):
            for signed in (False, True):  # alternating, so drift hits both alike
                name, url = fresh_database(args.url)
                try:
                    with MessageCassette(
                        url, worker_key=key if signed else None, durability=args.durability
                    ) as cassette:
                        rate = loop(cassette, args.steps)
                    best["postgresql", signed] = max(best.get(("postgresql", signed), 0), rate)
                finally:
                    drop_database(args.url, name)
                path = str(Path(folder) / f"ledger-{index}-{signed}.db")
                with MessageCassette(
                    path, worker_key=key if signed else None, durability=args.durability
                ) as cassette:
                    rate = loop(cassette, args.steps)
                best["sqlite", signed] = max(best.get(("sqlite", signed), 0), rate)
    for kind in ("postgresql", "sqlite"):
        plain, signed_rate = best[kind, False], best[kind, True]
        print(
            f"{kind:10} claim+complete, {args.steps} steps: unsigned {plain:7.0f} steps/s,"
            f" signed {signed_rate:7.0f} steps/s ({signed_rate / plain:.2f}x)",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
