"""Why it happened: cause chains, reasoning, statistics and downstream effects.

1. Known answers on a small hand-built ledger with two cause trees.
2. Random cause forests (each action has at most one cause) against naive Python walks.
3. Each query is one SQL statement whatever the depth, and its recursion searches an
   index instead of scanning the actions.
4. A 2,000-deep cause chain.
"""

from __future__ import annotations

import tempfile
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalytic_cassette import CassetteError, ErrorCode, ManualClock
from catalytic_cassette.actions import CATEGORIES
from catalytic_cassette.chain import CausalChain
from catalytic_cassette.reasoning import (
    build_causal_chain,
    causality_stats,
    downstream,
    reconstruct_reasoning,
)

from . import backends
from .backends import BACKENDS, Ledger

pytestmark = pytest.mark.both_backends

START_MS = 1_700_000_000_000
MISSING_ID = "ffffffff-ffff-4fff-bfff-ffffffffffff"
NO_CAUSALITY = "no causality data: this action names no cause, rationale or category"
LONG_RATIONALE = "Write the summary file, then check it again.  " * 4


def uid(n: int) -> str:
    """A lowercase UUID whose text sorts against n: id order is never insertion order."""
    return f"{10**9 - n:08x}-0000-4000-8000-{n:012x}"


def refused(excinfo: pytest.ExceptionInfo[CassetteError], code: ErrorCode) -> None:
    assert excinfo.value.code is code, (excinfo.value.code, str(excinfo.value))
    assert str(excinfo.value).startswith(f"{code.value}: ")


# ------------------------------------------------------- 1. the known-answer ledger

# n: (plan, session, type, function, cause, parent, rationale, category, success)
GRAPH: dict[int, tuple[Any, ...]] = {
    # tree A, in plan alpha: 1 -> 2 -> 3 -> 4 -> 5
    1: ("alpha", "s1", "PlanStarted", "start", None, None, "User asked for a report", "decision",
        True),
    2: ("alpha", "s1", "CapabilityCall", "search", 1, 1, "Need the data", "research", True),
    3: ("alpha", "s1", "CapabilityResult", "fetch", 2, 2, None, "tool_use", False),
    4: ("alpha", "s1", "InternalStep", "think", 3, 2, "Retry with  a \n smaller\tquery",
        "decision", True),
    5: ("alpha", "s1", "CapabilityCall", "write_file", 4, 1, LONG_RATIONALE, "file_edit", True),
    # tree B, rooted in plan beta, reaching into plan alpha: 6 -> {7, 8}, 8 -> 9
    6: ("beta", "s2", "InternalStep", "greet", None, None, "Greeting", "conversation", True),
    7: ("beta", "s2", "InternalStep", "listen", 6, None, None, None, True),
    8: ("beta", "s2", "InternalStep", "answer", 6, 6, "Answer", "conversation", True),
    9: ("alpha", "s2", "CapabilityCall", "lookup", 8, None, None, "tool_use", True),
    # no cause: nothing at all, a category only, a rationale only
    10: ("alpha", None, "InternalStep", "log", None, 1, None, None, True),
    11: ("beta", None, "InternalStep", "classify", None, None, None, "research", True),
    12: ("alpha", "s1", "InternalStep", "note", None, None, "Noted", None, True),
}  # fmt: skip

SUMMARIES = {
    1: "PlanStarted start: User asked for a report",
    2: "CapabilityCall search: Need the data",
    3: "CapabilityResult fetch (failed)",
    4: "InternalStep think: Retry with a smaller query",
    6: "InternalStep greet: Greeting",
    7: "InternalStep listen",
    8: "InternalStep answer: Answer",
    9: "CapabilityCall lookup",
    10: "InternalStep log",
    11: "InternalStep classify",
    12: "InternalStep note: Noted",
}
LONG_SUMMARY = (
    "CapabilityCall write_file: Write the summary file, then check it again. Write the summary"
    " file, t..."
)


def timestamp(n: int) -> int:
    return START_MS + 1000 * n


