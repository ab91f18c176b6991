"""An example orchestrator session that writes a real ledger.

A plan of three steps with capability calls, one failure followed by a retry, a pause
with a checkpoint and a resume, every decision linked to what caused it.

    python scripts/example_orchestrator.py example.db
    cassette --db example.db tree --plan incident-42 --format mermaid
"""

from __future__ import annotations

import argparse
import itertools
import sys
import uuid
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from catalytic_cassette import ManualClock
from catalytic_cassette.actions import Action
from catalytic_cassette.chain import CausalChain

PLAN, INTENT, SESSION = "incident-42", "restore-disk-space", "oncall-2026-11-22"
IDS = uuid.UUID("6a1d7f0e-4c55-4a8e-9b57-0c2f3f0f4242")  # fixed ids: the README quotes them


def run(path: str) -> dict[str, str]:
    """Write the session; return the ids worth looking at."""
    clock = ManualClock(1_795_300_000_000)
    ids: dict[str, str] = {}
    numbers = itertools.count(1)

    def next_id() -> str:
        return str(uuid.uuid5(IDS, str(next(numbers))))

    with CausalChain(path, clock=clock) as chain:

        def record(action_type: str, function_name: str, ms: int = 5, **fields: object) -> Action:
            clock.advance(ms)
            action = chain.append_action(
                {
                    "plan_id": PLAN,
                    "intent_id": INTENT,
                    "session_id": SESSION,
                    "action_type": action_type,
                    "function_name": function_name,
                    "duration_ms": ms,
                    "action_id": next_id(),
                    **fields,
                }
            )
            return action

        alert = record(
            "PlanStarted",
            "triage_alert",
            category="conversation",
            rationale="pager: /var at 97% on db-3",
            arguments=[{"host": "db-3", "mount": "/var"}],
        )
        ids["plan"] = alert.action_id
        look = record(
            "PlanStepStarted",
            "inspect_disk",
            parent_action_id=alert.action_id,
            caused_by=alert.action_id,
            category="research",
            rationale="find what grew before deleting anything",
            metadata={"timeout_ms": 30_000, "retries": {"max": 1}, "on_fail": "abort"},
        )
        du = record(
            "CapabilityCall",
            "shell.du",
            ms=800,
            parent_action_id=look.action_id,
            category="tool_use",
            arguments=["du -xsh /var/*"],
            cost=0.0004,
            result={"/var/log": "41G", "/var/lib/postgresql": "12G"},
        )
        ids["du"] = du.action_id
        record("PlanStepCompleted", "inspect_disk", parent_action_id=look.action_id)

        rotate = record(
            "PlanStepStarted",
            "rotate_logs",
            parent_action_id=alert.action_id,
            caused_by=du.action_id,
            category="decision",
            rationale="/var/log holds 41G; rotating is reversible, deleting data is not",
            metadata={"timeout_ms": 60_000, "retries": {"max": 2}, "on_fail": "pause"},
        )
        ids["decision"] = rotate.action_id
        failed = record(
            "CapabilityCall",
            "shell.logrotate",
            ms=1200,
            parent_action_id=rotate.action_id,
            category="tool_use",
            arguments=["logrotate -f /etc/logrotate.conf"],
            success=False,
            error_message="error: skipping /var/log/app.log: parent directory has insecure "
            "permissions",
            cost=0.0004,
        )
        fix = record(
            "PlanStepRetrying",
            "rotate_logs",
            parent_action_id=rotate.action_id,
            caused_by=failed.action_id,
            category="decision",
            rationale="logrotate refused insecure permissions; fix them and retry once",
        )
        chmod = record(
            "CapabilityCall",
            "shell.chmod",
            parent_action_id=rotate.action_id,
            caused_by=fix.action_id,
            category="file_edit",
            arguments=["chmod 755 /var/log"],
        )
        again = record(
            "CapabilityCall",
            "shell.logrotate",
            ms=900,
            parent_action_id=rotate.action_id,
            caused_by=chmod.action_id,
            category="tool_use",
            arguments=["logrotate -f /etc/logrotate.conf"],
            result={"freed": "38G"},
            cost=0.0004,
        )
        ids["rotated"] = again.action_id
        record("PlanStepCompleted", "rotate_logs", parent_action_id=rotate.action_id)

        paused = chain.pause(
            PLAN,
            {"next_step": "verify_space", "freed": "38G", "host": "db-3"},
            session_id=SESSION,
            action_id=next_id(),
            caused_by=again.action_id,
            category="conversation",
            rationale="hand-off to the day shift before verifying",
        )
        ids["paused"] = paused.action_id
        ids["checkpoint"] = paused.metadata["checkpoint_id"]
        clock.advance(3_600_000)
        resumed = chain.resume(PLAN, session_id=SESSION, action_id=next_id())
        context = resumed["context"]

        verify = record(
            "PlanStepStarted",
            "verify_space",
            parent_action_id=alert.action_id,
            caused_by=resumed["action"].action_id,
            category="research",
            rationale=f"resumed from checkpoint; expect {context['freed']} freed",
        )
        df = record(
            "CapabilityCall",
            "shell.df",
            parent_action_id=verify.action_id,
            category="tool_use",
            arguments=["df -h /var"],
            result={"use": "58%"},
        )
        record("PlanStepCompleted", "verify_space", parent_action_id=verify.action_id)
        done = record(
            "PlanCompleted",
            "triage_alert",
            parent_action_id=alert.action_id,
            caused_by=df.action_id,
            category="decision",
            rationale="/var back to 58%",
        )
        ids["done"] = done.action_id
    return ids


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("db", nargs="?", default="example.db")
    args = parser.parse_args()
    if Path(args.db).exists():
        sys.exit(f"{args.db} exists; the example writes a fresh ledger")
    for name, value in run(args.db).items():
        print(f"{name}: {value}")


if __name__ == "__main__":
    main()
