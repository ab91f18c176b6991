"""The reasoning reads on both backends: cause chains, reasoning, causality statistics,
downstream, reasoning links, suggested dependencies and chain validation give the same
answers for the same actions (issue 15). The logic is one (reasoning.py, dependencies.py);
each backend supplies its reads.

Timestamps are the ledgers' own (a manual clock on SQLite, the server's on PostgreSQL), so
they are left out of the comparison; every batch is one transaction, so the ages the
suggestions report (0 ms) are the same on both.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from catalytic_cassette import CassetteError
from catalytic_cassette.actions import CATEGORIES, REASONING_LINKS
from catalytic_cassette.chain import CausalChain
from catalytic_cassette.clock import ManualClock

N = 30


def uid(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012x}"


def cause_of(n: int) -> int | None:
    """A forest: roots every fifth action; the others caused by an earlier one, across
    plans and sessions."""
    return None if n % 5 == 0 else n // 2 if n % 3 else n - 1


def actions() -> list[dict[str, Any]]:
    made = []
    for n in range(N):
        cause = cause_of(n)
        links: dict[str, Any] = {}
        if n % 4 == 1:
            links["constitutional_rule_id"] = f"rule-{n % 3}"
        if n == 6:
            links["constitutional_rule_id"] = 5  # a number never equals the text "5"
        if n % 6 == 2:
            links["delegation_decision_id"] = "5"
        if n % 7 == 3:
            links["intent_id"] = "Intent-É"
        made.append(
            {
                "action_id": uid(n),
                "parent_action_id": None if n < 2 else uid(n // 2),
                "plan_id": ["p", "q", "Q"][n % 3],
                "intent_id": f"i{n % 2}",
                "session_id": None if n % 4 == 0 else f"s{n % 3}",
                "action_type": "CapabilityCall" if n % 2 else "InternalStep",
                "function_name": ["read", "write", "Zed"][n % 3],
                "success": n % 7 != 0,
                "caused_by": None if cause is None else uid(cause),
                "rationale": (
                    None if n % 3 == 0 else f"because  of\n{n} " + ("and a long reason " * (n % 8))
                ),
                "category": None if n % 4 == 3 else CATEGORIES[n % len(CATEGORIES)],
                "metadata": links,
            }
        )
    return made


def outcome(call: Callable[..., Any], *args: Any, **kwargs: Any) -> Any:
    try:
        return call(*args, **kwargs)
    except CassetteError as error:
        return ("refused", error.code.value)


def untimed(value: Any) -> Any:
    """The value without the ledgers' own clocks (timestamps, and Actions as their ids)."""
    if isinstance(value, dict):
        return {k: untimed(v) for k, v in value.items() if k != "timestamp"}
    if isinstance(value, (list, tuple)):
        return [untimed(v) for v in value]
    if hasattr(value, "action_id") and hasattr(value, "action_seq"):
        return (value.action_seq, value.action_id)
    return value


def on_both(tmp_path: Path, pg_ledger: str, ask: Callable[[CausalChain], Any]) -> list[Any]:
    answers = []
    for target, options in ((str(tmp_path / "l.db"), {"clock": ManualClock()}), (pg_ledger, {})):
        with CausalChain(target, **options) as chain:
            chain.append_actions(actions())
            answers.append(untimed(ask(chain)))
    assert answers[0] == answers[1]
    return answers[0]  # type: ignore[no-any-return]


UNKNOWN = uid(999)


def test_cause_chains_are_the_same(tmp_path: Path, pg_ledger: str) -> None:
    def ask(chain: CausalChain) -> Any:
        return [
            outcome(chain.build_causal_chain, a, depth)
            for a in [*(uid(n) for n in range(N)), UNKNOWN]
            for depth in (None, 0, 1, 2)
        ] + [outcome(chain.build_causal_chain, uid(1), -1)]

    found = on_both(tmp_path, pg_ledger, ask)
    assert any(r["truncated"] for r in found[:-1] if isinstance(r, dict))
    assert max(r["length"] for r in found[:-1] if isinstance(r, dict)) >= 3
    assert found[-1] == ["refused", "INVALID_ARGUMENT"]


def test_reasoning_is_the_same(tmp_path: Path, pg_ledger: str) -> None:
    def ask(chain: CausalChain) -> Any:
        return [
            outcome(chain.reconstruct_reasoning, a) for a in [*(uid(n) for n in range(N)), UNKNOWN]
        ]

    found = on_both(tmp_path, pg_ledger, ask)
    assert any("message" in r for r in found[:-1])
    assert any(r["summary"].endswith("...") for r in found[:-1])
    assert found[-1] == ["refused", "NOT_FOUND"]


