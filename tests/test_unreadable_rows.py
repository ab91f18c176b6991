"""A stored row or journal body a command cannot decode is a coded answer (UNREADABLE_ROW),
never a traceback: edited as its attacker edits it (the SQLite file through writable_schema
with the guards dropped, the PostgreSQL owner with triggers off), then read by each
command through the CLI."""

from __future__ import annotations

import re
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from catalytic_cassette import ManualClock, MessageCassette
from catalytic_cassette.chain import CausalChain
from catalytic_cassette.cli import cli

from .backends import Ledger
from .conftest import action_dict, tampering, unguarded
from .test_cli_edges import READ_COMMANDS, _fill

pytestmark = pytest.mark.both_backends

CODE_LINE = re.compile(r"^error: ([A-Z][A-Z_]+): \S.*$")
# The read commands, and verify's checks that decode rows: signatures and one session.
COMMANDS = {
    **READ_COMMANDS,
    ("verify", "--action-key"): ("{pub}",),
    ("verify", "--session"): ("s",),
}
VERIFYING = {("prove", "inclusion"), ("prove", "receipt"), ("prove", "consistency")}

# Stored text no reader can decode, as SQL literals. None of the API's paths writes these.
UNREADABLE = {
    "deep": "'" + '{"a":' + "[" * 1500 + "]" * 1500 + "}'",  # past orjson's 1024 levels
    "wide": '\'{"table":"x","op":"INSERT","key":1,"row":{"n":1180591620717411303424}}\'',
    "not-json": "'{\"a\": '",
    "scalar": "'5'",
    "utf8": "CAST(x'7b2261223a22ff227d' AS TEXT)",  # {"a":"<0xff>"}: SQLite only
}
# A JSON object whose fields have the wrong types for what reads it.
WRONG_TYPES = '\'{"table":1,"op":[],"key":{},"row":5,"retries":[1],"context":1}\''


