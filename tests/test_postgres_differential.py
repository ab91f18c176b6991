"""The same law on both backends, by differential testing (issue 15, item 6).

Hypothesis drives a SQLite ledger and a PostgreSQL ledger with the same random calls,
bad ones included (stale tokens, wrong workers, unknown steps, early requeues, late
completions, idempotent reposts and conflicts, releases, batches), and time moved on both
alike. Every call must return the same result, or be refused with the same code, on both.
Times differ (a test clock against the server's), so results and journal bodies are
compared with their times left out; at the end the PostgreSQL ledger is copied into a new
file, whose SQLite verify must pass: the server wrote entries SQLite's law accepts, byte
for byte. The second machine runs the same calls with worker w1 signing every act it
makes (and some requeues): attestations, and the refusals of unsigned acts on its leases,
alike on both; verify --worker-keys passes on the server and on the copy.
"""

from __future__ import annotations

import copy
import os
import shutil
import tempfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import orjson
import pytest
from hypothesis import HealthCheck, Phase, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, rule

from catalytic_cassette import CassetteError
from catalytic_cassette.copying import copy_ledger
from catalytic_cassette.signing import generate
from catalytic_cassette.verify import verify_path
from catalytic_cassette.worker_keys import PinnedKey, WorkerKey, load_pinned_keys

from . import postgres
from .backends import Ledger

pytestmark = pytest.mark.slow

RUNS = ("a", "b")
WORKERS = ("w1", "w2")
TIMES = ("created_at", "lease_expires_at")
# Leases last 30 s and time moves by 0 or 40 s: the server's clock, which also runs in
# real time between two calls, can never put a call on the other side of an expiry.
TTL = 30
PAYLOAD = st.one_of(
    st.fixed_dictionaries({"n": st.integers(-3, 3)}),
    st.fixed_dictionaries(
        {
            "jobs": st.lists(
                st.fixed_dictionaries(
                    {
                        "intent": st.sampled_from(["x", "y"]),
                        "steps": st.lists(
                            st.fixed_dictionaries({"s": st.text("ab", max_size=2)}),
                            min_size=1,
                            max_size=3,
                        ),
                    }
                ),
                min_size=1,
                max_size=2,
            )
        }
    ),
)


def timeless(value: Any, drop: tuple[str, ...] = TIMES) -> Any:
    """``value`` with every time field dropped (dicts, lists, journal bodies)."""
    if isinstance(value, dict):
        return {k: timeless(v, drop) for k, v in value.items() if k not in drop}
    if isinstance(value, list):
        return [timeless(v, drop) for v in value]
    if isinstance(value, tuple):
        return tuple(timeless(v, drop) for v in value)
    return value


def outcome(call: Any) -> Any:
    try:
        return ("ok", timeless(call()))
    except CassetteError as error:
        return ("refused", error.code.value, error.detail.get("index"))


