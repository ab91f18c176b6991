"""Idle workers polling an empty queue beside a poster, on a PostgreSQL ledger: what the
head costs when a claim that finds nothing takes it (through migration 0011) and when it
does not (0012).

    python scripts/bench_noop_pg.py URL [--seconds 5] [--pollers 4] [--interval-ms 5]
                                        [--rounds 3] [--batch 2000]

URL is a PostgreSQL server as its superuser (e.g. the one ``scripts/pg_cluster.py start
DIR`` prints); a fresh database is made per measurement and dropped after. In each round,
one ledger migrated through 0011 (the baseline) and one through 0012, in turn: one poster
process posts one-step messages one at a time into run ``work``, while ``--pollers``
processes each claim from run ``idle``, which never holds a step, sleeping
``--interval-ms`` between polls (0: as fast as they can, which on a machine of few cores
takes the poster's CPU once polls no longer wait), all for ``--seconds``, as autocommit
statements (the calls the package sends: ``cassette_post``, ``cassette_claim``). Prints
posts/s, the poster's mean and 99th percentile milliseconds per post, polls/s and the
pollers' mean milliseconds per poll, and the ratios to the baseline of the same round
(which runs first in odd rounds, second in even ones; ``--seconds 0`` skips this part).
Durability is the package's default (``synchronous_commit = on``).

Then, unless ``--batch 0``, what 0012's check of ``cassette.tail`` at every journal entry
costs: ``--batch`` one-step messages posted in one transaction by the server itself
(``cassette_post`` over ``generate_series``: three entries each), on a ledger through 0011
and one through 0012, in turn, ``--rounds`` times; prints entries/s and the ratio.
"""

from __future__ import annotations

import argparse
import multiprocessing
import sys
import time
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any
from urllib.parse import urlsplit, urlunsplit

from catalytic_cassette.postgresql import connection, sqlfiles

POST = (
    "SELECT message_id FROM cassette_post('work', 'USER', NULL, %s, ARRAY['default'], ARRAY[1],"
    " ARRAY['{}'])"
)
POLL = "SELECT step_id FROM cassette_claim('idle', %s, 1, 60000)"
SCHEMAS = {"through 0011 (baseline)": 11, "through 0012": 12}


@contextmanager
def ledger(server: str, version: int) -> Iterator[str]:
    """A fresh database migrated through ``version``, dropped after."""
    import psycopg

    name = "cassette_bench_" + uuid.uuid4().hex[:12]
    with psycopg.connect(server, autocommit=True) as admin:
        admin.execute(f'CREATE DATABASE "{name}"')
    url = urlunsplit(urlsplit(server)._replace(path="/" + name))
    try:
        every = sqlfiles.migrations()
        with psycopg.connect(url, autocommit=True) as conn:
            sqlfiles.migrations = lambda: every[:version]  # type: ignore[method-assign]
            try:
                assert connection.migrate(conn) == version
            finally:
                sqlfiles.migrations = lambda: every  # type: ignore[method-assign]
        yield url
    finally:
        with psycopg.connect(server, autocommit=True) as admin:
            admin.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def poster(url: str, seconds: float, start: Any, results: Any) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        took: list[float] = []
        start.wait()
        end = time.perf_counter() + seconds
        while (now := time.perf_counter()) < end:
            conn.execute(POST, (f'{{"n":{len(took)}}}',)).fetchall()
            took.append(time.perf_counter() - now)
    results.put(("post", took))


def poller(
    url: str, seconds: float, interval: float, worker: str, start: Any, results: Any
) -> None:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        took: list[float] = []
        start.wait()
        end = time.perf_counter() + seconds
        while (now := time.perf_counter()) < end:
            assert conn.execute(POLL, (worker,)).fetchall() == []
            took.append(time.perf_counter() - now)
            if interval:
                time.sleep(interval)
    results.put(("poll", took))


