"""Time verify on a PostgreSQL ledger and on a SQLite ledger holding the same history.

    python scripts/bench_verify_pg.py URL [--entries 10000 100000] [--sqlite-dir DIR]

URL is a PostgreSQL server as its superuser (e.g. the one ``scripts/pg_cluster.py start
DIR`` prints); a fresh database is made there per size and dropped after. Each ledger
gets the same work through the API: posts of one step each, every step claimed and
completed (six journal entries a message), in batches. Prints, per size, the seconds
verify takes (the best of ``--repeat`` runs) at the full and the quick level, and the
peak RSS of this process.
"""

from __future__ import annotations

import argparse
import resource
import sys
import tempfile
import time
import uuid
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from catalytic_cassette import MessageCassette
from catalytic_cassette.verify import Level, verify_path

BATCH = 500


def fill(cassette: MessageCassette, entries: int) -> None:
    messages = entries // 6
    done = 0
    while done < messages:
        count = min(BATCH, messages - done)
        cassette.post_messages([({"n": done + i}, "run", "USER", None) for i in range(count)])
        leased = cassette.claim_steps("run", "worker", count, ttl_seconds=3600)
        cassette.complete_steps(
            [
                ("run", s["step_id"], "worker", s["fencing_token"], {"ok": 1}, "SUCCESS")
                for s in leased
            ]
        )
        done += count


def fill_server_side(url: str, entries: int) -> None:
    """The same work as ``fill``, through the worker's functions called by the server
    itself (a few statements instead of thousands of round trips)."""
    import psycopg

    messages = entries // 6
    with psycopg.connect(url, autocommit=True) as conn:
        for first in range(0, messages, 5 * BATCH):
            count = min(5 * BATCH, messages - first)
            with conn.transaction():
                conn.execute(
                    "SELECT cassette_post('run', 'USER', NULL, '{\"n\":' || n || '}',"
                    " ARRAY['default'], ARRAY[1], ARRAY['{\"n\":' || n || '}'])"
                    " FROM generate_series(%s::bigint, %s::bigint) AS n ORDER BY n",
                    (first, first + count - 1),
                )
            with conn.transaction():
                conn.execute(
                    "SELECT count(*) FROM cassette_claim('run', 'worker', %s, 3600000)", (count,)
                )
            with conn.transaction():
                conn.execute(
                    "SELECT cassette_complete('run', step_id, 'worker', fencing_token, 'SUCCESS',"
                    " '{\"ok\":1}') FROM (SELECT step_id, fencing_token FROM cassette_steps"
                    " WHERE status = 'LEASED' ORDER BY step_id) AS leased"
                )


def best(target: str, level: Level, repeat: int) -> tuple[float, int]:
    times, rows = [], 0
    for _ in range(repeat):
        start = time.perf_counter()
        report = verify_path(target, level=level)
        times.append(time.perf_counter() - start)
        assert report.ok, report.findings[:5]
        rows = report.journal_rows
    return min(times), rows


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--entries", type=int, nargs="+", default=[10_000, 100_000])
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args(argv)
    import psycopg

    for entries in args.entries:
        name = "cassette_bench_" + uuid.uuid4().hex[:12]
        with psycopg.connect(args.url, autocommit=True) as admin:
            # (owned by a role that is no superuser, as a ledger's owner must be)
            if not admin.execute(
                "SELECT 1 FROM pg_roles WHERE rolname = 'cassette_bench_owner'"
            ).fetchone():
                admin.execute("CREATE ROLE cassette_bench_owner CREATEROLE")
            admin.execute(f'CREATE DATABASE "{name}" OWNER cassette_bench_owner')
        url = urlunsplit(urlsplit(args.url)._replace(path="/" + name))
        try:
            with tempfile.TemporaryDirectory() as folder:
                path = str(Path(folder) / "ledger.db")
                MessageCassette(url).close()
                fill_server_side(url, entries)
                for target in (url, path):
                    if target == path:
                        with MessageCassette(target, durability="normal") as cassette:
                            fill(cassette, entries)
                    kind = "postgresql" if target == url else "sqlite"
                    full, rows = best(target, Level.FULL, args.repeat)
                    quick, _ = best(target, Level.QUICK, args.repeat)
                    print(
                        f"{kind:10} {rows:>8} entries: verify {full:6.2f} s,"
                        f" quick {quick:6.2f} s ({rows / full:,.0f} entries/s full)",
                        flush=True,
                    )
        finally:
            with psycopg.connect(args.url, autocommit=True) as admin:
                admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024
    print(f"peak RSS {peak} MiB")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
