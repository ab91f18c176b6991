"""Regenerate tests/data/ledger_v1.sql: a ledger at schema version 1 with real rows.

Run from the repository root: python tests/data/make_ledger_v1.py
Only needed if the version-1 fixture must be rebuilt; the committed dump is the
reference that upgrade tests start from.
"""

from __future__ import annotations

import sqlite3
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from catalytic_cassette import ManualClock, MessageCassette, sqlfiles

V1_TRIGGERS_END = "CREATE TEMP TRIGGER cassette_actions_journal"


def main() -> None:
    first = sqlfiles.migrations()[:1]
    connection_sql = sqlfiles.schema_sql("connection.sql").split(V1_TRIGGERS_END)[0]
    sqlfiles.migrations = lambda: first  # type: ignore[assignment]
    sqlfiles.schema_sql = lambda name: connection_sql  # type: ignore[assignment]
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "v1.db"
        clock = ManualClock(1_790_000_000_000)
        with MessageCassette(path, clock=clock) as c:
            for n in range(3):
                c.post_message({"task": f"t{n}"}, "run-v1", "USER", f"k{n}")
            c.post_message(
                {
                    "jobs": [
                        {"intent": "research", "steps": [{"q": 1}, {"q": 2}]},
                        {"intent": "write", "steps": [{"f": "md"}]},
                    ]
                },
                "run-v1",
                "PLANNER",
            )
            s = c.claim_step("run-v1", "w1", 60)
            c.complete_step(
                "run-v1", s["step_id"], "w1", s["fencing_token"], {"ok": True}, "SUCCESS"
            )
            s = c.claim_step("run-v1", "w2", 60)
            c.complete_step("run-v1", s["step_id"], "w2", s["fencing_token"], {"e": 1}, "FAILURE")
            c.claim_step("run-v1", "w3", 1)
            clock.advance(2000)
            c.requeue("run-v1")
            s = c.claim_step("run-v1", "w4", 60)
            c.requeue("run-v1", s["step_id"], worker_id="w4", fencing_token=s["fencing_token"])
            c.claim_step("run-v1", "w5", 60)
        conn = sqlite3.connect(path)
        lines = list(conn.iterdump())
        conn.close()
    header = (
        "-- A ledger written at schema version 1 (real rows), by tests/data/make_ledger_v1.py.\n"
        "-- Load it raw, then PRAGMA application_id = 1129534548; PRAGMA user_version = 1.\n"
    )
    Path(__file__).with_name("ledger_v1.sql").write_text(header + "\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
