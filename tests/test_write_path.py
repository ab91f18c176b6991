"""The lean append path (issue 12): a batch inserted by chunks of rows per statement gives
the same rows, journal, returned actions and refusals as the same items appended one by one;
ids, field checks and returned values are those of the dataclass path they replace."""

from __future__ import annotations

import shutil
import tempfile
import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from catalytic_cassette import CassetteError, ErrorCode, ManualClock, MessageCassette
from catalytic_cassette.actions import (
    ACTION_TYPES,
    CATEGORIES,
    Action,
    coerce,
    format_v4,
    new_action_id,
)
from catalytic_cassette.chain import CausalChain

from .backends import DATABASE_ERRORS, Ledger, package_idle
from .conftest import file_digest

pytestmark = pytest.mark.both_backends
TWINS = pytest.mark.sqlite_only(
    reason="twin copies of one SQLite file per Hypothesis example (one PostgreSQL ledger"
    " per example would be a database clone each; the refusals below run on both)"
)

MISSING_ID = "ffffffff-ffff-4fff-bfff-ffffffffffff"
NAMES = st.text(  # what SQLite counts as 1-8 characters: no NUL, no lone surrogate
    st.characters(codec="utf-8", min_codepoint=1, exclude_categories=("Cs",)),
    min_size=1,
    max_size=8,
)
JSON_LEAVES = (
    st.none()
    | st.booleans()
    | st.integers(-(2**63), 2**63 - 1)
    | st.floats(allow_nan=False, allow_infinity=False)
    | NAMES
)
JSON = st.recursive(
    JSON_LEAVES,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(NAMES, inner, max_size=3),
    max_leaves=6,
)


@st.composite
def actions(draw: st.DrawFn, count: int) -> list[dict[str, Any]]:
    """`count` valid action dicts; some name an earlier one as parent or cause."""
    items: list[dict[str, Any]] = []
    randoms = st.binary(min_size=16, max_size=16)
    ids = draw(st.lists(randoms, min_size=count, max_size=count, unique_by=format_v4))
    for index, random in enumerate(ids):
        action_id = format_v4(random)
        item: dict[str, Any] = {
            "action_id": action_id,
            "plan_id": draw(st.sampled_from(["plan-a", "plan-b"])),
            "intent_id": draw(NAMES),
            "action_type": draw(st.sampled_from(["InternalStep", "CapabilityCall"])),
            "function_name": draw(NAMES),
        }
        optional: dict[str, Any] = {
            "session_id": NAMES,
            "arguments": st.lists(JSON, max_size=3),
            "result": JSON,
            "success": st.booleans(),
            "error_message": NAMES,
            "cost": st.integers(0, 10**6) | st.floats(0, 10**6, allow_nan=False),
            "duration_ms": st.integers(0, 10**9),
            "metadata": st.dictionaries(
                st.sampled_from(["note", "intent_id", "tags"]), JSON, max_size=2
            ),
            "rationale": NAMES,
            "category": st.sampled_from(CATEGORIES),
        }
        for name, strategy in optional.items():
            if draw(st.booleans()):
                item[name] = draw(strategy)
        if index and draw(st.booleans()):
            item["parent_action_id"] = items[draw(st.integers(0, index - 1))]["action_id"]
        if index and draw(st.booleans()):
            item["caused_by"] = items[draw(st.integers(0, index - 1))]["action_id"]
        items.append(item)
    return items


