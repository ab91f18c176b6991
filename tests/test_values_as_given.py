"""A value is stored as given or refused: a JSON integer beyond 64 bits is INVALID_PAYLOAD on
every input path (text and Python values, API and CLI, both backends), never a rounded
double; the ledger is unchanged by the refusal (LAW 3 rule 12)."""

from __future__ import annotations

import json
import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalytic_cassette import CassetteError, ErrorCode, MessageCassette
from catalytic_cassette.chain import CausalChain
from catalytic_cassette.cli import cli
from catalytic_cassette.errors import translate
from catalytic_cassette.payloads import MAX_WRITTEN_DEPTH, dumps, loads, parse_json

from .backends import Ledger
from .conftest import action_dict, file_digest, unguarded, write_journal
from .test_audit_attacks import look_alike

pytestmark = pytest.mark.both_backends

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
wide_integers = st.integers(INT64_MAX + 1, 2**200) | st.integers(-(2**200), INT64_MIN - 1)
leaves = (
    st.none()
    | st.booleans()
    | st.integers(INT64_MIN, INT64_MAX)
    | st.floats(allow_nan=False, allow_infinity=False)
    # digits in strings and keys are text, never numbers: they must not be refused
    | st.text(st.sampled_from('0123456789e.-"\\ab'), max_size=25)
)
documents = st.recursive(
    leaves,
    lambda children: (
        st.lists(children, max_size=3)
        | st.dictionaries(st.text(st.sampled_from('01234567890"\\k'), max_size=21), children)
    ),
    max_leaves=10,
)


@st.composite
def with_one_wide_integer(draw: st.DrawFn) -> tuple[dict[str, Any], int]:
    """A JSON object with an integer beyond 64 bits placed at a drawn depth."""
    wide = draw(wide_integers)
    value: Any = wide
    for kind in draw(st.lists(st.sampled_from(["list", "dict"]), max_size=8)):
        sibling = draw(leaves)
        value = [sibling, value] if kind == "list" else {"s": sibling, draw(st.text()): value}
    return {"v": value, "ok": draw(documents)}, wide


def text_of(document: Any) -> str:
    """JSON text as Python's json writes it: every integer exactly, as given."""
    return json.dumps(document)


# ------------------------------------------------------------------ the codec


@settings(max_examples=50, deadline=None)
@given(with_one_wide_integer())
def test_a_wide_integer_anywhere_in_text_is_refused(drawn: tuple[dict[str, Any], int]) -> None:
    document, wide = drawn
    with pytest.raises(CassetteError) as refused:
        parse_json(text_of(document))
    assert refused.value.code is ErrorCode.INVALID_PAYLOAD
    assert str(wide) in refused.value.message


@settings(max_examples=50, deadline=None)
@given(with_one_wide_integer())
def test_a_wide_integer_anywhere_in_a_value_is_refused(drawn: tuple[dict[str, Any], int]) -> None:
    with pytest.raises(CassetteError) as refused:
        dumps(drawn[0])
    assert refused.value.code is ErrorCode.INVALID_PAYLOAD


@settings(max_examples=50, deadline=None)
@given(documents)
def test_every_value_within_64_bits_reads_back_as_given(document: Any) -> None:
    """The same walk accepts every other document, digits in strings and keys included,
    and what it stores decodes to the value given."""
    assert parse_json(text_of(document)) == document
    assert loads(dumps(document)) == document


@pytest.mark.parametrize("wide", [INT64_MAX + 1, 2**64 - 1, 2**64, INT64_MIN - 1, 2**70])
def test_the_64_bit_edges(wide: int) -> None:
    for text in (f"[{wide}]", f'{{"a": {wide}}}', f'{{"{wide}": {wide}}}'):
        with pytest.raises(CassetteError) as refused:
            parse_json(text)
        assert refused.value.code is ErrorCode.INVALID_PAYLOAD
    with pytest.raises(CassetteError) as refused:
        dumps({"a": wide})
    assert refused.value.code is ErrorCode.INVALID_PAYLOAD
    for edge in (INT64_MAX, INT64_MIN):
        assert parse_json(f'{{"a":[{edge}]}}') == {"a": [edge]}
        assert dumps({"a": edge}) == f'{{"a":{edge}}}'
    # a real with many digits is a double, as JSON says: read as one, never refused
    assert parse_json("[1180591620717411303424.0, 1e21]") == [1.1805916207174113e21, 1e21]


# ------------------------------------------------------------------ the API


@pytest.fixture
def ledger(backend: Ledger) -> Ledger:
    """A ledger with a leased step (a receipt can be refused) and a started plan."""
    with backend.open() as cassette:
        cassette.post_message({"a": 1}, "r", "USER")
        cassette.claim_step("r", "w", 600)
    with CausalChain(backend.target, clock=backend.clock) as chain:
        chain.append_action(action_dict("PlanStarted", "plan"))
    return backend


