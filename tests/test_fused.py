"""The fused worker transaction (issue 12, third pass): ``complete_and_claim`` writes in one
transaction exactly what ``complete_step`` followed by ``claim_step`` writes in two, and a
refused call writes nothing.

Both sides of each comparison start from byte-identical copies of one ledger (so they share
its ledger_id, which attestations sign) and run on clocks that show the same times, so the
journal bodies, hashes, tree nodes and Ed25519 signatures (deterministic) must be equal.
"""

from __future__ import annotations

import shutil
import sqlite3
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st

from catalytic_cassette import CassetteError, ErrorCode, ManualClock, MessageCassette, WorkerKey
from catalytic_cassette.temp_objects import TempSchema
from catalytic_cassette.worker_keys import load_pinned_keys

from .backends import Ledger, package_idle
from .conftest import dump, file_digest

pytestmark = pytest.mark.both_backends

START_MS = 1_700_000_000_000
RUNS = ("run-a", "run-b")
WORKERS = ("w1", "w2", "w3")
OUTCOMES = ("SUCCESS", "FAILURE", "ABORTED")


def _post(cassette: MessageCassette, messages: list[tuple[str, int]]) -> None:
    """Post ``messages``: (run, number of steps) each, one job per message."""
    for number, (run, steps) in enumerate(messages):
        payload = {
            "jobs": [{"intent": "work", "steps": [{"m": number, "s": s} for s in range(steps)]}]
        }
        cassette.post_message(payload, run, "PLANNER")


def _template(path: Path, messages: list[tuple[str, int]]) -> Path:
    """A ledger holding ``messages`` (run, number of steps), checkpointed into one file."""
    with MessageCassette(path, clock=ManualClock(START_MS)) as cassette:
        _post(cassette, messages)
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchall()
    conn.close()
    return path


def _copy(template: Path, target: Path) -> Path:
    shutil.copyfile(template, target)
    return target


def _outcome(call: Callable[..., Any], *args: Any) -> tuple[str, Any]:
    try:
        return "ok", call(*args)
    except CassetteError as error:
        return "refused", error.code


@contextmanager
def _pair(
    tmp_path: Path, template: Path, keys: dict[str, WorkerKey] | None = None
) -> Iterator[
    tuple[Callable[[str], MessageCassette], Callable[[str], MessageCassette], ManualClock]
]:
    """Two copies of ``template`` and a clock both read; per worker, a cassette on each
    (signing as that worker when ``keys`` has its key)."""
    clock = ManualClock(START_MS + 1_000)
    paths = (_copy(template, tmp_path / "fused.db"), _copy(template, tmp_path / "separate.db"))
    opened: dict[tuple[int, str], MessageCassette] = {}

    def opener(side: int) -> Callable[[str], MessageCassette]:
        def cassette(worker: str) -> MessageCassette:
            if (side, worker) not in opened:
                key = None if keys is None else keys.get(worker)
                opened[(side, worker)] = MessageCassette(paths[side], clock=clock, worker_key=key)
            return opened[(side, worker)]

        return cassette

    try:
        yield opener(0), opener(1), clock
    finally:
        for cassette in opened.values():
            cassette.close()


# ---------------------------------------------------------------- equivalence

# One operation of a worker: ("claim", worker, run, ttl_ms) or (kind, worker, outcome, ttl_ms,
# variant, advance_ms) for kind "fused" or "separate"; variant picks the credentials.
VARIANTS = ("holder", "holder", "holder", "stale", "other_worker", "other_run", "missing")
OPERATIONS = st.one_of(
    st.tuples(
        st.just("claim"), st.sampled_from(WORKERS), st.sampled_from(RUNS), st.integers(1, 60_000)
    ),
    st.tuples(
        st.sampled_from(["fused", "fused", "separate"]),
        st.sampled_from(WORKERS),
        st.sampled_from(OUTCOMES),
        st.integers(1, 60_000),
        st.sampled_from(VARIANTS),
        st.sampled_from([0, 0, 0, 1, 999, 30_000, 70_000]),
    ),
)


