"""What healing skipped tree blocks costs the append that ends the next block (LAW.md 8a).

A client skips the block trigger on the last entry of ``k`` blocks in a row (its own TEMP
trigger ending in RAISE(IGNORE)); then an honest writer appends one entry short of a block
end, and the timed append ends the block: it stores the ``k`` skipped blocks and its own.
The baseline in the same run is the same append with nothing skipped (``k = 0``). The cost
per skipped block should not grow with ``k`` (each block is healed once, by one append).

    python scripts/bench_tree_heal.py                  # k = 0, 1, 4, 16, 64
    python scripts/bench_tree_heal.py --ks 0,8 --reps 5
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from catalytic_cassette import ManualClock  # noqa: E402
from catalytic_cassette.chain import CausalChain  # noqa: E402
from catalytic_cassette.tree import GROW_BLOCK  # noqa: E402

SKIP = (
    "CREATE TEMP TRIGGER skip_block AFTER INSERT ON main.cassette_journal"
    " WHEN NEW.seq % 256 = 255 BEGIN SELECT RAISE(IGNORE); END"
)


def _actions(count: int, name: str) -> list[dict[str, object]]:
    return [
        {"plan_id": "p", "intent_id": "i", "action_type": "CapabilityCall", "function_name": name}
        for _ in range(count)
    ]


def one(skipped: int) -> float:
    """Seconds of the append that ends the block after ``skipped`` skipped blocks."""
    with tempfile.TemporaryDirectory() as scratch:
        path, clock = Path(scratch) / "ledger.db", ManualClock()
        with CausalChain(path, clock=clock, durability="normal") as honest:
            honest.append_actions(_actions(GROW_BLOCK, "warm"))  # one complete block
            if skipped:
                attacker = CausalChain(path, clock=clock, durability="normal")
                attacker.conn.execute(SKIP)
                # (a hostile client records its TEMP schema as installed: see temp_objects)
                from catalytic_cassette.temp_objects import TempSchema

                attacker.conn.temp_schema = TempSchema(attacker.conn)  # type: ignore[attr-defined]
                for _ in range(skipped):
                    attacker.append_actions(_actions(GROW_BLOCK, "a"))
                attacker.close()
            honest.append_actions(_actions(GROW_BLOCK - 1, "h"))
            start = time.perf_counter()
            honest.append_action(_actions(1, "end")[0])
            return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ks", default="0,1,4,16,64")
    parser.add_argument("--reps", type=int, default=3)
    args = parser.parse_args()
    ks = [int(k) for k in args.ks.split(",")]
    print(f"command: python scripts/bench_tree_heal.py --ks {args.ks} --reps {args.reps}")
    times: dict[int, list[float]] = {k: [] for k in ks}
    for _ in range(args.reps):  # interleaved: every k once per repetition
        for k in ks:
            times[k].append(one(k))
    base = statistics.median(times[ks[0]])
    for k in ks:
        median = statistics.median(times[k])
        per_block = (median - base) / k * 1000 if k else 0.0
        print(f"skipped {k:4d}: {median * 1000:8.2f} ms  ({per_block:6.2f} ms per healed block)")


if __name__ == "__main__":
    main()