@pytest.fixture
def known(backend: Ledger) -> Iterator[CausalChain]:
    if not backend.postgresql:  # a PostgreSQL ledger keeps the server's time
        backend.clock = ManualClock(START_MS)
    with CausalChain(backend.target, clock=backend.clock) as chain:
        for n, row in GRAPH.items():
            plan, session, kind, function, cause, parent, rationale, category, ok = row
            if not backend.postgresql:  # the server's time needs no push (and each is a round trip)
                backend.advance(1000)
            chain.append_action(
                {
                    "action_id": uid(n),
                    "plan_id": plan,
                    "intent_id": f"intent-{plan}",
                    "session_id": session,
                    "action_type": kind,
                    "function_name": function,
                    "caused_by": None if cause is None else uid(cause),
                    "parent_action_id": None if parent is None else uid(parent),
                    "rationale": rationale,
                    "category": category,
                    "success": ok,
                    "error_message": None if ok else "timeout",
                }
            )
        yield chain


@pytest.fixture
def stamps(known: CausalChain, backend: Ledger) -> dict[int, int]:
    """Each action's time as stored: ``timestamp(n)`` on SQLite's ManualClock; on
    PostgreSQL the server's, never going back."""
    found = {n: known.get_action(uid(n)).timestamp for n in GRAPH}
    if backend.postgresql:
        assert all(found[n + 1] >= found[n] for n in list(GRAPH)[:-1])  # type: ignore[operator]
    else:
        assert found == {n: timestamp(n) for n in GRAPH}
    return found  # type: ignore[return-value]


def entry(n: int, depth: int, stamps: dict[int, int]) -> dict[str, Any]:
    _plan, _session, kind, function, cause, *_rest, category, _ok = GRAPH[n]
    return {
        "depth": depth,
        "action_id": uid(n),
        "caused_by": None if cause is None else uid(cause),
        "category": category,
        "timestamp": stamps[n],
        "function_name": function,
        "action_type": kind,
        "summary": SUMMARIES.get(n, LONG_SUMMARY),
    }


def test_the_long_summary_is_cut_at_100_characters() -> None:
    assert len(LONG_SUMMARY) == 100
    assert LONG_SUMMARY.endswith("...")


def test_the_causal_chain_runs_from_the_root_to_the_action(
    known: CausalChain, stamps: dict[int, int]
) -> None:
    found = known.build_causal_chain(uid(5))
    assert found == {
        "action_id": uid(5),
        "truncated": False,
        "length": 5,
        "chain": [entry(n, depth, stamps) for depth, n in enumerate([1, 2, 3, 4, 5])],
    }
    across_plans = known.build_causal_chain(uid(9))
    assert across_plans["chain"] == [entry(6, 0, stamps), entry(8, 1, stamps), entry(9, 2, stamps)]
    assert (across_plans["length"], across_plans["truncated"]) == (3, False)
    for root in (1, 6, 10, 11, 12):
        alone = known.build_causal_chain(uid(root))
        assert alone == {
            "action_id": uid(root),
            "truncated": False,
            "length": 1,
            "chain": [entry(root, 0, stamps)],
        }


@pytest.mark.parametrize(
    ("max_depth", "expected", "truncated"),
    [
        (0, [5], True),
        (1, [4, 5], True),
        (2, [3, 4, 5], True),
        (3, [2, 3, 4, 5], True),
        (4, [1, 2, 3, 4, 5], False),
        (5, [1, 2, 3, 4, 5], False),
        (1000, [1, 2, 3, 4, 5], False),
        (None, [1, 2, 3, 4, 5], False),
    ],
)
def test_max_depth_truncates_the_walk(
    known: CausalChain,
    stamps: dict[int, int],
    max_depth: int | None,
    expected: list[int],
    truncated: bool,
) -> None:
    found = known.build_causal_chain(uid(5), max_depth=max_depth)
    assert found["truncated"] is truncated
    assert found["length"] == len(expected)
    assert found["chain"] == [entry(n, depth, stamps) for depth, n in enumerate(expected)]


def test_a_root_is_never_truncated(known: CausalChain) -> None:
    assert known.build_causal_chain(uid(1), max_depth=0)["truncated"] is False
    assert known.build_causal_chain(uid(8), max_depth=1)["truncated"] is False
    assert known.build_causal_chain(uid(9), max_depth=1)["truncated"] is True


@pytest.mark.parametrize("max_depth", [-1, 1.5, True, False, "2"])
def test_a_bad_max_depth_is_refused(known: CausalChain, max_depth: Any) -> None:
    with pytest.raises(CassetteError) as excinfo:
        known.build_causal_chain(uid(5), max_depth=max_depth)
    refused(excinfo, ErrorCode.INVALID_ARGUMENT)


