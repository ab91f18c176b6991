"""Issue 14: suggested causes, causes in time, engine statistics, newest first and time
filters, latest, follow, metrics, session verify, plan bodies and bundles, through the
API and the CLI. Tail across processes and the MCP server are in test_live_processes."""

from __future__ import annotations

import json
import math
import sqlite3
import uuid
from collections.abc import Iterator
from datetime import datetime, timedelta, timezone
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalytic_cassette import ManualClock
from catalytic_cassette.chain import CausalChain
from catalytic_cassette.cli import cli
from catalytic_cassette.errors import CassetteError, ErrorCode
from catalytic_cassette.hashing import sha256_hex
from catalytic_cassette.timeline import parse_time

from . import backends, postgres
from .conftest import file_digest, tampering, unguarded

pytestmark = pytest.mark.both_backends

HOUR = 3_600_000
START = 1_700_000_000_000


class SettableClock:
    """A client's own clock: it may go backwards (the attacker picks its clock)."""

    def __init__(self, now: int = START) -> None:
        self.now = now

    def now_ms(self) -> int:
        return self.now


# Why a test here does not run on PostgreSQL: SQLite's by its means.
EXACT_TIME = pytest.mark.sqlite_only(
    reason="asserts times a ManualClock fixes (a clock of its own, START + n, gaps to the"
    " millisecond); a PostgreSQL ledger keeps the server's running time"
)
RAW_SQLITE3 = pytest.mark.sqlite_only(reason="forges rows through a raw sqlite3 connection")
QUERY_PLAN = pytest.mark.sqlite_only(reason="SQLite's EXPLAIN QUERY PLAN")
SQLITE_SESSION = pytest.mark.sqlite_only(
    reason="rewrites the SQLite file's journal consistently, stored tree nodes included"
    " (write_journal); PostgreSQL's consistent rewrite under a seal is"
    " tests/test_postgres_chain_extras.py's (not_included)"
)
FILE_TAMPERED = pytest.mark.sqlite_only(reason="a SQLite file whose triggers were dropped")


@pytest.fixture
def chain(db_path: Path, clock: ManualClock) -> Iterator[CausalChain]:
    with CausalChain(db_path, clock=clock) as opened:
        yield opened


def act(kind: str = "InternalStep", name: str = "f", **fields: Any) -> dict[str, Any]:
    return {"plan_id": "p", "intent_id": "i", "action_type": kind, "function_name": name, **fields}