def _api_calls(target: str, clock: Any, value: dict[str, Any]) -> list[Any]:
    def post() -> Any:
        with MessageCassette(target, clock=clock) as cassette:
            return cassette.post_message(value, "r", "USER")

    def complete() -> Any:
        with MessageCassette(target, clock=clock) as cassette:
            return cassette.complete_step("r", 1, "w", 1, value, "SUCCESS")

    def chain_call(name: str, *args: Any) -> Any:
        with CausalChain(target, clock=clock) as chain:
            return getattr(chain, name)(*args)

    act = action_dict("CapabilityCall", "call")
    return [
        post,
        complete,
        lambda: chain_call("append_action", {**act, "arguments": [value]}),
        lambda: chain_call("append_action", {**act, "result": value}),
        lambda: chain_call("append_action", {**act, "metadata": value}),
        lambda: chain_call("append_actions", [act, {**act, "result": [value]}]),
        lambda: chain_call("save_checkpoint", "p", value),
        lambda: chain_call("pause", "p", value),
    ]


@settings(
    max_examples=4, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)
@given(with_one_wide_integer())
def test_the_api_refuses_a_wide_integer_and_changes_nothing(
    ledger: Ledger, drawn: tuple[dict[str, Any], int]
) -> None:
    before = file_digest(ledger.target)  # type: ignore[arg-type]
    for call in _api_calls(ledger.target, ledger.clock, drawn[0]):
        with pytest.raises(CassetteError) as refused:
            call()
        assert refused.value.code is ErrorCode.INVALID_PAYLOAD, refused.value
    assert file_digest(ledger.target) == before  # type: ignore[arg-type]


def test_the_64_bit_edges_are_stored_as_given(ledger: Ledger) -> None:
    edges = {"max": INT64_MAX, "min": INT64_MIN, "list": [INT64_MAX, INT64_MIN]}
    with ledger.open() as cassette:
        cassette.post_message(edges, "edges", "USER")
        assert cassette.claim_step("edges", "w", 60)["payload"] == edges
    stored = ledger.scalar("SELECT payload_json FROM cassette_messages WHERE run_id = 'edges'")
    assert stored == dumps(edges) and json.loads(stored) == edges


# ------------------------------------------------------------------ the CLI

DOCUMENT = '{"a": [1, {"b": 1180591620717411303424}], "c": "18446744073709551616"}'


def _cli_inputs(tmp_path: Path) -> dict[str, list[str]]:
    return {
        "post": ["post", "--run-id", "r", "--source", "USER", "--payload"],
        "complete": [
            *("complete", "--run-id", "r", "--step", "1", "--worker", "w", "--token", "1"),
            *("--outcome", "SUCCESS", "--receipt"),
        ],
        "action": ["action", "append", "--actions"],
        "checkpoint": ["checkpoint", "save", "--plan", "p", "--context"],
    }


def _as_action(document: str) -> str:
    act = json.dumps(action_dict("CapabilityCall", "call"))
    return f'[{act}, {act[:-1]}, "result": {document}}}]'


def test_each_cli_input_refuses_a_wide_integer(ledger: Ledger, tmp_path: Path) -> None:
    """Each JSON option, from stdin and from a file."""
    before = file_digest(ledger.target)  # type: ignore[arg-type]
    for command, args in _cli_inputs(tmp_path).items():
        text = _as_action(DOCUMENT) if command == "action" else DOCUMENT
        source = tmp_path / "input.json"
        source.write_text(text)
        for result in (
            CliRunner().invoke(cli, ["--db", ledger.target, *args, str(source)]),
            CliRunner().invoke(cli, ["--db", ledger.target, *args, "-"], input=text),
        ):
            case = (command, result.exit_code, result.stdout, result.stderr)
            assert result.exit_code == 1 and result.stdout == "", case
            assert result.stderr.startswith("error: INVALID_PAYLOAD: "), case
            assert "1180591620717411303424" in result.stderr, case
            assert len(result.stderr.splitlines()) == 1, case
    assert file_digest(ledger.target) == before  # type: ignore[arg-type]