@pytest.mark.parametrize(
    "call",
    [
        pytest.param(lambda c: c.build_causal_chain(MISSING_ID), id="build_causal_chain"),
        pytest.param(lambda c: c.build_causal_chain(MISSING_ID, 3), id="build-max-depth"),
        pytest.param(lambda c: c.reconstruct_reasoning(MISSING_ID), id="reconstruct_reasoning"),
        pytest.param(lambda c: c.downstream(MISSING_ID), id="downstream"),
    ],
)
def test_an_unknown_action_is_not_found(
    known: CausalChain, call: Callable[[CausalChain], Any]
) -> None:
    with pytest.raises(CassetteError) as excinfo:
        call(known)
    refused(excinfo, ErrorCode.NOT_FOUND)


def test_reconstruct_reasoning_names_the_cause_and_the_parent(known: CausalChain) -> None:
    assert known.reconstruct_reasoning(uid(4)) == {
        "action_id": uid(4),
        "category": "decision",
        "rationale": "Retry with  a \n smaller\tquery",
        "summary": SUMMARIES[4],
        "cause": {"action_id": uid(3), "summary": SUMMARIES[3]},
        "parent": {"action_id": uid(2), "summary": SUMMARIES[2]},
        "has_causality": True,
    }
    assert known.reconstruct_reasoning(uid(5)) == {
        "action_id": uid(5),
        "category": "file_edit",
        "rationale": LONG_RATIONALE,
        "summary": LONG_SUMMARY,
        "cause": {"action_id": uid(4), "summary": SUMMARIES[4]},
        "parent": {"action_id": uid(1), "summary": SUMMARIES[1]},
        "has_causality": True,
    }
    # a cause from another plan, no parent
    assert known.reconstruct_reasoning(uid(9)) == {
        "action_id": uid(9),
        "category": "tool_use",
        "rationale": None,
        "summary": SUMMARIES[9],
        "cause": {"action_id": uid(8), "summary": SUMMARIES[8]},
        "parent": None,
        "has_causality": True,
    }


@pytest.mark.parametrize(
    ("n", "cause", "category", "rationale"),
    [
        (7, 6, None, None),  # a cause only
        (11, None, "research", None),  # a category only
        (12, None, None, "Noted"),  # a rationale only
        (1, None, "decision", "User asked for a report"),  # a root with both
    ],
)
def test_any_one_of_cause_rationale_category_is_causality(
    known: CausalChain, n: int, cause: int | None, category: str | None, rationale: str | None
) -> None:
    found = known.reconstruct_reasoning(uid(n))
    assert found["has_causality"] is True
    assert "message" not in found
    assert found["category"] == category
    assert found["rationale"] == rationale
    expected_cause = (
        None if cause is None else {"action_id": uid(cause), "summary": SUMMARIES[cause]}
    )
    assert found["cause"] == expected_cause


def test_an_action_without_causality_says_so(known: CausalChain) -> None:
    assert known.reconstruct_reasoning(uid(10)) == {
        "action_id": uid(10),
        "category": None,
        "rationale": None,
        "summary": SUMMARIES[10],
        "cause": None,
        "parent": {"action_id": uid(1), "summary": SUMMARIES[1]},
        "has_causality": False,
        "message": NO_CAUSALITY,
    }


def counts(**given: int) -> dict[str, int]:
    return {category: given.get(category, 0) for category in CATEGORIES}


