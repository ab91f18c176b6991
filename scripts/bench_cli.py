"""CLI start-up per call, and `cassette batch` per operation.

Per call: every round runs the baseline `python -c "import click, sqlite3"` and one
`cassette` command, alternating which goes first, each a fresh process, on a ledger of
10,000 steps prepared once; per command it reports the median wall time of both and the
median of the per-round ratios (command / baseline). The commands are the installed
`cassette` script: `--help`, `status`, `post`, `claim`, and `complete` of the step that
round's claim leased.

Batch: N posts, N claims and N completes as JSON lines through one `cassette batch`
process, against the same 3N calls made through the Python API in this process on an
already open ledger, each on its own copy of the prepared ledger, the order alternating.
It reports microseconds per operation, wall and CPU, with the process's start-up included
and without it (less an empty batch's time), and their ratios to the API.

On a shared machine the wall times move with the load; the CPU times (the children's
user + system time) move less, so both are printed.
Results and this command go to docs/BENCHMARKS.md.

    python scripts/bench_cli.py                 # 30 rounds, batch of 3 x 500; recorded
    python scripts/bench_cli.py --quick         # seconds; what the test suite runs
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from catalytic_cassette.cassette import MessageCassette

RUN = "bench"
WORKER = "w1"
DURABILITY = "normal"  # the same on both sides; a power-safe fsync would dominate both


def build(path: Path, steps: int) -> None:
    """A ledger holding ``steps`` pending steps of one run, in messages of 1,000."""
    with MessageCassette(path, durability=DURABILITY) as cassette:
        made = 0
        while made < steps:
            size = min(1_000, steps - made)
            job = {"intent": "bench", "steps": [{"n": made + i} for i in range(size)]}
            cassette.post_message({"jobs": [job]}, RUN, "USER")
            made += size


def cassette_command() -> list[str]:
    """The installed console script beside this interpreter, as a user runs it; with
    --code, ``python -m catalytic_cassette`` from that source tree (an older commit's)."""
    script = Path(sys.executable).parent / "cassette"
    if script.exists() and not FROM_SOURCE:
        return [str(script)]
    return [sys.executable, "-m", "catalytic_cassette"]


# Children write their bytecode caches, as an installed package has them (a caller's
# PYTHONDONTWRITEBYTECODE would make every call compile the package again).
CHILD_ENV = {k: v for k, v in os.environ.items() if k != "PYTHONDONTWRITEBYTECODE"}
FROM_SOURCE = False  # --code: the children import the package from a source tree
# (and run elsewhere than here: `python -m` would import the package from its directory)
CHILD_CWD = tempfile.gettempdir()


def timed(command: list[str], stdin: bytes | None = None) -> tuple[float, float, bytes]:
    """Wall seconds, CPU seconds (user + system) and stdout of one run of ``command``."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    done = subprocess.run(
        command, input=stdin, capture_output=True, check=False, env=CHILD_ENV, cwd=CHILD_CWD
    )
    elapsed = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode != 0:
        raise SystemExit(f"{command} exited {done.returncode}: {done.stderr.decode()}")
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return elapsed, cpu, done.stdout


COMMANDS = ("--help", "status", "post", "claim", "complete")
# One paired sample: (command wall, baseline wall, command CPU, baseline CPU) in seconds.
Pair = tuple[float, float, float, float]


def per_call(db: Path, tmp: Path, rounds: int) -> dict[str, list[Pair]]:
    """Every round runs each command once, each paired with a baseline run."""
    baseline = [sys.executable, "-c", "import click, sqlite3"]
    cassette = [*cassette_command(), "--db", str(db)]
    writing = [*cassette, "--durability", DURABILITY]
    payload, receipt = tmp / "payload.json", tmp / "receipt.json"
    payload.write_text('{"task": "resize", "size": 128}')
    receipt.write_text('{"ok": true}')
    timed([*cassette, "--help"])  # the children's bytecode caches are written here
    samples: dict[str, list[Pair]] = {name: [] for name in COMMANDS}
    for index in range(rounds):
        lease: dict[str, int] = {}
        for name in COMMANDS:
            if name == "--help":
                args = [*cassette, "--help"]
            elif name == "status":
                args = [*cassette, "status", "--run-id", RUN]
            elif name == "post":
                args = [*writing, "post", "--run-id", RUN, "--source", "USER"]
                args += ["--payload", str(payload)]
            elif name == "claim":
                args = [*writing, "claim", "--run-id", RUN, "--worker", WORKER]
            else:
                args = [*writing, "complete", "--run-id", RUN, "--worker", WORKER]
                args += ["--step", str(lease["step_id"]), "--token", str(lease["fencing_token"])]
                args += ["--outcome", "SUCCESS", "--receipt", str(receipt)]
            if index % 2 == 0:  # which of the pair runs first alternates
                base_wall, base_cpu, _ = timed(baseline)
                wall, cpu, out = timed(args)
            else:
                wall, cpu, out = timed(args)
                base_wall, base_cpu, _ = timed(baseline)
            if name == "claim":
                lease = json.loads(out)
            samples[name].append((wall, base_wall, cpu, base_cpu))
    return samples


def batch_lines(count: int) -> bytes:
    """count posts, then count claims, then count completes of the leased steps.

    A complete names its step by the claim's output, which a script has only after the
    batch; here the steps are known ahead: the prepared ledger's first pending steps are
    1..count in claim order (one run, posted in order)."""
    lines = []
    for n in range(count):
        args = {"run_id": RUN, "source": "USER", "payload": {"task": "resize", "n": n}}
        lines.append({"command": "post", "args": args})
    for _ in range(count):
        lines.append({"command": "claim", "args": {"run_id": RUN, "worker": WORKER}})
    for step in range(1, count + 1):
        args = {"run_id": RUN, "step": step, "worker": WORKER, "token": 1}
        args |= {"outcome": "SUCCESS", "receipt": {"ok": True}}
        lines.append({"command": "complete", "args": args})
    return b"".join(json.dumps(line).encode() + b"\n" for line in lines)


def through_api(db: Path, count: int) -> tuple[float, float]:
    """Wall and CPU seconds of the same 3 x count calls through the API, in this process,
    the ledger already open."""
    with MessageCassette(db, durability=DURABILITY) as cassette:
        start, start_cpu = time.perf_counter(), time.process_time()
        for n in range(count):
            cassette.post_message({"task": "resize", "n": n}, RUN, "USER")
        leases = [cassette.claim_step(RUN, WORKER) for _ in range(count)]
        for lease in leases:
            step, token = lease["step_id"], lease["fencing_token"]
            cassette.complete_step(RUN, step, WORKER, token, {"ok": True}, "SUCCESS")
        return time.perf_counter() - start, time.process_time() - start_cpu


def through_batch(db: Path, count: int) -> tuple[float, float]:
    """Wall and CPU seconds of one `cassette batch` process of 3 x count lines (0: the
    process's start-up, opening and closing the ledger, and nothing else)."""
    command = [*cassette_command(), "--db", str(db), "--durability", DURABILITY, "batch"]
    seconds, cpu, out = timed(command, batch_lines(count))
    answers = [json.loads(line) for line in out.splitlines()]
    assert len(answers) == 3 * count and all(a["ok"] for a in answers), answers[:3]
    return seconds, cpu


# One round: (API, batch, empty batch), each (wall, CPU) seconds.
Round = tuple[tuple[float, float], tuple[float, float], tuple[float, float]]


def batch(prepared: Path, tmp: Path, count: int, rounds: int) -> list[Round]:
    """Each round on fresh copies of the prepared ledger; the order alternates."""
    results: list[Round] = []
    for index in range(rounds):
        copies = [tmp / f"api{index}.db", tmp / f"batch{index}.db", tmp / f"empty{index}.db"]
        for copy in copies:
            shutil.copyfile(prepared, copy)
        if index % 2 == 0:
            api = through_api(copies[0], count)
            lines = through_batch(copies[1], count)
            empty = through_batch(copies[2], 0)
        else:
            empty = through_batch(copies[2], 0)
            lines = through_batch(copies[1], count)
            api = through_api(copies[0], count)
        results.append((api, lines, empty))
        for copy in copies:
            copy.unlink()
    return results


def report_batch(results: list[Round], ops: int) -> None:
    print(f"batch: {ops} operations per round, {len(results)} rounds; us per operation")
    print("            API in-process  batch  ratio  | batch less start-up  ratio")
    for label, i in (("wall", 0), ("CPU", 1)):
        api = statistics.median(r[0][i] for r in results) / ops * 1e6
        whole = statistics.median(r[1][i] for r in results) / ops * 1e6
        ratio = statistics.median(r[1][i] / r[0][i] for r in results)
        marginal = statistics.median((r[1][i] - r[2][i]) for r in results) / ops * 1e6
        marginal_ratio = statistics.median((r[1][i] - r[2][i]) / r[0][i] for r in results)
        print(
            f"{label:<6} {api:17.0f} {whole:6.0f} {ratio:5.2f}x  |"
            f" {marginal:19.0f} {marginal_ratio:5.2f}x"
        )
    start_up = statistics.median(r[2][0] for r in results) * 1e3
    print(f"(an empty batch, start-up to exit: {start_up:.1f} ms wall)")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=30, help="paired rounds per command")
    parser.add_argument("--steps", type=int, default=10_000, help="pending steps prepared")
    parser.add_argument("--batch", type=int, default=500, help="posts (= claims = completes)")
    parser.add_argument("--batch-rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="3 rounds, 200 steps, batch 20")
    parser.add_argument(
        "--code",
        type=Path,
        default=None,
        help="run the commands from this source tree (e.g. `git archive` of an older"
        " commit of the same schema version); the batch's API side stays this tree's",
    )
    options = parser.parse_args()
    if options.code is not None:
        global FROM_SOURCE
        FROM_SOURCE = True
        CHILD_ENV["PYTHONPATH"] = str(options.code.resolve())
    if options.quick:
        options.rounds, options.steps, options.batch, options.batch_rounds = 3, 200, 20, 1
    with tempfile.TemporaryDirectory() as name:
        tmp = Path(name)
        prepared = tmp / "prepared.db"
        build(prepared, options.steps)
        shutil.copyfile(prepared, tmp / "calls.db")
        print(f"CLI per call: {options.rounds} paired rounds, {options.steps:,} steps")
        print("command    wall ms  baseline ms  ratio   | CPU ms  baseline ms  ratio")
        for name, pairs in per_call(tmp / "calls.db", tmp, options.rounds).items():
            wall, base_wall, cpu, base_cpu = (
                statistics.median(p[i] for p in pairs) for i in range(4)
            )
            ratio = statistics.median(p[0] / p[1] for p in pairs)
            cpu_ratio = statistics.median(p[2] / p[3] for p in pairs)
            print(
                f"{name:<10} {wall * 1e3:7.1f} {base_wall * 1e3:12.1f} {ratio:5.2f}x"
                f"  | {cpu * 1e3:6.1f} {base_cpu * 1e3:12.1f} {cpu_ratio:5.2f}x",
                flush=True,
            )
        rounds = batch(prepared, tmp, options.batch, options.batch_rounds)
        report_batch(rounds, 3 * options.batch)


if __name__ == "__main__":
    main()