class Workers:
    """What each worker holds: the lease dicts the ledger handed it, newest last."""

    def __init__(self) -> None:
        self.held: dict[str, list[dict[str, Any]]] = {w: [] for w in WORKERS}

    def credentials(self, worker: str, variant: str) -> tuple[str, int, int] | None:
        """(run, step_id, token) for a completion by ``worker``; None if it holds nothing."""
        if not self.held[worker]:
            return None
        lease = self.held[worker][-1]
        run, step, token = lease["run_id"], lease["step_id"], lease["fencing_token"]
        if variant == "stale":
            token -= 1
        elif variant == "other_run":
            run = RUNS[1] if run == RUNS[0] else RUNS[0]
        elif variant == "missing":
            step += 10_000
        return run, step, token


def _run_operations(
    operations: list[tuple[Any, ...]],
    fused_side: Callable[[str], MessageCassette],
    separate_side: Callable[[str], MessageCassette],
    clock: ManualClock,
) -> None:
    """Each operation on both sides: a fused call on one, complete_step and (when the
    completion is accepted) claim_steps(n=1) on the other; results must agree."""
    workers = Workers()
    for operation in operations:
        if operation[0] == "claim":
            _, worker, run, ttl_ms = operation
            claim = (run, worker, 1, ttl_ms / 1000)
            got = _outcome(fused_side(worker).claim_steps, *claim)
            assert got == _outcome(separate_side(worker).claim_steps, *claim)
            if got[0] == "ok":
                workers.held[worker].extend(got[1])
            continue
        kind, worker, outcome, ttl_ms, variant, advance_ms = operation
        clock.advance(advance_ms)
        found = workers.credentials(worker, variant)
        if found is None:
            continue
        run, step, token = found
        completion = (run, step, worker, token, {"by": worker, "variant": variant}, outcome)
        separate = separate_side(worker)
        if kind == "separate":
            got = _outcome(fused_side(worker).complete_step, *completion)
            assert got == _outcome(separate.complete_step, *completion)
            continue
        fused = _outcome(fused_side(worker).complete_and_claim, *completion, ttl_ms / 1000)
        completed = _outcome(separate.complete_step, *completion)
        if completed[0] == "refused":
            assert fused == completed, (fused, completed)  # the same code, nothing written
            event(f"fused call refused: {completed[1].value}")
            continue
        claimed = separate.claim_steps(run, worker, 1, ttl_ms / 1000)
        event("fused call: completed, leased the next" if claimed else "fused call: completed")
        assert fused == (
            "ok",
            {"receipt_id": completed[1], "step_id": step, "next": claimed[0] if claimed else None},
        )
        workers.held[worker].extend(claimed)


