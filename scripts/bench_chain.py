"""Causal-chain benchmarks: appends against raw sqlite3, verify speed and memory, sessions.

Every comparison runs in the same process, interleaved (A B A B ...), and reports the
median and range of N repetitions plus the ratio of medians. Results and the command that
produced them go to docs/BENCHMARKS.md.

    python scripts/bench_chain.py                 # the full run recorded in docs/BENCHMARKS.md
    python scripts/bench_chain.py --quick         # seconds; what the test suite runs
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import time
import uuid
from collections.abc import Callable
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
sys.path.insert(0, str(Path(__file__).resolve().parent))

import bench_raw

from catalytic_cassette.chain import CausalChain

# The raw baseline writes the package's own cassette_actions (every index, no trigger:
# scripts/bench_raw.py) and, for raw+chain, its cassette_journal.
RAW_INSERT = (
    "INSERT INTO cassette_actions (action_id, parent_action_id, plan_id, intent_id, session_id,"
    " action_type, function_name, arguments_json, arguments_artifact, result_json,"
    " result_artifact, success, error_message, cost_micros, duration_ms, timestamp,"
    " metadata_json, caused_by, rationale, category)"
    " VALUES (?, NULL, 'plan-1', 'intent-1', 'session-1', 'CapabilityCall', 'search', ?, NULL,"
    " ?, NULL, 1, NULL, 2000, 12, ?, '{}', NULL, NULL, NULL)"
)
RAW_TABLES = ("cassette_actions", "cassette_journal")  # raw+chain writes both
ARGUMENTS = ["disk full on /var", {"limit": 10}]
RESULT = {"hits": 3, "top": "df -h"}


def action(session: str = "session-1") -> dict[str, object]:
    return {
        "plan_id": "plan-1",
        "intent_id": "intent-1",
        "session_id": session,
        "action_type": "CapabilityCall",
        "function_name": "search",
        "arguments": ARGUMENTS,
        "result": RESULT,
        "cost": 0.002,
        "duration_ms": 12,
    }


def raw_connection(path: Path, durability: str) -> sqlite3.Connection:
    """The raw baseline: the package's tables and indexes without its triggers."""
    return bench_raw.ledger(path, durability)


def print_ratios(results: dict[str, list[float]]) -> None:
    ours, raw, floor = (statistics.median(results[name]) for name in ("ours", "raw", "floor"))
    print(
        f"  ratio ours/raw = {ours / raw:.2f}  ours/floor = {ours / floor:.2f}"
        f"  floor/raw = {floor / raw:.2f}"
    )


def floor_connection(path: Path, durability: str) -> sqlite3.Connection:
    """The raw baseline plus the cheapest per-row journal (scripts/bench_raw.py)."""
    conn = bench_raw.ledger(path, durability)
    bench_raw.add_floor_journal(conn, (("cassette_actions", "INSERT", "action_id"),))
    return conn


def median_range(samples: list[float]) -> str:
    return f"{statistics.median(samples):,.0f}/s (range {min(samples):,.0f}-{max(samples):,.0f})"


def interleave(
    contenders: dict[str, Callable[[int], float]], count: int, reps: int
) -> dict[str, list[float]]:
    """Run every contender once per repetition, in turn; each returns ops/second."""
    results: dict[str, list[float]] = {name: [] for name in contenders}
    for _ in range(reps):
        for name, run in contenders.items():
            results[name].append(run(count))
    return results


class Single:
    """One record per transaction."""

    def __init__(self, scratch: Path, durability: str) -> None:
        self.ours = CausalChain(scratch / "single-ours.db", durability=durability)
        self.raw = raw_connection(scratch / "single-raw.db", durability)
        self.floor = floor_connection(scratch / "single-floor.db", durability)

    def run_ours(self, count: int) -> float:
        start = time.perf_counter()
        for _ in range(count):
            self.ours.append_action(action())
        return count / (time.perf_counter() - start)

    def run_raw(self, count: int) -> float:
        return _run_single(self.raw, count)

    def run_floor(self, count: int) -> float:
        """The raw insert plus the cheapest per-row journal (bench_raw.add_floor_journal)."""
        return _run_single(self.floor, count)