KNOWN_STATS: list[tuple[str | None, str | None, dict[str, Any]]] = [
    (
        None,
        None,
        {
            "actions": 12,
            "with_causality": 11,
            "with_cause": 7,
            "cause_without_rationale": 3,
            "root_causes": 2,
            "categories": counts(conversation=2, decision=2, file_edit=1, tool_use=2, research=2),
            "average_chain_length": 2.0,  # (1 + 2 + 3 + 4 + 1 + 1 + 2) / 7
            "max_chain_length": 4,
            "root_causes_including_isolated": 4,
            "average_chain_nodes": 2.273,
            "max_chain_nodes": 5,
        },
    ),
    (
        "alpha",
        None,
        {
            "actions": 8,
            "with_causality": 7,
            "with_cause": 5,
            "cause_without_rationale": 2,
            "root_causes": 1,
            "categories": counts(decision=2, research=1, tool_use=2, file_edit=1),
            "average_chain_length": 2.4,  # (1 + 2 + 3 + 4 + 2) / 5: 9's root is in beta
            "max_chain_length": 4,
            "root_causes_including_isolated": 2,
            "average_chain_nodes": 2.714,
            "max_chain_nodes": 5,
        },
    ),
    (
        "beta",
        None,
        {
            "actions": 4,
            "with_causality": 4,
            "with_cause": 2,
            "cause_without_rationale": 1,
            "root_causes": 1,
            "categories": counts(conversation=2, research=1),
            "average_chain_length": 1.0,
            "max_chain_length": 1,
            "root_causes_including_isolated": 2,
            "average_chain_nodes": 1.5,
            "max_chain_nodes": 2,
        },
    ),
    (
        None,
        "s1",
        {
            "actions": 6,
            "with_causality": 6,
            "with_cause": 4,
            "cause_without_rationale": 1,
            "root_causes": 1,
            "categories": counts(decision=2, research=1, tool_use=1, file_edit=1),
            "average_chain_length": 2.5,
            "max_chain_length": 4,
            "root_causes_including_isolated": 2,
            "average_chain_nodes": 2.667,
            "max_chain_nodes": 5,
        },
    ),
    (
        None,
        "s2",
        {
            "actions": 4,
            "with_causality": 4,
            "with_cause": 3,
            "cause_without_rationale": 2,
            "root_causes": 1,
            "categories": counts(conversation=2, tool_use=1),
            "average_chain_length": 1.333,  # 4 / 3, rounded to 3 places
            "max_chain_length": 2,
            "root_causes_including_isolated": 1,
            "average_chain_nodes": 2.0,
            "max_chain_nodes": 3,
        },
    ),
    (
        "alpha",
        "s2",
        {
            "actions": 1,
            "with_causality": 1,
            "with_cause": 1,
            "cause_without_rationale": 1,
            "root_causes": 0,
            "categories": counts(tool_use=1),
            "average_chain_length": 2.0,
            "max_chain_length": 2,
            "root_causes_including_isolated": 0,
            "average_chain_nodes": 3.0,
            "max_chain_nodes": 3,
        },
    ),
    (
        "beta",
        "s1",
        {
            "actions": 0,
            "with_causality": 0,
            "with_cause": 0,
            "cause_without_rationale": 0,
            "root_causes": 0,
            "categories": counts(),
            "average_chain_length": 0.0,
            "max_chain_length": 0,
            "root_causes_including_isolated": 0,
            "average_chain_nodes": 0.0,
            "max_chain_nodes": 0,
        },
    ),
    (
        "gamma",
        None,
        {
            "actions": 0,
            "with_causality": 0,
            "with_cause": 0,
            "cause_without_rationale": 0,
            "root_causes": 0,
            "categories": counts(),
            "average_chain_length": 0.0,
            "max_chain_length": 0,
            "root_causes_including_isolated": 0,
            "average_chain_nodes": 0.0,
            "max_chain_nodes": 0,
        },
    ),
]


@pytest.mark.parametrize(
    ("plan_id", "session_id", "expected"),
    [pytest.param(p, s, e, id=f"{p}-{s}") for p, s, e in KNOWN_STATS],
)
def test_causality_stats_known_answers(
    known: CausalChain, plan_id: str | None, session_id: str | None, expected: dict[str, Any]
) -> None:
    found = known.causality_stats(plan_id=plan_id, session_id=session_id)
    assert found == {"plan_id": plan_id, "session_id": session_id, **expected}
    assert isinstance(found["average_chain_length"], float)


@pytest.mark.parametrize(
    ("n", "expected"),
    [
        (1, [2, 3, 4, 5]),
        (2, [3, 4, 5]),
        (4, [5]),
        (5, []),
        (6, [7, 8, 9]),
        (8, [9]),
        (7, []),
        (10, []),
        (11, []),
    ],
)
def test_downstream_known_answers(
    known: CausalChain, backend: Ledger, n: int, expected: list[int]
) -> None:
    assert [a.action_id for a in known.downstream(uid(n))] == [uid(e) for e in expected]
    if not backend.postgresql:  # the module function reads a sqlite3 connection
        assert downstream(known.conn, uid(n)) == [uid(e) for e in expected]


@pytest.mark.sqlite_only(reason="the module functions read a sqlite3 connection")
def test_the_module_functions_match_the_chain_methods(known: CausalChain) -> None:
    conn = known.conn
    assert build_causal_chain(conn, uid(5), 2) == known.build_causal_chain(uid(5), 2)
    assert reconstruct_reasoning(conn, uid(4)) == known.reconstruct_reasoning(uid(4))
    assert causality_stats(conn, "alpha") == known.causality_stats("alpha")
    assert causality_stats(conn, session_id="s2") == known.causality_stats(session_id="s2")


