"""Merkle tree, seals, proofs and anchored verify benchmarks (issue 5, section 7).

Every comparison runs in this process tree, interleaved (A B, then B A, ...), and reports
the median and range of N repetitions plus the ratio of medians. Results and the command
that produced them go to docs/BENCHMARKS.md.

    python scripts/bench_anchors.py                  # the full run recorded in docs/BENCHMARKS.md
    python scripts/bench_anchors.py --quick          # seconds; what the test suite runs
    python scripts/bench_anchors.py --entries 200000 --json results.json

1. appends with the tree maintained vs without it: the same ledger, except that a raw
   sqlite3 connection dropped the trigger cassette_journal_grow_tree after creation, so
   journal appends do not grow the tree (append_action one per transaction, append_actions
   in batches, post_message one per transaction; durability normal and full);
2. ledgers of --entries journal entries (built with append_actions, durability normal):
   StoredTree.root, seals (record_seal + write_seal_file), inclusion and consistency proofs
   and their offline checks, plain vs anchored verify_path in child processes (time,
   rows/s, the child's own peak RSS);
3. bytes on disk per journal entry added by the tree (the pairs of workload 1, and the
   tree's own pages in the ledgers of workload 2).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import random
import resource
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import orjson

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench import checkpoint, file_bytes, out, rate_line, ratio  # the shared timing helpers

from catalytic_cassette import MessageCassette
from catalytic_cassette.chain import CausalChain
from catalytic_cassette.ledger import LedgerFile
from catalytic_cassette.proofs import check_proof_file, prove_consistency, prove_inclusion
from catalytic_cassette.seals import Seal, default_origin, record_seal, write_seal_file
from catalytic_cassette.tree import StoredTree

ROOT = Path(__file__).resolve().parents[1]
TREE_TRIGGER = "cassette_journal_grow_tree"
SYNC = {"full": "FULL", "normal": "NORMAL"}
RUN = "bench"
SOURCE = "USER"
# The action of scripts/bench_chain.py and the message of scripts/bench.py, so that row
# sizes match the other benchmarks.
ARGUMENTS = ["disk full on /var", {"limit": 10}]
RESULT = {"hits": 3, "top": "df -h"}
PAYLOAD: dict[str, Any] = {
    "task": "fetch-page",
    "url": "https://example.org/articles/2024/05/sqlite-write-ahead-logging",
    "headers": {"accept": "text/html", "user-agent": "bench/1.0"},
    "retries": 3,
    "timeout_s": 30,
    "note": "summarise the page in three sentences and keep every link",
}

Samples = dict[str, list[float]]


def action() -> dict[str, Any]:
    return {
        "plan_id": "plan-1",
        "intent_id": "intent-1",
        "session_id": "session-1",
        "action_type": "CapabilityCall",
        "function_name": "search",
        "arguments": ARGUMENTS,
        "result": RESULT,
        "cost": 0.002,
        "duration_ms": 12,
    }


# ----------------------------------------------------------------------- reporting


class Report:
    """What was printed, as JSON, plus the target table."""

    def __init__(self) -> None:
        self.data: dict[str, Any] = {"setup": {}, "workloads": {}, "targets": []}

    def put(self, workload: str, key: str, value: Any) -> None:
        self.data["workloads"].setdefault(workload, {})[key] = value

    def target(self, name: str, value: float, op: str, limit: float) -> str:
        met = value >= limit if op == ">=" else value <= limit
        self.data["targets"].append(
            {"target": name, "value": value, "op": op, "limit": limit, "met": met}
        )
        return f"(target {op} {limit:.2f}: {'met' if met else 'MISSED'})"


def duration(seconds: float) -> str:
    if seconds < 1e-3:
        return f"{seconds * 1e6:,.0f} us"
    if seconds < 1:
        return f"{seconds * 1e3:,.2f} ms"
    return f"{seconds:,.2f} s"


def time_line(samples: list[float]) -> str:
    return (
        f"{duration(statistics.median(samples))} "
        f"(range {duration(min(samples))}-{duration(max(samples))}, n={len(samples)})"
    )


def interleave(contenders: dict[str, Callable[[], float]], reps: int) -> Samples:
    """Every contender once per repetition; the order alternates (A B, B A, ...) so that
    neither side always runs first after the other's writes."""
    results: Samples = {name: [] for name in contenders}
    names = list(contenders)
    for rep in range(reps):
        for name in names if rep % 2 == 0 else names[::-1]:
            results[name].append(contenders[name]())
    return results