@pytest.mark.slow
@pytest.mark.sqlite_only(
    reason="byte-identical copies of one SQLite file on clocks showing the same times, per"
    " Hypothesis example (the server's time differs between two PostgreSQL ledgers)"
)
@settings(
    max_examples=30,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(operations=st.lists(OPERATIONS, min_size=1, max_size=25))
def test_fused_calls_write_what_separate_calls_write(
    tmp_path_factory: pytest.TempPathFactory, operations: list[tuple[Any, ...]]
) -> None:
    """Several workers mixing fused and separate calls (right and wrong credentials, late
    ones included): the same results, and the same ledger byte for byte in every row,
    journal entry and tree node, as each fused call replaced by complete + claim."""
    tmp = tmp_path_factory.mktemp("fused")
    template = _template(tmp / "template.db", [("run-a", 3), ("run-b", 2), ("run-a", 4)])
    seed = [("claim", worker, "run-a", 60_000) for worker in WORKERS]
    with _pair(tmp, template) as (fused_side, separate_side, clock):
        _run_operations(seed + operations, fused_side, separate_side, clock)
        fused_ledger = fused_side(WORKERS[0])
        assert not fused_ledger.conn.in_transaction
        report = fused_ledger.verify_cassette()
        assert report.ok, report.errors
    assert dump(tmp / "fused.db") == dump(tmp / "separate.db")


@pytest.fixture(scope="module")
def worker_keys(tmp_path_factory: pytest.TempPathFactory) -> tuple[dict[str, WorkerKey], Path]:
    """A key per worker, and a directory pinning their public halves."""
    from click.testing import CliRunner

    from catalytic_cassette.cli import cli

    folder = tmp_path_factory.mktemp("keys")
    pins = folder / "pins"
    pins.mkdir()
    keys = {}
    for worker in WORKERS:
        result = CliRunner().invoke(cli, ["keygen", "--out", str(folder / worker)])
        assert result.exit_code == 0, result.output
        (folder / f"{worker}.pub").rename(pins / f"{worker}.pub")
        keys[worker] = WorkerKey.load(worker, folder / f"{worker}.key")
    return keys, pins


@pytest.mark.slow
@pytest.mark.sqlite_only(
    reason="byte-identical copies of one SQLite file on clocks showing the same times, per"
    " Hypothesis example (the server's time differs between two PostgreSQL ledgers)"
)
@settings(
    max_examples=15,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(operations=st.lists(OPERATIONS, min_size=1, max_size=15))
def test_signed_fused_calls_carry_both_attestations(
    tmp_path_factory: pytest.TempPathFactory,
    worker_keys: tuple[dict[str, WorkerKey], Path],
    operations: list[tuple[Any, ...]],
) -> None:
    """With worker keys, a fused call records the completion's and the claim's signed
    statements exactly as the two separate calls do, and verify accepts every one."""
    keys, pins = worker_keys
    tmp = tmp_path_factory.mktemp("signed")
    template = _template(tmp / "template.db", [("run-a", 3), ("run-b", 2)])
    seed = [("claim", worker, "run-a", 60_000) for worker in WORKERS]
    with _pair(tmp, template, keys) as (fused_side, separate_side, clock):
        _run_operations(seed + operations, fused_side, separate_side, clock)
        report = fused_side(WORKERS[0]).verify_cassette(worker_keys=load_pinned_keys(pins))
        assert report.ok, report.errors
    assert dump(tmp / "fused.db") == dump(tmp / "separate.db")


def test_the_worker_loop_runs_a_run_to_the_end(backend: Ledger) -> None:
    """claim once, then complete_and_claim until "next" is None: every step once, in claim
    order, one token each; the last call completes and leases nothing."""
    with backend.open() as cassette:
        _post(cassette, [("run-a", 2), ("run-b", 1), ("run-a", 3)])
        order = [
            row[0]
            for row in backend.rows(
                "SELECT step_id FROM cassette_steps WHERE run_id = 'run-a'"
                " ORDER BY message_id, job_ordinal, ordinal"
            )
        ]
        step: dict[str, Any] | None = cassette.claim_step("run-a", "w1", 60)
        seen = []
        while step is not None:
            seen.append(step["step_id"])
            assert step["fencing_token"] == 1
            result = cassette.complete_and_claim(
                "run-a", step["step_id"], "w1", 1, {"done": step["step_id"]}, "SUCCESS", 60
            )
            assert result["step_id"] == step["step_id"]
            step = result["next"]
        assert seen == order
        status = cassette.status("run-a")
        assert status["steps"] == {"PENDING": 0, "LEASED": 0, "COMMITTED": 5}
        assert cassette.status("run-b")["steps"]["PENDING"] == 1  # another run is left alone
        assert cassette.verify_cassette().ok


# ------------------------------------------------------------------- refusals


def _refusal_args(case: str, step: dict[str, Any]) -> tuple[Any, ...]:
    """Arguments of a completion of ``step`` (held by w1) that is refused."""
    run, sid, token = step["run_id"], step["step_id"], step["fencing_token"]
    return {
        "stale token": (run, sid, "w1", token - 1, {}, "SUCCESS"),
        "token ahead": (run, sid, "w1", token + 1, {}, "SUCCESS"),
        "another worker": (run, sid, "w2", token, {}, "SUCCESS"),
        "another run": ("run-b", sid, "w1", token, {}, "SUCCESS"),
        "missing step": (run, sid + 99, "w1", token, {}, "SUCCESS"),
        "bad outcome": (run, sid, "w1", token, {}, "DONE"),
        "bad receipt": (run, sid, "w1", token, ["x"], "SUCCESS"),
        "bad token type": (run, sid, "w1", "1", {}, "SUCCESS"),
        "bad worker": (run, sid, "", token, {}, "SUCCESS"),
        "bad run": ("", sid, "w1", token, {}, "SUCCESS"),
        "step not a number": (run, "1", "w1", token, {}, "SUCCESS"),
        "pending step": (run, sid + 1, "w1", 0, {}, "SUCCESS"),  # never claimed
    }[case]


REFUSALS = [
    "stale token",
    "token ahead",
    "another worker",
    "another run",
    "missing step",
    "bad outcome",
    "bad receipt",
    "bad token type",
    "bad worker",
    "bad run",
    "step not a number",
    "pending step",
    "already committed",
    "expired",
]


@pytest.mark.slow
@pytest.mark.sqlite_only(
    reason="byte-identical copies of one SQLite file on clocks showing the same times, per"
    " Hypothesis example (the server's time differs between two PostgreSQL ledgers)"
)
@settings(
    max_examples=40,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(case=st.sampled_from(REFUSALS), ttl=st.sampled_from([1, 0.5, 300, 86_400.25]))
def test_a_refused_fused_call_changes_no_byte(
    tmp_path_factory: pytest.TempPathFactory, case: str, ttl: float
) -> None:
    """Refused with the code complete_step gives for the same arguments; the file and its
    WAL are byte for byte what they were, and no transaction is left open."""
    tmp = tmp_path_factory.mktemp("refused")
    template = _template(tmp / "template.db", [("run-a", 3), ("run-b", 1)])
    with _pair(tmp, template) as (fused_side, separate_side, clock):
        held = {}
        for side in (fused_side, separate_side):
            held[side] = side("w1").claim_step("run-a", "w1", 10)
        step = held[fused_side]
        args: tuple[Any, ...] = ("run-a", step["step_id"], "w1", 1, {}, "SUCCESS")
        if case == "already committed":
            for side in (fused_side, separate_side):
                side("w1").complete_step(*args)
        elif case == "expired":
            clock.advance(10_000)
        else:
            args = _refusal_args(case, step)
        fused = fused_side("w1")
        before = file_digest(tmp / "fused.db")
        with pytest.raises(CassetteError) as refused:
            fused.complete_and_claim(*args, ttl)
        assert not fused.conn.in_transaction
        assert file_digest(tmp / "fused.db") == before
        with pytest.raises(CassetteError) as separate:
            separate_side("w1").complete_step(*args)
        assert refused.value.code is separate.value.code, (case, refused.value.code)
        assert refused.value.code is not ErrorCode.DATABASE_ERROR


def test_a_refused_fused_call_is_refused_as_complete_step_is(backend: Ledger) -> None:
    """Every refusal of the Hypothesis test above on one ledger of either backend: the
    fused call gets complete_step's code, changes nothing and leaves no transaction."""
    with backend.open() as cassette:
        _post(cassette, [("run-a", 3), ("run-b", 1)])
        step = cassette.claim_step("run-a", "w1", 10)
        for case in REFUSALS[:-2]:  # the last two change the ledger first
            args = _refusal_args(case, step)
            before = backend.dump()
            with pytest.raises(CassetteError) as fused:
                cassette.complete_and_claim(*args, 60)
            assert package_idle(cassette)
            assert backend.dump() == before, case
            with pytest.raises(CassetteError) as separate:
                cassette.complete_step(*args)
            assert fused.value.code is separate.value.code, (case, fused.value.code)
            assert fused.value.code is not ErrorCode.DATABASE_ERROR
        done = ("run-a", step["step_id"], "w1", 1, {}, "SUCCESS")
        cassette.complete_step(*done)
        expiring = cassette.claim_step("run-a", "w1", 10)
        backend.advance(10_000)
        expired = ("run-a", expiring["step_id"], "w1", 1, {}, "SUCCESS")
        for case, args in (("already committed", done), ("expired", expired)):
            before = backend.dump()
            with pytest.raises(CassetteError) as fused:
                cassette.complete_and_claim(*args, 60)
            assert backend.dump() == before, case
            with pytest.raises(CassetteError) as separate:
                cassette.complete_step(*args)
            assert fused.value.code is separate.value.code, (case, fused.value.code)


def test_arguments_are_checked_before_the_transaction_completion_first(
    cassette: MessageCassette, db_path: Path
) -> None:
    cassette.post_message({"n": 1}, "r", "USER")
    step = cassette.claim_step("r", "w1", 60)
    before = file_digest(db_path)
    for bad_ttl in (0, -1, True, "5", float("nan"), float("inf"), 31 * 24 * 3600, 2**70):
        with pytest.raises(CassetteError) as refused:
            cassette.complete_and_claim("r", step["step_id"], "w1", 1, {}, "SUCCESS", bad_ttl)
        assert refused.value.code is ErrorCode.INVALID_TTL, bad_ttl
    # The completion's own argument refusal comes before the ttl's.
    with pytest.raises(CassetteError) as refused:
        cassette.complete_and_claim("r", step["step_id"], "w1", 1, {}, "DONE", 0)
    assert refused.value.code is ErrorCode.INVALID_OUTCOME
    assert file_digest(db_path) == before
    assert cassette.get_step(step["step_id"])["status"] == "LEASED"


@pytest.mark.sqlite_only(
    reason="a TEMP trigger on the package's sqlite3 connection refuses the claim part"
)
def test_a_refused_claim_takes_the_receipt_back_with_it(
    cassette: MessageCassette, db_path: Path
) -> None:
    """One transaction: when the claim part is refused (here by a TEMP trigger on this
    connection that refuses every lease), the receipt written before it is undone too."""
    for n in range(2):
        cassette.post_message({"n": n}, "r", "USER")
    step = cassette.claim_step("r", "w1", 60)
    cassette.conn.execute(
        "CREATE TEMP TRIGGER test_refuse_leases BEFORE UPDATE OF status ON main.cassette_steps"
        " WHEN NEW.status = 'LEASED' BEGIN"
        " SELECT RAISE(ABORT, 'ILLEGAL_TRANSITION: this test refuses every lease'); END"
    )
    # (recorded as the connection's own TEMP schema, past the package's refusal of
    # foreign TEMP objects: the trigger stands for a rule refusing the claim part)
    cassette.conn.temp_schema = TempSchema(cassette.conn)  # type: ignore[attr-defined]
    before = file_digest(db_path)
    with pytest.raises(CassetteError) as refused:
        cassette.complete_and_claim("r", step["step_id"], "w1", 1, {}, "SUCCESS")
    assert refused.value.code is ErrorCode.ILLEGAL_TRANSITION
    assert isinstance(refused.value.__cause__, sqlite3.Error)
    assert not cassette.conn.in_transaction
    assert file_digest(db_path) == before
    assert cassette.get_step(step["step_id"])["status"] == "LEASED"
    assert cassette.status("r")["receipts"]["SUCCESS"] == 0
    cassette.conn.execute("DROP TRIGGER temp.test_refuse_leases")
    cassette.conn.temp_schema = TempSchema(cassette.conn)  # type: ignore[attr-defined]
    result = cassette.complete_and_claim("r", step["step_id"], "w1", 1, {}, "SUCCESS")
    assert result["next"] is not None and result["next"]["step_id"] == step["step_id"] + 1


def test_a_signing_cassette_refuses_to_act_in_another_workers_name(
    backend: Ledger, worker_keys: tuple[dict[str, WorkerKey], Path]
) -> None:
    keys, _ = worker_keys
    path = backend.target
    with MessageCassette(path, worker_key=keys["w1"]) as signed:
        signed.post_message({"n": 1}, "r", "WORKER")
        step = signed.claim_step("r", "w1", 60)
        before = file_digest(path)
        with pytest.raises(CassetteError) as refused:
            signed.complete_and_claim("r", step["step_id"], "w2", 1, {}, "SUCCESS")
        assert refused.value.code is ErrorCode.WRONG_WORKER
        assert file_digest(path) == before
    with MessageCassette(path) as unsigned:  # w1's signed lease needs w1's signature
        before = file_digest(path)
        with pytest.raises(CassetteError) as refused:
            unsigned.complete_and_claim("r", step["step_id"], "w1", 1, {}, "SUCCESS")
        assert refused.value.code is ErrorCode.SIGNATURE_REQUIRED
        assert file_digest(path) == before
        assert package_idle(unsigned)
