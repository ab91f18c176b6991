"""Two source trees of the package on one workload, interleaved: CPU seconds and their ratio.

Each repetition runs the workload once per tree (A B A B ...), each in a fresh Python
process importing the package from its tree; the process reports the CPU time
(``time.process_time``) of the workload alone, not its start-up. CPU time, not wall time,
so that other load on the machine weighs on both trees alike and barely on the figure.

    python scripts/bench_trees.py --before OLD_TREE --after NEW_TREE write --reps 5
    python scripts/bench_trees.py --before OLD_TREE --after NEW_TREE verify \\
        --ledger-before OLD.db --ledger-after NEW.db --reps 5

``write``: the write path, one transaction per call: post messages (one job of two steps
each), claim and complete every step, append causal actions. ``verify``: a full verify of
a ledger each tree made (``bench_chain.build_ledger``: a file keeps the schema of the
package that made it, and each tree verifies its own).
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile

WRITE = """
import json, sys, tempfile, time
from pathlib import Path
from catalytic_cassette import MessageCassette
from catalytic_cassette.chain import CausalChain

n = int(sys.argv[1])
with tempfile.TemporaryDirectory() as scratch:
    path = Path(scratch) / "write.db"
    MessageCassette(path, durability="normal").close()
    start = time.process_time()
    with MessageCassette(path, durability="normal") as cassette:
        for i in range(n):
            cassette.post_message({"jobs": [{"intent": "work", "steps": [{"i": i}, {"j": i}]}]},
                                  "run", "USER")
        for _ in range(2 * n):
            step = cassette.claim_step("run", "worker", 600)
            cassette.complete_step("run", step["step_id"], "worker", step["fencing_token"],
                                   {"ok": True}, "SUCCESS")
    with CausalChain(path, durability="normal") as chain:
        for i in range(n):
            chain.append_action({"plan_id": "p", "intent_id": "i", "action_type": "InternalStep",
                                 "function_name": "f", "arguments": [i]})
    print(json.dumps({"cpu": time.process_time() - start}))
"""

VERIFY = """
import json, sys, time
from catalytic_cassette.verify import verify_path

start = time.process_time()
report = verify_path(sys.argv[1])
assert report.ok, report.to_dict()
print(json.dumps({"cpu": time.process_time() - start}))
"""


def run(tree: str, code: str, argument: str) -> float:
    env = dict(os.environ, PYTHONPATH=tree)
    with tempfile.TemporaryDirectory() as elsewhere:  # no checkout on the path but ``tree``
        done = subprocess.run(
            [sys.executable, "-c", code, argument],
            env=env,
            cwd=elsewhere,
            capture_output=True,
            text=True,
            check=True,
        )
    return float(json.loads(done.stdout.strip().splitlines()[-1])["cpu"])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("workload", choices=("write", "verify"))
    parser.add_argument("--before", required=True, help="source tree A (holds catalytic_cassette/)")
    parser.add_argument("--after", required=True, help="source tree B")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--messages", type=int, default=1000, help="write: messages per run")
    parser.add_argument("--ledger-before", help="verify: the ledger tree A made")
    parser.add_argument("--ledger-after", help="verify: the ledger tree B made")
    args = parser.parse_args()
    if args.workload == "write":
        sides = {"before": (args.before, WRITE, str(args.messages)),
                 "after": (args.after, WRITE, str(args.messages))}  # fmt: skip
    else:
        if not (args.ledger_before and args.ledger_after):
            parser.error("verify takes --ledger-before and --ledger-after")
        sides = {"before": (args.before, VERIFY, args.ledger_before),
                 "after": (args.after, VERIFY, args.ledger_after)}  # fmt: skip
    samples: dict[str, list[float]] = {"before": [], "after": []}
    for rep in range(args.reps):
        order = ("before", "after") if rep % 2 == 0 else ("after", "before")
        for side in order:
            samples[side].append(run(*sides[side]))
    before, after = statistics.median(samples["before"]), statistics.median(samples["after"])
    ratios = sorted(a / b for a, b in zip(samples["after"], samples["before"], strict=True))
    print(f"{args.workload}: CPU s, median of {args.reps} interleaved runs")
    print(f"  before {before:.3f}  {[round(x, 3) for x in samples['before']]}")
    print(f"  after  {after:.3f}  {[round(x, 3) for x in samples['after']]}")
    print(f"  after/before {after / before:.3f} (paired ratios {[round(r, 3) for r in ratios]})")


if __name__ == "__main__":
    main()