def _run_single(conn: sqlite3.Connection, count: int) -> float:
    args, result = json.dumps(ARGUMENTS), json.dumps(RESULT)
    start = time.perf_counter()
    for _ in range(count):
        conn.execute("BEGIN IMMEDIATE")
        conn.execute(RAW_INSERT, (str(uuid.uuid4()), args, result, time.time_ns() // 10**6))
        conn.execute("COMMIT")
    return count / (time.perf_counter() - start)


class Batched:
    """Batches of `batch` records per transaction."""

    def __init__(self, scratch: Path, durability: str, batch: int) -> None:
        self.batch = batch
        self.ours = CausalChain(scratch / "batch-ours.db", durability=durability)
        self.raw = raw_connection(scratch / "batch-raw.db", durability)
        self.floor = floor_connection(scratch / "batch-floor.db", durability)

    def run_ours(self, count: int) -> float:
        start = time.perf_counter()
        for _ in range(count // self.batch):
            self.ours.append_actions([action() for _ in range(self.batch)])
        return count / (time.perf_counter() - start)

    def run_raw(self, count: int) -> float:
        return self._run(self.raw, count)

    def run_floor(self, count: int) -> float:
        return self._run(self.floor, count)

    def _run(self, conn: sqlite3.Connection, count: int) -> float:
        args, result = json.dumps(ARGUMENTS), json.dumps(RESULT)
        start = time.perf_counter()
        for _ in range(count // self.batch):
            now = time.time_ns() // 10**6
            conn.execute("BEGIN IMMEDIATE")
            conn.executemany(
                RAW_INSERT, [(str(uuid.uuid4()), args, result, now) for _ in range(self.batch)]
            )
            conn.execute("COMMIT")
        return count / (time.perf_counter() - start)


CATEGORIES = ("conversation", "decision", "file_edit", "tool_use", "research")


def build_ledger(path: Path, total: int, session_size: int, durability: str) -> float:
    """A ledger of `total` actions in sessions of `session_size`, each action caused by the
    one before it in its batch (cause chains of up to 1,000); returns actions/second."""
    start = time.perf_counter()
    with CausalChain(path, durability=durability) as chain:
        batch = 1000
        for first in range(0, total, batch):
            items = []
            previous = None
            for i in range(batch):
                item = action(f"session-{(first + i) // session_size}")
                item["action_id"] = str(uuid.uuid4())
                item["caused_by"] = previous
                item["category"] = CATEGORIES[i % len(CATEGORIES)]
                if i % 3:
                    item["rationale"] = "because the previous step said so"
                previous = item["action_id"]
                items.append(item)
            chain.append_actions(items)
    return total / (time.perf_counter() - start)


def deep_chain(path: Path, depth: int) -> list[tuple[int, float]]:
    """build_causal_chain at several depths of one cause chain: (depth, seconds)."""
    with CausalChain(path, durability="normal") as chain:
        ids: list[str] = []
        for first in range(0, depth, 1000):
            items = []
            for _ in range(min(1000, depth - first)):
                item = action("deep")
                item["action_id"] = str(uuid.uuid4())
                item["caused_by"] = ids[-1] if ids else None
                ids.append(str(item["action_id"]))
                items.append(item)
            chain.append_actions(items)
        timings = []
        for at in sorted({max(1, depth // 10), depth // 2, depth}):
            start = time.perf_counter()
            result = chain.build_causal_chain(ids[at - 1])
            elapsed = time.perf_counter() - start
            assert result["length"] == at, (result["length"], at)
            timings.append((at, elapsed))
        return timings


def measure_in_child(code: str) -> dict[str, float]:
    """Run `code` in a fresh interpreter; it prints a JSON object of its measurements."""
    out = subprocess.run(
        [sys.executable, "-c", code], check=True, capture_output=True, text=True
    ).stdout
    return dict(json.loads(out.strip().splitlines()[-1]))


CHILD_VERIFY = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from catalytic_cassette.verify import Level, verify_path
before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
cpu = time.process_time()
start = time.perf_counter()
report = verify_path({path!r}, level=Level({level!r}))
elapsed = time.perf_counter() - start
cpu = time.process_time() - cpu  # (every thread of the process)
assert report.ok, report.findings[:3]
peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
anon = 0
with open("/proc/self/status") as status:  # private memory, without mapped file pages
    for line in status:
        if line.startswith("RssAnon:"):
            anon = int(line.split()[1])
print(json.dumps({{"rows": report.journal_rows, "seconds": elapsed, "cpu_s": cpu,
                  "rows_per_s": report.journal_rows / elapsed,
                  "rss_before_kib": before, "rss_peak_kib": peak, "rss_anon_kib": anon}}))
"""

CHILD_FLOOR = """
import hashlib, json, sqlite3, struct, time
conn = sqlite3.connect("file:" + {path!r} + "?mode=ro", uri=True)
conn.text_factory = bytes
sha256, pack, prev, rows = hashlib.sha256, struct.Struct(">Q").pack, bytes(32), 0
start = time.perf_counter()
for seq, body, leaf, chain in conn.execute(
    "SELECT seq, body, leaf_hash, chain_hash FROM cassette_journal ORDER BY seq"
):
    assert sha256(b"\\x00" + body).digest() == leaf
    assert sha256(b"\\x02" + pack(seq) + prev + leaf).digest() == chain
    prev, rows = chain, rows + 1
elapsed = time.perf_counter() - start
print(json.dumps({{"rows": rows, "rows_per_s": rows / elapsed}}))
"""

CHILD_SESSION = """
import json, resource, sys, time
sys.path.insert(0, {root!r})
from catalytic_cassette.chain import CausalChain
def rss():
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
base = rss()
start = time.perf_counter()
chain = CausalChain({path!r})
opened = time.perf_counter() - start
after_open = rss()
start = time.perf_counter()
working = chain.load_session("session-7")
loaded = time.perf_counter() - start
after_load = rss()
print(json.dumps({{"open_ms": opened * 1000, "load_ms": loaded * 1000, "actions": len(working),
                  "open_rss_kib": after_open - base, "load_rss_kib": after_load - after_open}}))
"""


def live_workloads(path: Path, root: str) -> None:
    """metrics (one SQL statement per dimension) and tail: the journal read in seq order,
    in-process through follow() and end to end through `cassette tail` to /dev/null."""
    from catalytic_cassette.connection import connect_readonly
    from catalytic_cassette.follow import follow
    from catalytic_cassette.metrics import DIMENSIONS, metrics

    conn = connect_readonly(path)
    try:
        for by in DIMENSIONS:
            start = time.perf_counter()
            groups = metrics(conn, by)
            elapsed = time.perf_counter() - start
            print(f"metrics --by {by:10s}: {elapsed:.2f} s, {len(groups):,} groups")
        start = time.perf_counter()
        entries = sum(1 for _ in follow(conn, -1, keep_following=False))
        elapsed = time.perf_counter() - start
        print(
            f"follow() from seq 0: {entries:,} entries in {elapsed:.2f} s"
            f" = {entries / elapsed:,.0f}/s"
        )
    finally:
        conn.close()
    env = {**os.environ, "PYTHONPATH": root}
    start = time.perf_counter()
    with open(os.devnull, "wb") as sink:
        subprocess.run(
            [sys.executable, "-m", "catalytic_cassette", "--db", str(path), "tail"],
            stdout=sink,
            check=True,
            env=env,
        )
    elapsed = time.perf_counter() - start
    print(
        f"cassette tail (JSON lines to /dev/null): {entries:,} entries in {elapsed:.2f} s"
        f" = {entries / elapsed:,.0f}/s"
    )


def seal_costs(path: Path, scratch: Path, reps: int) -> None:
    """record_seal on a copy of the ledger (the kept one stays as built), each repetition
    with a new key, so that it has no checkpoint of its own (LAW.md section 12 (b)): a
    first seal, which checks the whole journal from the bodies; then a seal of the head
    ``gap`` entries after it (the checkpoint: as --seal-every seals); then one right after
    that. Beside each, the same seal with the check replaced by the stored root only (what
    a seal cost before the check)."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    from catalytic_cassette import seals, tree
    from catalytic_cassette.connection import connect

    copy = scratch / f"seal-{path.name}"
    source = sqlite3.connect(path)
    target = sqlite3.connect(copy)
    source.backup(target)
    source.close()
    target.close()
    checked, ahead = seals._checked_root, seals._check_ahead

    def unchecked(
        conn: sqlite3.Connection, key: object, origin: str, size: int, ahead: object = None
    ) -> bytes:
        return tree.StoredTree(conn).root(size)

    def no_ahead(*_: object) -> None:
        return None

    import catalytic_cassette.verify.chain  # noqa: F401  (imports are not the seal's cost)

    samples: dict[str, list[float]] = {}
    conn = connect(str(copy), durability="normal")
    try:
        head = tree.size(conn)
        gap = min(10_000, head // 2)
        for _ in range(reps):
            for label, check, before in (
                ("checked", checked, ahead),
                ("unchecked", unchecked, no_ahead),
            ):
                seals._checked_root = check  # type: ignore[assignment]
                seals._check_ahead = before  # type: ignore[assignment]
                key = Ed25519PrivateKey.generate()
                for step, size in (
                    ("first seal (no checkpoint)", tree.size(conn) - gap),
                    (f"seal of the head {gap:,} entries after it", None),
                    ("seal of the head right after that", None),
                ):
                    start = time.perf_counter()
                    seals.record_seal(conn, key, now_ms=0, origin=None, size=size)
                    samples.setdefault(f"{step}, {label}", []).append(time.perf_counter() - start)
    finally:
        seals._checked_root, seals._check_ahead = checked, ahead  # type: ignore[assignment]
        conn.close()
        for part in scratch.glob(f"{copy.name}*"):
            part.unlink()
    print(f"record_seal on {head:,} journal entries (median of {reps}, min-max, ms):")
    for name, values in samples.items():
        ms = sorted(v * 1000 for v in values)
        print(f"  {name}: {statistics.median(ms):,.1f} ({ms[0]:,.1f}-{ms[-1]:,.1f})")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--durability", choices=["normal", "full", "both"], default="both")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--single", type=int, default=2000, help="records per single-insert rep")
    parser.add_argument("--batched", type=int, default=20000, help="records per batched rep")
    parser.add_argument("--batch", type=int, default=1000)
    parser.add_argument("--ledger-sizes", default="100000,1000000", help="actions, for verify")
    parser.add_argument("--verify-reps", type=int, default=3)
    parser.add_argument("--session-size", type=int, default=1000)
    parser.add_argument("--chain-depth", type=int, default=10000, help="deepest cause chain")
    parser.add_argument("--quick", action="store_true", help="tiny sizes, to check the script")
    parser.add_argument(
        "--live-only",
        action="store_true",
        help="only build (or reuse) the ledgers and measure metrics and tail",
    )
    parser.add_argument(
        "--seals-only",
        action="store_true",
        help="only build (or reuse) the ledgers and measure record_seal",
    )
    parser.add_argument("--seal-reps", type=int, default=3)
    parser.add_argument(
        "--keep",
        default=None,
        help="keep the built ledgers in this directory and reuse them on the next run",
    )
    args = parser.parse_args()
    if args.quick:
        args.reps, args.single, args.batched, args.batch = 1, 50, 200, 100
        args.verify_reps = 1
        args.ledger_sizes, args.session_size, args.chain_depth = "2000", 100, 300
    durabilities = ["normal", "full"] if args.durability == "both" else [args.durability]
    root = str(Path(__file__).resolve().parents[1])

    print(
        f"python {platform.python_version()}, sqlite {sqlite3.sqlite_version}, "
        f"{os.cpu_count()} CPUs, {platform.machine()}"
    )
    row = json.dumps(action())
    print(
        f"action: {len(row)} bytes of JSON input; batch size {args.batch}; "
        f"{args.reps} interleaved repetitions; journal mode WAL"
    )

    with tempfile.TemporaryDirectory(prefix="bench-chain-") as tmp:
        scratch = Path(tmp)
        bench_raw.create(scratch / "raw-schema.db")
        print("raw: the package's migrated schema with every trigger dropped (bench_raw.py):")
        for line in bench_raw.describe(scratch / "raw-schema.db", RAW_TABLES):
            print(f"  {line}")
        kept = Path(args.keep) if args.keep else scratch
        kept.mkdir(parents=True, exist_ok=True)
        if args.live_only or args.seals_only:
            durabilities = []
        for durability in durabilities:
            print(f"\n== durability {durability} (synchronous={durability.upper()})")
            (scratch / durability).mkdir()
            single = Single(scratch / durability, durability)
            results = interleave(
                {"ours": single.run_ours, "raw": single.run_raw, "floor": single.run_floor},
                args.single,
                args.reps,
            )
            for name, samples in results.items():
                print(f"append one per transaction, {name:5s}: {median_range(samples)}")
            print_ratios(results)
            batched = Batched(scratch / durability, durability, args.batch)
            results = interleave(
                {"ours": batched.run_ours, "raw": batched.run_raw, "floor": batched.run_floor},
                args.batched,
                args.reps,
            )
            for name, samples in results.items():
                print(f"append batches of {args.batch}, {name:5s}: {median_range(samples)}")
            print_ratios(results)

        if not (args.live_only or args.seals_only):
            print("\n== cause chains (durability normal)")
            for depth, seconds in deep_chain(scratch / "deep.db", args.chain_depth):
                print(
                    f"build_causal_chain depth {depth:,}: {seconds * 1000:.1f} ms "
                    f"({seconds / depth * 1e6:.1f} us per link)"
                )

        print("\n== verify, sessions and statistics (durability normal for the build)")
        for size in (int(s) for s in args.ledger_sizes.split(",")):
            path = kept / f"ledger-{size}.db"
            if path.exists():
                print(f"reusing {path}")
            else:
                rate = build_ledger(path, size, args.session_size, "normal")
                on_disk = sum(
                    p.stat().st_size for p in kept.glob(f"ledger-{size}.db*") if p.is_file()
                )
                print(
                    f"built {size:,} actions at {rate:,.0f}/s; {on_disk / size:,.0f} bytes/action"
                )
            seal_costs(path, scratch, 1 if args.quick else args.seal_reps)
            if args.seals_only:
                continue
            live_workloads(path, root)
            if args.live_only:
                continue
            verifies, quicks, floors = [], [], []
            for _ in range(args.verify_reps):  # interleaved with the floor below
                verifies.append(
                    measure_in_child(CHILD_VERIFY.format(root=root, path=str(path), level="full"))
                )
                quicks.append(
                    measure_in_child(CHILD_VERIFY.format(root=root, path=str(path), level="quick"))
                )
                floors.append(measure_in_child(CHILD_FLOOR.format(path=str(path))))
            quick_rate = statistics.median(m["rows_per_s"] for m in quicks)
            floor_rate = statistics.median(m["rows_per_s"] for m in floors)
            print(
                f"verify --quick (header, schema, chain): "
                f"{median_range([m['rows_per_s'] for m in quicks])}; "
                f"ratio quick/floor = {quick_rate / floor_rate:.2f}"
            )
            v = verifies[-1]
            rates = [m["rows_per_s"] for m in verifies]
            floor = statistics.median(m["rows_per_s"] for m in floors)
            print(
                f"verify {v['rows']:,.0f} journal rows: {median_range(rates)}; "
                f"peak RSS {max(m['rss_peak_kib'] for m in verifies) / 1024:.1f} MiB "
                f"(interpreter and imports {v['rss_before_kib'] / 1024:.1f} MiB)"
            )
            print(
                f"  floor: fetch every journal row and check its leaf and link, nothing else: "
                f"{floor:,.0f} rows/s; ratio verify/floor = "
                f"{statistics.median(rates) / floor:.2f}"
            )
            with CausalChain(path) as chain:
                start = time.perf_counter()
                stats = chain.causality_stats()
                elapsed = time.perf_counter() - start
            print(
                f"causality_stats over {stats['actions']:,} actions: {elapsed:.2f} s "
                f"(max chain {stats['max_chain_length']}, "
                f"average {stats['average_chain_length']})"
            )
            s = measure_in_child(CHILD_SESSION.format(root=root, path=str(path)))
            print(
                f"open ledger: {s['open_ms']:.1f} ms, +{s['open_rss_kib'] / 1024:.2f} MiB; "
                f"load_session of {s['actions']:,.0f} actions: {s['load_ms']:.1f} ms, "
                f"+{s['load_rss_kib'] / 1024:.2f} MiB"
            )
    usage = resource.getrusage(resource.RUSAGE_SELF)
    print(f"\nbenchmark process peak RSS {usage.ru_maxrss / 1024:.0f} MiB")


if __name__ == "__main__":
    main()
