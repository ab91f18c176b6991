"""Instructions per operation, ours against raw sqlite3 and huey, counted by valgrind (issue 12).

Wall and CPU time on a shared two-core machine move by 20-30 % between runs; the number of
instructions a workload executes in user space is repeatable to about 0.1 %. Each workload
runs in a fresh interpreter under `valgrind --tool=callgrind` at two sizes, and
`(Ir(n2) - Ir(n1)) / (n2 - n1)` is the cost of one operation (the defaults differ by 256
operations, so by whole blocks of 256 journal entries, each of which stores its tree nodes
once: a difference of 200 cycles held two or three such blocks depending on where the run
started, about 1 % either way): start-up, imports and the
ledger's setup (the same 1,500 pending steps or tasks at both sizes) cancel out. What it
does not count: the kernel's writes of WAL pages, the fsyncs of durability `full`, cache
misses. Read it beside `bench.py`'s rates, not instead.

    python scripts/bench_instructions.py                       # every workload, normal
    python scripts/bench_instructions.py --workloads cycle --n1 100 --n2 356
    python scripts/bench_instructions.py --native --n1 5 --n2 10   # no valgrind: a smoke run

Workloads (baselines in the same run): `cycle` = claim + complete with 1 worker, ours as two
calls and as the fused loop (`complete_and_claim`), raw sqlite3 (the package's schema
without triggers, scripts/bench_raw.py) and huey's SqliteHuey worker (dequeue, execute,
store the result); `post` = one `post_message` per transaction, ours and raw; `single` = one
`append_action` per transaction, ours and raw; `batch` = `append_actions` in batches of
1,000, per action, ours and raw.

`floor` (every workload): the raw tables plus the cheapest hash-chained journal a ledger
could keep (scripts/bench_raw.py, `add_floor_journal`).
"""

from __future__ import annotations

import argparse
import os
import platform
import re
import shutil
import sqlite3
import subprocess
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import bench  # noqa: E402
import bench_chain  # noqa: E402
import bench_raw  # noqa: E402

from catalytic_cassette import ManualClock, MessageCassette  # noqa: E402

WARM = 100  # operations before the counted ones, in both runs
PENDING = 1_500  # steps (or huey tasks) made ready before any is timed, whatever n is
BATCH = 1_000
CONTENDERS = {
    "cycle": ("ours", "ours-fused", "raw", "floor", "huey"),
    "post": ("ours", "raw", "floor"),
    "single": ("ours", "raw", "floor"),
    "batch": ("ours", "raw", "floor"),
}


def _cycle_ours(folder: Path, n: int, fused: bool) -> None:
    path = folder / "ours.db"
    with MessageCassette(path, clock=ManualClock(), durability="normal") as cassette:
        bench.post_batches(cassette, PENDING, 500)
    with MessageCassette(path, clock=ManualClock(), durability="normal") as cassette:
        if not fused:
            for _ in range(WARM + n):
                step = cassette.claim_step(bench.RUN, bench.WORKER, bench.TTL_SECONDS)
                cassette.complete_step(
                    bench.RUN, step["step_id"], bench.WORKER, step["fencing_token"],
                    bench.RECEIPT, "SUCCESS",
                )  # fmt: skip
            return
        step = cassette.claim_step(bench.RUN, bench.WORKER, bench.TTL_SECONDS)
        for _ in range(WARM + n):
            step = cassette.complete_and_claim(
                bench.RUN, step["step_id"], bench.WORKER, step["fencing_token"],
                bench.RECEIPT, "SUCCESS", bench.TTL_SECONDS,
            )["next"]  # fmt: skip


def _cycle_raw(folder: Path, n: int) -> None:
    templates = bench.Templates(folder, 500)
    conn = bench.raw_connect(templates.raw(PENDING), "normal")
    for _ in range(WARM + n):
        claimed = bench.raw_claim(conn, bench.WORKER)
        assert claimed is not None
        bench.raw_complete(conn, claimed[0], claimed[1], bench.WORKER, claimed[2])
    conn.close()


def _cycle_floor(folder: Path, n: int) -> None:
    """The raw cycle with one journal row per write written by SQL triggers, unguarded."""
    templates = bench.Templates(folder, 500)
    conn = bench.raw_connect(templates.raw(PENDING), "normal")
    bench_raw.add_floor_journal(conn, bench_raw.CYCLE_WRITES)
    for _ in range(WARM + n):
        claimed = bench.raw_claim(conn, bench.WORKER)
        assert claimed is not None
        bench.raw_complete(conn, claimed[0], claimed[1], bench.WORKER, claimed[2])
    conn.close()


def _post_ours(folder: Path, n: int) -> None:
    with MessageCassette(folder / "ours.db", clock=ManualClock(), durability="normal") as cassette:
        for _ in range(WARM + n):
            cassette.post_message(bench.PAYLOAD, bench.RUN, bench.SOURCE)


def _post_raw(folder: Path, n: int, floor: bool) -> None:
    templates = bench.Templates(folder, 500)
    conn = bench.raw_connect(templates.raw(0), "normal")
    if floor:
        bench_raw.add_floor_journal(conn, bench_raw.POST_WRITES)
    payload = bench.canonical(bench.PAYLOAD)
    for _ in range(WARM + n):
        conn.execute("BEGIN IMMEDIATE")
        bench.raw_post(conn, payload, bench.now_ms())
        conn.execute("COMMIT")
    conn.close()


