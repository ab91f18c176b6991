"""metrics on both backends: the same groups, counts, rates, percentiles and costs for the
same actions (issue 15)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from catalytic_cassette.chain import CausalChain
from catalytic_cassette.clock import ManualClock

DIMENSIONS = ("plan", "intent", "session", "function", "capability")


def actions() -> list[dict[str, Any]]:
    made = []
    for n in range(23):
        made.append(
            {
                "plan_id": ["p", "q", "Q", "é"][n % 4],
                "intent_id": f"i{n % 3}",
                "session_id": None if n % 5 == 0 else f"s{n % 2}",
                "action_type": "CapabilityCall" if n % 2 else "InternalStep",
                "function_name": ["read", "write", "Zed"][n % 3],
                "arguments": [n],
                "success": n % 7 != 0,
                "duration_ms": (n * 37) % 101,
                "cost": (n % 4) * 0.25,
            }
        )
    return made


@pytest.mark.parametrize("by", DIMENSIONS)
def test_metrics_are_the_same_on_both_backends(tmp_path: Path, pg_ledger: str, by: str) -> None:
    results = []
    for target, options in ((str(tmp_path / "l.db"), {"clock": ManualClock()}), (pg_ledger, {})):
        with CausalChain(target, **options) as chain:
            chain.append_actions(actions())
            results.append(chain.metrics(by))
    assert results[0] == results[1]
    assert len(results[0]) >= 2
