"""One `cassette` command's CPU per call, from several source trees run alternately.

Each tree is a copy of the package (e.g. `git archive COMMIT catalytic_cassette | tar -x -C
DIR`) of the same schema version; each round runs the command once from every tree, the
order reversed every other round, as `python -m catalytic_cassette` with the tree on
PYTHONPATH, each on its own copy of one ledger of pending steps. It prints each tree's
median CPU time (the child's user + system, `getrusage`), which other processes on a
shared machine inflate less than wall time: a lever is measured as the tree before it
against the tree after it.

    python scripts/bench_cli_trees.py --trees /tmp/before,/tmp/after --command claim
    python scripts/bench_cli_trees.py --trees A,B --command=--help --rounds 80
"""

from __future__ import annotations

import argparse
import json
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))

from bench_cli import CHILD_ENV, DURABILITY, RUN, WORKER, build

COMMANDS = ("--help", "status", "post", "claim", "complete")


def run(tree: Path, args: list[str]) -> tuple[float, bytes]:
    """CPU milliseconds and stdout of one `python -m catalytic_cassette` from ``tree``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    done = subprocess.run(
        [sys.executable, "-m", "catalytic_cassette", *args],
        capture_output=True,
        check=False,
        env={**CHILD_ENV, "PYTHONPATH": str(tree)},
        cwd=tempfile.gettempdir(),  # (not here: -m would import this checkout's package)
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{tree}: {args} exited {done.returncode}: {done.stderr.decode()}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return cpu * 1e3, done.stdout


def one_call(tree: Path, db: Path, command: str, payload: Path) -> float:
    """The CPU of one call of ``command``; a complete completes a step claimed first
    (the claim is not counted)."""
    ledger = ["--db", str(db), "--durability", DURABILITY]
    if command == "--help":
        return run(tree, ["--help"])[0]
    if command == "status":
        return run(tree, ["--db", str(db), "status", "--run-id", RUN])[0]
    if command == "post":
        args = ["post", "--run-id", RUN, "--source", "USER", "--payload", str(payload)]
        return run(tree, [*ledger, *args])[0]
    claim = [*ledger, "claim", "--run-id", RUN, "--worker", WORKER]
    cpu, out = run(tree, claim)
    if command == "claim":
        return cpu
    lease = json.loads(out)
    args = ["complete", "--run-id", RUN, "--worker", WORKER, "--outcome", "SUCCESS"]
    args += ["--step", str(lease["step_id"]), "--token", str(lease["fencing_token"])]
    return run(tree, [*ledger, *args, "--receipt", str(payload)])[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--trees", required=True, help="source trees, comma-separated")
    parser.add_argument("--command", choices=COMMANDS, default="claim")
    parser.add_argument("--rounds", type=int, default=60)
    parser.add_argument("--steps", type=int, default=10_000, help="pending steps prepared")
    options = parser.parse_args()
    trees = [Path(tree).resolve() for tree in options.trees.split(",")]
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        build(tmp / "prepared.db", options.steps)
        payload = tmp / "payload.json"
        payload.write_text('{"task": "resize", "size": 128}')
        ledgers = []
        for index in range(len(trees)):
            ledgers.append(tmp / f"tree{index}.db")
            shutil.copyfile(tmp / "prepared.db", ledgers[-1])
        for tree, db in zip(trees, ledgers, strict=True):  # bytecode written, not timed
            one_call(tree, db, options.command, payload)
        samples: list[list[float]] = [[] for _ in trees]
        for index in range(options.rounds):
            order = list(range(len(trees)))
            if index % 2:
                order.reverse()
            for i in order:
                samples[i].append(one_call(trees[i], ledgers[i], options.command, payload))
    print(f"{options.command}: CPU ms per call, median of {options.rounds} alternating rounds")
    for tree, cpu in zip(trees, samples, strict=True):
        print(f"{statistics.median(cpu):7.2f}  {tree}")


if __name__ == "__main__":
    main()
