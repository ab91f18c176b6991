"""What judging history costs, on a ledger of work (messages, jobs, steps claimed, some
released and claimed again, completed: about 7 journal entries per step), against the
alternative design of replaying the journal through the law the package ships (``cassette
copy`` into a fresh file, which writes every entry again through the destination's
triggers).

    python scripts/bench_history.py [--entries 1000000] [--reps 3] [--keep DIR]

Each measurement runs in a fresh interpreter, interleaved: a full verify, the same verify
with the history judge switched off (its methods replaced by no-ops in that child only),
and, on the first ``--copy-entries`` of the ledger, ``copy``. Prints entries per second and
the ratios; results and the command go to docs/BENCHMARKS.md.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

NO_JUDGE = """
from catalytic_cassette.verify import history
def _nothing(*_args, **_kwargs):
    return None
for _name in ("entry", "body", "dated", "finish"):
    setattr(history.HistoryJudge, _name, _nothing)
history.check_history = lambda *_args, **_kwargs: True
from catalytic_cassette.verify import inserts, run
inserts.broken_inserts = run.broken_inserts = lambda *_args, **_kwargs: []
"""

CHILD_VERIFY = """
import json, sys, time
sys.path.insert(0, {root!r})
{prelude}
from catalytic_cassette.verify import verify_path
start, cpu = time.perf_counter(), time.process_time()
report = verify_path({path!r})
elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
assert report.ok, [f.to_dict() for f in report.findings[:3]]
print(json.dumps({{"rows": report.journal_rows, "seconds": elapsed, "cpu": cpu}}))
"""

CHILD_SEAL_JUDGE = """
import json, sqlite3, sys, time
sys.path.insert(0, {root!r})
from catalytic_cassette.verify.findings import Collector
from catalytic_cassette.verify.history import check_since
conn = sqlite3.connect("file:" + {path!r} + "?mode=ro", uri=True)
size = conn.execute("SELECT seq + 1 FROM cassette_journal ORDER BY seq DESC LIMIT 1").fetchone()[0]
out = {{}}
for label, start in (("whole", 0), ("last 10000", size - 10_000)):
    begin = time.perf_counter()
    found = Collector()
    assert check_since(conn, found, start, size, 1 << 62, 300_000), found.report.findings[:3]
    out[label] = time.perf_counter() - begin