# ----------------------------------------------------- 2. random forests, naive walks

PLANS = ("p0", "p1")
SESSIONS = (None, "s0", "s1")

# per action: its cause (None, "previous" as -1, or any earlier one by index modulo),
# plan, session, whether it has a rationale, and its category
NODE = st.tuples(
    st.one_of(st.none(), st.just(-1), st.integers(min_value=0, max_value=10**6)),
    st.sampled_from(PLANS),
    st.sampled_from(SESSIONS),
    st.booleans(),
    st.sampled_from((None, *CATEGORIES)),
)


# sizes up to 200, a good share of them large (plain lists stay short)
FORESTS = st.one_of(st.integers(1, 20), st.integers(21, 200)).flatmap(
    lambda n: st.lists(NODE, min_size=n, max_size=n)
)


class Forest:
    """A random cause forest stored in a fresh ledger, and its naive answers."""

    def __init__(self, nodes: list[tuple[Any, ...]]) -> None:
        self.causes: list[int | None] = []
        self.nodes = nodes
        for i, (pick, *_rest) in enumerate(nodes):
            if pick is None or i == 0:
                self.causes.append(None)
            else:
                self.causes.append(i - 1 if pick == -1 else pick % i)
        self.effects: dict[int, list[int]] = {}
        for i, cause in enumerate(self.causes):
            if cause is not None:
                self.effects.setdefault(cause, []).append(i)

    def cause_id(self, i: int) -> str | None:
        cause = self.causes[i]
        return None if cause is None else uid(cause)

    def actions(self) -> list[dict[str, Any]]:
        return [
            {
                "action_id": uid(i),
                "plan_id": plan,
                "intent_id": "intent",
                "session_id": session,
                "action_type": "InternalStep",
                "function_name": f"fn{i}",
                "caused_by": self.cause_id(i),
                "rationale": f"because {i}" if has_rationale else None,
                "category": category,
            }
            for i, (_pick, plan, session, has_rationale, category) in enumerate(self.nodes)
        ]

    def path(self, i: int) -> list[int]:
        """Root first, down to i."""
        up = [i]
        while self.causes[up[-1]] is not None:
            up.append(self.causes[up[-1]])  # type: ignore[arg-type]
        return up[::-1]

    def below(self, i: int) -> list[int]:
        found, stack = [], list(self.effects.get(i, []))
        while stack:
            j = stack.pop()
            found.append(j)
            stack.extend(self.effects.get(j, []))
        return sorted(found)  # insertion order is index order

    def stats(self, plan_id: str | None, session_id: str | None) -> dict[str, Any]:
        scope = [
            i
            for i, (_p, plan, session, _r, _c) in enumerate(self.nodes)
            if (plan_id is None or plan == plan_id)
            and (session_id is None or session == session_id)
        ]
        caused = [i for i in scope if self.causes[i] is not None]
        lengths = [len(self.path(i)) - 1 for i in caused]
        with_data = [
            i
            for i in scope
            if self.causes[i] is not None or self.nodes[i][3] or self.nodes[i][4] is not None
        ]
        categories = dict.fromkeys(CATEGORIES, 0)
        for i in scope:
            if self.nodes[i][4] is not None:
                categories[self.nodes[i][4]] += 1
        return {
            "plan_id": plan_id,
            "session_id": session_id,
            "actions": len(scope),
            "with_causality": sum(
                1
                for i in scope
                if self.causes[i] is not None or self.nodes[i][3] or self.nodes[i][4] is not None
            ),
            "with_cause": len(caused),
            "cause_without_rationale": sum(1 for i in caused if not self.nodes[i][3]),
            "root_causes": sum(1 for i in scope if self.causes[i] is None and i in self.effects),
            "categories": categories,
            "average_chain_length": round(sum(lengths) / len(lengths), 3) if lengths else 0.0,
            "max_chain_length": max(lengths, default=0),
            # the causality engine's definitions: roots among the actions with causality
            # data, chain sizes in nodes (the action included) over those actions
            "root_causes_including_isolated": sum(1 for i in with_data if self.causes[i] is None),
            "average_chain_nodes": (
                round(sum(len(self.path(i)) for i in with_data) / len(with_data), 3)
                if with_data
                else 0.0
            ),
            "max_chain_nodes": max((len(self.path(i)) for i in with_data), default=0),
        }