def invoke(db: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--db", str(db), *args])


def out(result: Result) -> Any:
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
    return json.loads(result.stdout)


def assert_refused(result: Result, code: str, exit_code: int = 1) -> None:
    assert result.exit_code == exit_code, (result.exit_code, result.stdout, result.stderr)
    assert result.exception is None or isinstance(result.exception, SystemExit)
    assert "Traceback" not in result.stderr
    assert result.stderr.startswith(f"error: {code}: "), result.stderr


def refused(excinfo: pytest.ExceptionInfo[CassetteError], code: ErrorCode) -> None:
    assert excinfo.value.code is code, excinfo.value


# ---------------------------------------------------------- dependency detection


@EXACT_TIME
def test_candidates_are_the_newest_of_the_scope_within_the_window(
    chain: CausalChain, clock: ManualClock
) -> None:
    old = chain.append_action(act(name="old"))
    clock.advance(HOUR + 1)
    recent = []
    for n in range(7):
        recent.append(chain.append_action(act(name=f"n{n}", success=n != 3)))
        chain.append_action(act(name="elsewhere", plan_id="other"))
        clock.advance(10)
    found = chain.detect_dependencies(plan_id="p")
    assert [c["action_id"] for c in found] == [a.action_id for a in reversed(recent)][:5]
    assert old.action_id not in {
        c["action_id"] for c in chain.detect_dependencies(plan_id="p", limit=20)
    }
    assert found[0]["reason"] == "same plan 'p', 10 ms earlier: InternalStep n6"
    assert "(failed)" in chain.detect_dependencies(plan_id="p", limit=4)[3]["reason"]
    wide = chain.detect_dependencies(plan_id="p", window_ms=2 * HOUR, limit=20)
    assert wide[-1]["action_id"] == old.action_id
    # By action: only what was appended before it, and its own time is the reference.
    by_action = chain.detect_dependencies(action_id=recent[2].action_id)
    assert [c["action_id"] for c in by_action] == [recent[1].action_id, recent[0].action_id]
    assert chain.detect_dependencies(action_id=recent[2].action_id, scope="session") == []


@pytest.mark.parametrize(
    "query",
    [
        {},
        {"plan_id": "p", "session_id": "s"},
        {"plan_id": "p", "limit": 0},
        {"plan_id": "p", "limit": 21},
        {"plan_id": "p", "window_ms": 0},
        {"plan_id": "p", "window_ms": True},
        {"action_id": "x", "plan_id": "p"},
        {"action_id": "x", "scope": "project"},
        {"plan_id": "p", "scope": "project"},  # a bad scope is refused in either form
        {"session_id": "s", "scope": ""},
    ],
)
def test_a_bad_dependency_query_is_refused(chain: CausalChain, query: dict[str, Any]) -> None:
    chain.append_action(act())
    with pytest.raises(CassetteError) as excinfo:
        chain.detect_dependencies(**query)
    refused(excinfo, ErrorCode.INVALID_ARGUMENT)


def test_suggested_causes_are_recorded_apart_from_observed_ones(
    db_path: Path, clock: ManualClock, tmp_path: Path
) -> None:
    from catalytic_cassette.signing import generate, load_private
    from catalytic_cassette.verify import verify_path

    private, public = generate(str(tmp_path / "k"))
    with CausalChain(db_path, clock=clock, signing_key=load_private(private)) as chain:
        first = chain.append_action(act(name="a", session_id="s"))
        clock.advance(5)
        second = chain.append_action(act(name="b", session_id="s"), suggest_causes=True)
        expected = chain.detect_dependencies(action_id=second.action_id)
        assert second.caused_by is None
        assert second.metadata["suggested_causes"] == [
            {"action_id": c["action_id"], "reason": c["reason"]} for c in expected
        ]
        assert expected[0]["action_id"] == first.action_id
        # a batch: each item sees the items before it
        batch = chain.append_actions([act(name="c"), act(name="d")], suggest_causes="plan")
        assert batch[1].metadata["suggested_causes"][0]["action_id"] == batch[0].action_id
        lonely = chain.append_action(act(name="e"), suggest_causes="session")
        assert lonely.metadata["suggested_causes"] == []
        assert chain.get_action(second.action_id).metadata == second.metadata
        with pytest.raises(CassetteError) as excinfo:
            chain.append_action(act(), suggest_causes="project")
        refused(excinfo, ErrorCode.INVALID_ARGUMENT)
    from catalytic_cassette.signing import load_public

    assert verify_path(str(db_path), public_key=load_public(public)).ok  # signed with them


@RAW_SQLITE3
@pytest.mark.parametrize(
    ("suggestions", "code"),
    [
        (5, ErrorCode.INVALID_METADATA),
        ([{"action_id": "x"}], ErrorCode.INVALID_METADATA),
        ([{"action_id": "x", "reason": ""}], ErrorCode.INVALID_METADATA),
        ([{"action_id": "x", "reason": "r", "extra": 1}], ErrorCode.INVALID_METADATA),
        ([{"action_id": "x", "reason": "r"}] * 21, ErrorCode.INVALID_METADATA),
        ([{"action_id": str(uuid.uuid4()), "reason": "r"}], ErrorCode.REFERENCE_MISSING),
    ],
)
def test_forged_suggestions_are_refused_for_every_connection(
    chain: CausalChain, db_path: Path, suggestions: Any, code: ErrorCode
) -> None:
    chain.append_action(act())
    before = file_digest(db_path)
    with pytest.raises(CassetteError) as excinfo:
        chain.append_action(act(metadata={"suggested_causes": suggestions}))
    refused(excinfo, code)
    raw = sqlite3.connect(db_path)
    with pytest.raises(sqlite3.IntegrityError, match=f"^{code.value}: "):
        raw.execute(
            "INSERT INTO cassette_actions (action_id, plan_id, intent_id, action_type,"
            " function_name, success, cost_micros, duration_ms, timestamp, metadata_json)"
            " VALUES (?, 'p', 'i', 'InternalStep', 'f', 1, 0, 0, ?, ?)",
            (str(uuid.uuid4()), START, json.dumps({"suggested_causes": suggestions})),
        )
    raw.close()
    assert file_digest(db_path) == before


def test_a_suggestion_cannot_name_the_action_itself(chain: CausalChain) -> None:
    own = str(uuid.uuid4())
    with pytest.raises(CassetteError) as excinfo:
        chain.append_action(
            act(action_id=own, metadata={"suggested_causes": [{"action_id": own, "reason": "r"}]})
        )
    refused(excinfo, ErrorCode.REFERENCE_MISSING)


# --------------------------------------------------------------- causes in time


@EXACT_TIME
def test_an_effect_before_its_cause_is_refused(db_path: Path) -> None:
    clock = SettableClock(START + 1000)
    with CausalChain(db_path, clock=clock) as chain:
        cause = chain.append_action(act(name="cause"))
        clock.now = START  # a client whose clock went back
        # The package dates the effect at the ledger's time instead (never backwards).
        carried = chain.append_action(act(name="effect", caused_by=cause.action_id))
        assert carried.timestamp == cause.timestamp
        assert chain.validate_causal_chain(carried.action_id)["ok"]
        # A statement that dates the effect before its cause itself is refused.
        before = file_digest(db_path)
        with pytest.raises(sqlite3.IntegrityError) as raw:
            chain.conn.execute(
                "INSERT INTO cassette_actions (action_id, plan_id, intent_id, action_type,"
                " function_name, success, cost_micros, duration_ms, timestamp, metadata_json,"
                " caused_by) VALUES (?, 'p', 'i', 'InternalStep', 'f', 1, 0, 0, ?, '{}', ?)",
                (str(uuid.uuid4()), START, cause.action_id),
            )
        assert str(raw.value).startswith("CAUSE_AFTER_EFFECT: ")
        assert file_digest(db_path) == before


def test_validate_causal_chain_reports_a_forged_order(chain: CausalChain, db_path: Path) -> None:
    root = chain.append_action(act(name="root"))
    middle = chain.append_action(act(name="middle", caused_by=root.action_id))
    leaf = chain.append_action(act(name="leaf", caused_by=middle.action_id))
    result = chain.validate_causal_chain(leaf.action_id)
    assert result == {
        "action_id": leaf.action_id,
        "ok": True,
        "length_nodes": 3,
        "chain": [leaf.action_id, middle.action_id, root.action_id],
        "problems": [],
    }
    with tampering(db_path) as conn:  # someone who owns the storage
        conn.execute(  # the root dated after the action it caused
            "UPDATE cassette_actions SET timestamp = 5 + (SELECT timestamp FROM"
            " cassette_actions WHERE action_id = ?) WHERE action_id = ?",
            (middle.action_id, root.action_id),
        )
    result = chain.validate_causal_chain(leaf.action_id)
    assert not result["ok"]
    assert [(p["kind"], p["effect"], p["cause"]) for p in result["problems"]] == [
        ("cause_after_effect", middle.action_id, root.action_id)
    ]
    listed = invoke(db_path, "validate-chain", leaf.action_id)
    assert listed.exit_code == 1
    assert json.loads(listed.stdout)["problems"][0]["kind"] == "cause_after_effect"
    assert out(invoke(db_path, "validate-chain", root.action_id))["ok"] is True
    assert_refused(invoke(db_path, "validate-chain", str(uuid.uuid4())), "NOT_FOUND")


# -------------------------------------------------------------- engine statistics


@settings(
    max_examples=25, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(
    st.lists(
        st.tuples(st.integers(min_value=-1, max_value=30), st.booleans()), min_size=1, max_size=30
    )
)
def test_engine_statistics_match_their_definitions(
    tmp_path: Path, shape: list[tuple[int, bool]]
) -> None:
    """Each action names as cause an earlier one (index < own) or none; some carry a
    category. The oracle counts roots and chain nodes by the engine's definitions."""
    path = tmp_path / f"{uuid.uuid4()}.db"
    causes: list[int | None] = []
    data: list[bool] = []
    with CausalChain(path, clock=ManualClock()) as chain:
        stored = []
        for index, (cause, categorised) in enumerate(shape):
            cause_index = cause if 0 <= cause < index else None
            has_data = categorised or cause_index is not None
            causes.append(cause_index)
            data.append(has_data)
            stored.append(
                chain.append_action(
                    act(
                        caused_by=None if cause_index is None else stored[cause_index].action_id,
                        category="decision" if categorised else None,
                    )
                )
            )
        stats = chain.causality_stats()

    def nodes(i: int) -> int:
        return 1 if causes[i] is None else 1 + nodes(causes[i])  # type: ignore[arg-type]

    with_data = [i for i in range(len(shape)) if data[i]]
    assert stats["root_causes_including_isolated"] == sum(causes[i] is None for i in with_data)
    expected_avg = sum(nodes(i) for i in with_data) / len(with_data) if with_data else 0.0
    assert math.isclose(stats["average_chain_nodes"], round(expected_avg, 3))
    assert stats["max_chain_nodes"] == max((nodes(i) for i in with_data), default=0)
    # Today's figures keep their own definitions beside them.
    effects = {c for c in causes if c is not None}
    assert stats["root_causes"] == sum(
        causes[i] is None and i in effects for i in range(len(shape))
    )
    caused = [nodes(i) - 1 for i in range(len(shape)) if causes[i] is not None]
    assert stats["max_chain_length"] == max(caused, default=0)


def test_stats_cli_names_both_definitions(chain: CausalChain, db_path: Path) -> None:
    chain.append_action(act(category="decision"))
    chain.append_action(act(category="decision"))
    text = invoke(db_path, "stats").stdout
    assert "root causes:             0" in text
    assert "roots incl. isolated:    2" in text
    assert "max chain nodes:         1" in text


# ------------------------------------------------------------- time and newest


def _timeline(chain: CausalChain, clock: ManualClock) -> list[Any]:
    stored = []
    for n in range(6):
        stored.append(
            chain.append_action(act(name="even" if n % 2 == 0 else "odd", session_id="s"))
        )
        clock.advance(1000)
    return stored


@EXACT_TIME
def test_newest_first_since_seq_time_range_and_function(
    chain: CausalChain, clock: ManualClock
) -> None:
    stored = _timeline(chain, clock)
    ids = [a.action_id for a in stored]
    newest = chain.find_actions(newest_first=True, limit=1)
    assert [a.action_id for a in newest] == [ids[-1]]
    assert [a.action_id for a in chain.find_actions(since_seq=stored[3].action_seq)] == ids[4:]
    window = chain.find_actions(after=START + 1000, before=START + 3000)
    assert [a.action_id for a in window] == ids[1:3]
    iso = datetime.fromtimestamp((START + 1000) / 1000, tz=timezone.utc).isoformat()
    assert chain.find_actions(after=iso.replace("+00:00", "Z")) == chain.find_actions(
        after=START + 1000
    )
    assert [a.action_id for a in chain.find_actions(function_name="odd", newest_first=True)] == [
        ids[5],
        ids[3],
        ids[1],
    ]
    assert chain.latest(session_id="s").action_id == ids[-1]  # type: ignore[union-attr]
    assert chain.latest(plan_id="nope") is None
    with pytest.raises(CassetteError) as excinfo:
        chain.find_actions(after="yesterday")
    refused(excinfo, ErrorCode.INVALID_ARGUMENT)


@QUERY_PLAN
@pytest.mark.parametrize(
    ("query", "index"),
    [
        ("timestamp >= ? AND timestamp < ?", "cassette_actions_by_time"),
        ("function_name = ?", "cassette_actions_by_function"),
    ],
)
def test_time_and_function_queries_use_their_index(
    chain: CausalChain, query: str, index: str
) -> None:
    params = (1, 2) if "timestamp" in query else ("f",)
    plan = chain.conn.execute(
        f"EXPLAIN QUERY PLAN SELECT * FROM cassette_actions WHERE {query} ORDER BY action_seq",
        params,
    ).fetchall()
    assert any(index in row[-1] for row in plan), plan


@given(st.integers(min_value=0, max_value=4_102_444_800_000))
def test_iso_times_round_trip_to_epoch_ms(ms: int) -> None:
    moment = datetime(1970, 1, 1, tzinfo=timezone.utc) + timedelta(milliseconds=ms)
    assert parse_time(moment.isoformat()) == ms
    assert parse_time(moment.isoformat().replace("+00:00", "Z")) == ms
    assert parse_time(moment.replace(tzinfo=None).isoformat()) == ms  # naive is UTC
    shifted = moment.astimezone(timezone(timedelta(hours=-5)))
    assert parse_time(shifted.isoformat()) == ms
    assert parse_time(str(ms)) == ms


@EXACT_TIME
def test_cli_newest_first_and_latest(chain: CausalChain, clock: ManualClock, db_path: Path) -> None:
    stored = _timeline(chain, clock)
    last = out(invoke(db_path, "actions", "--desc", "--limit", "1"))
    assert [a["action_id"] for a in last] == [stored[-1].action_id]
    since = out(invoke(db_path, "actions", "--since-seq", str(stored[4].action_seq)))
    assert [a["action_id"] for a in since] == [stored[5].action_id]
    iso = datetime.fromtimestamp((START + 2000) / 1000, tz=timezone.utc).isoformat()
    ranged = out(invoke(db_path, "actions", "--after", iso, "--before", str(START + 4000)))
    assert [a["action_id"] for a in ranged] == [stored[2].action_id, stored[3].action_id]
    odd = out(invoke(db_path, "actions", "--function", "odd", "--desc"))
    assert [a["action_id"] for a in odd] == [
        stored[5].action_id,
        stored[3].action_id,
        stored[1].action_id,
    ]
    assert out(invoke(db_path, "latest", "--session", "s"))["action_id"] == stored[-1].action_id
    assert out(invoke(db_path, "latest", "--plan", "nope")) is None
    assert invoke(db_path, "latest", "--plan", "p", "--session", "s").exit_code == 2
    before = file_digest(db_path)
    assert_refused(invoke(db_path, "actions", "--after", "tomorrow"), "USAGE", exit_code=2)
    assert file_digest(db_path) == before


@EXACT_TIME
def test_cli_suggest_causes(chain: CausalChain, clock: ManualClock, db_path: Path) -> None:
    stored = _timeline(chain, clock)
    by_action = out(
        invoke(db_path, "suggest-causes", "--action", stored[3].action_id, "--limit", "2")
    )
    assert [c["action_id"] for c in by_action] == [stored[2].action_id, stored[1].action_id]
    at = out(invoke(db_path, "suggest-causes", "--session", "s", "--at", str(START + 1500)))
    assert [c["action_id"] for c in at] == [stored[1].action_id, stored[0].action_id]
    before = file_digest(db_path)
    assert_refused(
        invoke(db_path, "suggest-causes", "--plan", "p", "--session", "s"), "USAGE", exit_code=2
    )
    assert file_digest(db_path) == before


# ----------------------------------------------------------------------- metrics


def _nearest_rank(values: list[int], p: int) -> int:
    ordered = sorted(values)
    return ordered[math.ceil(p * len(ordered) / 100) - 1]


@settings(max_examples=20, deadline=None)
@given(
    st.lists(
        st.tuples(
            st.sampled_from(["a", "b", "c"]),
            st.integers(min_value=0, max_value=10_000),
            st.booleans(),
            st.sampled_from(["CapabilityCall", "InternalStep"]),
        ),
        min_size=1,
        max_size=40,
    )
)
def test_metrics_match_an_independent_count(
    tmp_path_factory: pytest.TempPathFactory, rows: list[tuple[str, int, bool, str]]
) -> None:
    path = tmp_path_factory.mktemp("m") / "ledger.db"
    with CausalChain(path, clock=ManualClock()) as chain:
        chain.append_actions(
            act(kind, name, duration_ms=d, success=ok, cost=0.25, session_id=name)
            for name, d, ok, kind in rows
        )
        statements: list[str] = []
        chain.conn.set_trace_callback(statements.append)
        by_function = chain.metrics("function")
        chain.conn.set_trace_callback(None)
        assert len(statements) == 1  # one SQL statement
        by_capability = chain.metrics("capability")
    for result, kinds in ((by_function, None), (by_capability, "CapabilityCall")):
        expected = {}
        for name in sorted({r[0] for r in rows if kinds is None or r[3] == kinds}):
            group = [r for r in rows if r[0] == name and (kinds is None or r[3] == kinds)]
            durations = [r[1] for r in group]
            failures = sum(not r[2] for r in group)
            expected[name] = {
                "count": len(group),
                "failures": failures,
                "failure_rate": round(failures / len(group), 6),
                "total_duration_ms": sum(durations),
                "p50_duration_ms": _nearest_rank(durations, 50),
                "p95_duration_ms": _nearest_rank(durations, 95),
                "total_cost": 0.25 * len(group),
            }
        key = "function" if kinds is None else "capability"
        assert {r.pop(key): r for r in result} == expected


def test_metrics_cli(chain: CausalChain, db_path: Path) -> None:
    chain.append_actions([act(duration_ms=10, session_id="s"), act(duration_ms=30, success=False)])
    by_session = out(invoke(db_path, "metrics", "--by", "session", "--json"))
    assert [(r["session"], r["count"], r["failures"]) for r in by_session] == [
        (None, 1, 1),
        ("s", 1, 0),
    ]
    by_plan = out(invoke(db_path, "metrics", "--by", "plan", "--json"))
    assert by_plan[0]["failure_rate"] == 0.5 and by_plan[0]["total_duration_ms"] == 40
    table = invoke(db_path, "metrics", "--by", "intent")
    assert table.exit_code == 0 and "failure_rate" in table.stdout.splitlines()[0]
    assert invoke(db_path, "metrics", "--by", "planet").exit_code == 2


# ------------------------------------------------------------------------ follow


def test_follow_reads_in_seq_order_and_resumes_without_gap(chain: CausalChain) -> None:
    chain.append_actions([act(name=f"n{n}") for n in range(5)])
    everything = list(chain.follow(keep_following=False))
    assert [e["seq"] for e in everything] == list(range(5))
    assert everything[2]["row"]["function_name"] == "n2"
    resumed = list(chain.follow(everything[1]["seq"], keep_following=False))
    assert [e["seq"] for e in resumed] == [2, 3, 4]
    assert list(chain.follow(4, keep_following=False)) == []
    with pytest.raises(CassetteError):
        list(chain.follow(-2, keep_following=False))


@EXACT_TIME
def test_follow_sees_new_commits_and_holds_no_read_transaction(db_path: Path) -> None:
    """While the follower waits between polls, a writer appends and a TRUNCATE
    checkpoint completes: the follower holds no snapshot that would pin the WAL."""
    from catalytic_cassette.connection import connect_readonly
    from catalytic_cassette.follow import follow

    writer = CausalChain(db_path, clock=ManualClock())
    writer.append_action(act(name="first"))
    reader = connect_readonly(db_path)
    checkpoints: list[tuple[int, int, int]] = []

    def between_polls(_: float) -> None:
        assert not reader.in_transaction
        checkpoints.append(writer.conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone())
        if len(checkpoints) < 3:
            writer.append_action(act(name=f"later{len(checkpoints)}"))

    seen = []
    for item in follow(reader, -1, sleep=between_polls, timeout_seconds=None):
        seen.append(item["row"]["function_name"])
        if len(seen) == 3:
            break
    assert seen == ["first", "later1", "later2"]
    assert all(busy == 0 for busy, _, _ in checkpoints), checkpoints
    reader.close()
    writer.close()


def test_tail_cli_prints_json_lines_of_a_table(chain: CausalChain, db_path: Path) -> None:
    chain.append_actions([act(name="a"), act(name="b")])
    chain.save_checkpoint("p", {"x": 1})
    lines = invoke(db_path, "tail").stdout.splitlines()
    assert [json.loads(line)["seq"] for line in lines] == [0, 1, 2]
    actions = invoke(db_path, "tail", "--table", "cassette_actions", "--since-seq", "0")
    assert [json.loads(line)["row"]["function_name"] for line in actions.stdout.splitlines()] == [
        "b"
    ]
    bounded = invoke(db_path, "tail", "--follow", "--max-entries", "2", "--timeout", "5")
    assert len(bounded.stdout.splitlines()) == 2
    idle = invoke(db_path, "tail", "--follow", "--since-seq", "2", "--timeout", "0.3")
    assert idle.exit_code == 0 and idle.stdout == ""
    missing = (
        postgres.with_database(str(db_path), "cassette_test_no_such_database")
        if backends.is_postgresql(db_path)
        else db_path.with_name("missing.db")
    )
    assert_refused(invoke(missing, "tail"), "CANNOT_OPEN")


# --------------------------------------------------------------------- plan body


PLAN = "# incident plan\n1. inspect disk\n2. rotate logs — never delete\n"


def test_a_plan_body_is_archived_with_its_hash(chain: CausalChain, db_path: Path) -> None:
    started = chain.append_action(act("PlanStarted", "triage", metadata={"plan_body": PLAN}))
    assert started.metadata["plan_hash"] == sha256_hex(PLAN)
    assert chain.plan_body("p") == {
        "plan_id": "p",
        "action_id": started.action_id,
        "plan_hash": sha256_hex(PLAN),
        "plan_body": PLAN,
    }
    shown = invoke(db_path, "plan", "show", "p")
    assert shown.exit_code == 0 and shown.stdout == PLAN
    assert out(invoke(db_path, "plan", "show", "p", "--json"))["plan_hash"] == sha256_hex(PLAN)
    assert_refused(invoke(db_path, "plan", "show", "other"), "NOT_FOUND")


@pytest.mark.parametrize(
    ("kind", "metadata", "code"),
    [
        ("PlanStarted", {"plan_body": PLAN, "plan_hash": "0" * 64}, ErrorCode.PLAN_HASH_MISMATCH),
        ("PlanStarted", {"plan_body": {"steps": []}}, ErrorCode.INVALID_PLAN_BODY),
        ("PlanStarted", {"plan_hash": sha256_hex(PLAN)}, ErrorCode.INVALID_PLAN_BODY),
        ("PlanStarted", {"plan_body": PLAN, "plan_hash": "A" * 64}, ErrorCode.INVALID_PLAN_BODY),
        ("InternalStep", {"plan_body": PLAN}, ErrorCode.INVALID_PLAN_BODY),
    ],
)
def test_a_bad_plan_body_is_refused(
    chain: CausalChain, db_path: Path, kind: str, metadata: dict[str, Any], code: ErrorCode
) -> None:
    chain.append_action(act())
    before = file_digest(db_path)
    with pytest.raises(CassetteError) as excinfo:
        chain.append_action(act(kind, metadata=metadata))
    refused(excinfo, code)
    assert file_digest(db_path) == before


def test_an_edited_plan_body_is_caught_on_read_and_by_session_verify(
    chain: CausalChain, db_path: Path
) -> None:
    started = chain.append_action(
        act("PlanStarted", "triage", session_id="s", metadata={"plan_body": PLAN})
    )
    forged = json.dumps({**started.metadata, "plan_body": "delete everything"})
    with tampering(db_path) as conn:
        conn.execute("UPDATE cassette_actions SET metadata_json = ?", (forged,))
    with pytest.raises(CassetteError) as excinfo:
        chain.plan_body("p")
    refused(excinfo, ErrorCode.PLAN_HASH_MISMATCH)
    result = invoke(db_path, "verify", "--session", "s", "--json")
    assert result.exit_code == 1
    kinds = {f["kind"] for f in json.loads(result.stdout)["findings"]}
    assert kinds == {"plan_hash", "row_changed"}


# ---------------------------------------------------------------- session verify


def _two_sessions(chain: CausalChain) -> tuple[list[Any], list[Any]]:
    mine = chain.append_actions([act(name=f"m{n}", session_id="mine") for n in range(4)])
    theirs = chain.append_actions([act(name=f"t{n}", session_id="theirs") for n in range(4)])
    more = chain.append_actions([act(name="m4", session_id="mine")])
    return mine + more, theirs


def test_session_verify_passes_and_reads_only_its_session(
    chain: CausalChain, db_path: Path
) -> None:
    _mine, theirs = _two_sessions(chain)
    ok = invoke(db_path, "verify", "--session", "mine")
    assert ok.exit_code == 0, ok.stderr
    assert "PASS: session mine verified (5 actions)" in ok.stderr
    # Damage another session's journal entry: the whole-ledger verify fails, the
    # session's own verify does not read it and still passes.
    with tampering(db_path) as conn:
        conn.execute(
            "UPDATE cassette_journal SET body = replace(body, '\"t1\"', '\"t9\"')"
            " WHERE row_key = ?",
            (theirs[1].action_id,),
        )
    assert invoke(db_path, "verify").exit_code == 1
    assert invoke(db_path, "verify", "--session", "mine").exit_code == 0
    assert invoke(db_path, "verify", "--session", "theirs").exit_code == 1
    assert_refused(invoke(db_path, "verify", "--session", "nobody"), "NOT_FOUND", exit_code=3)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (
            "UPDATE cassette_actions SET function_name = 'forged' WHERE action_id = ?",
            {("row_changed", 2)},
        ),
        (
            "UPDATE cassette_journal SET body = replace(body, '\"m2\"', '\"mX\"')"
            " WHERE row_key = ?",
            {("row_changed", 2), ("leaf_hash", 2)},
        ),
        # the next entry then has no predecessor to link to
        (
            "DELETE FROM cassette_journal WHERE row_key = ?",
            {("unjournaled", 2), ("chain_hash", 3)},
        ),
    ],
)
def test_session_verify_names_the_edited_action(
    chain: CausalChain, db_path: Path, edit: str, expected: set[tuple[str, int]]
) -> None:
    mine, _ = _two_sessions(chain)
    with tampering(db_path) as conn:
        conn.execute(edit, (mine[2].action_id,))
    result = invoke(db_path, "verify", "--session", "mine", "--json")
    assert result.exit_code == 1
    index = {a.action_id: n for n, a in enumerate(mine)}
    found = {(f["kind"], index[f["action_id"]]) for f in json.loads(result.stdout)["findings"]}
    assert found == expected


