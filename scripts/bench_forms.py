"""The write path's statements in their previous and present forms, timed on one ledger.

Issue 12, second pass: each pair does the same write, through the package's connection
(its TEMP triggers and SQL functions), inside BEGIN IMMEDIATE ... COMMIT with the ledger's
"now" read first, as the package does. The two forms of a pair run interleaved (A B A B
...) on the same file, so the machine's load falls on both; each reports the median CPU
time of this process per operation (`time.process_time`) and the median wall time.

    python scripts/bench_forms.py --durability normal --reps 5
    python scripts/bench_forms.py --durability full --reps 5

Pairs: `claim` (one UPDATE ... WHERE step_id = (SELECT ...) RETURNING, against a SELECT
of the next step and an UPDATE by its id); `complete` (the receipt INSERT ... SELECT with
RETURNING receipt_id, against the same without it and lastrowid); `post` (message and job
INSERTs with RETURNING, against lastrowid); `append` (one action with RETURNING
action_seq, against lastrowid); `batch` (1,000 actions by one execute each, against one
executemany; reported per action).
"""

from __future__ import annotations

import argparse
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
from catalytic_cassette import cassette as cassette_module
from catalytic_cassette import chain as chain_module
from catalytic_cassette.chain import CausalChain

RUN, WORKER = "bench", "worker-1"
PAYLOAD: dict[str, Any] = {"task": "fetch-page", "url": "https://example.org/a", "retries": 3}
RECEIPT = payloads.dumps({"ok": True, "result": "summary stored", "tokens": 412})

# The forms before this pass, kept here to be measured.
CLAIM_RETURNING = """
UPDATE cassette_steps
   SET status = 'LEASED', lease_owner = :worker, lease_expires_at = :expires,
       fencing_token = fencing_token + 1
 WHERE step_id = (SELECT step_id FROM cassette_steps
                   WHERE run_id = :run AND status = 'PENDING'
                   ORDER BY message_id, job_ordinal, ordinal LIMIT 1)
RETURNING step_id, job_id, message_id, ordinal, payload_json, fencing_token, lease_expires_at
"""
COMPLETE_RETURNING = cassette_module._COMPLETE + " RETURNING receipt_id"
APPEND_RETURNING = chain_module._INSERT + " RETURNING action_seq"
MESSAGE = (
    "INSERT INTO cassette_messages (message_id, run_id, source, idempotency_key, payload_json,"
    " created_at) VALUES (NULL, ?, 'USER', NULL, ?, ?)"
)
JOB = (
    "INSERT INTO cassette_jobs (message_id, run_id, intent, ordinal, created_at)"
    " VALUES (?, ?, 'default', 0, ?)"
)
STEP = (
    "INSERT INTO cassette_steps (job_id, run_id, message_id, job_ordinal, ordinal, status,"
    " fencing_token, payload_json, created_at) VALUES (?, ?, ?, 0, 0, 'PENDING', 0, ?, ?)"
)

Form = Callable[[], None]
SETUP = "setup"  # a pair's entry run, untimed, before each timed block: setup(ops)


def in_transaction(
    ledger: MessageCassette | CausalChain, write: Callable[[Any, int], None]
) -> Form:
    conn = ledger.conn

    def run() -> None:
        conn.execute("BEGIN IMMEDIATE")
        write(conn, ledger.ledger_now(conn))
        conn.execute("COMMIT")

    return run


def claim_forms(cassette: MessageCassette) -> dict[str, Form]:
    def returning(conn: Any, now: int) -> None:
        params = {"worker": WORKER, "expires": now + 600_000, "run": RUN}
        conn.execute(CLAIM_RETURNING, params).fetchone()

    def read_then_update(conn: Any, now: int) -> None:
        row = conn.execute(cassette_module._NEXT_PENDING, (RUN,)).fetchone()
        conn.execute(cassette_module._CLAIM_STEP, (WORKER, now + 600_000, row[0]))

    return {
        "UPDATE ... RETURNING": in_transaction(cassette, returning),
        "SELECT, UPDATE by id": in_transaction(cassette, read_then_update),
    }


def complete_forms(cassette: MessageCassette) -> dict[str, Form]:
    leased: list[dict[str, Any]] = []  # filled before each timed block (see measure)

    def params(now: int) -> tuple[Any, ...]:  # in the order of _COMPLETE's placeholders
        step = leased.pop()
        return (RUN, WORKER, step["fencing_token"], "SUCCESS", RECEIPT, now, step["step_id"])

    def returning(conn: Any, now: int) -> None:
        conn.execute(COMPLETE_RETURNING, params(now)).fetchone()

    def lastrowid(conn: Any, now: int) -> None:
        assert conn.execute(cassette_module._COMPLETE, params(now)).lastrowid

    def lease(count: int) -> None:
        leased[:] = cassette.claim_steps(RUN, WORKER, count, 600)[::-1]

    return {
        "INSERT ... RETURNING": in_transaction(cassette, returning),
        "INSERT, lastrowid": in_transaction(cassette, lastrowid),
        SETUP: lease,  # type: ignore[dict-item]
    }


