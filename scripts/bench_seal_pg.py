"""What automatic seals cost on a PostgreSQL ledger, and how long a seal holds the head.

    python scripts/bench_seal_pg.py URL [--posts 2000] [--rounds 3] [--entries 10000 100000]

URL is a PostgreSQL server as its superuser (e.g. the one ``scripts/pg_cluster.py start
DIR`` prints); a fresh database is made per measurement and dropped after.

1. Posts one at a time (one message, one job, one step: three journal entries each),
   interleaved in rounds: without automatic seals (the baseline), with automatic seals
   that never come due (the check after each write alone: one more round trip), and
   sealing every 1,000 entries. Prints microseconds per post and the ratio to the
   baseline of the same round.
2. On ledgers of ``--entries`` entries: the seconds the server's root check of a seal
   takes (``cassette_tree_root``; since migration 0011 the insert runs it before it
   takes the head's lock), the seconds the whole seal takes (the tree rebuilt from the
   bodies in a snapshot, without the lock, then the insert), and what a writer waits:
   a seal's INSERT in one thread, a post sent 20 ms into it in another.
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from urllib.parse import urlsplit, urlunsplit

from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from catalytic_cassette import MessageCassette
from catalytic_cassette.seals import AutoSeal

KEY = Ed25519PrivateKey.generate()
NEVER = 2**62  # an automatic seal that never comes due: the check alone


@contextmanager
def database(server: str) -> Iterator[str]:
    import psycopg

    name = "cassette_bench_" + uuid.uuid4().hex[:12]
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    try:
        yield urlunsplit(urlsplit(server)._replace(path="/" + name))
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def posts_per_second(url: str, posts: int, every: int | None, folder: Path) -> float:
    """Microseconds per post, posting one message at a time."""
    auto = None if every is None else AutoSeal(KEY, folder, every=every)
    with MessageCassette(url, auto_seal=auto) as cassette:
        start = time.perf_counter()
        for n in range(posts):
            cassette.post_message({"n": n}, "run", "USER")
        elapsed = time.perf_counter() - start
    return elapsed / posts * 1e6


def fill(url: str, entries: int) -> None:
    """Messages of one step (three entries each), posted by the server itself, in
    transactions of 2,500 (one of 30,000 posts takes minutes)."""
    import psycopg

    messages = entries // 3
    with psycopg.connect(url, autocommit=True) as conn:
        for first in range(0, messages, 2500):
            with conn.transaction():
                conn.execute(
                    "SELECT cassette_post('run', 'USER', NULL, '{\"n\":' || n || '}',"
                    " ARRAY['default'], ARRAY[1], ARRAY['{}'])"
                    " FROM generate_series(%s::bigint, %s::bigint) AS n ORDER BY n",
                    (first, min(first + 2500, messages) - 1),
                )


def seal_times(url: str) -> tuple[int, float, float]:
    """(entries, seconds of the server's root check, seconds of the whole seal)."""
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT cassette_journal_size()").fetchone()
        assert row is not None
        size = int(row[0])
        start = time.perf_counter()
        conn.execute("SELECT cassette_tree_root(%s)", (size,)).fetchone()
        check = time.perf_counter() - start
    with MessageCassette(url) as cassette:
        start = time.perf_counter()
        cassette.seal(KEY)
        whole = time.perf_counter() - start
    return size, check, whole


def writer_wait(url: str, delay: float = 0.02) -> tuple[float, float]:
    """(seconds a seal's INSERT took, seconds a post sent ``delay`` after it started took):
    since 0011 the insert folds the root before it takes the head, so a writer waits for
    the fold no longer (before, it waited for all of it)."""
    import threading

    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        row = conn.execute("SELECT cassette_journal_size()").fetchone()
        assert row is not None
        size = int(row[0])
        root = conn.execute("SELECT encode(cassette_tree_root(%s), 'hex')", (size,)).fetchone()
        assert root is not None
    took: list[float] = []

    def insert() -> None:
        with psycopg.connect(url, autocommit=True) as sealer:
            begun = time.perf_counter()
            sealer.execute(
                "INSERT INTO cassette_seals (tree_size, root_hex, origin, key_id, note)"
                " VALUES (%s, %s, 'o', 'abcdef01', 'o' || chr(10) || %s || chr(10))",
                (size, root[0], str(size)),
            )
            took.append(time.perf_counter() - begun)

    with MessageCassette(url) as writer:
        sealing = threading.Thread(target=insert)
        sealing.start()
        time.sleep(delay)
        begun = time.perf_counter()
        writer.post_message({"meanwhile": True}, "run", "USER")
        waited = time.perf_counter() - begun
        sealing.join()
    return took[0], waited


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--posts", type=int, default=2000)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--entries", type=int, nargs="+", default=[10_000, 100_000])
    args = parser.parse_args(argv)
    kinds: dict[str, int | None] = {
        "no automatic seals": None,
        "automatic, never due": NEVER,
        "automatic, every 1000": 1000,
    }
    for round_number in range(1, args.rounds + 1):
        micros: dict[str, float] = {}
        for kind, every in kinds.items():
            with database(args.url) as url, tempfile.TemporaryDirectory() as folder:
                micros[kind] = posts_per_second(url, args.posts, every, Path(folder))
        base = micros["no automatic seals"]
        for kind, value in micros.items():
            print(
                f"round {round_number} {kind:22} {value:8.0f} us/post"
                f" ({value / base:4.2f}x the baseline)",
                flush=True,
            )
    for entries in args.entries:
        with database(args.url) as url:
            MessageCassette(url).close()
            fill(url, entries)
            size, check, whole = seal_times(url)
            insert, waited = writer_wait(url)
        print(
            f"seal of {size:>8} entries: server root check {check:6.3f} s,"
            f" whole seal {whole:6.3f} s; a seal's INSERT {insert:6.3f} s, a post sent"
            f" 20 ms into it {waited:6.3f} s",
            flush=True,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