def measure(
    url: str, seconds: float, pollers: int, interval: float
) -> tuple[float, float, float, float, float]:
    """(posts/s, mean ms per post, p99 ms per post, polls/s, mean ms per poll)."""
    context = multiprocessing.get_context("spawn")
    start = context.Event()
    results = context.Queue()
    processes = [context.Process(target=poster, args=(url, seconds, start, results))]
    processes += [
        context.Process(target=poller, args=(url, seconds, interval, f"idle-{n}", start, results))
        for n in range(pollers)
    ]
    for process in processes:
        process.start()
    time.sleep(1.0)  # every process connected and waiting
    start.set()
    took: list[float] = []
    polls: list[float] = []
    for _ in processes:
        kind, value = results.get(timeout=seconds + 60)
        if kind == "post":
            took = value
        else:
            polls += value
    for process in processes:
        process.join()
        if process.exitcode != 0:
            raise SystemExit(f"a benchmark process failed ({process.exitcode})")
    ordered = sorted(took)
    p99 = ordered[min(len(ordered) - 1, int(len(ordered) * 0.99))] if ordered else 0.0
    mean = sum(took) / len(took) if took else 0.0
    poll_mean = sum(polls) / len(polls) if polls else 0.0
    return len(took) / seconds, mean * 1e3, p99 * 1e3, len(polls) / seconds, poll_mean * 1e3


def batch_entries_per_second(url: str, messages: int) -> float:
    import psycopg

    with psycopg.connect(url, autocommit=True) as conn:
        start = time.perf_counter()
        with conn.transaction():
            conn.execute(
                "SELECT cassette_post('work', 'USER', NULL, '{\"n\":' || n || '}',"
                " ARRAY['default'], ARRAY[1], ARRAY['{}'])"
                " FROM generate_series(1, %s) AS n ORDER BY n",
                (messages,),
            )
        elapsed = time.perf_counter() - start
    return 3 * messages / elapsed


def in_turn(round_number: int) -> list[tuple[str, int]]:
    """The schemas in the order a round measures them: the baseline first in odd rounds,
    last in even ones (the second of a pair runs on a server the first has just loaded)."""
    pairs = list(SCHEMAS.items())
    return pairs if round_number % 2 else pairs[::-1]


def ratio(value: float, base: float) -> str:
    return f"{value / base:5.2f}x" if base else "    -"


def main(argv: list[str]) -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("url")
    parser.add_argument("--seconds", type=float, default=5.0)
    parser.add_argument("--pollers", type=int, default=4)
    parser.add_argument("--interval-ms", type=float, default=5.0)
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--batch", type=int, default=2000)
    args = parser.parse_args(argv)
    for round_number in range(1, args.rounds + 1 if args.seconds > 0 else 1):
        got: dict[str, tuple[float, float, float, float, float]] = {}
        for name, version in in_turn(round_number):
            with ledger(args.url, version) as url:
                got[name] = measure(url, args.seconds, args.pollers, args.interval_ms / 1e3)
        base = got["through 0011 (baseline)"]
        for name in SCHEMAS:
            posts, mean, p99, polls, poll_ms = got[name]
            print(
                f"round {round_number} {name:24} {posts:6.0f} posts/s"
                f" ({ratio(posts, base[0])}), {mean:6.2f} ms/post mean, {p99:6.2f} ms p99;"
                f" {args.pollers} pollers {polls:7.0f} polls/s ({ratio(polls, base[3])}),"
                f" {poll_ms:6.3f} ms/poll mean",
                flush=True,
            )
    for round_number in range(1, args.rounds + 1 if args.batch else 1):
        rates: dict[str, float] = {}
        for name, version in in_turn(round_number):
            with ledger(args.url, version) as url:
                rates[name] = batch_entries_per_second(url, args.batch)
        base_rate = rates["through 0011 (baseline)"]
        for name in SCHEMAS:
            rate = rates[name]
            print(
                f"round {round_number} {name:24} one transaction of {args.batch} posts:"
                f" {rate:7.0f} entries/s ({ratio(rate, base_rate)})",
                flush=True,
            )
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