@EXACT_TIME
def test_session_verify_checks_the_chain_link_and_signatures(db_path: Path, tmp_path: Path) -> None:
    from catalytic_cassette.hashing import leaf_hash

    with CausalChain(db_path, clock=ManualClock()) as chain:
        mine, _ = _two_sessions(chain)
    # Edit a body and recompute its leaf, but not the chain: the link breaks.
    with unguarded(db_path) as conn:
        seq, body = conn.execute(
            "SELECT seq, body FROM cassette_journal WHERE row_key = ?", (mine[1].action_id,)
        ).fetchone()
        forged = body.replace('"m1"', '"mY"')
        conn.execute(
            "UPDATE cassette_journal SET body = ?, leaf_hash = ? WHERE seq = ?",
            (forged, leaf_hash(forged.encode()), seq),
        )
    report = json.loads(invoke(db_path, "verify", "--session", "mine", "--json").stdout)
    assert {f["kind"] for f in report["findings"]} == {"row_changed", "chain_hash"}
    out(invoke(tmp_path / "k.db", "keygen", "--out", str(tmp_path / "k")))
    unsigned = invoke(
        db_path, "verify", "--session", "theirs", "--action-key", str(tmp_path / "k.pub"), "--json"
    )
    assert {f["kind"] for f in json.loads(unsigned.stdout)["findings"]} == {"unsigned_action"}