@contextmanager
def stored(forest: Forest, request: pytest.FixtureRequest, kind: str) -> Iterator[CausalChain]:
    """A fresh ledger per example (tmp_path is per test, not per example): a SQLite file,
    or a PostgreSQL database copied from the session's migrated template."""
    if kind == "postgresql":
        from . import postgres

        server = request.getfixturevalue("pg_server")
        url = postgres.clone_database(server, request.getfixturevalue("pg_template"))
        try:
            with CausalChain(url) as chain:
                chain.append_actions(forest.actions())
                yield chain
        finally:
            postgres.drop_database(server, url)
        return
    with (
        tempfile.TemporaryDirectory(prefix="cassette-reasoning-") as directory,
        CausalChain(Path(directory) / "forest.db", clock=ManualClock(START_MS)) as chain,
    ):
        chain.append_actions(forest.actions())
        yield chain


def downstream_ids(chain: CausalChain, action_id: str) -> list[str]:
    """What downstream answers, through the chain and, on SQLite, the module function that
    reads a sqlite3 connection too (they must agree)."""
    found = [a.action_id for a in chain.downstream(action_id)]
    if not backends.is_postgresql(chain.db_path):
        assert downstream(chain.conn, action_id) == found
    return found


# A fresh ledger per Hypothesis example: on PostgreSQL a database copied per example.
EACH_BACKEND = pytest.mark.parametrize("kind", BACKENDS)


@pytest.mark.slow
@EACH_BACKEND
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=FORESTS, data=st.data())
def test_chains_and_downstream_match_a_naive_walk(
    request: pytest.FixtureRequest, kind: str, nodes: list[tuple[Any, ...]], data: st.DataObject
) -> None:
    forest = Forest(nodes)
    with stored(forest, request, kind) as chain:
        for i in range(len(nodes)):
            path = forest.path(i)
            found = chain.build_causal_chain(uid(i))
            assert [e["action_id"] for e in found["chain"]] == [uid(j) for j in path]
            assert [e["depth"] for e in found["chain"]] == list(range(len(path)))
            assert [e["caused_by"] for e in found["chain"]] == [forest.cause_id(j) for j in path]
            assert (found["length"], found["truncated"]) == (len(path), False)
            assert downstream_ids(chain, uid(i)) == [uid(j) for j in forest.below(i)]
        for i in data.draw(st.lists(st.integers(0, len(nodes) - 1), max_size=5), label="picks"):
            limit = data.draw(st.integers(min_value=0, max_value=12), label="max_depth")
            path = forest.path(i)
            cut = chain.build_causal_chain(uid(i), max_depth=limit)
            assert [e["action_id"] for e in cut["chain"]] == [uid(j) for j in path[-limit - 1 :]]
            assert cut["truncated"] is (len(path) - 1 > limit)
            assert [a.action_id for a in chain.downstream(uid(i))] == [
                uid(j) for j in forest.below(i)
            ]


@pytest.mark.slow
@EACH_BACKEND
@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(nodes=st.just([]) | FORESTS)
def test_causality_stats_match_a_naive_computation(
    request: pytest.FixtureRequest, kind: str, nodes: list[tuple[Any, ...]]
) -> None:
    forest = Forest(nodes)
    with stored(forest, request, kind) as chain:
        for plan_id in (None, *PLANS, "nowhere"):
            for session_id in (None, "s0", "s1", "nowhere"):
                found = chain.causality_stats(plan_id=plan_id, session_id=session_id)
                assert found == forest.stats(plan_id, session_id), (plan_id, session_id)


@EACH_BACKEND
def test_a_deep_forest_has_the_naive_depths(request: pytest.FixtureRequest, kind: str) -> None:
    nodes: list[tuple[Any, ...]] = [
        (-1, PLANS[i % 2], SESSIONS[i % 3], i % 4 == 0, None) for i in range(300)
    ]
    nodes[150] = (None, "p0", None, False, "decision")  # a second root midway
    forest = Forest(nodes)
    with stored(forest, request, kind) as chain:
        assert chain.causality_stats() == forest.stats(None, None)
        assert chain.causality_stats()["max_chain_length"] == 149
        assert chain.causality_stats("p1")["root_causes"] == 0
        assert chain.build_causal_chain(uid(299))["length"] == 150
        assert downstream_ids(chain, uid(150)) == [uid(j) for j in range(151, 300)]