def count(path: Path, table: str) -> int:
    conn = sqlite3.connect(path)
    try:
        return int(conn.execute(f"SELECT count(*) FROM {table}").fetchone()[0])
    finally:
        conn.close()


# ------------------------------------------------- 1. appends with and without the tree


def drop_tree_trigger(path: Path) -> None:
    conn = sqlite3.connect(path, isolation_level=None)
    try:
        conn.execute(f"DROP TRIGGER {TREE_TRIGGER}")
    finally:
        conn.close()


class Pair:
    """Two ledgers created alike; in `without` the tree trigger was dropped after creation."""

    def __init__(self, folder: Path, kind: type[LedgerFile], durability: str) -> None:
        folder.mkdir(parents=True)
        self.paths = {"with tree": folder / "with-tree.db", "without": folder / "without.db"}
        for path in self.paths.values():
            kind(path, durability=durability).close()
        drop_tree_trigger(self.paths["without"])
        self.ledgers = {
            name: kind(path, durability=durability) for name, path in self.paths.items()
        }

    def close(self) -> dict[str, Any]:
        """Close, checkpoint and return entries, tree nodes and bytes of each side."""
        for ledger in self.ledgers.values():
            ledger.close()
        sizes: dict[str, Any] = {}
        for name, path in self.paths.items():
            checkpoint(path)
            sizes[name] = {
                "entries": count(path, "cassette_journal"),
                "tree_nodes": count(path, "cassette_tree_nodes"),
                "bytes": file_bytes(path),
            }
        return sizes


