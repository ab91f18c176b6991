"""Every edge of the API a coded refusal (issue 13): no Python error escapes, the file is
unchanged by a refusal."""

from __future__ import annotations

import math
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalytic_cassette import CassetteError, ErrorCode, ManualClock, MessageCassette
from catalytic_cassette.chain import CausalChain
from catalytic_cassette.payloads import dumps

from .backends import Ledger
from .conftest import action_dict, file_digest

pytestmark = pytest.mark.both_backends

NON_FINITE = [math.nan, math.inf, -math.inf]
LONE_SURROGATE = "run-\udcff"  # what os.fsdecode makes of the byte 0xff

finite_json = st.recursive(
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | st.text(st.characters(blacklist_categories=["Cs"]), max_size=5),
    lambda children: (
        st.lists(children, max_size=3) | st.dictionaries(st.text(max_size=3), children, max_size=3)
    ),
    max_leaves=12,
)


@st.composite
def with_one_non_finite(draw: st.DrawFn) -> Any:
    """A JSON value with a NaN or an infinity placed at a drawn position."""
    bad = draw(st.sampled_from(NON_FINITE))
    value = draw(finite_json)
    path = draw(st.lists(st.sampled_from(["list", "dict"]), max_size=4))
    for kind in path:
        value = [value, bad] if kind == "list" else {"k": value, "bad": bad}
    return {"payload": value, "bad": bad} if not path else {"payload": value}


@given(with_one_non_finite())
def test_a_non_finite_number_anywhere_is_refused(value: Any) -> None:
    with pytest.raises(CassetteError) as refused:
        dumps(value)
    assert refused.value.code is ErrorCode.INVALID_PAYLOAD


@given(finite_json)
def test_finite_values_encode_and_null_stays_null(value: Any) -> None:
    import orjson

    assert orjson.loads(dumps({"v": value})) == {"v": value}


@pytest.fixture
def ledger(backend: Ledger) -> Path:
    path: Any = backend.target if backend.postgresql else Path(backend.target)
    with CausalChain(path, clock=backend.clock) as chain:
        chain.append_action(action_dict("PlanStarted", "plan"))
    with MessageCassette(path, clock=backend.clock) as cassette:
        cassette.post_message({"x": 1}, "r", "USER")
    return path


def refused(path: Path, call: Any, code: ErrorCode) -> None:
    before = file_digest(path)
    with pytest.raises(CassetteError) as error:
        call()
    assert error.value.code is code, error.value
    assert file_digest(path) == before


@pytest.mark.parametrize("bad", NON_FINITE, ids=["nan", "inf", "-inf"])
class TestNonFiniteEverywhereJsonEnters:
    def test_payload(self, ledger: Path, bad: float) -> None:
        with MessageCassette(ledger) as cassette:
            refused(
                ledger,
                lambda: cassette.post_message({"x": bad}, "r", "USER"),
                ErrorCode.INVALID_PAYLOAD,
            )

    def test_receipt(self, ledger: Path, bad: float) -> None:
        with MessageCassette(ledger) as cassette:
            step = cassette.claim_step("r", "w")
            refused(
                ledger,
                lambda: cassette.complete_step(
                    "r", step["step_id"], "w", step["fencing_token"], {"score": [bad]}, "SUCCESS"
                ),
                ErrorCode.INVALID_PAYLOAD,
            )

    @pytest.mark.parametrize("field", ["arguments", "result", "metadata"])
    def test_action_fields(self, ledger: Path, bad: float, field: str) -> None:
        value = [bad] if field == "arguments" else {"v": bad}
        with CausalChain(ledger) as chain:
            action = {**action_dict("InternalStep", "s"), field: value}
            refused(ledger, lambda: chain.append_action(action), ErrorCode.INVALID_PAYLOAD)

    def test_checkpoint(self, ledger: Path, bad: float) -> None:
        with CausalChain(ledger) as chain:
            refused(
                ledger, lambda: chain.save_checkpoint("p", {"v": bad}), ErrorCode.INVALID_PAYLOAD
            )


def test_nan_and_null_are_no_longer_the_same_idempotent_post(ledger: Path) -> None:
    with MessageCassette(ledger) as cassette:
        cassette.post_message({"x": None}, "r2", "USER", "key")
        refused(
            ledger,
            lambda: cassette.post_message({"x": math.nan}, "r2", "USER", "key"),
            ErrorCode.INVALID_PAYLOAD,
        )