def invoke(db: str, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--db", db, *args])


def coded(result: Result, case: str = "", code: str = "UNREADABLE_ROW") -> None:
    """Exit 1, one ``error: CODE: ...`` line on stderr, no Python exception."""
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    assert result.exit_code == 1, (case, result.exit_code, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    match = CODE_LINE.match(lines[0])
    assert match is not None and match.group(1) == code, lines[0]


@pytest.fixture
def ledger(backend: Ledger, tmp_path: Path) -> dict[str, Any]:
    """A run with a receipt, a plan of three actions, a checkpoint and a key pair."""
    with backend.open() as cassette:
        cassette.post_message({"a": 1}, "r", "USER")
        step = cassette.claim_step("r", "w", 600)
        cassette.complete_step("r", step["step_id"], "w", step["fencing_token"], {}, "SUCCESS")
    with CausalChain(backend.target, clock=backend.clock) as chain:
        plan = chain.append_action(action_dict("PlanStarted", "plan", session="s"))
        step_action = chain.append_action(
            action_dict("PlanStepStarted", "s", plan.action_id, session="s")
        )
        call = chain.append_action(
            action_dict("CapabilityCall", "c", step_action.action_id, session="s")
        )
        chain.save_checkpoint("p", {"at": 1})
    CliRunner().invoke(cli, ["keygen", "--out", str(tmp_path / "k")])
    return {
        "backend": backend,
        "db": backend.target,
        "tmp": tmp_path,
        "plan": plan.action_id,
        "step": step_action.action_id,
        "call": call.action_id,
        "key": tmp_path / "k.key",
        "pub": tmp_path / "k.pub",
    }


def _sqlite_store(path: Path, update: str) -> None:
    """Run ``update`` on the file as its owner can: guards dropped, CHECKs ignored, and
    the table's schema text loosened through writable_schema for the write (its stored
    generated columns and JSON-expression indexes would evaluate the text), then put back."""
    table = re.search(r"UPDATE (\w+)", update).group(1)  # type: ignore[union-attr]
    with unguarded(path, table) as conn:
        for (index,) in conn.execute(
            "SELECT name FROM sqlite_master WHERE type = 'index' AND tbl_name = ?"
            " AND sql LIKE '%json_extract%'",
            (table,),
        ).fetchall():
            conn.execute(f"DROP INDEX {index}")
        (original,) = conn.execute(
            "SELECT sql FROM sqlite_master WHERE name = ?", (table,)
        ).fetchone()
        loose = re.sub(r"GENERATED ALWAYS AS \(json_extract\([^)]*\)\) STORED", "", original)
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute("UPDATE sqlite_master SET sql = ? WHERE name = ?", (loose, table))
        conn.execute("PRAGMA writable_schema = OFF")
    with unguarded(path, table) as conn:  # a new connection reads the loosened schema
        conn.execute("PRAGMA ignore_check_constraints = ON")
        conn.execute(update)
        conn.execute("PRAGMA writable_schema = ON")
        conn.execute("UPDATE sqlite_master SET sql = ? WHERE name = ?", (original, table))
        conn.execute("PRAGMA writable_schema = OFF")


def store(backend: Ledger, *updates: str) -> None:
    """Each UPDATE committed as the backend's strongest attacker runs it."""
    if backend.postgresql:
        with tampering(backend.target) as conn:
            for update in updates:
                conn.execute(update)
        return
    for update in updates:
        _sqlite_store(Path(backend.target), update)


def _kinds(backend: Ledger) -> list[str]:
    # PostgreSQL text holds only valid UTF-8
    return [kind for kind in UNREADABLE if not (backend.postgresql and kind == "utf8")]


LAST_ENTRY = "(SELECT max(seq) FROM cassette_journal)"


def test_tail_answers_each_unreadable_body_with_a_code(ledger: dict[str, Any]) -> None:
    backend = ledger["backend"]
    for kind in [*_kinds(backend), "wrong-types"]:
        value = WRONG_TYPES if kind == "wrong-types" else UNREADABLE[kind]
        store(backend, f"UPDATE cassette_journal SET body = {value} WHERE seq = {LAST_ENTRY}")
        result = invoke(ledger["db"], "tail")
        coded(result)
        assert "seq" in result.stderr or "UTF-8" in result.stderr, (kind, result.stderr)
        # every entry before it was printed, in order, before the answer
        assert len(result.stdout.splitlines()) == backend.scalar(f"SELECT {LAST_ENTRY}"), (
            result.stderr
        )


def test_action_show_answers_an_unreadable_field_with_a_code(ledger: dict[str, Any]) -> None:
    backend = ledger["backend"]
    for column in ("metadata_json", "arguments_json", "result_json"):
        for kind in _kinds(backend):
            if kind == "scalar" and column == "result_json":
                continue  # a result may be any JSON value
            store(
                backend,
                f"UPDATE cassette_actions SET {column} = {UNREADABLE[kind]}"
                f" WHERE action_id = '{ledger['call']}'",
            )
            coded(invoke(ledger["db"], "action", "show", ledger["call"]), f"{column} {kind}")
        readable = {"metadata_json": "'{}'", "arguments_json": "'[]'", "result_json": "NULL"}
        store(
            backend,
            f"UPDATE cassette_actions SET {column} = {readable[column]}"
            f" WHERE action_id = '{ledger['call']}'",
        )
        assert invoke(ledger["db"], "action", "show", ledger["call"]).exit_code == 0
    assert invoke(ledger["db"], "action", "show", ledger["plan"]).exit_code == 0


def _every_read_command(ledger: dict[str, Any]) -> None:
    """Each command answers 0 or one coded line (verify and proofs: its findings, exit
    1 or 3), never a traceback."""
    for path, args in COMMANDS.items():
        result = invoke(ledger["db"], *path, *_fill(args, ledger))
        where = (" ".join(path), result.exit_code, result.stderr[-300:])
        assert result.exception is None or isinstance(result.exception, SystemExit), (
            where,
            repr(result.exception),
        )
        if path[0] == "verify" or path in VERIFYING:
            assert result.exit_code in (0, 1, 3), where
        elif result.exit_code != 0:
            assert result.exit_code == 1, where
            lines = result.stderr.splitlines()
            assert len(lines) == 1 and CODE_LINE.match(lines[0]), where


def _unread_everywhere(ledger: dict[str, Any], value: str) -> None:
    step, call = ledger["step"], ledger["call"]
    store(
        ledger["backend"],
        f"UPDATE cassette_journal SET body = {value} WHERE seq = {LAST_ENTRY}",
        f"UPDATE cassette_actions SET metadata_json = {value} WHERE action_id = '{step}'",
        f"UPDATE cassette_actions SET arguments_json = {value} WHERE action_id = '{call}'",
        f"UPDATE cassette_steps SET payload_json = {value}",
        f"UPDATE cassette_messages SET payload_json = {value}",
        f"UPDATE cassette_receipts SET receipt_json = {value}",
        f"UPDATE cassette_checkpoints SET context_json = {value}",
    )


def test_every_read_command_answers_an_unreadable_ledger_with_a_code(
    ledger: dict[str, Any],
) -> None:
    """Each kind in turn, written over the last: a sweep of every read command for each."""
    for kind in ("deep", "wrong-types", "utf8"):
        if kind in _kinds(ledger["backend"]) or kind == "wrong-types":
            _unread_everywhere(ledger, WRONG_TYPES if kind == "wrong-types" else UNREADABLE[kind])
            _every_read_command(ledger)


def test_what_the_api_stores_reads_back_with_no_answer(tmp_path: Path) -> None:
    """The same reader passes every honest row: deep (254 levels, what the encoder
    writes), the 64-bit edges, digits in strings."""
    deep: Any = 1
    for _ in range(253):
        deep = [deep]
    db = tmp_path / "honest.db"
    value = {"deep": deep, "edges": [2**63 - 1, -(2**63)], "text": "1" * 40}
    with MessageCassette(db, clock=ManualClock(1)) as cassette:
        cassette.post_message(value, "r", "USER")
    result = invoke(str(db), "tail")
    assert result.exit_code == 0, result.stderr
    assert len(result.stdout.splitlines()) == 3
    raw = sqlite3.connect(db).execute("SELECT payload_json FROM cassette_steps").fetchone()[0]
    assert "[" * 253 + "1" + "]" * 253 in raw and "9223372036854775807" in raw


def test_a_checkpoint_rewritten_with_its_id_but_no_context_is_a_coded_answer(
    ledger: dict[str, Any],
) -> None:
    from catalytic_cassette.plans import checkpoint_id_for

    text = '{"plan_id":"p"}'
    forged = checkpoint_id_for(text)
    store(
        ledger["backend"],
        f"UPDATE cassette_checkpoints SET context_json = '{text}', checkpoint_id = '{forged}'",
    )
    coded(invoke(ledger["db"], "checkpoint", "show", forged))
    coded(invoke(ledger["db"], "checkpoint", "latest", "--plan", "p"))