def _sealed(db_path: Path, tmp_path: Path) -> tuple[str, str, Path]:
    out(invoke(db_path, "keygen", "--out", str(tmp_path / "seal")))
    sealed = out(
        invoke(
            db_path, "seal", "--key", str(tmp_path / "seal.key"), "--out", str(tmp_path / "s.seal")
        )
    )
    return str(tmp_path / "seal.pub"), sealed["origin"], tmp_path / "s.seal"


@SQLITE_SESSION
def test_session_verify_against_a_seal_detects_a_rewritten_chain(
    chain: CausalChain, db_path: Path, tmp_path: Path
) -> None:
    from .conftest import write_journal

    _mine, _ = _two_sessions(chain)
    key, origin, seal = _sealed(db_path, tmp_path)
    chain.append_action(act(name="after", session_id="mine"))
    args = (
        "verify",
        "--session",
        "mine",
        "--against",
        str(seal),
        "--public-key",
        key,
        "--origin",
        origin,
    )
    held = invoke(db_path, *args)
    assert held.exit_code == 0, held.stdout + held.stderr
    assert "5 of the session's entries are proven under the seal" in held.stdout
    assert "1 come after it" in held.stdout
    wrong = invoke(db_path, *args[:-1], "another/origin")
    assert wrong.exit_code == 3
    # Rewrite the whole chain consistently (every hash and node recomputed).
    with unguarded(db_path) as conn:
        bodies = [b for (b,) in conn.execute("SELECT body FROM cassette_journal ORDER BY seq")]
        bodies[0] = bodies[0].replace('"m0"', '"mZ"')
        write_journal(conn, bodies)
        conn.execute("UPDATE cassette_actions SET function_name = 'mZ' WHERE function_name = 'm0'")
    assert invoke(db_path, "verify", "--session", "mine").exit_code == 0  # locally consistent
    broken = json.loads(invoke(db_path, *args, "--json").stdout)
    # a rewritten prefix has another root: no entry of it is provable under the seal
    assert [f["kind"] for f in broken["findings"]] == ["not_included"] * 5
    assert broken["anchors"][0]["status"] == "forked"


