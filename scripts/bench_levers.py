"""What each piece of the write path costs, and what a connection setting buys (issue 12).

Each variant is a scratch copy of the same small ledger with one change: a trigger or index
dropped by a raw connection (an upper bound of what removing or deferring it could save,
never something the package does), a page size, or a `wal_autocheckpoint` value. The
variants run interleaved (A B C A B C ...) and each reports its median wall rate and the
median CPU time of this process per operation (`time.process_time`, which other processes
on the machine do not inflate as much as wall time).

    python scripts/bench_levers.py --durability normal --variants base,ckpt:4000 --reps 5
    python scripts/bench_levers.py --variants base,drop:cassette_journal_grow_tree
    python scripts/bench_levers.py --statements          # CPU per SQL statement of a cycle
    python scripts/bench_levers.py --statements --workloads cycle,fused
    python scripts/bench_levers.py --python              # the package's own Python per call

Variants: `base`; `ckpt:N` (PRAGMA wal_autocheckpoint = N on the benchmark's connection);
`page:N` (the copy rebuilt with N-byte pages); `drop:name|name...` (triggers or indexes of
the file, dropped on the copy); `droptemp:name|name...` (TEMP triggers of the connection).
Workloads: `cycle` (claim + complete, 1 worker), `fused` (the same cycle as the fused
worker loop: one claim, then `complete_and_claim` per cycle), `single` (append_action, one
per transaction), `batch` (append_actions, batches of 1,000). `--statements` times the
statements of `cycle` and of `fused`, whichever `--workloads` names (`cycle` by default).
`--python` times `claim_step`, `complete_step` and `complete_and_claim` with every
statement answered at once by a stub instead of SQLite: what the package's own Python
(argument checks, JSON, the transaction object, building the results) costs per call.
`--warm N` runs N operations before timing, so the WAL is past its first growth (a fresh
file's WAL grows by appending, which costs more at durability full than reusing it).
"""

from __future__ import annotations

import argparse
import collections
import shutil
import sqlite3
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_chain

from catalytic_cassette import MessageCassette, payloads
from catalytic_cassette import connection as connection_module
from catalytic_cassette.chain import CausalChain
from catalytic_cassette.temp_objects import TempSchema

RUN = "bench"
WORKER = "worker-1"
PAYLOAD: dict[str, Any] = {
    "task": "fetch-page",
    "url": "https://example.org/articles/2024/05/sqlite-write-ahead-logging",
    "retries": 3,
    "note": "summarise the page in three sentences and keep every link",
}
RECEIPT: dict[str, Any] = {"ok": True, "result": "summary stored", "tokens": 412}


def build_templates(folder: Path, durability: str, steps: int) -> None:
    with MessageCassette(folder / "messages.db", durability=durability) as cassette:
        for start in range(0, steps, 500):
            count = min(500, steps - start)
            cassette.post_messages([(PAYLOAD, RUN, "USER", None)] * count)
    with CausalChain(folder / "actions.db", durability=durability) as chain:
        chain.append_action(bench_chain.action())
    for name in ("messages.db", "actions.db"):
        conn = sqlite3.connect(folder / name)
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
        conn.close()


def prepare(template: Path, target: Path, variant: str) -> Path:
    shutil.copy(template, target)
    kind, _, value = variant.partition(":")
    conn = sqlite3.connect(target, isolation_level=None)
    try:
        if kind == "drop":
            for name in value.split("|"):
                kind_of = conn.execute(
                    "SELECT type FROM sqlite_schema WHERE name = ?", (name,)
                ).fetchone()
                conn.execute(f"DROP {kind_of[0].upper()} {name}")
        elif kind == "page":
            conn.execute("PRAGMA journal_mode = DELETE").fetchall()
            conn.execute(f"PRAGMA page_size = {int(value)}")
            conn.execute("VACUUM")
            conn.execute("PRAGMA journal_mode = WAL").fetchall()
    finally:
        conn.close()
    return target


def configure(conn: sqlite3.Connection, variant: str) -> None:
    kind, _, value = variant.partition(":")
    if kind == "ckpt":
        conn.execute(f"PRAGMA wal_autocheckpoint = {int(value)}").fetchall()
    elif kind == "droptemp":
        for name in value.split("|"):
            conn.execute(f"DROP TRIGGER temp.{name}")
        # the lever's TEMP schema is this connection's own from now on (temp_objects)
        conn.temp_schema = TempSchema(conn)  # type: ignore[attr-defined]