def _cycle_huey(folder: Path, n: int) -> None:
    queue, task = bench.make_huey(folder / "huey.db", "normal")
    for _ in range(PENDING):
        task(bench.PAYLOAD)
    for _ in range(WARM + n):
        item = queue.dequeue()
        assert item is not None
        queue.execute(item)
    queue.storage.close()


def _appends(folder: Path, n: int, side: str, batch: int | None) -> None:
    if batch is None:
        single = bench_chain.Single(folder, "normal")
        run = {"ours": single.run_ours, "raw": single.run_raw, "floor": single.run_floor}[side]
        run(WARM), run(n)
        closing = [single.ours, single.raw, single.floor]
    else:
        batched = bench_chain.Batched(folder, "normal", batch)
        run = {"ours": batched.run_ours, "raw": batched.run_raw, "floor": batched.run_floor}[side]
        run(batch), run(n)
        closing = [batched.ours, batched.raw, batched.floor]
    for conn in closing:
        conn.close()


RUNNERS: dict[str, Callable[[Path, int], None]] = {
    "cycle:ours": lambda folder, n: _cycle_ours(folder, n, fused=False),
    "cycle:ours-fused": lambda folder, n: _cycle_ours(folder, n, fused=True),
    "cycle:raw": _cycle_raw,
    "cycle:huey": _cycle_huey,
    "cycle:floor": _cycle_floor,
    "post:ours": _post_ours,
    "post:raw": lambda folder, n: _post_raw(folder, n, floor=False),
    "post:floor": lambda folder, n: _post_raw(folder, n, floor=True),
    "single:ours": lambda folder, n: _appends(folder, n, "ours", None),
    "single:raw": lambda folder, n: _appends(folder, n, "raw", None),
    "single:floor": lambda folder, n: _appends(folder, n, "floor", None),
    "batch:ours": lambda folder, n: _appends(folder, n, "ours", BATCH),
    "batch:raw": lambda folder, n: _appends(folder, n, "raw", BATCH),
    "batch:floor": lambda folder, n: _appends(folder, n, "floor", BATCH),
}


def child(name: str, n: int) -> None:
    if name.startswith("cycle") and WARM + n >= PENDING:
        raise SystemExit(f"at most {PENDING - WARM - 1} operations per run")
    folder = Path(tempfile.mkdtemp(prefix="bench-instructions-"))
    try:
        RUNNERS[name](folder, n)
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def instructions(name: str, n: int) -> int:
    """Instructions of one child run (valgrind's own count, user space only)."""
    command = [
        "valgrind", "--tool=callgrind", "--callgrind-out-file=/dev/null",
        sys.executable, __file__, "--child", name, str(n),
    ]  # fmt: skip
    done = subprocess.run(command, capture_output=True, text=True, check=False)
    found = re.search(r"Collected : ([\d,]+)", done.stderr)
    if done.returncode != 0 or found is None:
        raise SystemExit(f"{name} at {n} failed under valgrind:\n{done.stderr[-2000:]}")
    return int(found.group(1).replace(",", ""))


def per_operation(name: str, n1: int, n2: int, native: bool) -> float:
    if native:  # the smoke run: the workloads work, nothing is counted
        child(name, n1)
        return float("nan")
    return (instructions(name, n2) - instructions(name, n1)) / (n2 - n1)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--workloads", default="cycle,post,single,batch")
    parser.add_argument("--n1", type=int, default=100, help="operations in the smaller run")
    parser.add_argument(  # 256 more cycles or appends: whole blocks of 256 journal entries
        "--n2", type=int, default=356, help="operations in the larger run"
    )
    parser.add_argument("--native", action="store_true", help="run each once, count nothing")
    parser.add_argument("--skip", default="", help="contenders to leave out, e.g. ours-fused")
    parser.add_argument("--child", nargs=2, metavar=("WORKLOAD", "N"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        child(args.child[0], int(args.child[1]))
        return
    workloads = [w for w in args.workloads.split(",") if w]
    for workload in workloads:
        if workload not in CONTENDERS:
            raise SystemExit(f"unknown workload {workload!r}: one of {', '.join(CONTENDERS)}")
    if not args.native and shutil.which("valgrind") is None:
        raise SystemExit("valgrind is not installed (Debian: apt-get install valgrind)")
    print(f"command: {' '.join([Path(sys.executable).name, *sys.argv])}")
    print(
        f"python {platform.python_version()}, sqlite {sqlite3.sqlite_version},"
        f" {platform.machine()}, {os.cpu_count()} cpus, durability normal, huey"
        f" {getattr(bench.huey_module(), '__version__', 'not installed')}"
    )
    print(f"per operation = (Ir(n2) - Ir(n1)) / (n2 - n1), n1 = {args.n1}, n2 = {args.n2}")
    for workload in workloads:
        counts: dict[str, float] = {}
        for side in CONTENDERS[workload]:
            if side in args.skip.split(",") or (side == "huey" and bench.huey_module() is None):
                continue
            n1, n2 = (args.n1, args.n2) if workload != "batch" else (BATCH, 3 * BATCH)
            if args.native:
                n1, n2 = (n1, n2) if workload != "batch" else (BATCH, BATCH)
            counts[side] = per_operation(f"{workload}:{side}", n1, n2, args.native)
            print(f"{workload:7s} {side:11s} {counts[side]:>12,.0f} instructions per operation")
        for side in counts:
            bases = ("raw", "huey") if side == "floor" else ("raw", "floor", "huey")
            for base in bases:
                if base in counts and side != base and side not in ("raw", "huey"):
                    print(f"{workload:7s} {side} / {base} = {counts[side] / counts[base]:.2f}")


if __name__ == "__main__":
    main()