# ------------------------------------------------------------------------ bundle


def test_an_exported_bundle_verifies_offline_and_tampering_fails(
    chain: CausalChain, db_path: Path, tmp_path: Path
) -> None:
    _mine, _theirs = _two_sessions(chain)
    key, origin, _ = _sealed(db_path, tmp_path)
    bundle = tmp_path / "mine.bundle"
    written = out(invoke(db_path, "export", "--session", "mine", "--out", str(bundle)))
    assert written["entries"] == 5
    check = ("verify-bundle", str(bundle), "--public-key", key, "--origin", origin)
    result = out(invoke(db_path, *check))
    assert result["ok"] and result["entries"] == 5 and result["scope"] == {"session_id": "mine"}
    lines = bundle.read_bytes().splitlines()

    def verdict(new_lines: list[bytes]) -> tuple[int, Any]:
        bundle.write_bytes(b"\n".join(new_lines) + b"\n")
        ran = invoke(db_path, *check)
        return ran.exit_code, json.loads(ran.stdout)

    entry = json.loads(lines[2])
    entry["body"] = entry["body"].replace('"m1"', '"mQ"')
    assert verdict([lines[0], lines[1], json.dumps(entry).encode(), *lines[3:]])[0] == 1
    assert verdict([lines[0], lines[2], lines[1], *lines[3:]])[0] == 1  # reordered
    assert verdict(lines[:-1])[0] == 1  # an entry left out without fixing the count
    assert verdict([lines[0], *lines[1:], lines[1]])[0] == 1  # repeated
    header = json.loads(lines[0])
    note_lines = header["seal"].split("\n")
    note_lines[1] = str(int(note_lines[1]) + 1)  # claim a larger tree under the same signature
    header["seal"] = "\n".join(note_lines)
    code, report = verdict([json.dumps(header).encode(), *lines[1:]])
    assert code == 1 and report["problem"] == "bad_signature"
    bundle.write_bytes(b"\n".join(lines) + b"\n")
    assert (
        invoke(
            db_path, "verify-bundle", str(bundle), "--public-key", key, "--origin", "x/y"
        ).exit_code
        == 3
    )
    # a plan bundle of another scope cannot pass as this one's
    plan_bundle = tmp_path / "plan.bundle"
    out(invoke(db_path, "export", "--plan", "p", "--out", str(plan_bundle)))
    assert (
        out(
            invoke(
                db_path, "verify-bundle", str(plan_bundle), "--public-key", key, "--origin", origin
            )
        )["entries"]
        == 9
    )
    chain.append_action(act(name="late", session_id="mine"))
    before = file_digest(db_path)
    assert_refused(invoke(db_path, "export", "--session", "mine"), "NOT_FOUND")
    assert file_digest(db_path) == before
    assert invoke(db_path, "export").exit_code == 2