class BothBackends(RuleBasedStateMachine):
    server: str = ""
    template: str = ""
    # what differs between the backends' journals besides time: nothing
    unshared: tuple[str, ...] = TIMES

    def __init__(self) -> None:
        super().__init__()
        self.tmp = Path(tempfile.mkdtemp(prefix="cassette-diff-"))
        self.url = postgres.clone_database(self.server, self.template)
        self.sqlite = Ledger("sqlite", str(self.tmp / "ledger.db"))
        self.pg = Ledger("postgresql", self.url)
        self.a = self.sqlite.open()
        self.b = self.pg.open()
        self.leases: list[tuple[str, int, str, int]] = []

    def same(self, method: str, *args: Any, **kwargs: Any) -> Any:
        first = outcome(lambda: getattr(self.a, method)(*copy.deepcopy(args), **kwargs))
        second = outcome(lambda: getattr(self.b, method)(*copy.deepcopy(args), **kwargs))
        assert first == second, (method, args, kwargs)
        return first

    @initialize()
    def start(self) -> None:
        self.same("post_message", {"jobs": [{"intent": "x", "steps": [{}, {}]}]}, "a", "USER")

    @rule(payload=PAYLOAD, run=st.sampled_from(RUNS), key=st.sampled_from([None, "k", "j"]))
    def post(self, payload: dict[str, Any], run: str, key: str | None) -> None:
        self.same("post_message", payload, run, "USER", key)

    @rule(items=st.lists(st.tuples(PAYLOAD, st.sampled_from([*RUNS, ""])), min_size=1, max_size=3))
    def post_batch(self, items: list[tuple[dict[str, Any], str]]) -> None:
        self.same("post_messages", [(p, r, "SYSTEM", None) for p, r in items])

    @rule(run=st.sampled_from(RUNS), worker=st.sampled_from(WORKERS), n=st.integers(1, 3))
    def claim(self, run: str, worker: str, n: int) -> None:
        result = self.same("claim_steps", run, worker, n, TTL)
        if result[0] == "ok":
            self.leases += [(run, x["step_id"], worker, x["fencing_token"]) for x in result[1]]

    @rule(
        pick=st.integers(0, 50),
        outcome_=st.sampled_from(["SUCCESS", "FAILURE", "ABORTED"]),
        token_shift=st.sampled_from([0, 0, 0, 1, -1]),
        other_worker=st.booleans(),
        chained=st.booleans(),
    )
    def complete(
        self, pick: int, outcome_: str, token_shift: int, other_worker: bool, chained: bool
    ) -> None:
        if not self.leases:
            return
        run, step, worker, token = self.leases[pick % len(self.leases)]
        if other_worker:
            worker = "w9"
        args = (run, step, worker, token + token_shift, {"r": pick}, outcome_)
        self.same("complete_and_claim" if chained else "complete_step", *args)

    @rule(
        step=st.integers(1, 12), run=st.sampled_from(RUNS), attempts=st.sampled_from([None, 1, 2])
    )
    def requeue(self, step: int, run: str, attempts: int | None) -> None:
        self.same("requeue", run, step if step < 10 else None, max_attempts=attempts)

    @rule(pick=st.integers(0, 50), token_shift=st.sampled_from([0, 0, 1]))
    def release(self, pick: int, token_shift: int) -> None:
        if not self.leases:
            return
        run, step, worker, token = self.leases[pick % len(self.leases)]
        self.same("requeue", run, step, worker_id=worker, fencing_token=token + token_shift)

    @rule()
    def let_leases_expire(self) -> None:
        self.sqlite.advance(40_000)
        self.pg.advance(40_000)

    @rule(step=st.integers(0, 14))
    def read_a_step(self, step: int) -> None:
        self.same("get_step", step)

    @invariant()
    def same_status_and_history(self) -> None:
        for run in RUNS:
            self.same("status", run)
        bodies = [
            [timeless(orjson.loads(body), self.unshared) for _, body, _, _ in ledger.journal()]
            for ledger in (self.sqlite, self.pg)
        ]
        assert bodies[0] == bodies[1]

    def server_time(self) -> int:
        """The ledger's time on the server (moved forward by the test), plus a minute."""
        import psycopg

        with psycopg.connect(self.url) as conn:
            (ms,) = conn.execute("SELECT time_ms + 60000 FROM cassette_head").fetchone()
        return int(ms)

    def pinned(self) -> dict[str, PinnedKey] | None:
        return None

    def close_sides(self) -> None:
        self.a.close()
        self.b.close()

    def teardown(self) -> None:
        try:
            self.close_sides()
            copied = self.tmp / "copy.db"
            copy_ledger(self.url, str(copied))
            # the server's clock was moved forward by the test: verify at the ledger's time
            now = self.server_time()
            report = verify_path(str(copied), now_ms=now, worker_keys=self.pinned())
            assert report.ok, report.findings
            if self.pinned() is not None:  # and on the server, by its own verify
                report = verify_path(self.url, now_ms=now, worker_keys=self.pinned())
                assert report.ok, report.findings
        finally:
            postgres.drop_database(self.server, self.url)
            shutil.rmtree(self.tmp, ignore_errors=True)  # (one directory per example)