def single_appends(chain: CausalChain, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        chain.append_action(action())
    return n / (time.perf_counter() - start)


def batched_appends(chain: CausalChain, n: int, batch: int) -> float:
    start = time.perf_counter()
    for _ in range(n // batch):
        chain.append_actions([action() for _ in range(batch)])
    return n // batch * batch / (time.perf_counter() - start)


def posts(cassette: MessageCassette, n: int) -> float:
    start = time.perf_counter()
    for _ in range(n):
        cassette.post_message(PAYLOAD, RUN, SOURCE)
    return n / (time.perf_counter() - start)


def workload_appends(
    report: Report, scratch: Path, durability: str, args: argparse.Namespace
) -> None:
    tag = f"[{durability}]"
    folder = scratch / f"appends-{durability}"
    batched = args.batched // args.batch * args.batch
    # (key, title, ledger class, operations per rep, journal entries per operation, run)
    cases: list[tuple[str, str, type[LedgerFile], int, int, Callable[[Any], float]]] = [
        (
            "single",
            f"append_action one per transaction ({args.single:,} per rep)",
            CausalChain,
            args.single,
            1,
            lambda ledger: single_appends(ledger, args.single),
        ),
        (
            "batched",
            f"append_actions batches of {args.batch:,} ({batched:,} per rep)",
            CausalChain,
            batched,
            1,
            lambda ledger: batched_appends(ledger, args.batched, args.batch),
        ),
        (
            "post",
            f"post_message one per transaction ({args.posts:,} per rep; 3 journal entries each)",
            MessageCassette,
            args.posts,
            3,
            lambda ledger: posts(ledger, args.posts),
        ),
    ]
    for key, title, kind, ops, per_op, run in cases:
        pair = Pair(folder / key, kind, durability)
        cpu: Samples = {name: [] for name in pair.ledgers}

        def contender(
            name: str,
            run: Callable[[Any], float] = run,
            pair: Pair = pair,
            cpu: Samples = cpu,
            ops: int = ops,
        ) -> Callable[[], float]:
            """Wall-clock ops/s; the process's CPU seconds per op go to `cpu` (CPU time
            is not taken by other processes on the machine, wall time is)."""

            def go() -> float:
                started = time.process_time()
                rate = run(pair.ledgers[name])
                cpu[name].append((time.process_time() - started) / ops)
                return rate

            return go

        results = interleave({name: contender(name) for name in pair.ledgers}, args.reps)
        sizes = pair.close()
        for name, samples in results.items():
            out(f"{tag:8s} {title}, {name:9s}: {rate_line(samples)}")
        value = ratio(results, "with tree", "without")
        verdict = report.target(f"1. {key} with tree / without [{durability}]", value, ">=", 0.8)
        out(f"{tag:8s}   ratio with tree / without = {value:.2f} {verdict}")
        cpu_ratio = ratio(cpu, "without", "with tree")
        cpu_extra = (
            statistics.median(cpu["with tree"]) - statistics.median(cpu["without"])
        ) / per_op
        out(
            f"{tag:8s}   CPU time per operation: with tree {time_line(cpu['with tree'])},"
            f" without {time_line(cpu['without'])}; CPU ratio (as throughput) {cpu_ratio:.2f};"
            f" the tree adds {cpu_extra * 1e6:,.1f} us of CPU per journal entry"
        )
        with_tree, without = sizes["with tree"], sizes["without"]
        if without["tree_nodes"] != 0 or with_tree["entries"] != without["entries"]:
            raise RuntimeError(f"the pair is not comparable: {sizes}")
        added = (with_tree["bytes"] - without["bytes"]) / with_tree["entries"]
        out(
            f"{tag:8s}   bytes on disk per journal entry (checkpointed, {with_tree['entries']:,}"
            f" entries, {with_tree['tree_nodes']:,} tree nodes): with tree"
            f" {with_tree['bytes'] / with_tree['entries']:,.0f}, without"
            f" {without['bytes'] / without['entries']:,.0f}, added by the tree {added:,.1f}"
            f" ({with_tree['bytes'] / without['bytes'] - 1:+.1%})"
        )
        report.put(
            "1_appends",
            f"{key}_{durability}",
            {
                "samples_per_s": results,
                "ratio": value,
                "cpu_s_per_op": cpu,
                "cpu_ratio": cpu_ratio,
                "cpu_s_per_entry_added": cpu_extra,
                "sizes": sizes,
                "tree_bytes": added,
            },
        )


# ----------------------------------------------------- 2. ledgers of many entries


def build_ledgers(scratch: Path, sizes: list[int], batch: int) -> dict[int, Path]:
    """One ledger grown to each size in turn (append_actions, durability normal); each
    size is checkpointed and copied (the largest moved) so later sizes reuse the work."""
    growing = scratch / "growing.db"
    built: dict[int, Path] = {}
    have = previous = 0
    for size in sorted(sizes):
        start = time.perf_counter()
        with CausalChain(growing, durability="normal") as chain:
            while have < size:
                step = min(batch, size - have)
                chain.append_actions([action() for _ in range(step)])
                have += step
        elapsed = time.perf_counter() - start
        checkpoint(growing)
        target = scratch / f"ledger-{size}.db"
        if size == max(sizes):
            growing.rename(target)
        else:
            shutil.copyfile(growing, target)
        built[size] = target
        entries = count(target, "cassette_journal")
        added = size - previous
        out(
            f"built a ledger of {entries:,} journal entries: the last {added:,} appended in"
            f" {elapsed:,.1f} s = {added / elapsed:,.0f}/s (append_actions batches of {batch:,},"
            " durability normal)"
        )
        previous = size
    return built


def tree_pages(path: Path) -> tuple[int, int]:
    """Bytes of the pages of cassette_tree_nodes (dbstat), and its row count."""
    conn = sqlite3.connect(path)
    try:
        pages = conn.execute(
            "SELECT coalesce(sum(pgsize), 0) FROM dbstat WHERE name = 'cassette_tree_nodes'"
        ).fetchone()[0]
        rows = conn.execute("SELECT count(*) FROM cassette_tree_nodes").fetchone()[0]
    finally:
        conn.close()
    return int(pages), int(rows)


def timed(call: Callable[[], object]) -> float:
    start = time.perf_counter()
    call()
    return time.perf_counter() - start


def measure_anchors(
    report: Report, scratch: Path, path: Path, args: argparse.Namespace
) -> tuple[Path, str, str]:
    """Roots, seals and proofs on one ledger; returns (newest seal file, origin, public key)."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    rng = random.Random(args.seed)
    key = Ed25519PrivateKey.generate()
    public = key.public_key()
    public_hex = public.public_bytes(
        serialization.Encoding.Raw, serialization.PublicFormat.Raw
    ).hex()
    result: dict[str, Any] = {}
    seal_dir = path.with_suffix(".seals")
    seal_dir.mkdir()
    with CausalChain(path, durability="normal") as chain:
        conn = chain.conn
        stored = StoredTree(conn)
        n = stored.size()
        origin = default_origin(conn)
        head_root = [timed(lambda: stored.root(n)) for _ in range(args.proofs)]
        sizes = [rng.randint(1, n) for _ in range(args.proofs)]
        any_root = [timed(lambda s=s: stored.root(s)) for s in sizes]  # type: ignore[misc]
        out(f"StoredTree.root(n), n = {n:,}: {time_line(head_root)}")
        out(f"StoredTree.root(size), random sizes 1..{n:,}: {time_line(any_root)}")
        result["root_head_s"], result["root_random_s"] = head_root, any_root

        # Older seals (of sizes chosen at random) for the consistency proofs.
        olds: list[Seal] = []
        for size in sorted(rng.randint(1, n - 1) for _ in range(args.old_seals)):
            olds.append(record_seal(conn, key, now_ms=chain.now_ms(), origin=None, size=size))
            write_seal_file(olds[-1], seal_dir)
        # Seals of the head, timed: record_seal, then write_seal_file (an fsync'd file).
        recording: list[float] = []
        writing: list[float] = []
        head: Seal | None = None
        head_file = seal_dir
        for _ in range(args.seal_reps):
            start = time.perf_counter()
            head = record_seal(conn, key, now_ms=chain.now_ms(), origin=None)
            middle = time.perf_counter()
            head_file = write_seal_file(head, seal_dir)
            recording.append(middle - start)
            writing.append(time.perf_counter() - middle)
        assert head is not None
        total = [a + b for a, b in zip(recording, writing, strict=True)]
        out(f"seal (record_seal + write_seal_file) of the head: {time_line(total)}")
        out(f"  record_seal {time_line(recording)}; write_seal_file {time_line(writing)}")
        result["seal_s"] = {"record": recording, "write": writing, "total": total}

        proving: list[float] = []
        checking: list[float] = []
        proof_bytes: list[int] = []
        for seq in (rng.randrange(head.tree_size) for _ in range(args.proofs)):
            start = time.perf_counter()
            data = prove_inclusion(conn, seq, head.note).to_bytes()
            middle = time.perf_counter()
            check = check_proof_file(data, origin, public)
            checking.append(time.perf_counter() - middle)
            proving.append(middle - start)
            proof_bytes.append(len(data))
            if not check.ok:
                raise RuntimeError(f"inclusion proof of {seq} does not check: {check}")
        out(
            f"inclusion proof under a seal of {head.tree_size:,} (prove_inclusion + to_bytes),"
            f" random entries: {time_line(proving)}"
        )
        out(
            f"  offline check (check_proof_file): {time_line(checking)};"
            f" proof file {statistics.median(proof_bytes):,.0f} bytes (median)"
        )
        result["inclusion_s"] = {"prove": proving, "check": checking, "bytes": proof_bytes}

        proving, checking, proof_bytes = [], [], []
        for i in range(args.consistency):
            old = olds[i % len(olds)]
            start = time.perf_counter()
            data = orjson.dumps(prove_consistency(conn, old.note, head.note))
            middle = time.perf_counter()
            check = check_proof_file(data, origin, public)
            checking.append(time.perf_counter() - middle)
            proving.append(middle - start)
            proof_bytes.append(len(data))
            if not check.ok:
                raise RuntimeError(f"consistency proof from {old.tree_size} does not check")
        out(
            f"consistency proof, seals of {', '.join(f'{s.tree_size:,}' for s in olds)}"
            f" -> {head.tree_size:,} (prove_consistency + JSON): {time_line(proving)}"
        )
        out(
            f"  offline check (check_proof_file): {time_line(checking)};"
            f" proof file {statistics.median(proof_bytes):,.0f} bytes (median)"
        )
        result["consistency_s"] = {"prove": proving, "check": checking, "bytes": proof_bytes}
    report.put("2_anchors", str(n), result)
    return head_file, origin, public_hex


CHILD_VERIFY = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey
from catalytic_cassette.anchor import load_anchors
from catalytic_cassette.verify import verify_path
kwargs = {{}}
if {anchored!r}:
    kwargs = {{"anchors": load_anchors({seal!r}), "origin": {origin!r},
              "seal_key": Ed25519PublicKey.from_public_bytes(bytes.fromhex({key!r}))}}
def status(field):
    with open("/proc/self/status") as lines:
        for line in lines:
            if line.startswith(field + ":"):
                return int(line.split()[1])
imports_peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
start_rss = status("VmRSS")
try:  # reset the peak (Linux >= 4.0), so that it is verify's own
    with open("/proc/self/clear_refs", "w") as clear:
        clear.write("5")
    reset = True
except OSError:
    reset = False
start = time.perf_counter()
report = verify_path({path!r}, **kwargs)
elapsed = time.perf_counter() - start
peak = status("VmHWM")
print(json.dumps({{"rows": report.journal_rows, "seconds": elapsed, "ok": report.ok,
                  "findings": [f.kind + ": " + f.detail for f in report.findings][:3],
                  "anchors": [a["status"] for a in report.anchors],
                  "anchored": report.anchored,
                  "rss_imports_peak_kib": imports_peak, "rss_start_kib": start_rss,
                  "rss_peak_kib": peak, "peak_reset": reset}}))
"""


def verify_child(path: Path, anchored: bool, seal: Path, origin: str, key: str) -> dict[str, Any]:
    """verify_path in a fresh interpreter, which reports its own time and peak RSS."""
    code = CHILD_VERIFY.format(
        root=str(ROOT), path=str(path), anchored=anchored, seal=str(seal), origin=origin, key=key
    )
    done = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True)
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    if not result["ok"] or (anchored and result["anchors"] != ["holds"]):
        raise RuntimeError(f"verify of {path} failed: {result}")
    return result


def workload_verify(
    report: Report, path: Path, seal: Path, origin: str, key: str, args: argparse.Namespace
) -> None:
    runs: dict[str, list[dict[str, Any]]] = {"plain": [], "anchored": []}

    def contender(name: str) -> Callable[[], float]:
        def run() -> float:
            runs[name].append(verify_child(path, name == "anchored", seal, origin, key))
            return float(runs[name][-1]["seconds"])

        return run

    results = interleave({name: contender(name) for name in runs}, args.verify_reps)
    rows = runs["plain"][0]["rows"]
    summary: dict[str, Any] = {}
    for name, samples in results.items():
        rates = [rows / s for s in samples]
        peak = max(r["rss_peak_kib"] for r in runs[name]) / 1024
        at_start = max(r["rss_start_kib"] for r in runs[name]) / 1024
        imports = max(r["rss_imports_peak_kib"] for r in runs[name]) / 1024
        own = "during verify" if all(r["peak_reset"] for r in runs[name]) else "of the process"
        out(
            f"verify {name:8s} {rows:,} journal rows: {time_line(samples)} ="
            f" {rate_line(rates, ' rows/s')}; peak RSS {own} {peak:.1f} MiB"
            f" (RSS when verify_path was called {at_start:.1f} MiB, peak during imports"
            f" {imports:.1f} MiB)"
        )
        summary[name] = {
            "seconds": samples,
            "rows_per_s": rates,
            "rss_peak_mib": peak,
            "rss_start_mib": at_start,
        }
    value = ratio(results, "anchored", "plain")
    anchored = runs["anchored"][0]["anchored"]
    out(
        f"  ratio of times anchored / plain = {value:.3f}; the seal of"
        f" {anchored['newest_holding_size']:,} entries holds"
        f" ({anchored['entries_after_anchor']} entries after it)"
    )
    summary["ratio_anchored_plain"] = value
    summary["rows"] = rows
    summary["file_bytes"] = file_bytes(path)
    report.put("2_verify", str(rows), summary)


# --------------------------------------------------------------------- setup


def git_state() -> str:
    """The commit, and whether the package's code differs from it (read-only git calls)."""
    try:
        head = subprocess.run(
            ["git", "-C", str(ROOT), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            [
                *("git", "--no-optional-locks", "-C", str(ROOT), "status", "--porcelain"),
                *("--", "catalytic_cassette"),
            ],
            capture_output=True,
            text=True,
            check=True,
        ).stdout.splitlines()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"
    changed = [line[3:] for line in dirty if line.strip()]
    return head + (f" + uncommitted changes to {', '.join(changed)}" if changed else "")


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="tiny sizes, 1 rep: seconds")
    parser.add_argument("--reps", type=int, default=5, help="interleaved reps of workload 1")
    parser.add_argument("--durability", choices=["full", "normal", "both"], default="both")
    parser.add_argument("--single", type=int, default=2000, help="append_action calls per rep")
    parser.add_argument("--batched", type=int, default=10000, help="actions per batched rep")
    parser.add_argument("--batch", type=int, default=1000, help="append_actions batch size")
    parser.add_argument("--posts", type=int, default=2000, help="post_message calls per rep")
    parser.add_argument(
        "--entries", default="100000,1000000", help="journal entries of the ledgers of part 2"
    )
    parser.add_argument("--build-batch", type=int, default=1000, help="batch size of the build")
    parser.add_argument("--proofs", type=int, default=200, help="roots and inclusion proofs")
    parser.add_argument("--consistency", type=int, default=50, help="consistency proofs")
    parser.add_argument("--old-seals", type=int, default=5, help="old seals for consistency")
    parser.add_argument("--seal-reps", type=int, default=5, help="seals of the head")
    parser.add_argument("--verify-reps", type=int, default=2, help="verify runs per mode")
    parser.add_argument("--seed", type=int, default=20261122)
    parser.add_argument("--json", type=Path, default=None, help="also write results here")
    parser.add_argument("--tmpdir", type=Path, default=None, help="where scratch files go")
    args = parser.parse_args()
    if args.quick:
        # (past one block of stored tree nodes, tree.GROW_BLOCK, in every workload)
        args.reps, args.single, args.batched, args.batch, args.posts = 1, 300, 300, 100, 100
        args.entries, args.build_batch, args.proofs, args.consistency = "1000,3000", 500, 20, 6
        args.old_seals, args.seal_reps, args.verify_reps = 3, 2, 1
    args.durabilities = ["normal", "full"] if args.durability == "both" else [args.durability]
    args.sizes = sorted({int(s) for s in args.entries.split(",")})
    if min(args.sizes) < 2:
        parser.error("--entries: every ledger needs at least 2 entries")
    return args


def print_setup(report: Report, args: argparse.Namespace, scratch: Path) -> None:
    setup = {
        "command": " ".join([Path(sys.executable).name, *sys.argv]),
        "python": platform.python_version(),
        "sqlite": sqlite3.sqlite_version,
        "cpus": os.cpu_count(),
        "machine": f"{platform.machine()}, {platform.system()} {platform.release()}",
        "code": git_state(),
        "durability": args.durabilities,
        "action_bytes": len(json.dumps(action())),
        "payload_bytes": len(json.dumps(PAYLOAD, separators=(",", ":"))),
        "batch": args.batch,
        "reps": args.reps,
        "entries": args.sizes,
    }
    report.data["setup"] = setup
    out(f"command: {setup['command']}")
    out(
        f"python {setup['python']}, sqlite {setup['sqlite']}, {setup['cpus']} CPUs,"
        f" {setup['machine']}; code at {setup['code']}"
    )
    modes = " and ".join(f"{d} (synchronous={SYNC[d]})" for d in args.durabilities)
    out(f"durability {modes} for workload 1, normal for the ledgers of part 2; journal mode WAL")
    out(
        f"action {setup['action_bytes']} bytes of JSON input (1 journal entry);"
        f" message payload {setup['payload_bytes']} bytes (message + job + step = 3 entries);"
        f" batch size {args.batch:,}; {args.reps} interleaved repetition(s), order alternating"
    )
    out(
        f"'without' = the same ledger after a raw sqlite3 connection ran DROP TRIGGER"
        f" {TREE_TRIGGER} (journal appends do not grow the tree); scratch files in {scratch}"
    )


def main() -> None:
    args = parse_args()
    report = Report()
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="bench-anchors-", dir=args.tmpdir) as tmp:
        scratch = Path(tmp)
        print_setup(report, args, scratch)
        out(
            "\n== 1. appends with the tree maintained vs without it;"
            " 3. bytes per entry added by the tree"
        )
        for durability in args.durabilities:
            workload_appends(report, scratch, durability, args)

        out(f"\n== 2. ledgers of {', '.join(f'{s:,}' for s in args.sizes)} journal entries")
        ledgers = build_ledgers(scratch, args.sizes, args.build_batch)
        for size, path in ledgers.items():
            pages, nodes = tree_pages(path)
            entries = count(path, "cassette_journal")
            out(
                f"\n-- {entries:,} entries: file {file_bytes(path) / 2**20:,.1f} MiB"
                f" ({file_bytes(path) / entries:,.0f} bytes per entry); the tree's pages"
                f" {pages / 2**20:,.1f} MiB = {pages / entries:,.1f} bytes per entry"
                f" ({nodes:,} nodes; dbstat)"
            )
            report.put(
                "3_bytes",
                str(size),
                {"entries": entries, "file": file_bytes(path), "tree_pages": pages},
            )
            seal, origin, key = measure_anchors(report, scratch, path, args)
            workload_verify(report, path, seal, origin, key, args)
    elapsed = time.perf_counter() - started

    out("\n== targets")
    for row in report.data["targets"]:
        status = "met   " if row["met"] else "MISSED"
        out(f"{status} {row['target']}: {row['value']:.2f} (target {row['op']} {row['limit']:.2f})")
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    out(f"\nbenchmark process peak RSS {peak / 1024:.0f} MiB; total {elapsed:,.0f} s")
    report.data["elapsed_s"] = elapsed
    if args.json is not None:
        args.json.write_text(json.dumps(report.data, indent=2) + "\n")
        out(f"results written to {args.json}")


if __name__ == "__main__":
    main()