print(json.dumps(out))
"""

CHILD_COPY = """
import json, os, sys, time
sys.path.insert(0, {root!r})
from catalytic_cassette.copying import copy_ledger
start = time.perf_counter()
done = copy_ledger({source!r}, {dest!r}, durability="normal")
elapsed = time.perf_counter() - start
os.remove({dest!r})
print(json.dumps({{"rows": done["copied"], "seconds": elapsed}}))
"""


def build(path: Path, entries: int) -> int:
    """A ledger of work with about ``entries`` journal entries; returns the count."""
    from catalytic_cassette import MessageCassette

    batch = 500
    with MessageCassette(path, durability="normal") as cassette:
        size = 0
        round_ = 0
        while size < entries:
            run = f"run-{round_ % 7}"
            cassette.post_messages(
                [({"n": round_, "i": i}, run, "USER", None) for i in range(batch)]
            )
            held = cassette.claim_steps(run, "w1", batch, 3600)
            for lease in held[::10]:  # a tenth released and claimed again
                cassette.requeue(
                    run, lease["step_id"], worker_id="w1", fencing_token=lease["fencing_token"]
                )
            held = [h for h in held if h not in held[::10]]
            held += cassette.claim_steps(run, "w2", batch, 3600)
            cassette.complete_steps(
                [
                    (run, h["step_id"], h["worker_id"], h["fencing_token"], {"ok": 1}, "SUCCESS")
                    for h in held
                ]
            )
            size = int(
                cassette.conn.execute(
                    "SELECT seq + 1 FROM cassette_journal ORDER BY seq DESC LIMIT 1"
                ).fetchone()[0]
            )
            round_ += 1
    return size


def child(code: str) -> dict[str, float]:
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--entries", type=int, default=1_000_000)
    parser.add_argument("--copy-entries", type=int, default=100_000)
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--keep", type=Path, default=None, help="build or reuse ledgers here")
    parser.add_argument(
        "--ledger", type=Path, default=None, help="verify this ledger instead of a built one"
    )
    parser.add_argument("--no-copy", action="store_true", help="skip copy and the seal check")
    args = parser.parse_args()
    folder = args.keep or Path(tempfile.mkdtemp(prefix="bench-history-"))
    folder.mkdir(parents=True, exist_ok=True)
    big = args.ledger or folder / f"work-{args.entries}.db"
    small = folder / f"work-{args.copy_entries}.db"
    for path, size in ((big, args.entries), (small, args.copy_entries)):
        if not path.exists() and not (args.no_copy and path == small):
            start = time.perf_counter()
            made = build(path, size)
            print(f"built {path.name}: {made:,} entries in {time.perf_counter() - start:.0f} s")
    print(
        f"python {platform.python_version()}, sqlite {sqlite3.sqlite_version}, "
        f"{os.cpu_count()} CPUs, {platform.machine()}"
    )
    root = str(ROOT)
    runs: dict[str, list[float]] = {"full": [], "no judge": [], "copy": [], "small full": []}
    seal_judge: list[dict[str, float]] = []
    cpu: dict[str, list[float]] = {"full": [], "no judge": []}
    for _ in range(args.reps):
        full = child(CHILD_VERIFY.format(root=root, prelude="", path=str(big)))
        runs["full"].append(full["rows"] / full["seconds"])
        bare = child(CHILD_VERIFY.format(root=root, prelude=NO_JUDGE, path=str(big)))
        runs["no judge"].append(bare["rows"] / bare["seconds"])
        cpu["full"].append(full["cpu"])
        cpu["no judge"].append(bare["cpu"])
        if args.no_copy:
            continue
        dest = str(folder / "copy-dest.db")
        copied = child(CHILD_COPY.format(root=root, source=str(small), dest=dest))
        runs["copy"].append(copied["rows"] / copied["seconds"])
        verified = child(CHILD_VERIFY.format(root=root, prelude="", path=str(small)))
        runs["small full"].append(verified["rows"] / verified["seconds"])
        seal_judge.append(child(CHILD_SEAL_JUDGE.format(root=root, path=str(big))))

    def shown(name: str) -> str:
        values = runs[name]
        return f"{statistics.median(values):,.0f}/s (range {min(values):,.0f}-{max(values):,.0f})"

    print(f"full verify, {big.name}: {shown('full')}")
    print(f"full verify without the history judge: {shown('no judge')}")
    print(
        "ratio with/without (time): "
        f"{statistics.median(runs['no judge']) / statistics.median(runs['full']):.3f}"
    )
    judged_cpu, bare_cpu = statistics.median(cpu["full"]), statistics.median(cpu["no judge"])
    print(
        f"CPU seconds of the verifying process, with/without the judge: {judged_cpu:.2f} /"
        f" {bare_cpu:.2f} (ratio {judged_cpu / bare_cpu:.3f})"
    )
    if args.no_copy:
        return
    print(f"copy (replay through the law), {small.name}: {shown('copy')}")
    print(f"full verify, {small.name}: {shown('small full')}")
    for label in ("whole", "last 10000"):
        values = [m[label] for m in seal_judge]
        print(
            f"a seal's history check, {label} of {big.name}: {statistics.median(values):.3f} s"
            f" (range {min(values):.3f}-{max(values):.3f})"
        )
    print(
        "ratio verify/copy (rate): "
        f"{statistics.median(runs['small full']) / statistics.median(runs['copy']):.1f}"
    )


if __name__ == "__main__":
    main()