# ---------------------------------------------- 3. one statement, searched by index


def traced(chain: CausalChain, call: Callable[[], Any]) -> list[str]:
    """Every query the call runs, with its values bound (transaction control left out)."""
    seen: list[str] = []
    chain.conn.set_trace_callback(seen.append)
    try:
        call()
    finally:
        chain.conn.set_trace_callback(None)
    return [s for s in seen if s.strip().upper() not in ("BEGIN", "COMMIT", "ROLLBACK")]


def query_plan(chain: CausalChain, sql: str) -> list[str]:
    return [str(row[3]) for row in chain.conn.execute("EXPLAIN QUERY PLAN " + sql)]


@pytest.fixture
def two_depths(tmp_path: Path) -> Iterator[CausalChain]:
    """Cause chains 5 and 200 deep (ids 0-4 and 1000-1199), plus unrelated actions."""
    with CausalChain(tmp_path / "depths.db", clock=ManualClock(START_MS)) as chain:
        rows = []
        for start, depth in ((0, 5), (1000, 200)):
            for k in range(depth):
                rows.append(
                    {
                        "action_id": uid(start + k),
                        "plan_id": f"plan-{depth}",
                        "intent_id": "intent",
                        "action_type": "InternalStep",
                        "function_name": "fn",
                        "caused_by": None if k == 0 else uid(start + k - 1),
                        "category": "decision" if k % 2 else None,
                    }
                )
        rows += [
            {
                "action_id": uid(5000 + k),
                "plan_id": "noise",
                "intent_id": "intent",
                "action_type": "CapabilityCall",
                "function_name": "fn",
            }
            for k in range(300)
        ]
        chain.append_actions(rows)
        yield chain


SHALLOW_TIP, DEEP_TIP = uid(4), uid(1199)
SHALLOW_ROOT, DEEP_ROOT = uid(0), uid(1000)


@pytest.mark.sqlite_only(reason="SQLite's trace callback and EXPLAIN QUERY PLAN")
def test_build_causal_chain_is_one_query_whatever_the_depth(two_depths: CausalChain) -> None:
    shallow = traced(two_depths, lambda: two_depths.build_causal_chain(SHALLOW_TIP))
    deep = traced(two_depths, lambda: two_depths.build_causal_chain(DEEP_TIP))
    assert len(two_depths.build_causal_chain(DEEP_TIP)["chain"]) == 200
    assert len(shallow) == len(deep) == 2, (shallow, deep)
    for statements, tip in ((shallow, SHALLOW_TIP), (deep, DEEP_TIP)):
        check, walk = statements
        assert check.lstrip().startswith("SELECT") and f"'{tip}'" in check
        assert "RECURSIVE" not in check
        assert walk.lstrip().startswith("WITH RECURSIVE") and f"'{tip}'" in walk
    limited = traced(two_depths, lambda: two_depths.build_causal_chain(DEEP_TIP, max_depth=50))
    assert len(limited) == 2


@pytest.mark.sqlite_only(reason="SQLite's trace callback and EXPLAIN QUERY PLAN")
@pytest.mark.parametrize(
    ("name", "shallow", "deep", "count"),
    [
        ("downstream", lambda c: downstream(c.conn, SHALLOW_ROOT),
         lambda c: downstream(c.conn, DEEP_ROOT), 2),
        ("reconstruct_reasoning", lambda c: c.reconstruct_reasoning(SHALLOW_TIP),
         lambda c: c.reconstruct_reasoning(DEEP_TIP), 2),  # the action, its cause
        ("causality_stats", lambda c: c.causality_stats("plan-5"),
         lambda c: c.causality_stats("plan-200"), 3),
    ],
)  # fmt: skip
def test_the_other_queries_do_not_grow_with_depth(
    two_depths: CausalChain,
    name: str,
    shallow: Callable[[CausalChain], Any],
    deep: Callable[[CausalChain], Any],
    count: int,
) -> None:
    few = traced(two_depths, lambda: shallow(two_depths))
    many = traced(two_depths, lambda: deep(two_depths))
    assert len(few) == len(many) == count, (name, few, many)
    assert sum("RECURSIVE" in s for s in many) == (0 if name == "reconstruct_reasoning" else 1)


def _recursive_step(details: list[str]) -> list[str]:
    assert "RECURSIVE STEP" in details, details
    return details[details.index("RECURSIVE STEP") + 1 :]