@pytest.mark.sqlite_only(reason="the attacker rewrites the file's journal with its hashes")
def test_copy_refuses_a_journal_holding_a_wide_integer(ledger: Ledger, tmp_path: Path) -> None:
    """A source whose journal was rewritten (hashes recomputed) to hold what the law
    refuses: the destination's law refuses it, never a rounded number carried over."""
    wide = '{"a":1180591620717411303424}'
    with unguarded(Path(ledger.target)) as conn:
        bodies = [
            body for (body,) in conn.execute("SELECT body FROM cassette_journal ORDER BY seq")
        ]
        first = json.loads(bodies[0])
        assert first["table"] == "cassette_messages"
        first["row"]["payload_json"] = wide
        bodies[0] = json.dumps(first, separators=(",", ":"))
        write_journal(conn, bodies)
        conn.execute("UPDATE cassette_messages SET payload_json = ? WHERE message_id = 1", (wide,))
    dest = tmp_path / "copy.db"
    result = CliRunner().invoke(cli, ["copy", ledger.target, str(dest)])
    assert result.exit_code == 1, (result.stdout, result.stderr)
    assert result.stderr.startswith("error: INVALID_PAYLOAD: "), result.stderr
    assert len(result.stderr.splitlines()) == 1


def _nested(levels: int) -> str:
    return '{"a":' + "[" * (levels - 1) + "]" * (levels - 1) + "}"


# Text SQLite accepts as JSON (or that some parser would) and no reader gets back as given.
UNSTORABLE_TEXT = {
    "nan": '{"a": NaN}',
    "infinity": '{"a": [Infinity]}',
    "minus-infinity": '{"a": -Infinity}',
    "overflow": '{"a": 1e400}',
    "minus-overflow": '{"a": [-1e400]}',
    "high-surrogate": '{"a": "\\ud800"}',
    "low-surrogate-key": '{"\\udc00": 1}',
    "deeper-than-1024": _nested(1025),
    "deeper-than-the-encoder": _nested(MAX_WRITTEN_DEPTH + 1),
}


def test_each_value_no_reader_gets_back_is_refused_through_the_cli(ledger: Ledger) -> None:
    """Through ``post --payload -`` on both backends: the same code as the law's."""
    before = file_digest(ledger.target)  # type: ignore[arg-type]
    for name, text in UNSTORABLE_TEXT.items():
        result = CliRunner().invoke(
            cli, ["--db", ledger.target, *_cli_inputs(Path())["post"], "-"], input=text
        )
        case = (name, result.exit_code, result.stdout, result.stderr)
        assert result.exit_code == 1 and result.stdout == "", case
        assert result.stderr.startswith("error: INVALID_PAYLOAD: "), case
    assert file_digest(ledger.target) == before  # type: ignore[arg-type]


def test_each_python_value_no_reader_gets_back_is_refused(ledger: Ledger) -> None:
    values = {
        "surrogate": {"a": "\ud800"},
        "surrogate-key": {"\udc00": 1},
        "nan": {"a": math.nan},
        "infinity": {"a": [-math.inf]},
        "too-deep": json.loads(_nested(MAX_WRITTEN_DEPTH + 1)),
    }
    before = file_digest(ledger.target)  # type: ignore[arg-type]
    for name, value in values.items():
        for call in _api_calls(ledger.target, ledger.clock, {"v": value}):
            with pytest.raises(CassetteError) as refused:
                call()
            assert refused.value.code is ErrorCode.INVALID_PAYLOAD, (name, refused.value)
    assert file_digest(ledger.target) == before  # type: ignore[arg-type]


def _raw_message(ledger: Ledger, payload: str) -> ErrorCode | None:
    """A message inserted by the strongest SQL client of each backend: on SQLite one with
    the package's functions and TEMP triggers (it journals), on PostgreSQL the owner."""
    insert = (
        "INSERT INTO cassette_messages (run_id, source, payload_json{}) VALUES ('raw', 'USER', ?{})"
    )
    if ledger.postgresql:
        return ledger.raw_sql(insert.format("", ""), payload)
    conn = look_alike(Path(ledger.target), ledger.now_ms())
    try:
        conn.execute(insert.format(", created_at", ", ?"), (payload, ledger.now_ms()))
    except sqlite3.Error as error:
        return translate(error).code
    finally:
        conn.close()
    return None


def test_the_law_refuses_the_same_text_for_any_connection(ledger: Ledger) -> None:
    """What the API refuses as text, the SQL refuses from a raw connection with the same
    code (SQLite: a client with the package's functions; PostgreSQL: the owner), except a
    nesting the law reads but the encoder does not write."""
    texts = {
        **UNSTORABLE_TEXT,
        "wide": '{"a": [1, {"b": 1180591620717411303424}]}',
        "wide-unsigned": '{"a": 18446744073709551615}',
        "wide-negative": '{"a": -9223372036854775809}',
    }
    for name, text in texts.items():
        refused = _raw_message(ledger, text)
        if name == "deeper-than-the-encoder":
            assert refused is None
        else:
            assert refused is ErrorCode.INVALID_PAYLOAD, (name, refused)
    assert ledger.count("cassette_messages", "run_id = 'raw'") == 1
