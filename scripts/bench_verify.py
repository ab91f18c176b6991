"""Verify speed on an existing ledger: the quick and full levels against the fetch-and-hash
floor (every journal row fetched and its leaf and link checked, nothing else), and the full
level with the history judge switched off (its methods no-ops in that child only: what
judging history costs, as a ratio), each in a fresh interpreter, interleaved (quick, full,
full without the judge, floor, quick, ...), with the phases of one full run. Results and
the command go to docs/BENCHMARKS.md.

    python scripts/bench_verify.py LEDGER [--reps 3]

Build a ledger with scripts/bench_chain.py (--keep DIR keeps ledger-N.db), or use any.
"""

from __future__ import annotations

import argparse
import os
import platform
import sqlite3
import statistics
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_chain import CHILD_FLOOR, CHILD_VERIFY, measure_in_child, median_range

# The full verify with the history judge's methods replaced by no-ops (this child only).
CHILD_VERIFY_NO_JUDGE = CHILD_VERIFY.replace(
    "from catalytic_cassette.verify import Level, verify_path",
    "from catalytic_cassette.verify import Level, verify_path, history\n"
    "for _name in ('entry', 'body', 'dated', 'finish'):\n"
    "    setattr(history.HistoryJudge, _name, lambda *_a, **_k: None)\n"
    "history.check_history = lambda *_a, **_k: True\n"
    "from catalytic_cassette.verify import inserts, run\n"
    "inserts.broken_inserts = run.broken_inserts = lambda *_a, **_k: []",
)