class SignedBothBackends(BothBackends):
    """w1 holds a worker key: every call in its name goes through a cassette signing as
    w1 on each backend, and so do batches of posts and the requeues of even steps (and
    of the whole run); everything else through the unsigned ones. Attestation bodies
    also differ by signature (each ledger has its own id, and its own times)."""

    keys_dir: str = ""
    unshared = (*TIMES, "signature")

    def __init__(self) -> None:
        super().__init__()
        key = WorkerKey.load("w1", os.path.join(self.keys_dir, "w1.key"))
        self.signed_a = self.sqlite.open(worker_key=key)
        self.signed_b = self.pg.open(worker_key=key)

    def same(self, method: str, *args: Any, **kwargs: Any) -> Any:
        step = args[1] if method == "requeue" and len(args) > 1 else None
        signing = (
            "w1" in args
            or kwargs.get("worker_id") == "w1"
            or method == "post_messages"
            or (method == "requeue" and "worker_id" not in kwargs and (step or 0) % 2 == 0)
        )
        if not signing:
            return super().same(method, *args, **kwargs)
        first = outcome(lambda: getattr(self.signed_a, method)(*copy.deepcopy(args), **kwargs))
        second = outcome(lambda: getattr(self.signed_b, method)(*copy.deepcopy(args), **kwargs))
        assert first == second, (method, args, kwargs)
        return first

    def pinned(self) -> dict[str, PinnedKey] | None:
        return load_pinned_keys(os.path.join(self.keys_dir, "pins"))

    def close_sides(self) -> None:
        super().close_sides()
        self.signed_a.close()
        self.signed_b.close()


@pytest.fixture
def machine(pg_server: str, pg_template: str) -> type[BothBackends]:
    BothBackends.server = pg_server
    BothBackends.template = pg_template
    return BothBackends


def search_phases(environ: Mapping[str, str]) -> tuple[Phase, ...]:
    """Every phase that finds a failure; shrinking it too only when asked. Each example
    clones a database and verifies a copy, so shrinking once took 5 minutes of a CI run
    (Hypothesis stops shrinking at 5 minutes); unshrunk, the failure is still reported
    with its steps (at most ``stateful_step_count``), and Hypothesis's example database
    replays it first when the test runs again with CASSETTE_DIFF_SHRINK=1."""
    phases = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target]
    if environ.get("CASSETTE_DIFF_SHRINK", "") == "1":
        phases.append(Phase.shrink)
    return tuple(phases)


def test_only_asked_for_shrinking_is_done() -> None:
    assert Phase.shrink not in search_phases({})
    assert Phase.generate in search_phases({})
    assert Phase.shrink in search_phases({"CASSETTE_DIFF_SHRINK": "1"})


def test_both_backends_answer_alike(machine: type[BothBackends]) -> None:
    run(machine)


@pytest.fixture
def signed_machine(pg_server: str, pg_template: str, tmp_path: Path) -> type[SignedBothBackends]:
    _, public_path = generate(str(tmp_path / "w1"))
    (tmp_path / "pins").mkdir()
    os.rename(public_path, tmp_path / "pins" / "w1.pub")
    SignedBothBackends.server = pg_server
    SignedBothBackends.template = pg_template
    SignedBothBackends.keys_dir = str(tmp_path)
    return SignedBothBackends


def test_both_backends_answer_alike_with_a_signing_worker(
    signed_machine: type[SignedBothBackends],
) -> None:
    run(signed_machine)


def run(machine: type[BothBackends]) -> None:
    from hypothesis.stateful import run_state_machine_as_test

    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=int(os.environ.get("CASSETTE_DIFF_EXAMPLES", "10")),
            stateful_step_count=20,
            deadline=None,
            suppress_health_check=list(HealthCheck),
            phases=search_phases(os.environ),
        ),
    )