class TestIdsThatAreNotText:
    @pytest.mark.parametrize(
        ("call", "code"),
        [
            (lambda c: c.post_message({}, LONE_SURROGATE, "USER"), ErrorCode.INVALID_RUN_ID),
            (
                lambda c: c.post_message({}, "r", "USER", LONE_SURROGATE),
                ErrorCode.INVALID_IDEMPOTENCY_KEY,
            ),
            (lambda c: c.claim_step("r", LONE_SURROGATE), ErrorCode.INVALID_WORKER),
            (lambda c: c.status(LONE_SURROGATE), ErrorCode.INVALID_RUN_ID),
            (lambda c: c.requeue(LONE_SURROGATE), ErrorCode.INVALID_RUN_ID),
            (lambda c: c.get_step(2**64), ErrorCode.STEP_NOT_FOUND),
            (lambda c: c.get_step(-(2**63) - 1), ErrorCode.STEP_NOT_FOUND),
            (lambda c: c.get_step(object()), ErrorCode.STEP_NOT_FOUND),
            (
                lambda c: c.complete_step("r", 2**64, "w", 1, {}, "SUCCESS"),
                ErrorCode.STEP_NOT_FOUND,
            ),
        ],
    )
    def test_message_cassette(self, ledger: Path, call: Any, code: ErrorCode) -> None:
        with MessageCassette(ledger) as cassette:
            refused(ledger, lambda: call(cassette), code)

    @pytest.mark.parametrize(
        ("call", "code"),
        [
            (lambda c: c.get_action(LONE_SURROGATE), ErrorCode.INVALID_ARGUMENT),
            (lambda c: c.actions_for_plan(LONE_SURROGATE), ErrorCode.INVALID_ARGUMENT),
            (lambda c: c.build_causal_chain(LONE_SURROGATE), ErrorCode.INVALID_ARGUMENT),
            (lambda c: c.plan_status(LONE_SURROGATE), ErrorCode.INVALID_ARGUMENT),
            (
                lambda c: c.append_action(
                    {**action_dict("PlanStarted", "x"), "plan_id": LONE_SURROGATE}
                ),
                ErrorCode.INVALID_PLAN_ID,
            ),
            (
                lambda c: c.append_action(
                    {**action_dict("PlanStarted", "x", plan="q"), "session_id": LONE_SURROGATE}
                ),
                ErrorCode.INVALID_SESSION_ID,
            ),
            (
                lambda c: c.append_action(
                    {**action_dict("PlanStarted", "x", plan="q"), "metadata": {LONE_SURROGATE: 1}}
                ),
                ErrorCode.INVALID_PAYLOAD,
            ),
            (lambda c: list(c.iter_actions(offset=-1)), ErrorCode.INVALID_ARGUMENT),
        ],
    )
    def test_causal_chain(self, ledger: Path, call: Any, code: ErrorCode) -> None:
        with CausalChain(ledger) as chain:
            refused(ledger, lambda: call(chain), code)


def test_verify_cassette_on_a_malformed_file_is_a_coded_refusal(tmp_path: Path) -> None:
    path = tmp_path / "ledger.db"
    with CausalChain(path, clock=ManualClock()) as chain:
        chain.append_actions([action_dict("InternalStep", f"s{n}") for n in range(400)])
    with MessageCassette(path) as cassette:
        conn = sqlite3.connect(path)
        page_size = conn.execute("PRAGMA page_size").fetchone()[0]
        conn.close()
        with path.open("r+b") as handle:  # garble every page after the first few
            size = path.stat().st_size
            for offset in range(page_size * 4, size, page_size):
                handle.seek(offset)
                handle.write(b"\xa5" * page_size)
        try:
            report = cassette.verify_cassette()
        except CassetteError as error:
            assert error.code in {ErrorCode.DATABASE_ERROR, ErrorCode.NOT_A_CASSETTE}
        else:
            assert not report.ok


@settings(max_examples=30, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.text(min_size=1, max_size=8))
def test_any_text_id_is_a_coded_answer_never_a_python_error(ledger: Path, text: str) -> None:
    with CausalChain(ledger, read_only=True) as chain:
        try:
            chain.get_action(text)
        except CassetteError as error:
            assert error.code in {ErrorCode.NOT_FOUND, ErrorCode.INVALID_ARGUMENT}