def phases(path: str) -> list[tuple[str, float]]:
    """Each piece of a full verify alone, one after another, on one connection (the
    full run overlaps the walk with the pages-and-indexes check on two connections)."""
    from catalytic_cassette.clock import SystemClock
    from catalytic_cassette.connection import connect_readonly
    from catalytic_cassette.verify import (
        chain,
        consistency,
        findings,
        history,
        inserts,
        run,
        state,
        stream,
        timeline,
    )

    conn = run._for_verify(connect_readonly(path))
    conn.execute("BEGIN")
    out = findings.Collector()
    now = SystemClock().now_ms()

    deferred: list[stream.RowsCheck] = []
    streams: list[stream.StateStream] = []

    def walk(tree: bool, rows: bool) -> None:
        walk = chain.TreeWalk(conn, out, set(), stored_nodes=True) if tree else None
        streamed = (
            # (as on two cores: the walk renders one block of rows in two, the other
            # blocks' bodies are compared by whichever connection is free)
            stream.StateStream(conn, now, 300_000, 86_400_000, defer=deferred.append, shares=2)
            if rows
            else None
        )
        see = streamed.see if streamed is not None else None
        chain.check_chain(conn, out, None, walk, see=see)
        if walk is not None:
            walk.finish()
        if streamed is not None:
            streamed.end_walk()
            streams.append(streamed)  # its body comparisons are the next piece

    def bodies() -> None:
        for check in deferred:
            check.run(conn)
        assert streams.pop().finish(), "the fast path did not hold on this ledger"

    steps = [
        ("chain alone (fetch, leaf and link hashes)", lambda: walk(False, False)),
        ("chain and tree", lambda: walk(True, False)),
        ("chain, tree, state and time streamed (the walk)", lambda: walk(True, True)),
        ("the other half of the bodies against their rows (either connection)", bodies),
        (
            "pages and indexes (integrity_check, every table)",
            lambda: [run._integrity_check(conn, out, t) for t in run._tables_to_check(conn)],
        ),
        (
            "consistency and checkpoint ids",
            lambda: (
                consistency.check_consistency(conn, out, None, now),
                consistency.check_checkpoint_ids(conn, out),
            ),
        ),
        ("for comparison: state by full replay", lambda: state.check_state(conn, out, None)),
        (
            "for comparison: time from the journal in SQL",
            lambda: timeline.check_time(conn, out, now, 300_000, 86_400_000),
        ),
        (
            "for comparison: history by its own scan of the journal",
            lambda: history.check_history(conn, out, now, 300_000),
        ),
        (
            "the insert rules over the final tables (on a free connection)",
            lambda: inserts.broken_inserts(conn),
        ),
    ]
    timed = []
    for label, step in steps:
        start = time.process_time()
        step()
        timed.append((label, time.process_time() - start))
    conn.close()
    assert not out.report.errors, out.report.findings[:3]
    return timed


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("ledger")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    path = str(Path(args.ledger).resolve())
    root = str(Path(__file__).resolve().parents[1])
    conn = sqlite3.connect(f"file:{path}?mode=ro", uri=True)
    rows = conn.execute("SELECT count(*) FROM cassette_journal").fetchone()[0]
    conn.close()
    print(
        f"python {platform.python_version()}, sqlite {sqlite3.sqlite_version}, "
        f"{os.cpu_count()} CPUs, {platform.machine()}"
    )
    print(f"ledger {path}: {rows:,} journal rows, {os.path.getsize(path) / 2**20:,.0f} MiB")
    quick, full, unjudged, floor = [], [], [], []
    load_before = f"{os.getloadavg()[0]:.2f}"
    for _ in range(args.reps):
        quick.append(measure_in_child(CHILD_VERIFY.format(root=root, path=path, level="quick")))
        full.append(measure_in_child(CHILD_VERIFY.format(root=root, path=path, level="full")))
        unjudged.append(
            measure_in_child(CHILD_VERIFY_NO_JUDGE.format(root=root, path=path, level="full"))
        )
        floor.append(measure_in_child(CHILD_FLOOR.format(path=path)))
    floor_rate = statistics.median(m["rows_per_s"] for m in floor)
    for label, runs in (("quick", quick), ("full", full)):
        rates = [m["rows_per_s"] for m in runs]
        peak = max(m["rss_peak_kib"] for m in runs) / 1024
        anon = max(m.get("rss_anon_kib", 0) for m in runs) / 1024
        print(
            f"verify {label}: {median_range(rates)}; ratio to floor "
            f"{statistics.median(rates) / floor_rate:.2f}; peak RSS {peak:.0f} MiB"
            f" (mostly the file's pages, mapped; private memory at the end {anon:.0f} MiB)"
        )
    judged = statistics.median(m["seconds"] for m in full)
    bare = statistics.median(m["seconds"] for m in unjudged)
    print(
        f"verify full without the history judge: "
        f"{median_range([m['rows_per_s'] for m in unjudged])}; time with/without the judge"
        f" {judged / bare:.3f}"
    )
    # CPU seconds of the verifying process (both threads): steadier than the wall clock
    # on a shared machine; their difference is the judge's own cost.
    judged_cpu = statistics.median(m["cpu_s"] for m in full)
    bare_cpu = statistics.median(m["cpu_s"] for m in unjudged)
    print(
        f"CPU s of a full verify with / without the judge (median): {judged_cpu:.2f} /"
        f" {bare_cpu:.2f}; the judge's own cost {judged_cpu - bare_cpu:.2f} s"
        f" ({(judged_cpu - bare_cpu) / rows * 1e6:.2f} us per journal row);"
        f" quick {statistics.median(m['cpu_s'] for m in quick):.2f} (without the child"
        " process that hashes its second half)"
    )
    print(f"load average before / after: {load_before} / {os.getloadavg()[0]:.2f}")
    print(f"floor (fetch, leaf, link): {median_range([m['rows_per_s'] for m in floor])}")
    print("pieces of a full verify, each alone (CPU seconds of this process):")
    for label, seconds in phases(path):
        print(f"  {label}: {seconds:.2f} s ({seconds / rows * 1e6:.1f} us per journal row)")


if __name__ == "__main__":
    main()