# ---------------------------------------------------------------------- upgrade


@FILE_TAMPERED
def test_an_effect_stored_before_its_cause_is_reported_not_hidden(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """An effect recorded before its cause, stored past the rules (the actions' triggers
    dropped, the package journaling it with its writer's clock): the journal keeps it as
    written, and the pair is reported (by validate-chain, and by verify as time running
    backwards), not hidden."""
    from catalytic_cassette.verify import verify_path

    from .conftest import unguarded

    CausalChain(db_path, clock=ManualClock()).close()
    with unguarded(db_path, "cassette_actions"), monkeypatch.context() as patched:
        patched.setattr(CausalChain, "ledger_now", lambda self, conn: self.clock.now_ms())
        clock = SettableClock(START + 1000)
        with CausalChain(db_path, clock=clock) as chain:
            cause = chain.append_action(act(name="cause", session_id="s"))
            clock.now = START
            effect = chain.append_action(
                act(name="effect", caused_by=cause.action_id, session_id="s")
            )
            journal = chain.conn.execute("SELECT seq, body FROM cassette_journal").fetchall()
    with CausalChain(db_path, clock=ManualClock()) as chain:
        assert chain.conn.execute("SELECT seq, body FROM cassette_journal").fetchall() == journal
        assert not chain.validate_causal_chain(effect.action_id)["ok"]
        later = chain.append_action(act(name="later", session_id="s"))
        body = json.loads(
            chain.conn.execute(
                "SELECT body FROM cassette_journal WHERE row_key = ?", (later.action_id,)
            ).fetchone()[0]
        )
        assert list(body["row"]) == list(json.loads(journal[0][1])["row"])  # same columns
    errors = verify_path(str(db_path)).errors
    # the effect, and the next entry: ledger time is the newest row's (the rules assume
    # the dates before it never decreased), so it is dated before the cause
    assert [(f.kind, f.seq) for f in errors] == [("time_backwards", 1), ("time_backwards", 2)]
    report = json.loads(invoke(db_path, "verify", "--session", "s", "--json").stdout)
    assert [f["kind"] for f in report["findings"]] == ["cause_after_effect"]


def test_cli_appends_a_plan_body_and_refuses_a_forged_hash(tmp_path: Path, db_path: Path) -> None:
    started = act("PlanStarted", "triage", metadata={"plan_body": PLAN})
    source = tmp_path / "plan.json"
    source.write_text(json.dumps(started))
    stored = out(invoke(db_path, "action", "append", "--actions", str(source)))
    assert stored[0]["metadata"]["plan_hash"] == sha256_hex(PLAN)
    forged = act(
        "PlanStarted", "triage", plan_id="q", metadata={"plan_body": PLAN, "plan_hash": "f" * 64}
    )
    source.write_text(json.dumps(forged))
    before = file_digest(db_path)
    assert_refused(
        invoke(db_path, "action", "append", "--actions", str(source)), "PLAN_HASH_MISMATCH"
    )
    assert file_digest(db_path) == before
    assert invoke(db_path, "plan", "show", "p").stdout == PLAN


@RAW_SQLITE3
def test_session_verify_reports_a_journal_body_that_is_not_an_entry(
    chain: CausalChain, db_path: Path
) -> None:
    """A body that is not JSON cannot be written (the journal's index evaluates it); one
    that is JSON but no entry leaves the action without a journal entry."""
    mine, _ = _two_sessions(chain)
    with unguarded(db_path) as conn:
        conn.execute("PRAGMA ignore_check_constraints = ON")
        with pytest.raises(sqlite3.OperationalError, match="malformed JSON"):
            conn.execute(
                "UPDATE cassette_journal SET body = 'not json' WHERE row_key = ?",
                (mine[0].action_id,),
            )
        conn.execute(
            "UPDATE cassette_journal SET body = '[1]' WHERE row_key = ?", (mine[0].action_id,)
        )
    result = invoke(db_path, "verify", "--session", "mine", "--json")
    assert result.exit_code == 1 and "Traceback" not in result.stderr
    findings = json.loads(result.stdout)["findings"]
    assert [(f["kind"], f["action_id"]) for f in findings] == [("unjournaled", mine[0].action_id)]


def _bundle(db_path: Path, scope: str, value: str) -> list[bytes]:
    """A bundle's lines, read as `cassette export` reads either backend."""
    from catalytic_cassette.bundle import bundle_lines

    with backends.proof_source(db_path) as source:
        return list(bundle_lines(source, scope, value))


def test_session_verify_and_bundles_through_the_api(
    chain: CausalChain, db_path: Path, tmp_path: Path
) -> None:
    from catalytic_cassette.bundle import verify_bundle
    from catalytic_cassette.session_verify import verify_session_path
    from catalytic_cassette.signing import generate, load_private, load_public

    mine, _ = _two_sessions(chain)
    report = verify_session_path(str(db_path), "mine")
    assert report.ok and report.actions == 5 and report.findings == []
    with pytest.raises(CassetteError) as excinfo:
        verify_session_path(str(db_path), "nobody")
    refused(excinfo, ErrorCode.NOT_FOUND)
    with pytest.raises(CassetteError) as excinfo:
        _bundle(db_path, "session_id", "mine")  # nothing sealed yet
    refused(excinfo, ErrorCode.NOT_FOUND)
    private, public = generate(str(tmp_path / "api"))
    seal = chain.seal(load_private(private))
    data = b"\n".join(_bundle(db_path, "session_id", "mine")) + b"\n"
    key = load_public(public)
    checked = verify_bundle(data, key, seal.origin)
    assert checked["ok"] and checked["entries"] == 5 and checked["size"] == seal.tree_size
    expected = [
        backends.rows(
            db_path,
            "SELECT seq FROM cassette_journal WHERE tbl = 'cassette_actions' AND row_key = ?",
            a.action_id,
        )[0][0]
        for a in mine
    ]
    assert [json.loads(line)["seq"] for line in data.splitlines()[1:]] == expected
    assert verify_bundle(b"", key, seal.origin)["problem"] == "malformed"
    assert verify_bundle(data, key, "other/origin")["ok"] is False
    with pytest.raises(CassetteError) as excinfo:
        _bundle(db_path, "intent_id", "i")
    refused(excinfo, ErrorCode.INVALID_ARGUMENT)