@pytest.fixture(scope="module")
def empty_ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One empty ledger, copied for each side: both then share their ledger_id."""
    path = tmp_path_factory.mktemp("template") / "empty.db"
    CausalChain(path, clock=ManualClock()).close()
    return path


@contextmanager
def twin_ledgers(template: Path) -> Iterator[tuple[CausalChain, CausalChain]]:
    with tempfile.TemporaryDirectory() as folder:
        paths = [Path(folder) / name for name in ("together.db", "one_by_one.db")]
        for path in paths:
            shutil.copyfile(template, path)
        with (
            CausalChain(paths[0], clock=ManualClock(), durability="normal") as together,
            CausalChain(paths[1], clock=ManualClock(), durability="normal") as one_by_one,
        ):
            yield together, one_by_one


def ledger_rows(chain: CausalChain) -> list[str]:
    """Every row of every table of the ledger (the journal and tree included), as SQL."""
    return list(chain.conn.iterdump())


def append_each(chain: CausalChain, items: list[dict[str, Any]]) -> list[Action]:
    return [chain.append_action(item) for item in items]


@pytest.mark.slow
@TWINS
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data(), count=st.integers(2, 12) | st.integers(30, 100))  # (chunks of 32)
def test_a_batch_equals_its_items_appended_one_by_one(
    empty_ledger: Path, data: st.DataObject, count: int
) -> None:
    items = data.draw(actions(count))
    with twin_ledgers(empty_ledger) as (together, one_by_one):
        stored = together.append_actions(items)
        expected = append_each(one_by_one, items)
        assert stored == expected
        assert [a.action_seq for a in stored] == list(range(1, count + 1))
        assert stored == [together.get_action(a.action_id) for a in stored]
        assert ledger_rows(together) == ledger_rows(one_by_one)


# What the database refuses (not Python): the refused item is named by its index.
SQL_REFUSALS = {
    "parent missing": ({"parent_action_id": MISSING_ID}, ErrorCode.REFERENCE_MISSING),
    "cause missing": ({"caused_by": MISSING_ID}, ErrorCode.REFERENCE_MISSING),
    "id reused": ({"action_id": "same"}, ErrorCode.APPEND_ONLY),
}


@pytest.mark.slow
@TWINS
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    data=st.data(),
    count=st.integers(2, 8) | st.integers(33, 100),  # a refusal inside a chunk of 32, or after
    refusal=st.sampled_from(sorted(SQL_REFUSALS)),
)
def test_a_refused_item_is_named_by_its_index_as_one_by_one(
    empty_ledger: Path, data: st.DataObject, count: int, refusal: str
) -> None:
    items = data.draw(actions(count))
    bad = data.draw(st.integers(0 if refusal != "id reused" else 1, count - 1))
    change, code = SQL_REFUSALS[refusal]
    items[bad] = {k: v for k, v in items[bad].items() if k not in ("parent_action_id", "caused_by")}
    if refusal == "id reused":
        items[bad]["action_id"] = items[data.draw(st.integers(0, bad - 1))]["action_id"]
    else:
        items[bad].update(change)
    for later in items[bad + 1 :]:  # nothing after the refused item may point at it
        for link in ("parent_action_id", "caused_by"):
            if later.get(link) == items[bad]["action_id"] and refusal != "id reused":
                del later[link]
    seed = {
        "plan_id": "seed",
        "intent_id": "i",
        "action_type": "InternalStep",
        "function_name": "f",
    }
    with twin_ledgers(empty_ledger) as (together, one_by_one):
        for side in (together, one_by_one):  # the batch does not start the ledger
            side.append_action({**seed, "action_id": MISSING_ID.replace("f", "e")})
        before = ledger_rows(together)
        with pytest.raises(CassetteError) as batch_refusal:
            together.append_actions(items)
        assert batch_refusal.value.code is code, batch_refusal.value
        assert batch_refusal.value.detail["index"] == bad
        assert ledger_rows(together) == before
        assert not together.conn.in_transaction
        append_each(one_by_one, items[:bad])
        with pytest.raises(CassetteError) as item_refusal:
            one_by_one.append_action(items[bad])
        assert item_refusal.value.code is code
        assert item_refusal.value.message == batch_refusal.value.message


def _plain(n: int) -> dict[str, Any]:
    return {
        "plan_id": "p",
        "intent_id": "i",
        "action_type": "InternalStep",
        "function_name": f"f{n}",
    }


@pytest.mark.parametrize("refusal", sorted(SQL_REFUSALS))
def test_a_refused_item_is_named_by_its_index_on_either_backend(
    backend: Ledger, refusal: str
) -> None:
    """The Hypothesis test above, by hand on one ledger of either backend: inside the first
    chunk of 32 and after it, the batch is refused naming the item, nothing is written, and
    the same items one by one meet the same refusal at that item."""
    change, code = SQL_REFUSALS[refusal]
    items = [{**_plain(n), "action_id": new_action_id()} for n in range(40)]
    with CausalChain(backend.target, clock=backend.clock) as chain:
        chain.append_action(_plain(-1))  # the batch does not start the ledger
        before = backend.dump()
        for bad in (5, 35):
            batch = [dict(item) for item in items]
            batch[bad].update(change)
            if refusal == "id reused":
                batch[bad]["action_id"] = batch[bad - 1]["action_id"]
            with pytest.raises(CassetteError) as batch_refusal:
                chain.append_actions(batch)
            assert batch_refusal.value.code is code, batch_refusal.value
            assert batch_refusal.value.detail["index"] == bad
            assert package_idle(chain)
            assert backend.dump() == before
        for item in batch[:bad]:
            chain.append_action(item)
        with pytest.raises(CassetteError) as item_refusal:
            chain.append_action(batch[bad])
        assert item_refusal.value.code is code
        assert item_refusal.value.message == batch_refusal.value.message


def test_a_refused_batch_leaves_the_file_unchanged(backend: Ledger, db_path: Path) -> None:
    path = db_path
    with CausalChain(path, clock=backend.clock) as chain:
        chain.append_action(
            {"plan_id": "p", "intent_id": "i", "action_type": "InternalStep", "function_name": "f"}
        )
        digest = file_digest(path)
        batch = [
            {"plan_id": "p", "intent_id": "i", "action_type": "InternalStep", "function_name": "f"}
            for _ in range(500)
        ]
        batch[321]["caused_by"] = MISSING_ID
        with pytest.raises(CassetteError) as refused:
            chain.append_actions(batch)
        assert refused.value.code is ErrorCode.REFERENCE_MISSING
        assert refused.value.detail["index"] == 321
        assert isinstance(refused.value.__cause__, DATABASE_ERRORS)
        assert file_digest(path) == digest
        assert chain.append_actions(batch[:2])[1].action_seq == 3  # the ledger goes on


def test_a_returned_action_shares_nothing_with_its_input(backend: Ledger) -> None:
    """As before the lean path: the stored metadata is decoded from what was stored."""
    metadata: dict[str, Any] = {"tags": ("a", "b")}
    item = {
        "plan_id": "p",
        "intent_id": "i",
        "action_type": "InternalStep",
        "function_name": "f",
        "metadata": metadata,
    }
    with CausalChain(backend.target, clock=backend.clock) as chain:
        for stored in (chain.append_action(item), *chain.append_actions([dict(item)] * 2)):
            assert stored.metadata == {"tags": ["a", "b"]}
            assert stored.metadata is not metadata
            assert stored == chain.get_action(stored.action_id)
    assert metadata == {"tags": ("a", "b")}
    assert set(item) == {"plan_id", "intent_id", "action_type", "function_name", "metadata"}


@given(st.binary(min_size=16, max_size=16))
def test_action_ids_are_spelt_as_uuid4(random: bytes) -> None:
    assert format_v4(random) == str(uuid.UUID(bytes=random, version=4))


def test_new_action_ids_are_random_version_4() -> None:
    made = {new_action_id() for _ in range(1000)}
    assert len(made) == 1000
    assert all(uuid.UUID(one).version == 4 and str(uuid.UUID(one)) == one for one in made)
    assert uuid.UUID(Action("p", "i", "InternalStep", "f").action_id).version == 4


FIELD_VALUES: dict[str, Any] = {
    "plan_id": NAMES | st.none() | st.integers(),
    "intent_id": NAMES | st.just("\udc80"),
    "action_type": st.sampled_from(ACTION_TYPES) | st.just("Hack"),
    "function_name": NAMES | st.just(""),
    "action_id": st.just(MISSING_ID) | st.just(MISSING_ID.upper()) | st.just("x") | st.none(),
    "parent_action_id": st.none() | NAMES | st.just("\udcff"),
    "session_id": st.none() | NAMES | st.integers(),
    "arguments": st.none() | st.lists(st.integers(), max_size=2) | st.just({"a": 1}),
    "result": JSON,
    "success": st.booleans() | st.just(1),
    "error_message": st.none() | NAMES,
    "cost": st.integers(-1, 3) | st.floats() | st.just(True) | st.just("1"),
    "duration_ms": st.integers(-1, 3) | st.just(2**64) | st.just(1.0),
    "metadata": st.dictionaries(NAMES, JSON, max_size=2) | st.just([]),
    "caused_by": st.none() | NAMES,
    "rationale": st.none() | NAMES | st.just(b"x"),
    "category": st.none() | st.sampled_from(CATEGORIES) | st.just("other"),
}


@settings(max_examples=300)
@given(
    st.fixed_dictionaries(
        {k: FIELD_VALUES[k] for k in ("plan_id", "intent_id", "action_type", "function_name")},
        optional={
            k: v
            for k, v in FIELD_VALUES.items()
            if k not in ("plan_id", "intent_id", "action_type", "function_name")
        },
    )
)
def test_a_dict_is_checked_as_the_dataclass_it_names(item: dict[str, Any]) -> None:
    """The dict path never builds the dataclass first; it accepts and refuses exactly
    what building it and checking that would (same code, same message)."""
    as_dataclass = Action(**item)
    outcomes = []
    for value in (item, as_dataclass):
        try:
            outcomes.append(coerce(value))
        except CassetteError as error:
            outcomes.append((error.code, error.message))
    if isinstance(outcomes[0], Action) and "action_id" not in item:
        outcomes[0] = Action(**{**outcomes[0].to_dict(), "action_id": as_dataclass.action_id})
    assert outcomes[0] == outcomes[1]


@pytest.mark.parametrize(
    ("item", "message"),
    [
        (
            {
                "plan_id": "p",
                "intent_id": "i",
                "action_type": "InternalStep",
                "function_name": "f",
                "colour": 1,
                "size": 2,
            },
            "unknown action fields: ['colour', 'size']",
        ),
        (
            {"plan_id": "p", "function_name": "f"},
            "missing action fields: ['intent_id', 'action_type']",
        ),
    ],
)
def test_unknown_and_missing_fields_are_named(item: dict[str, Any], message: str) -> None:
    with pytest.raises(CassetteError) as refused:
        coerce(item)
    assert refused.value.code is ErrorCode.INVALID_PAYLOAD
    assert refused.value.message == message


# --------------------------------------------------- posts, claims, completes

STEP_PAYLOAD = st.fixed_dictionaries({"n": st.integers(0, 9)})
MESSAGES = st.lists(
    st.one_of(
        st.fixed_dictionaries({"task": NAMES}),
        st.fixed_dictionaries(
            {
                "jobs": st.lists(
                    st.fixed_dictionaries(
                        {"intent": NAMES, "steps": st.lists(STEP_PAYLOAD, min_size=1, max_size=3)}
                    ),
                    min_size=1,
                    max_size=3,
                )
            }
        ),
    ),
    min_size=1,
    max_size=5,
)


@TWINS
@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    messages=MESSAGES,
    keyed=st.lists(st.booleans(), min_size=5, max_size=5),
    claims=st.lists(st.integers(1, 4), min_size=1, max_size=4),
    ttl=st.sampled_from([1, 60, 0.5]),
)
def test_returned_ids_and_leases_are_the_rows_as_stored(
    empty_ledger: Path,
    messages: list[dict[str, Any]],
    keyed: list[bool],
    claims: list[int],
    ttl: float,
) -> None:
    """post, claim and complete report the ids, tokens and expiries the ledger holds
    (the rows' ids come from lastrowid and the lease from the read before it, not from
    RETURNING; a replayed idempotent post names the first post's ids)."""
    with (
        tempfile.TemporaryDirectory() as folder,
        MessageCassette(
            shutil.copyfile(empty_ledger, Path(folder) / "l.db"), clock=ManualClock()
        ) as cassette,
    ):
        conn = cassette.conn
        for index, (payload, has_key) in enumerate(zip(messages, keyed, strict=False)):
            key = f"key-{index}" if has_key else None
            for _ in range(2 if key else 1):  # the second post of a key is a replay
                message_id, job_id = cassette.post_message(payload, "run", "USER", key)
                stored = conn.execute(
                    "SELECT payload_json FROM cassette_messages WHERE message_id = ?",
                    (message_id,),
                ).fetchone()
                first_job = conn.execute(
                    "SELECT job_id FROM cassette_jobs WHERE message_id = ? AND ordinal = 0",
                    (message_id,),
                ).fetchone()
                assert stored is not None and first_job == (job_id,)
        leased = []
        for n in claims:
            for step in cassette.claim_steps("run", "w", n, ttl):
                row = cassette.get_step(step["step_id"])
                assert row["status"] == "LEASED" and row["lease_owner"] == "w"
                for name in ("job_id", "message_id", "ordinal", "payload"):
                    assert step[name] == row[name]
                assert step["fencing_token"] == row["fencing_token"] == 1
                assert step["lease_expires_at"] == row["lease_expires_at"]
                assert step["lease_expires_at"] == ManualClock().now_ms() + round(ttl * 1000)
                leased.append(step)
        assert [s["step_id"] for s in leased] == sorted(s["step_id"] for s in leased)
        receipts = cassette.complete_steps(
            [("run", s["step_id"], "w", s["fencing_token"], {}, "SUCCESS") for s in leased]
        )
        for step, receipt_id in zip(leased, receipts, strict=True):
            assert conn.execute(
                "SELECT step_id FROM cassette_receipts WHERE receipt_id = ?", (receipt_id,)
            ).fetchone() == (step["step_id"],)
        assert cassette.verify_cassette().ok
