"""The `cassette` CLI: JSON on stdout, one coded line on stderr, exit 0/1/2/3."""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from catalytic_cassette import MessageCassette
from catalytic_cassette.cli import cli
from catalytic_cassette.payloads import MAX_PAYLOAD_BYTES

from . import backends
from .backends import Ledger
from .conftest import dump, file_digest, load_development_ledger, record_future_migration

pytestmark = pytest.mark.both_backends

ROOT = Path(__file__).resolve().parent.parent
CODE_LINE = re.compile(r"^error: ([A-Z][A-Z_]+): \S.*$")
# The message-cassette commands this file drives end to end.
CORE_COMMANDS = ("init", "post", "claim", "complete", "requeue", "status", "verify", "demo")
PASS = "PASS: All invariants verified"


def _command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = []
    for name, command in sorted(group.commands.items()):
        paths.append((*prefix, name))
        if isinstance(command, click.Group):
            paths.extend(_command_paths(command, (*prefix, name)))
    return paths


ALL_COMMAND_PATHS = _command_paths(cli)
TOP_LEVEL_COMMANDS = sorted(cli.commands)


# --------------------------------------------------------------------- helpers


def invoke(db: Path | str, *args: str, stdin: bytes | None = None) -> Result:
    return CliRunner().invoke(cli, ["--db", str(db), *args], input=stdin)


def out(result: Result) -> Any:
    """The JSON document on stdout of a successful command."""
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
    assert result.exception is None
    return json.loads(result.stdout)


def assert_refused(result: Result, code: str, exit_code: int = 1) -> None:
    """Exit status, no stdout, exactly one `error: CODE: message` line on stderr."""
    assert result.exit_code == exit_code, (result.exit_code, result.stdout, result.stderr)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert result.stdout == ""
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    match = CODE_LINE.match(lines[0])
    assert match is not None, lines[0]
    assert match.group(1) == code, lines[0]


def snapshot(path: Path) -> tuple[str, list[str]]:
    return file_digest(path), dump(path)


def write_json(path: Path, value: Any) -> Path:
    path.write_text(json.dumps(value), encoding="utf-8")
    return path


def receipt_json(db: Path, step_id: int) -> dict[str, Any]:
    (row,) = backends.rows(
        db, "SELECT receipt_json FROM cassette_receipts WHERE step_id = ?", step_id
    )
    return dict(json.loads(row[0]))


def cassette_script() -> str:
    beside = Path(sys.executable).parent / "cassette"
    if beside.exists():
        return str(beside)
    found = shutil.which("cassette")
    assert found is not None, "the cassette console script is not installed"
    return found


# --------------------------------------------------------------------- fixtures


@pytest.fixture
def db(request: pytest.FixtureRequest, backend: Ledger, tmp_path: Path) -> Path:
    """Where a ledger is not yet: a new file's path, or an empty PostgreSQL database."""
    if backend.postgresql:
        return request.getfixturevalue("pg_database")  # type: ignore[no-any-return]
    return tmp_path / "cli.db"


@pytest.fixture
def payload(tmp_path: Path) -> Path:
    return write_json(tmp_path / "payload.json", {"task": "fetch", "n": 1})


@pytest.fixture
def receipt(tmp_path: Path) -> Path:
    return write_json(tmp_path / "receipt.json", {"result": "done"})


@pytest.fixture
def ledger(backend: Ledger) -> dict[str, Any]:
    """An existing ledger with rows: a committed step, a live lease, pending steps."""
    path: Any = backend.target if backend.postgresql else Path(backend.target)
    with MessageCassette(path) as cassette:
        for n in range(3):
            cassette.post_message({"n": n}, "r1", "USER", f"key-{n}")
        cassette.post_message(
            {"jobs": [{"intent": "plan", "steps": [{"s": 0}, {"s": 1}]}]}, "r2", "PLANNER"
        )
        done = cassette.claim_step("r1", "w1", 300)
        cassette.complete_step(
            "r1", done["step_id"], "w1", done["fencing_token"], {"ok": True}, "SUCCESS"
        )
        held = cassette.claim_step("r1", "w2", 300)
    return {"path": path, "step": held["step_id"], "token": held["fencing_token"]}