def test_causality_stats_are_the_same(tmp_path: Path, pg_ledger: str) -> None:
    scopes = [(p, s) for p in (None, "p", "q", "Q", "none") for s in (None, "s0", "s1", "s2")]

    def ask(chain: CausalChain) -> Any:
        return [chain.causality_stats(p, s) for p, s in scopes]

    found = on_both(tmp_path, pg_ledger, ask)
    assert found[0]["with_cause"] > 0 and found[0]["max_chain_length"] >= 2
    assert isinstance(found[0]["average_chain_length"], float)


def test_downstream_is_the_same(tmp_path: Path, pg_ledger: str) -> None:
    def ask(chain: CausalChain) -> Any:
        return [outcome(chain.downstream, a) for a in [*(uid(n) for n in range(N)), UNKNOWN]]

    found = on_both(tmp_path, pg_ledger, ask)
    assert max(len(r) for r in found[:-1]) >= 3
    assert found[-1] == ["refused", "NOT_FOUND"]


def test_actions_for_link_are_the_same(tmp_path: Path, pg_ledger: str) -> None:
    values = ("rule-0", "rule-1", "rule-2", "5", "Intent-É", "intent-é", "")

    def ask(chain: CausalChain) -> Any:
        return [
            outcome(chain.actions_for_link, link, value)
            for link in (*REASONING_LINKS, "plan_id")
            for value in values
        ]

    found = on_both(tmp_path, pg_ledger, ask)
    assert sum(1 for r in found if r and r[0] != "refused") >= 4
    assert found[-1] == ["refused", "INVALID_ARGUMENT"]


def test_suggested_dependencies_are_the_same(tmp_path: Path, pg_ledger: str) -> None:
    def ask(chain: CausalChain) -> Any:
        at = chain.get_action(uid(N - 1)).timestamp
        answers = [
            outcome(chain.detect_dependencies, action_id=a, scope=scope, limit=limit)
            for a in (uid(0), uid(7), uid(N - 1), UNKNOWN)
            for scope in ("plan", "session", "intent", "nope")
            for limit in (1, 5, 20)
        ]
        answers += [
            outcome(chain.detect_dependencies, at_ms=at, **{name: value})
            for name, value in (
                ("plan_id", "p"),
                ("plan_id", "Q"),
                ("session_id", "s1"),
                ("intent_id", "i0"),
                ("plan_id", "none"),
            )
        ]
        answers += [
            outcome(chain.detect_dependencies, plan_id="p", at_ms=at - 1),
            outcome(chain.detect_dependencies, plan_id="p", session_id="s1"),
            outcome(chain.detect_dependencies, action_id=uid(1), plan_id="p"),
            outcome(chain.detect_dependencies, plan_id="p", at_ms=at, limit=21),
            outcome(chain.detect_dependencies, plan_id="p", at_ms=at, window_ms=0),
        ]
        return answers

    found = on_both(tmp_path, pg_ledger, ask)
    assert any(isinstance(r, list) and len(r) == 5 for r in found)
    assert ["refused", "NOT_FOUND"] in found and ["refused", "INVALID_ARGUMENT"] in found


def test_the_default_time_is_the_servers_now(pg_ledger: str) -> None:
    """Without ``at_ms`` the window ends at the ledger's now: the server's on PostgreSQL."""
    with CausalChain(pg_ledger) as chain:
        chain.append_actions(actions())
        found = chain.detect_dependencies(plan_id="p", window_ms=3_600_000)
    assert [f["action_id"] for f in found] == [uid(27), uid(24), uid(21), uid(18), uid(15)]


def test_validated_chains_are_the_same(tmp_path: Path, pg_ledger: str) -> None:
    def ask(chain: CausalChain) -> Any:
        return [
            outcome(chain.validate_causal_chain, a) for a in [*(uid(n) for n in range(N)), UNKNOWN]
        ]

    found = on_both(tmp_path, pg_ledger, ask)
    assert all(r["ok"] for r in found[:-1])
    assert max(r["length_nodes"] for r in found[:-1]) >= 3
    assert found[-1] == ["refused", "NOT_FOUND"]


@pytest.mark.parametrize("n", [0, 1, 13])
def test_a_chain_read_is_the_sqlite_answer_with_the_servers_times(
    tmp_path: Path, pg_ledger: str, n: int
) -> None:
    """The timestamps left out above are each ledger's own: PostgreSQL's are its rows'."""
    with CausalChain(pg_ledger) as chain:
        chain.append_actions(actions())
        found = chain.build_causal_chain(uid(n))
        assert [e["timestamp"] for e in found["chain"]] == [
            chain.get_action(e["action_id"]).timestamp for e in found["chain"]
        ]