def post_forms(cassette: MessageCassette) -> dict[str, Form]:
    payload_json = payloads.dumps(PAYLOAD)

    def post(returning: bool) -> Callable[[Any, int], None]:
        suffix = " RETURNING rowid" if returning else ""

        def write(conn: Any, now: int) -> None:
            cursor = conn.execute(MESSAGE + suffix, (RUN, payload_json, now))
            message_id = cursor.fetchone()[0] if returning else cursor.lastrowid
            cursor = conn.execute(JOB + suffix, (message_id, RUN, now))
            job_id = cursor.fetchone()[0] if returning else cursor.lastrowid
            conn.execute(STEP, (job_id, RUN, message_id, payload_json, now))

        return write

    return {
        "INSERTs ... RETURNING": in_transaction(cassette, post(True)),
        "INSERTs, lastrowid": in_transaction(cassette, post(False)),
    }


def rows(chain: CausalChain, count: int) -> list[list[Any]]:
    return [row for _, row in chain._prepare([bench_chain.action() for _ in range(count)])]


def append_forms(chain: CausalChain) -> dict[str, Form]:
    def one(returning: bool) -> Callable[[Any, int], None]:
        def write(conn: Any, now: int) -> None:
            row = rows(chain, 1)[0]
            row[chain_module._TIMESTAMP] = now
            if returning:
                conn.execute(APPEND_RETURNING, row).fetchone()
            else:
                assert conn.execute(chain_module._INSERT, row).lastrowid

        return write

    return {
        "INSERT ... RETURNING": in_transaction(chain, one(True)),
        "INSERT, lastrowid": in_transaction(chain, one(False)),
    }


def batch_forms(chain: CausalChain) -> dict[str, Form]:
    def many(together: bool) -> Callable[[Any, int], None]:
        def write(conn: Any, now: int) -> None:
            batch = rows(chain, 1000)
            for row in batch:
                row[chain_module._TIMESTAMP] = now
            if together:
                chain_module._insert_together(conn, batch)
            else:
                for row in batch:
                    conn.execute(APPEND_RETURNING, row).fetchone()

        return write

    return {
        "1,000 x execute RETURNING": in_transaction(chain, many(False)),
        "executemany": in_transaction(chain, many(True)),
    }


def measure(forms: dict[str, Form], ops: int, reps: int) -> dict[str, list[tuple[float, float]]]:
    setup: Any = forms.pop(SETUP, None)
    samples: dict[str, list[tuple[float, float]]] = {name: [] for name in forms}
    for _ in range(reps):
        for name, form in forms.items():
            if setup is not None:
                setup(ops)
            cpu, wall = time.process_time(), time.perf_counter()
            for _ in range(ops):
                form()
            samples[name].append(
                ((time.process_time() - cpu) / ops * 1e6, (time.perf_counter() - wall) / ops * 1e6)
            )
    return samples


def report(
    pair: str, samples: dict[str, list[tuple[float, float]]], durability: str, per: int = 1
) -> None:
    """Median CPU and wall per operation (per action for a batch: ``per`` = 1,000)."""
    medians = {
        name: (
            statistics.median(c for c, _ in s) / per,
            statistics.median(w for _, w in s) / per,
        )
        for name, s in samples.items()
    }
    (old, (old_cpu, old_wall)), (new, (new_cpu, new_wall)) = medians.items()
    print(
        f"[{durability}] {pair:8s} {old:26s} cpu {old_cpu:7.0f} us  wall {old_wall:7.0f} us\n"
        f"[{durability}] {pair:8s} {new:26s} cpu {new_cpu:7.0f} us  wall {new_wall:7.0f} us"
        f"   cpu x{old_cpu / new_cpu:.2f}  wall x{old_wall / new_wall:.2f}"
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=(__doc__ or "").splitlines()[0])
    parser.add_argument("--durability", choices=["normal", "full"], default="normal")
    parser.add_argument("--pairs", default="claim,complete,post,append,batch")
    parser.add_argument("--reps", type=int, default=5)
    parser.add_argument("--ops", type=int, default=300, help="operations per form and rep")
    args = parser.parse_args()
    pairs = args.pairs.split(",")
    with tempfile.TemporaryDirectory(prefix="forms-") as tmp:
        folder = Path(tmp)
        with (
            MessageCassette(folder / "messages.db", durability=args.durability) as cassette,
            CausalChain(folder / "actions.db", durability=args.durability) as chain,
        ):
            steps = args.ops * args.reps * 2 * (("claim" in pairs) + ("complete" in pairs))
            for _ in range(0, steps + 500, 500):
                cassette.post_messages([(PAYLOAD, RUN, "USER", None)] * 500)
            chain.append_actions([bench_chain.action() for _ in range(500)])
            builders = {
                "claim": lambda: claim_forms(cassette),
                "complete": lambda: complete_forms(cassette),
                "post": lambda: post_forms(cassette),
                "append": lambda: append_forms(chain),
                "batch": lambda: batch_forms(chain),
            }
            for pair in pairs:
                ops = max(1, args.ops // 100) if pair == "batch" else args.ops
                per = 1000 if pair == "batch" else 1
                report(pair, measure(builders[pair](), ops, args.reps), args.durability, per)


if __name__ == "__main__":
    main()