def _no_table_scan(details: list[str], ctes: tuple[str, ...]) -> None:
    for detail in details:
        if detail.startswith("SCAN"):
            assert detail in tuple(f"SCAN {c}" for c in ctes), details


@pytest.mark.sqlite_only(reason="SQLite's trace callback and EXPLAIN QUERY PLAN")
def test_the_cause_walk_up_searches_by_action_id(two_depths: CausalChain) -> None:
    walk = traced(two_depths, lambda: two_depths.build_causal_chain(DEEP_TIP))[-1]
    details = query_plan(two_depths, walk)
    _no_table_scan(details, ("up",))
    step = _recursive_step(details)
    assert any(
        d.startswith("SEARCH")
        and "USING INDEX sqlite_autoindex_cassette_actions" in d
        and "(action_id=?)" in d
        for d in step
    ), details


@pytest.mark.sqlite_only(reason="SQLite's trace callback and EXPLAIN QUERY PLAN")
def test_the_walk_down_searches_by_cause(two_depths: CausalChain) -> None:
    walk = traced(two_depths, lambda: downstream(two_depths.conn, DEEP_ROOT))[-1]
    details = query_plan(two_depths, walk)
    _no_table_scan(details, ("down",))
    assert any("cassette_actions_by_cause (caused_by=?)" in d for d in details[:3] + details)
    step = _recursive_step(details)
    assert any(
        d.startswith("SEARCH") and "cassette_actions_by_cause (caused_by=?)" in d for d in step
    ), details


@pytest.mark.sqlite_only(reason="SQLite's trace callback and EXPLAIN QUERY PLAN")
def test_the_stats_recursion_searches_by_cause(two_depths: CausalChain) -> None:
    statements = traced(two_depths, lambda: two_depths.causality_stats("plan-200"))
    (recursive,) = [s for s in statements if "RECURSIVE" in s]
    details = query_plan(two_depths, recursive)
    step = _recursive_step(details)
    assert any(
        d.startswith("SEARCH") and "cassette_actions_by_cause (caused_by=?)" in d for d in step
    ), details
    for filtered in statements[:2]:  # the totals and the categories use the plan index
        assert any("cassette_actions_by_plan" in d for d in query_plan(two_depths, filtered))


# --------------------------------------------------------------- 4. 2,000 deep


DEEP = 2000


@pytest.fixture
def very_deep(backend: Ledger) -> Iterator[CausalChain]:
    with CausalChain(backend.target, clock=backend.clock) as chain:
        chain.append_actions(
            {
                "action_id": uid(k),
                "plan_id": "deep",
                "intent_id": "intent",
                "action_type": "InternalStep",
                "function_name": f"fn{k}",
                "caused_by": None if k == 0 else uid(k - 1),
            }
            for k in range(DEEP)
        )
        yield chain


def test_a_2000_deep_chain_is_walked_root_first(very_deep: CausalChain) -> None:
    found = very_deep.build_causal_chain(uid(DEEP - 1))
    assert (found["length"], found["truncated"]) == (DEEP, False)
    chain = found["chain"]
    assert len(chain) == DEEP
    assert [e["action_id"] for e in chain] == [uid(k) for k in range(DEEP)]
    assert [e["depth"] for e in chain] == list(range(DEEP))
    assert chain[0]["caused_by"] is None
    assert chain[-1]["function_name"] == f"fn{DEEP - 1}"
    cut = very_deep.build_causal_chain(uid(DEEP - 1), max_depth=1500)
    assert (cut["length"], cut["truncated"]) == (1501, True)
    assert cut["chain"][0]["action_id"] == uid(DEEP - 1501)


def test_a_2000_deep_chain_downstream_and_stats(very_deep: CausalChain) -> None:
    assert [a.action_id for a in very_deep.downstream(uid(0))] == [uid(k) for k in range(1, DEEP)]
    stats = very_deep.causality_stats()
    assert (stats["actions"], stats["with_cause"], stats["root_causes"]) == (DEEP, DEEP - 1, 1)
    assert stats["max_chain_length"] == DEEP - 1
    assert stats["average_chain_length"] == DEEP / 2  # mean of 1..1999
    reasoning = very_deep.reconstruct_reasoning(uid(DEEP - 1))
    assert reasoning["cause"] == {
        "action_id": uid(DEEP - 2),
        "summary": f"InternalStep fn{DEEP - 2}",
    }