def cycle(cassette: MessageCassette) -> None:
    step = cassette.claim_step(RUN, WORKER, 600)
    cassette.complete_step(RUN, step["step_id"], WORKER, step["fencing_token"], RECEIPT, "SUCCESS")


class FusedLoop:
    """One cycle of the fused worker loop per call: complete the step held and lease the
    next in one transaction (the first call claims first)."""

    def __init__(self, cassette: MessageCassette) -> None:
        self.cassette = cassette
        self.step: dict[str, Any] | None = None

    def __call__(self) -> None:
        if self.step is None:
            self.step = self.cassette.claim_step(RUN, WORKER, 600)
        step = self.step
        self.step = self.cassette.complete_and_claim(
            RUN, step["step_id"], WORKER, step["fencing_token"], RECEIPT, "SUCCESS", 600
        )["next"]


def cycle_operation(cassette: MessageCassette, workload: str) -> Callable[[], None]:
    return FusedLoop(cassette) if workload == "fused" else lambda: cycle(cassette)


def run_cycles(
    path: Path, variant: str, args: argparse.Namespace, workload: str
) -> tuple[float, float]:
    with MessageCassette(path, durability=args.durability) as cassette:
        configure(cassette.conn, variant)
        operation = cycle_operation(cassette, workload)
        for _ in range(args.warm):
            operation()
        return timed(args.ops, operation)


def run_appends(
    path: Path, variant: str, args: argparse.Namespace, batched: bool
) -> tuple[float, float]:
    with CausalChain(path, durability=args.durability) as chain:
        configure(chain.conn, variant)
        for _ in range(args.warm):
            chain.append_action(bench_chain.action())
        if batched:
            batches = [[bench_chain.action() for _ in range(1000)] for _ in range(3)]
            rate, cpu = timed(3, lambda: chain.append_actions(batches.pop()))
            return rate * 1000, cpu / 1000
        return timed(args.ops, lambda: chain.append_action(bench_chain.action()))


def timed(count: int, operation: Callable[[], object]) -> tuple[float, float]:
    wall, cpu = time.perf_counter(), time.process_time()
    for _ in range(count):
        operation()
    return count / (time.perf_counter() - wall), (time.process_time() - cpu) / count * 1e6


def levers(args: argparse.Namespace, folder: Path) -> None:
    build_templates(folder, args.durability, args.ops + args.warm + 1)
    results: dict[tuple[str, str], list[tuple[float, float]]] = collections.defaultdict(list)
    for rep in range(args.reps):
        for number, variant in enumerate(args.variants):
            for workload in args.workloads:
                cycles = workload in ("cycle", "fused")
                template = folder / ("messages.db" if cycles else "actions.db")
                path = prepare(template, folder / f"{workload}-{number}-{rep}.db", variant)
                if cycles:
                    result = run_cycles(path, variant, args, workload)
                else:
                    result = run_appends(path, variant, args, workload == "batch")
                results[(workload, variant)].append(result)
    for workload in args.workloads:
        for variant in args.variants:
            samples = results[(workload, variant)]
            rates = [rate for rate, _ in samples]
            print(
                f"[{args.durability}] {workload:6s} {variant:40s}"
                f" {statistics.median(rates):8,.0f}/s ({min(rates):,.0f}-{max(rates):,.0f})"
                f"  cpu {statistics.median(cpu for _, cpu in samples):6.0f} us/op"
            )