@pytest.fixture(scope="module")
def big_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A 20 MB JSON object: over the documented 16 MiB limit."""
    path = tmp_path_factory.mktemp("big") / "big.json"
    path.write_text('{"blob": "' + "x" * (20 * 1024 * 1024) + '"}', encoding="utf-8")
    assert path.stat().st_size > MAX_PAYLOAD_BYTES
    return path


# ------------------------------------------------------------------ end to end


# ------------------------------------------------------------------- bad input


@pytest.fixture
def bad_files(tmp_path: Path, big_file: Path) -> dict[str, str]:
    files = {
        "notjson": b"{this is not json",
        "array": b"[1, 2, 3]",
        "string": b'"just a string"',
        "badutf8": b'{"text": "\xff\xfe\xfd"}',
        "good": b'{"fine": true}',
    }
    paths = {}
    for name, data in files.items():
        path = tmp_path / f"{name}.json"
        path.write_bytes(data)
        paths[name] = str(path)
    paths["big"] = str(big_file)
    return paths


POST = ("post", "--run-id", "r1", "--source", "USER", "--payload")
COMPLETE = ("complete", "--run-id", "r1", "--step", "{step}", "--worker", "w2", "--token")
# A good completion of the fixture's lease, fused with the next claim, and a --ttl.
CLAIM_NEXT = (*COMPLETE, "{token}", "--receipt", "{good}", "--outcome", "SUCCESS", "--claim-next")
BAD_INPUT = [
    pytest.param((*POST, "{notjson}"), None, "INVALID_PAYLOAD", id="payload-not-json"),
    pytest.param((*POST, "{array}"), None, "INVALID_PAYLOAD", id="payload-array"),
    pytest.param((*POST, "{string}"), None, "INVALID_PAYLOAD", id="payload-string"),
    pytest.param((*POST, "{badutf8}"), None, "INVALID_PAYLOAD", id="payload-bad-utf8-file"),
    pytest.param((*POST, "-"), b"\xff\xfe\x00garbage", "INVALID_PAYLOAD", id="payload-bad-utf8"),
    pytest.param((*POST, "-"), b"[]", "INVALID_PAYLOAD", id="payload-stdin-array"),
    pytest.param((*POST, "-"), b"", "INVALID_PAYLOAD", id="payload-stdin-empty"),
    pytest.param((*POST, "{big}"), None, "PAYLOAD_TOO_LARGE", id="payload-20MB"),
    pytest.param(
        ("post", "--run-id", "r1", "--source", "ROBOT", "--payload", "{good}"),
        None,
        "INVALID_SOURCE",
        id="unknown-source",
    ),
    pytest.param(
        ("post", "--run-id", "", "--source", "USER", "--payload", "{good}"),
        None,
        "INVALID_RUN_ID",
        id="empty-run-id",
    ),
    pytest.param(
        (
            "post",
            "--run-id",
            "r1",
            "--source",
            "USER",
            "--payload",
            "{good}",
            "--idempotency-key",
            "key-0",
        ),
        None,
        "IDEMPOTENCY_CONFLICT",
        id="idempotency-conflict",
    ),
    pytest.param(
        (*COMPLETE, "{token}", "--receipt", "{notjson}", "--outcome", "SUCCESS"),
        None,
        "INVALID_PAYLOAD",
        id="receipt-not-json",
    ),
    pytest.param(
        (*COMPLETE, "{token}", "--receipt", "{array}", "--outcome", "SUCCESS"),
        None,
        "INVALID_PAYLOAD",
        id="receipt-array",
    ),
    pytest.param(
        (*COMPLETE, "{token}", "--receipt", "{string}", "--outcome", "SUCCESS"),
        None,
        "INVALID_PAYLOAD",
        id="receipt-string",
    ),
    pytest.param(
        (*COMPLETE, "{token}", "--receipt", "-", "--outcome", "SUCCESS"),
        b"\xc3\x28",
        "INVALID_PAYLOAD",
        id="receipt-bad-utf8",
    ),
    pytest.param(
        (*COMPLETE, "{token}", "--receipt", "{big}", "--outcome", "SUCCESS"),
        None,
        "PAYLOAD_TOO_LARGE",
        id="receipt-20MB",
    ),
    pytest.param(
        (*COMPLETE, "{token}", "--receipt", "{good}", "--outcome", "MAYBE"),
        None,
        "INVALID_OUTCOME",
        id="unknown-outcome",
    ),
    pytest.param(
        (*COMPLETE, "abc", "--receipt", "{good}", "--outcome", "SUCCESS"),
        None,
        "USAGE",
        id="token-not-integer",
    ),
    pytest.param(
        (*COMPLETE, "1.5", "--receipt", "{good}", "--outcome", "SUCCESS"),
        None,
        "USAGE",
        id="token-float",
    ),
    pytest.param(
        (*COMPLETE, "99", "--receipt", "{good}", "--outcome", "SUCCESS"),
        None,
        "STALE_FENCING_TOKEN",
        id="token-stale",
    ),
    pytest.param(
        (*COMPLETE, "99", "--receipt", "{good}", "--outcome", "SUCCESS", "--claim-next"),
        None,
        "STALE_FENCING_TOKEN",
        id="claim-next-token-stale",
    ),
    pytest.param(
        (*COMPLETE, "{token}", "--receipt", "{notjson}", "--outcome", "SUCCESS", "--claim-next"),
        None,
        "INVALID_PAYLOAD",
        id="claim-next-receipt-not-json",
    ),
    pytest.param(
        (*COMPLETE, "{token}", "--receipt", "{good}", "--outcome", "SUCCESS", "--ttl", "60"),
        None,
        "USAGE",
        id="ttl-without-claim-next",
    ),
    pytest.param(
        (*CLAIM_NEXT, "--ttl", "soon"),
        None,
        "USAGE",
        id="claim-next-ttl-not-a-number",
    ),
    pytest.param(
        (*CLAIM_NEXT, "--ttl", "0"),
        None,
        "INVALID_TTL",
        id="claim-next-ttl-zero",
    ),
    pytest.param(
        (*CLAIM_NEXT, "--ttl", "nan"),
        None,
        "INVALID_TTL",
        id="claim-next-ttl-nan",
    ),
    pytest.param(
        (*CLAIM_NEXT, "--ttl", str(31 * 24 * 3600)),
        None,
        "INVALID_TTL",
        id="claim-next-ttl-over-30-days",
    ),
    pytest.param(
        (
            "complete",
            "--run-id",
            "r1",
            "--step",
            "{step}",
            "--worker",
            "intruder",
            "--token",
            "{token}",
            "--receipt",
            "{good}",
            "--outcome",
            "SUCCESS",
        ),
        None,
        "WRONG_WORKER",
        id="wrong-worker",
    ),
    pytest.param(
        (
            "complete",
            "--run-id",
            "r2",
            "--step",
            "{step}",
            "--worker",
            "w2",
            "--token",
            "{token}",
            "--receipt",
            "{good}",
            "--outcome",
            "SUCCESS",
        ),
        None,
        "RUN_MISMATCH",
        id="run-mismatch",
    ),
    pytest.param(
        (
            "complete",
            "--run-id",
            "r1",
            "--step",
            "9999",
            "--worker",
            "w2",
            "--token",
            "1",
            "--receipt",
            "{good}",
            "--outcome",
            "SUCCESS",
        ),
        None,
        "STEP_NOT_FOUND",
        id="step-not-found",
    ),
    pytest.param(
        (
            "complete",
            "--run-id",
            "r1",
            "--step",
            "x",
            "--worker",
            "w2",
            "--token",
            "1",
            "--receipt",
            "{good}",
            "--outcome",
            "SUCCESS",
        ),
        None,
        "USAGE",
        id="step-not-integer",
    ),
    pytest.param(
        ("requeue", "--run-id", "r1", "--step", "{step}", "--worker", "w2", "--token", "abc"),
        None,
        "USAGE",
        id="release-token-not-integer",
    ),
    pytest.param(
        ("requeue", "--run-id", "r1", "--step", "{step}", "--worker", "w2"),
        None,
        "INVALID_ARGUMENT",
        id="release-without-token",
    ),
    pytest.param(
        ("requeue", "--run-id", "r1", "--step", "{step}"),
        None,
        "LEASE_NOT_EXPIRED",
        id="requeue-live-lease",
    ),
    pytest.param(
        ("requeue", "--run-id", "r1", "--max-attempts", "many"),
        None,
        "USAGE",
        id="max-attempts-not-integer",
    ),
    pytest.param(
        ("requeue", "--run-id", "r1", "--max-attempts", "0"),
        None,
        "USAGE",
        id="max-attempts-zero",
    ),
    pytest.param(
        ("claim", "--run-id", "r1", "--worker", "w", "--ttl", "0"),
        None,
        "INVALID_TTL",
        id="ttl-zero",
    ),
    pytest.param(
        ("claim", "--run-id", "r1", "--worker", "w", "--ttl", "-1"),
        None,
        "INVALID_TTL",
        id="ttl-negative",
    ),
    pytest.param(
        ("claim", "--run-id", "r1", "--worker", "w", "--ttl=-0.5"),
        None,
        "INVALID_TTL",
        id="ttl-negative-fraction",
    ),
    pytest.param(
        ("claim", "--run-id", "r1", "--worker", "w", "--ttl", "1e12"),
        None,
        "INVALID_TTL",
        id="ttl-huge",
    ),
    pytest.param(
        ("claim", "--run-id", "r1", "--worker", "w", "--ttl", "soon"),
        None,
        "USAGE",
        id="ttl-not-a-number",
    ),
    pytest.param(
        ("claim", "--run-id", "r1", "--worker", "w", "--ttl", "nan"),
        None,
        "INVALID_TTL",
        id="ttl-nan",
    ),
    pytest.param(
        ("claim", "--run-id", "r1", "--worker", "w", "--ttl", "inf"),
        None,
        "INVALID_TTL",
        id="ttl-inf",
    ),
    pytest.param(
        ("claim", "--run-id", "r1", "--worker", "w", "--ttl", "0.0001"),
        None,
        "INVALID_TTL",
        id="ttl-below-1ms",
    ),
    pytest.param(
        ("claim", "--run-id", "r1", "--worker", ""), None, "INVALID_WORKER", id="empty-worker"
    ),
    pytest.param(("status", "--run-id", "x" * 201), None, "INVALID_RUN_ID", id="long-run-id"),
]


def _fill(args: tuple[str, ...], values: dict[str, str]) -> list[str]:
    return [arg.format(**values) if "{" in arg else arg for arg in args]


TOO_BIG = "99999999999999999999999"  # beyond SQLite's 64-bit INTEGER


USAGE_ERRORS = [
    pytest.param(("status",), id="missing-run-id"),
    pytest.param(("claim", "--run-id", "r1"), id="missing-worker"),
    pytest.param(("post", "--run-id", "r1", "--source", "USER"), id="missing-json"),
    pytest.param(
        ("post", "--run-id", "r1", "--source", "USER", "--payload", "/no/such/file"),
        id="json-file-missing",
    ),
    pytest.param(("frobnicate",), id="unknown-command"),
    pytest.param(("status", "--run-id", "r1", "--bogus"), id="unknown-option"),
    pytest.param(("demo", "--workers", "0"), id="demo-workers-out-of-range"),
]


# ------------------------------------------------------------ unusable files

OPENING_COMMANDS = [
    pytest.param(("init",), id="init"),
    pytest.param(("status", "--run-id", "r1"), id="status"),
    pytest.param(("claim", "--run-id", "r1", "--worker", "w"), id="claim"),
    pytest.param(("requeue", "--run-id", "r1"), id="requeue"),
    pytest.param(("migrate",), id="migrate"),
    pytest.param(("post", "--run-id", "r1", "--source", "USER", "--payload", "{good}"), id="post"),
]


def _make_newer(path: Path) -> None:
    """A cassette whose cassette_migrations claims a version this package does not know."""
    record_future_migration(path, 999)


# -------------------------------------------------------------------- mounting


def _cortex() -> click.Group:
    @click.group()
    @click.pass_context
    def cortex(ctx: click.Context) -> None:
        """A host application that mounts the cassette CLI."""
        ctx.obj = {"host": "cortex"}

    @cortex.command()
    def hello() -> None:
        click.echo("hello from cortex")

    cortex.add_command(cli, name="cassette")
    return cortex


# ------------------------------------------------------------------- help, docs


def _readme_cassette_lines() -> list[str]:
    text = (ROOT / "README.md").read_text(encoding="utf-8")
    lines, inside = [], False
    for line in text.splitlines():
        if line.lstrip().startswith(("```", "~~~")):
            inside = not inside
            continue
        stripped = line.strip()
        if stripped.startswith("$ "):
            stripped = stripped[2:]
        if inside and stripped.startswith("cassette "):
            lines.append(stripped)
    return lines


# ----------------------------------------------------------------- subprocesses


def _env() -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASSETTE_")}
    env["PYTHONDONTWRITEBYTECODE"] = "1"
    return env


class TestInit:
    """``cassette init``."""

    def test_init_creates_then_reports_existing(self, db: Path) -> None:
        version = backends.schema_version(db)
        first = out(invoke(db, "init"))
        assert first == {"db": str(db), "created": True, "schema_version": version}
        assert backends.exists(db)
        again = out(invoke(db, "init"))
        assert again == {"db": str(db), "created": False, "schema_version": version}

    def test_init_with_durability_normal(self, db: Path) -> None:
        result = CliRunner().invoke(cli, ["--db", str(db), "--durability", "normal", "init"])
        assert out(result)["created"] is True


class TestPost:
    """``cassette post``."""

    def test_db_from_environment(self, db: Path, payload: Path) -> None:
        result = CliRunner().invoke(
            cli,
            ["post", "--payload", str(payload), "--run-id", "r", "--source", "USER"],
            env={"CASSETTE_DB": str(db)},
        )
        assert out(result) == {"message_id": 1, "job_id": 1}
        assert backends.exists(db)

    def test_post_from_file_and_from_stdin(self, db: Path, payload: Path) -> None:
        first = out(
            invoke(db, "post", "--payload", str(payload), "--run-id", "r", "--source", "USER")
        )
        assert first == {"message_id": 1, "job_id": 1}
        plan = {
            "jobs": [
                {"intent": "research", "steps": [{"q": 1}, {"q": 2}]},
                {"intent": "write", "steps": [{"q": 3}]},
            ]
        }
        second = out(
            invoke(
                db,
                "post",
                "--payload",
                "-",
                "--run-id",
                "r",
                "--source",
                "PLANNER",
                stdin=json.dumps(plan).encode(),
            )
        )
        assert second == {"message_id": 2, "job_id": 2}
        status = out(invoke(db, "status", "--run-id", "r"))
        assert status["messages"] == 2
        assert status["steps"] == {"PENDING": 4, "LEASED": 0, "COMMITTED": 0}

    def test_post_idempotency_key_returns_same_ids(self, db: Path, payload: Path) -> None:
        args = ("post", "--payload", str(payload), "--run-id", "r", "--source", "USER")
        first = out(invoke(db, *args, "--idempotency-key", "k"))
        before = snapshot(db)
        again = out(invoke(db, *args, "--idempotency-key", "k"))
        assert again == first
        assert snapshot(db) == before
        other = write_json(payload.parent / "other.json", {"different": True})
        conflict = invoke(
            db,
            "post",
            "--payload",
            str(other),
            "--run-id",
            "r",
            "--source",
            "USER",
            "--idempotency-key",
            "k",
        )
        assert_refused(conflict, "IDEMPOTENCY_CONFLICT")
        assert snapshot(db) == before


class TestClaim:
    """``cassette claim`` (and the claim-complete-status round trip)."""

    def test_claim_complete_status(self, db: Path, payload: Path, receipt: Path) -> None:
        out(invoke(db, "post", "--payload", str(payload), "--run-id", "r", "--source", "USER"))
        before_ms = time.time_ns() // 1_000_000
        step = out(invoke(db, "claim", "--run-id", "r", "--worker", "w1", "--ttl", "60"))
        after_ms = time.time_ns() // 1_000_000
        assert step["step_id"] == 1
        assert step["job_id"] == 1
        assert step["message_id"] == 1
        assert step["ordinal"] == 0
        assert step["payload"] == {"task": "fetch", "n": 1}
        assert step["fencing_token"] == 1
        assert step["run_id"] == "r"
        assert step["worker_id"] == "w1"
        assert before_ms + 60_000 <= step["lease_expires_at"] <= after_ms + 60_000

        leased = out(invoke(db, "status", "--run-id", "r"))
        assert leased["steps"] == {"PENDING": 0, "LEASED": 1, "COMMITTED": 0}

        done = out(
            invoke(
                db,
                "complete",
                "--run-id",
                "r",
                "--step",
                "1",
                "--worker",
                "w1",
                "--token",
                "1",
                "--receipt",
                str(receipt),
                "--outcome",
                "SUCCESS",
            )
        )
        assert done == {"receipt_id": 1, "step_id": 1}
        assert receipt_json(db, 1) == {"result": "done"}
        assert out(invoke(db, "status", "--run-id", "r")) == {
            "run_id": "r",
            "messages": 1,
            "steps": {"PENDING": 0, "LEASED": 0, "COMMITTED": 1},
            "receipts": {"SUCCESS": 1, "FAILURE": 0, "ABORTED": 0},
            "expired_leases": 0,
        }

    def test_claim_on_empty_run_is_no_pending_steps(self, ledger: dict[str, Any]) -> None:
        path = ledger["path"]
        before = snapshot(path)
        assert_refused(
            invoke(path, "claim", "--run-id", "nothing", "--worker", "w"), "NO_PENDING_STEPS"
        )
        assert snapshot(path) == before


class TestComplete:
    """``cassette complete``."""

    def test_complete_receipt_from_stdin(self, db: Path, payload: Path) -> None:
        out(invoke(db, "post", "--payload", str(payload), "--run-id", "r", "--source", "USER"))
        step = out(invoke(db, "claim", "--run-id", "r", "--worker", "w"))
        done = out(
            invoke(
                db,
                "complete",
                "--run-id",
                "r",
                "--step",
                str(step["step_id"]),
                "--worker",
                "w",
                "--token",
                str(step["fencing_token"]),
                "--receipt",
                "-",
                "--outcome",
                "FAILURE",
                stdin=b'{"error": "timeout"}',
            )
        )
        assert done["step_id"] == step["step_id"]
        assert receipt_json(db, step["step_id"]) == {"error": "timeout"}
        assert out(invoke(db, "status", "--run-id", "r"))["receipts"]["FAILURE"] == 1

    def _complete_next(
        self, db: Path, step: dict[str, Any], *extra: str, stdin: bytes = b'{"ok": 1}'
    ) -> Result:
        return invoke(
            db,
            *("complete", "--run-id", "r", "--step", str(step["step_id"]), "--worker", "w"),
            *("--token", str(step["fencing_token"]), "--receipt", "-", "--outcome", "SUCCESS"),
            "--claim-next",
            *extra,
            stdin=stdin,
        )

    def test_claim_next_prints_the_receipt_and_the_next_lease(
        self, db: Path, payload: Path
    ) -> None:
        for _ in range(2):
            out(invoke(db, "post", "--payload", str(payload), "--run-id", "r", "--source", "USER"))
        first = out(invoke(db, "claim", "--run-id", "r", "--worker", "w"))
        before_ms = time.time_ns() // 1_000_000
        done = out(self._complete_next(db, first, "--ttl", "60"))
        after_ms = time.time_ns() // 1_000_000
        following = done["next"]
        assert done == {"receipt_id": 1, "step_id": first["step_id"], "next": following}
        assert following["step_id"] == first["step_id"] + 1
        assert following["fencing_token"] == 1
        assert (following["run_id"], following["worker_id"]) == ("r", "w")
        assert following["payload"] == {"task": "fetch", "n": 1}
        assert before_ms + 60_000 <= following["lease_expires_at"] <= after_ms + 60_000
        assert receipt_json(db, first["step_id"]) == {"ok": 1}
        last = out(self._complete_next(db, following))  # the default ttl: nothing is left
        assert last == {"receipt_id": 2, "step_id": following["step_id"], "next": None}
        status = out(invoke(db, "status", "--run-id", "r"))
        assert status["steps"] == {"PENDING": 0, "LEASED": 0, "COMMITTED": 2}
        verified = invoke(db, "verify")
        assert verified.exit_code == 0, verified.stderr

    def test_claim_next_refused_writes_neither(self, db: Path, payload: Path) -> None:
        for _ in range(2):
            out(invoke(db, "post", "--payload", str(payload), "--run-id", "r", "--source", "USER"))
        step = out(invoke(db, "claim", "--run-id", "r", "--worker", "w"))
        before = snapshot(db)
        stale = {**step, "fencing_token": step["fencing_token"] + 1}
        assert_refused(self._complete_next(db, stale), "STALE_FENCING_TOKEN")
        assert_refused(self._complete_next(db, step, "--ttl", "-1"), "INVALID_TTL")
        assert_refused(self._complete_next(db, step, stdin=b"[]"), "INVALID_PAYLOAD")
        assert snapshot(db) == before
        leased = out(invoke(db, "status", "--run-id", "r"))["steps"]
        assert leased == {"PENDING": 1, "LEASED": 1, "COMMITTED": 0}

    def test_claim_next_as_a_process_gives_no_traceback(self, db: Path, payload: Path) -> None:
        """The installed script: JSON on stdout, exit 0; a refusal, one coded line, exit 1;
        a usage error, exit 2."""
        out(invoke(db, "post", "--payload", str(payload), "--run-id", "r", "--source", "USER"))
        step = out(invoke(db, "claim", "--run-id", "r", "--worker", "w"))
        base = [cassette_script(), "--db", str(db), "complete", "--run-id", "r", "--worker", "w"]
        args = ["--step", str(step["step_id"]), "--receipt", "-", "--outcome", "SUCCESS"]
        ran = [
            subprocess.run(
                [*base, *args, "--token", token, *extra],
                input=b"{}",
                capture_output=True,
                timeout=60,
                check=False,
            )
            for token, extra in (
                ("1", ["--claim-next"]),
                ("1", ["--claim-next"]),
                ("1", ["--ttl", "5"]),
            )
        ]
        assert [r.returncode for r in ran] == [0, 1, 2]
        assert json.loads(ran[0].stdout) == {"receipt_id": 1, "step_id": 1, "next": None}
        assert ran[1].stdout == b"" and ran[1].stderr.startswith(b"error: DUPLICATE_RECEIPT: ")
        assert ran[2].stdout == b"" and ran[2].stderr.startswith(b"error: USAGE: ")
        assert all(b"Traceback" not in r.stderr and len(r.stderr.splitlines()) <= 1 for r in ran)


class TestRequeue:
    """``cassette requeue``."""

    def test_requeue_expired_then_reclaim_and_stale_complete(
        self, db: Path, payload: Path, receipt: Path
    ) -> None:
        out(invoke(db, "post", "--payload", str(payload), "--run-id", "r", "--source", "USER"))
        first = out(invoke(db, "claim", "--run-id", "r", "--worker", "w1", "--ttl", "0.05"))
        time.sleep(0.1)
        assert out(invoke(db, "status", "--run-id", "r"))["expired_leases"] == 1
        requeued = out(invoke(db, "requeue", "--run-id", "r"))
        assert requeued == {
            "run_id": "r",
            "steps": [{"step_id": first["step_id"], "action": "requeued", "fencing_token": 1}],
        }
        second = out(invoke(db, "claim", "--run-id", "r", "--worker", "w2"))
        assert second["step_id"] == first["step_id"]
        assert second["fencing_token"] == 2
        stale = invoke(
            db,
            "complete",
            "--run-id",
            "r",
            "--step",
            str(first["step_id"]),
            "--worker",
            "w1",
            "--token",
            "1",
            "--receipt",
            str(receipt),
            "--outcome",
            "SUCCESS",
        )
        assert_refused(stale, "STALE_FENCING_TOKEN")

    def test_requeue_one_step(self, db: Path, payload: Path) -> None:
        for _ in range(2):
            out(invoke(db, "post", "--payload", str(payload), "--run-id", "r", "--source", "USER"))
        short = out(invoke(db, "claim", "--run-id", "r", "--worker", "w", "--ttl", "0.05"))
        long = out(invoke(db, "claim", "--run-id", "r", "--worker", "w", "--ttl", "300"))
        assert_refused(
            invoke(db, "requeue", "--run-id", "r", "--step", str(long["step_id"])),
            "LEASE_NOT_EXPIRED",
        )
        time.sleep(0.1)
        result = out(invoke(db, "requeue", "--run-id", "r", "--step", str(short["step_id"])))
        assert result["steps"] == [
            {"step_id": short["step_id"], "action": "requeued", "fencing_token": 1}
        ]
        assert out(invoke(db, "status", "--run-id", "r"))["steps"] == {
            "PENDING": 1,
            "LEASED": 1,
            "COMMITTED": 0,
        }

    def test_requeue_release_by_holder(self, db: Path, payload: Path) -> None:
        out(invoke(db, "post", "--payload", str(payload), "--run-id", "r", "--source", "USER"))
        step = out(invoke(db, "claim", "--run-id", "r", "--worker", "w1", "--ttl", "300"))
        sid, token = str(step["step_id"]), str(step["fencing_token"])
        path_before = snapshot(db)
        wrong_worker = invoke(
            db, "requeue", "--run-id", "r", "--step", sid, "--worker", "w2", "--token", token
        )
        assert_refused(wrong_worker, "WRONG_WORKER")
        wrong_token = invoke(
            db, "requeue", "--run-id", "r", "--step", sid, "--worker", "w1", "--token", "7"
        )
        assert_refused(wrong_token, "STALE_FENCING_TOKEN")
        assert snapshot(db) == path_before
        released = out(
            invoke(
                db, "requeue", "--run-id", "r", "--step", sid, "--worker", "w1", "--token", token
            )
        )
        assert released == {
            "run_id": "r",
            "steps": [{"step_id": step["step_id"], "action": "released", "fencing_token": 1}],
        }
        assert out(invoke(db, "status", "--run-id", "r"))["steps"]["PENDING"] == 1
        again = out(invoke(db, "claim", "--run-id", "r", "--worker", "w3"))
        assert again["fencing_token"] == 2

    def test_requeue_max_attempts_aborts(self, db: Path, payload: Path) -> None:
        out(invoke(db, "post", "--payload", str(payload), "--run-id", "r", "--source", "USER"))
        step = out(invoke(db, "claim", "--run-id", "r", "--worker", "w1", "--ttl", "0.05"))
        time.sleep(0.1)
        result = out(invoke(db, "requeue", "--run-id", "r", "--max-attempts", "1"))
        assert result["steps"] == [
            {"step_id": step["step_id"], "action": "aborted", "fencing_token": 1}
        ]
        status = out(invoke(db, "status", "--run-id", "r"))
        assert status["steps"] == {"PENDING": 0, "LEASED": 0, "COMMITTED": 1}
        assert status["receipts"] == {"SUCCESS": 0, "FAILURE": 0, "ABORTED": 1}
        assert receipt_json(db, step["step_id"]) == {"reason": "max_attempts", "attempts": 1}

    def test_requeue_max_attempts_not_reached_requeues(self, db: Path, payload: Path) -> None:
        out(invoke(db, "post", "--payload", str(payload), "--run-id", "r", "--source", "USER"))
        out(invoke(db, "claim", "--run-id", "r", "--worker", "w1", "--ttl", "0.05"))
        time.sleep(0.1)
        result = out(invoke(db, "requeue", "--run-id", "r", "--max-attempts", "2"))
        assert [s["action"] for s in result["steps"]] == ["requeued"]


class TestVerify:
    """``cassette verify``."""

    def test_verify_intact(self, ledger: dict[str, Any]) -> None:
        path = ledger["path"]
        before = snapshot(path)
        result = invoke(path, "verify", "--json")
        assert result.exit_code == 0, result.stderr
        report = json.loads(result.stdout)
        assert report["ok"] is True
        assert report["journal_rows"] > 0
        assert report["findings"] == []
        assert result.stderr.splitlines()[-1].startswith(PASS)
        plain = invoke(path, "verify")
        assert plain.exit_code == 0
        assert plain.stderr.splitlines()[-1].startswith(PASS)
        assert snapshot(path) == before

    def test_verify_prints_findings_as_text_and_json_on_request(
        self, ledger: dict[str, Any]
    ) -> None:
        plain = invoke(ledger["path"], "verify")
        assert plain.exit_code == 0
        assert plain.stdout.startswith("note: ")  # text for people, no JSON document
        with pytest.raises(json.JSONDecodeError):
            json.loads(plain.stdout)
        as_json = invoke(ledger["path"], "verify", "--json")
        assert json.loads(as_json.stdout)["ok"] is True

    def test_verify_scoped_to_a_run(self, ledger: dict[str, Any]) -> None:
        path = ledger["path"]
        before = snapshot(path)
        for run_id in ("r1", "r2", "no-such-run"):
            scoped = invoke(path, "verify", "--json", "--run-id", run_id)
            assert scoped.exit_code == 0, (scoped.stdout, scoped.stderr)
            assert json.loads(scoped.stdout)["ok"] is True
            assert scoped.stderr.splitlines()[-1].startswith(PASS)
        assert snapshot(path) == before

    def test_verify_tampered_exits_1(self, ledger: dict[str, Any]) -> None:
        path = ledger["path"]
        if backends.is_postgresql(path):  # the owner turns the table's rules off and back on
            assert backends.raw_script(
                path,
                "ALTER TABLE cassette_receipts DISABLE TRIGGER USER",
                "UPDATE cassette_receipts SET outcome = 'FAILURE'",
                "ALTER TABLE cassette_receipts ENABLE TRIGGER USER",
            )
        else:
            conn = sqlite3.connect(path)
            conn.execute("DROP TRIGGER cassette_receipts_no_update")
            conn.execute("UPDATE cassette_receipts SET outcome = 'FAILURE'")
            conn.commit()
            conn.close()
        before = snapshot(path)
        result = invoke(path, "verify", "--json")
        assert result.exit_code == 1, (result.stdout, result.stderr)
        report = json.loads(result.stdout)
        assert report["ok"] is False
        errors = [f for f in report["findings"] if f["severity"] == "error"]
        assert errors
        assert result.stderr.splitlines()[-1] == f"FAIL: {len(errors)} issue(s) found"
        plain = invoke(path, "verify")
        assert plain.exit_code == 1
        assert plain.stderr.splitlines()[-1] == f"FAIL: {len(errors)} issue(s) found"
        assert snapshot(path) == before


class TestEveryCommand:
    """Bad input and usage errors across every command."""

    @pytest.mark.parametrize(("args", "stdin", "code"), BAD_INPUT)
    def test_bad_input_is_refused_and_changes_nothing(
        self,
        ledger: dict[str, Any],
        bad_files: dict[str, str],
        args: tuple[str, ...],
        stdin: bytes | None,
        code: str,
    ) -> None:
        path = ledger["path"]
        values = {**bad_files, "step": str(ledger["step"]), "token": str(ledger["token"])}
        before = snapshot(path)
        result = invoke(path, *_fill(args, values), stdin=stdin)
        assert_refused(result, code, exit_code=2 if code == "USAGE" else 1)
        assert snapshot(path) == before

    @pytest.mark.parametrize(
        ("args", "code"),
        [
            pytest.param(
                (
                    "complete",
                    "--run-id",
                    "r1",
                    "--step",
                    "{step}",
                    "--worker",
                    "w2",
                    "--token",
                    TOO_BIG,
                    "--receipt",
                    "{good}",
                    "--outcome",
                    "SUCCESS",
                ),
                "INVALID_TOKEN",
                id="complete-token",
            ),
            pytest.param(
                (
                    "complete",
                    "--run-id",
                    "r1",
                    "--step",
                    TOO_BIG,
                    "--worker",
                    "w2",
                    "--token",
                    "{token}",
                    "--receipt",
                    "{good}",
                    "--outcome",
                    "SUCCESS",
                ),
                "STEP_NOT_FOUND",
                id="complete-step",
            ),
            pytest.param(
                ("requeue", "--run-id", "r1", "--step", TOO_BIG),
                "STEP_NOT_FOUND",
                id="requeue-step",
            ),
        ],
    )
    def test_integer_beyond_64_bits_is_refused(
        self, ledger: dict[str, Any], bad_files: dict[str, str], args: tuple[str, ...], code: str
    ) -> None:
        path = ledger["path"]
        values = {**bad_files, "step": str(ledger["step"]), "token": str(ledger["token"])}
        before = snapshot(path)
        result = invoke(path, *_fill(args, values))
        assert_refused(result, code)
        assert snapshot(path) == before

    @pytest.mark.parametrize("args", USAGE_ERRORS)
    def test_usage_errors_exit_2(self, ledger: dict[str, Any], args: tuple[str, ...]) -> None:
        path = ledger["path"]
        before = snapshot(path)
        result = invoke(path, *args)
        assert result.exit_code == 2, (result.stdout, result.stderr)
        assert result.stdout == ""
        assert snapshot(path) == before

    def test_bad_durability_is_usage_error(self, ledger: dict[str, Any]) -> None:
        path = ledger["path"]
        before = snapshot(path)
        result = CliRunner().invoke(
            cli, ["--db", str(path), "--durability", "sometimes", "status", "--run-id", "r1"]
        )
        assert result.exit_code == 2
        assert snapshot(path) == before


class TestOpening:
    """Opening a ledger that cannot be used, for every command that opens one."""

    @pytest.mark.parametrize("args", OPENING_COMMANDS)
    def test_missing_directory_cannot_open(
        self, tmp_path: Path, bad_files: dict[str, str], args: tuple[str, ...]
    ) -> None:
        path = tmp_path / "missing" / "deeper" / "x.db"
        assert_refused(invoke(path, *_fill(args, bad_files)), "CANNOT_OPEN")
        assert not path.parent.exists()
        assert_refused(invoke(path, "verify"), "CANNOT_OPEN", exit_code=3)
        assert not path.parent.exists()

    @pytest.mark.parametrize("args", OPENING_COMMANDS)
    def test_unwritable_location_cannot_open(
        self, bad_files: dict[str, str], args: tuple[str, ...]
    ) -> None:
        path = Path("/proc/cassette-test.db")
        assert_refused(invoke(path, *_fill(args, bad_files)), "CANNOT_OPEN")
        assert not path.exists()
        assert_refused(invoke(path, "verify"), "CANNOT_OPEN", exit_code=3)

    def test_directory_as_database_cannot_open(self, tmp_path: Path) -> None:
        assert_refused(invoke(tmp_path, "status", "--run-id", "r"), "CANNOT_OPEN")

    @pytest.mark.parametrize("args", OPENING_COMMANDS)
    def test_file_that_is_not_sqlite(
        self, tmp_path: Path, bad_files: dict[str, str], args: tuple[str, ...]
    ) -> None:
        path = tmp_path / "notes.db"
        content = b"These are my notes, not a database.\n" * 20
        path.write_bytes(content)
        assert_refused(invoke(path, *_fill(args, bad_files)), "NOT_A_CASSETTE")
        assert path.read_bytes() == content
        assert_refused(invoke(path, "verify"), "NOT_A_CASSETTE", exit_code=3)
        assert path.read_bytes() == content
        assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("notes")) == [
            "notes.db"
        ]

    @pytest.mark.parametrize("args", OPENING_COMMANDS)
    def test_sqlite_database_that_is_not_a_cassette(
        self, tmp_path: Path, bad_files: dict[str, str], args: tuple[str, ...]
    ) -> None:
        path = tmp_path / "other.db"
        conn = sqlite3.connect(path)
        conn.execute("CREATE TABLE customers (id INTEGER PRIMARY KEY, name TEXT)")
        conn.execute("INSERT INTO customers (name) VALUES ('ada'), ('grace')")
        conn.commit()
        conn.close()
        before = snapshot(path)
        assert_refused(invoke(path, *_fill(args, bad_files)), "NOT_A_CASSETTE")
        assert snapshot(path) == before
        assert_refused(invoke(path, "verify"), "NOT_A_CASSETTE", exit_code=3)
        assert snapshot(path) == before


class TestMigrate:
    """A newer schema than this version knows (migration refused)."""

    @pytest.mark.parametrize("args", OPENING_COMMANDS)
    def test_newer_schema_is_refused(
        self, ledger: dict[str, Any], bad_files: dict[str, str], args: tuple[str, ...]
    ) -> None:
        path = ledger["path"]
        _make_newer(path)
        before = snapshot(path)
        assert_refused(invoke(path, *_fill(args, bad_files)), "SCHEMA_TOO_NEW")
        assert snapshot(path) == before
        assert_refused(invoke(path, "verify"), "SCHEMA_TOO_NEW", exit_code=3)
        assert snapshot(path) == before

    @pytest.mark.sqlite_only(reason="the SQLite files development builds made")
    @pytest.mark.parametrize("args", OPENING_COMMANDS)
    def test_a_development_build_ledger_is_refused(
        self, tmp_path: Path, bad_files: dict[str, str], args: tuple[str, ...]
    ) -> None:
        """Exit 1 (3 for verify), one error line, no traceback, the file unchanged."""
        path = tmp_path / "development.db"
        load_development_ledger(path)
        before = snapshot(path)
        assert_refused(invoke(path, *_fill(args, bad_files)), "SCHEMA_UNRELEASED")
        assert snapshot(path) == before
        assert_refused(invoke(path, "migrate", "--check"), "SCHEMA_UNRELEASED")
        assert_refused(invoke(path, "verify"), "SCHEMA_UNRELEASED", exit_code=3)
        assert snapshot(path) == before

    @pytest.mark.sqlite_only(reason="rollback journal mode is a setting of a SQLite file")
    def test_newer_schema_in_rollback_mode_is_left_untouched(self, ledger: dict[str, Any]) -> None:
        path = ledger["path"]
        _make_newer(path)
        conn = sqlite3.connect(path)
        assert conn.execute("PRAGMA journal_mode = DELETE").fetchone()[0] == "delete"
        conn.close()
        before = snapshot(path)
        assert_refused(invoke(path, "status", "--run-id", "r1"), "SCHEMA_TOO_NEW")
        assert snapshot(path) == before


class TestMounting:
    """The cassette commands mounted inside another click group."""

    def test_mounted_verify(self, ledger: dict[str, Any]) -> None:
        cortex = _cortex()
        result = CliRunner().invoke(cortex, ["cassette", "--db", str(ledger["path"]), "verify"])
        assert result.exit_code == 0, result.stderr
        assert result.stderr.splitlines()[-1].startswith(PASS)
        as_json = CliRunner().invoke(
            cortex, ["cassette", "--db", str(ledger["path"]), "verify", "--json"]
        )
        assert as_json.exit_code == 0
        assert json.loads(as_json.stdout)["ok"] is True

    def test_mounted_post_and_refusal(self, ledger: dict[str, Any], payload: Path) -> None:
        cortex = _cortex()
        path = ledger["path"]
        base = ["cassette", "--db", str(path), "post", "--run-id", "r9", "--payload"]
        posted = CliRunner().invoke(cortex, [*base, str(payload), "--source", "USER"])
        assert out(posted) == {"message_id": 5, "job_id": 5}
        from_stdin = CliRunner().invoke(
            cortex, [*base, "-", "--source", "WORKER"], input=b'{"from": "stdin"}'
        )
        assert out(from_stdin)["message_id"] == 6
        before = snapshot(path)
        refused = CliRunner().invoke(cortex, [*base, str(payload), "--source", "ALIEN"])
        assert_refused(refused, "INVALID_SOURCE")
        no_steps = CliRunner().invoke(
            cortex, ["cassette", "--db", str(path), "claim", "--run-id", "empty", "--worker", "w"]
        )
        assert_refused(no_steps, "NO_PENDING_STEPS")
        assert snapshot(path) == before
        assert CliRunner().invoke(cortex, ["hello"]).stdout == "hello from cortex\n"

    def test_mounted_newer_schema_verify_exits_3(self, ledger: dict[str, Any]) -> None:
        _make_newer(ledger["path"])
        result = CliRunner().invoke(_cortex(), ["cassette", "--db", str(ledger["path"]), "verify"])
        assert_refused(result, "SCHEMA_TOO_NEW", exit_code=3)


class TestHelp:
    """``--help`` and the README for every command."""

    def test_core_commands_exist(self) -> None:
        assert set(CORE_COMMANDS) <= set(cli.commands)

    @pytest.mark.parametrize("path", ALL_COMMAND_PATHS, ids=" ".join)
    def test_every_command_has_help(self, path: tuple[str, ...]) -> None:
        command: click.Command = cli
        for name in path:
            assert isinstance(command, click.Group)
            command = command.commands[name]
        short = command.get_short_help_str()
        assert short.strip(), f"{' '.join(path)} has no short help"
        for flag in ("--help", "-h"):
            result = CliRunner().invoke(cli, [*path, flag])
            assert result.exit_code == 0, result.output
            assert f"{path[-1]} [OPTIONS]" in result.stdout
            assert short.rstrip(".").split()[0] in result.stdout

    def test_group_help_lists_commands(self) -> None:
        result = CliRunner().invoke(cli, ["--help"])
        assert result.exit_code == 0
        for name in TOP_LEVEL_COMMANDS:
            assert re.search(rf"^\s+{name}\s+\S", result.stdout, re.MULTILINE), name
        assert CliRunner().invoke(cli, ["-h"]).exit_code == 0

    @pytest.mark.parametrize("name", TOP_LEVEL_COMMANDS)
    def test_readme_documents_every_command(self, name: str) -> None:
        documented = _readme_cassette_lines()
        assert any(name in line.split()[1:] for line in documented), (
            f"README.md has no code-block line starting with `cassette ` that uses {name!r}"
        )


class TestEntryPoints:
    """``python -m catalytic_cassette`` and the ``cassette`` script in a subprocess."""

    def test_python_dash_m_and_script(self, tmp_path: Path) -> None:
        path = tmp_path / "sub.db"
        init = subprocess.run(
            [sys.executable, "-m", "catalytic_cassette", "--db", str(path), "init"],
            capture_output=True,
            env=_env(),
            cwd=tmp_path,
            timeout=60,
            check=False,
        )
        assert init.returncode == 0, init.stderr
        assert json.loads(init.stdout)["created"] is True

        posted = subprocess.run(
            [
                cassette_script(),
                "--db",
                str(path),
                "post",
                "--payload",
                "-",
                "--run-id",
                "r",
                "--source",
                "USER",
            ],
            input=b'{"via": "script"}',
            capture_output=True,
            env=_env(),
            timeout=60,
            check=False,
        )
        assert posted.returncode == 0, posted.stderr
        assert json.loads(posted.stdout) == {"message_id": 1, "job_id": 1}

        before = snapshot(path)
        refused = subprocess.run(
            [
                cassette_script(),
                "--db",
                str(path),
                "claim",
                "--run-id",
                "r",
                "--worker",
                "w",
                "--ttl",
                "never",
            ],
            capture_output=True,
            env=_env(),
            timeout=60,
            check=False,
        )
        assert refused.returncode == 2
        assert refused.stdout == b""
        assert refused.stderr.decode().splitlines() == [
            "error: USAGE: Invalid value for '--ttl': 'never' is not a valid float. (see --help)"
        ]
        assert snapshot(path) == before

        verify = subprocess.run(
            [sys.executable, "-m", "catalytic_cassette", "--db", str(path), "verify", "--json"],
            capture_output=True,
            env=_env(),
            timeout=60,
            check=False,
        )
        assert verify.returncode == 0
        assert json.loads(verify.stdout)["ok"] is True
        assert verify.stderr.decode().splitlines()[-1].startswith(PASS)

    def test_subprocess_newer_schema_verify_exits_3(self, ledger: dict[str, Any]) -> None:
        _make_newer(ledger["path"])
        result = subprocess.run(
            [cassette_script(), "--db", str(ledger["path"]), "verify"],
            capture_output=True,
            env=_env(),
            timeout=60,
            check=False,
        )
        assert result.returncode == 3
        lines = result.stderr.decode().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: SCHEMA_TOO_NEW: "), lines


class TestDemo:
    """``cassette demo``."""

    def test_demo_in_subprocess(self, tmp_path: Path) -> None:
        """`cassette --db PATH demo` writes there, says so and keeps it; nothing else."""
        result = subprocess.run(
            [cassette_script(), "--db", "demo.db", "demo"],
            capture_output=True,
            env=_env(),
            cwd=tmp_path,
            timeout=180,
            check=False,
        )
        text = result.stdout.decode() + result.stderr.decode()
        assert result.returncode == 0, text
        assert PASS in text
        assert "STALE_FENCING_TOKEN" in text
        assert "Traceback" not in text
        assert "Ledger: demo.db" in text and "kept at demo.db" in text
        assert [p.name for p in tmp_path.iterdir()] == ["demo.db"]