def statements(args: argparse.Namespace, folder: Path) -> None:
    """CPU per statement of a claim + complete cycle, as the package issues them: the
    separate calls (`cycle`) and the fused worker loop (`fused`)."""
    workloads = [w for w in args.workloads if w in ("cycle", "fused")] or ["cycle"]
    build_templates(folder, args.durability, len(workloads) * (args.ops + args.warm + 1))
    plain = connection_module.CassetteConnection.execute
    for workload in workloads:
        spent: dict[str, float] = collections.defaultdict(float)
        calls: collections.Counter[str] = collections.Counter()

        def execute(
            self: Any,
            sql: str,
            parameters: Any = (),
            /,
            spent: dict[str, float] = spent,
            calls: collections.Counter[str] = calls,
        ) -> sqlite3.Cursor:
            start = time.process_time()
            try:
                return plain(self, sql, parameters)
            finally:
                key = " ".join(sql.split())[:60]
                spent[key] += time.process_time() - start
                calls[key] += 1

        with MessageCassette(folder / "messages.db", durability=args.durability) as cassette:
            operation = cycle_operation(cassette, workload)
            for _ in range(args.warm):
                operation()
            setattr(connection_module.CassetteConnection, "execute", execute)  # noqa: B010
            try:
                _, total = timed(args.ops, operation)
            finally:
                setattr(connection_module.CassetteConnection, "execute", plain)  # noqa: B010
        tag = f"[{args.durability}] {workload:5s}"
        for key, seconds in sorted(spent.items(), key=lambda item: -item[1]):
            per_cycle = seconds / args.ops * 1e6
            print(f"{tag} {per_cycle:7.1f} us x{calls[key] / args.ops:.0f}  {key}")
        in_statements = sum(spent.values()) / args.ops * 1e6
        print(
            f"{tag} {total:7.1f} us per cycle in all (Python included);"
            f" {total - in_statements:.1f} us outside the statements (the timing adds some)"
        )


class _StubCursor:
    rowcount = 1
    lastrowid = 1

    def __init__(self, row: tuple[Any, ...] | None) -> None:
        self.row = row

    def fetchone(self) -> tuple[Any, ...] | None:
        return self.row


def python_only(args: argparse.Namespace, folder: Path) -> None:
    """The package's Python per call, SQLite replaced by a stub that answers at once: the
    ledger time, the next pending step (a payload of this script's size), and an empty
    cursor for every other statement. Best of --reps runs of --ops calls each."""
    now = _StubCursor((0,))
    pending = _StubCursor((7, 7, 7, 0, payloads.dumps(PAYLOAD), 1))
    other = _StubCursor(None)

    def execute(self: Any, sql: str, parameters: Any = (), /) -> Any:
        if sql.startswith("SELECT ms"):
            return now
        return pending if "fencing_token + 1" in sql else other

    plain = connection_module.CassetteConnection.execute
    cassette = MessageCassette(folder / "stub.db", durability=args.durability)
    calls: dict[str, Callable[[], object]] = {
        "claim_step": lambda: cassette.claim_step(RUN, WORKER, 600),
        "complete_step": lambda: cassette.complete_step(RUN, 7, WORKER, 1, RECEIPT, "SUCCESS"),
        "complete_and_claim": lambda: cassette.complete_and_claim(
            RUN, 7, WORKER, 1, RECEIPT, "SUCCESS", 600
        ),
    }
    setattr(connection_module.CassetteConnection, "execute", execute)  # noqa: B010
    try:
        for name, call in calls.items():
            best = min(timed(args.ops, call)[1] for _ in range(args.reps))
            print(f"[python] {name:18s} {best:6.1f} us per call outside SQLite")
    finally:
        setattr(connection_module.CassetteConnection, "execute", plain)  # noqa: B010
        cassette.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--durability", choices=["normal", "full"], default="normal")
    parser.add_argument("--variants", default="base", help="comma-separated, see above")
    parser.add_argument("--workloads", default="cycle,fused,single,batch")
    parser.add_argument("--reps", type=int, default=3)
    parser.add_argument("--ops", type=int, default=1500, help="cycles or single appends per rep")
    parser.add_argument("--warm", type=int, default=1500, help="untimed operations first")
    parser.add_argument("--statements", action="store_true", help="CPU per SQL statement")
    parser.add_argument("--python", action="store_true", help="the package's Python per call")
    args = parser.parse_args()
    args.variants = args.variants.split(",")
    args.workloads = args.workloads.split(",")
    with tempfile.TemporaryDirectory(prefix="levers-") as tmp:
        if args.python:
            python_only(args, Path(tmp))
        elif args.statements:
            statements(args, Path(tmp))
        else:
            levers(args, Path(tmp))


if __name__ == "__main__":
    main()
