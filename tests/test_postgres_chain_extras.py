"""The causal chain's extras on PostgreSQL (issue 15): signed actions, artifact files,
suggested causes while appending, `plan show`, `verify --session`, `export` and
`verify-bundle`, each with the results, JSON, exit codes and error codes of SQLite.

Every test runs on both backends (``target``) or holds one backend's answer to the
other's; the attacks are done as the database owner in raw SQL (PostgreSQL) or as a
client that writes what it likes through the API (both).
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner

from catalytic_cassette import CassetteError, ErrorCode
from catalytic_cassette.chain import CausalChain
from catalytic_cassette.cli import cli
from catalytic_cassette.session_verify import verify_session_path
from catalytic_cassette.signing import check, generate, load_public
from catalytic_cassette.verify import verify_path

psycopg = pytest.importorskip("psycopg")

from catalytic_cassette.postgresql.chain import PgCausalChain  # noqa: E402

COLUMNS_SQL = (
    "SELECT action_seq, action_id, parent_action_id, plan_id, intent_id, session_id,"
    " action_type, function_name, arguments_json, arguments_artifact, result_json,"
    ' result_artifact, success, error_message, cost_micros, duration_ms, "timestamp",'
    " metadata_json, caused_by, rationale, category FROM cassette_actions ORDER BY action_seq"
)
BIG = "x" * 70_000  # over the default artifact threshold (64 KiB)


def uid(n: int) -> str:
    return f"00000000-0000-4000-8000-{n:012x}"


def act(**fields: Any) -> dict[str, Any]:
    base: dict[str, Any] = {
        "plan_id": "plan",
        "intent_id": "intent",
        "session_id": "s",
        "action_type": "InternalStep",
        "function_name": "fn",
    }
    base.update(fields)
    return base


def code_of(call: Any) -> str:
    try:
        call()
    except CassetteError as error:
        return error.code.value
    return "ACCEPTED"


@pytest.fixture(params=["sqlite", "postgresql"])
def target(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    if request.param == "sqlite":
        return str(tmp_path / "chain.db")
    return str(request.getfixturevalue("pg_ledger"))


@pytest.fixture
def keys(tmp_path: Path) -> tuple[Path, Path]:
    return generate(str(tmp_path / "signer"))


def rows_of(target: str) -> list[dict[str, Any]]:
    """Every action row as stored, read without the package."""
    names = [c.strip().strip('"') for c in COLUMNS_SQL[7:].split(" FROM ")[0].split(",")]
    if target.startswith("postgresql"):
        with psycopg.connect(target) as conn:
            found = conn.execute(COLUMNS_SQL).fetchall()
    else:
        import sqlite3

        conn = sqlite3.connect(target)
        try:
            found = conn.execute(COLUMNS_SQL).fetchall()
        finally:
            conn.close()
    return [dict(zip(names, row, strict=True)) for row in found]


def run(target: str, *args: str, artifact_dir: Path | None = None) -> Any:
    extra = [] if artifact_dir is None else ["--artifact-dir", str(artifact_dir)]
    return CliRunner().invoke(cli, ["--db", target, *extra, *args])


# ----------------------------------------------------------------- signed actions


def test_signed_actions_verify_on_both_backends_and_on_a_copy(
    target: str, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    private, public = keys
    with CausalChain(target, signing_key=private) as chain:
        started = chain.append_action(act(action_id=uid(1), action_type="PlanStarted"))
        batch = chain.append_actions([act(parent_action_id=uid(1)), act(caused_by=uid(1))])
        paused = chain.pause("plan", {"at": 1})
        resumed = chain.resume("plan")["action"]
        stored = [chain.get_action(a.action_id) for a in (started, *batch, paused, resumed)]
    assert stored == [started, *batch, paused, resumed]
    key = load_public(public)
    rows = rows_of(target)
    assert len(rows) == 5
    assert [check(key, row) for row in rows] == [None] * 5  # the row as stored is signed
    assert {json.loads(r["metadata_json"])["key_id"] for r in rows} == {started.metadata["key_id"]}
    report = verify_path(target, public_key=key)
    assert report.ok, report.findings
    assert verify_session_path(target, "s", public_key=key).ok
    copy = tmp_path / "copy.db"
    assert run(target, "copy", target, str(copy)).exit_code == 0
    assert verify_path(str(copy), public_key=key).ok  # the signatures hold in SQLite too


def test_signing_with_another_key_and_forged_signatures_are_reported(
    target: str, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    private, public = keys
    other_private, _ = generate(str(tmp_path / "other"))
    with CausalChain(target, signing_key=private) as chain:
        chain.append_action(act(action_id=uid(1)))
        real = chain.get_action(uid(1)).metadata
    with CausalChain(target, signing_key=other_private) as chain:
        chain.append_action(act(action_id=uid(2)))
    with CausalChain(target) as chain:  # a client writing signature fields it did not make
        chain.append_action(act(action_id=uid(3), metadata=real))
        chain.append_action(act(action_id=uid(4)))
    report = verify_path(target, public_key=load_public(public))
    found = {(f.kind.value, f.key) for f in report.findings}
    assert found == {
        ("unknown_key", uid(2)),
        ("bad_signature", uid(3)),
        ("unsigned_action", uid(4)),
    }
    result = run(target, "verify", "--action-key", str(public))
    assert result.exit_code == 1 and "bad_signature" in result.stdout


def test_an_owner_forging_a_signed_row_in_raw_sql_is_reported(
    pg_ledger: str, keys: tuple[Path, Path]
) -> None:
    """The owner rewrites a signed action (and its journal entry, so the chain and the
    state still agree) with triggers off: only the signature can tell, and does."""
    private, public = keys
    with CausalChain(pg_ledger, signing_key=private) as chain:
        chain.append_action(act(action_id=uid(1), rationale="honest"))
        chain.append_action(act(action_id=uid(2)))
    with psycopg.connect(pg_ledger, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute(
            "UPDATE cassette_actions SET rationale = 'forged' WHERE action_id = %s", (uid(1),)
        )
        # the journal rebuilt from seq 0 with the forged body: every hash recomputed
        entries = conn.execute("SELECT seq, body FROM cassette_journal ORDER BY seq").fetchall()
        previous = bytes(32)
        for seq, body in entries:
            body = body.replace('"rationale":"honest"', '"rationale":"forged"')
            leaf = hashlib.sha256(b"\x00" + body.encode()).digest()
            previous = hashlib.sha256(b"\x02" + seq.to_bytes(8, "big") + previous + leaf).digest()
            conn.execute(
                "UPDATE cassette_journal SET body = %s, leaf_hash = %s, chain_hash = %s"
                " WHERE seq = %s",
                (body, leaf, previous, seq),
            )
    key = load_public(public)
    report = verify_path(pg_ledger, public_key=key)
    kinds = {(f.kind.value, f.key) for f in report.findings}
    assert ("bad_signature", uid(1)) in kinds
    assert not any(kind == "state_mismatch" for kind, _ in kinds)  # the rewrite agrees
    session = verify_session_path(pg_ledger, "s", public_key=key)
    assert [(f["kind"], f["action_id"]) for f in session.findings] == [("bad_signature", uid(1))]
    cli_session = run(pg_ledger, "verify", "--session", "s", "--action-key", str(public))
    assert cli_session.exit_code == 1 and "bad_signature" in cli_session.stdout


def test_the_cli_signs_on_both_backends(
    target: str, keys: tuple[Path, Path], tmp_path: Path
) -> None:
    private, public = keys
    items = tmp_path / "items.json"
    items.write_text(json.dumps([act(), act(session_id="t")]))
    appended = run(
        target, "action", "append", "--actions", str(items), "--signing-key", str(private)
    )
    assert appended.exit_code == 0, appended.output
    assert [a["metadata"]["key_id"] for a in json.loads(appended.stdout)] == [
        json.loads(appended.stdout)[0]["metadata"]["key_id"]
    ] * 2
    verified = run(target, "verify", "--action-key", str(public))
    assert verified.exit_code == 0, verified.output
    missing = run(target, "action", "append", "--actions", str(items), "--signing-key", "nope")
    assert missing.exit_code == 2  # click: the key file must exist


def test_an_appender_login_signs_and_suggests(pg_ledger: str, keys: tuple[Path, Path]) -> None:
    """The appender role may take the transaction's time (0008) and nothing else new."""
    from .postgres import database_name

    role = "appender_" + database_name(pg_ledger)[-12:]
    with psycopg.connect(pg_ledger, autocommit=True) as conn:
        conn.execute(f"CREATE ROLE {role} LOGIN IN ROLE cassette_appender")
    try:
        url = pg_ledger.replace("postgres@", f"{role}@", 1)
        if url == pg_ledger:
            pytest.skip("the server URL names no user to replace")
        with CausalChain(url, signing_key=keys[0]) as chain:
            first = chain.append_action(act())
            second = chain.append_action(act(), suggest_causes=True)
        assert second.metadata["suggested_causes"][0]["action_id"] == first.action_id
        assert verify_path(pg_ledger, public_key=load_public(keys[1])).ok
        for role_name in ("cassette_auditor", "cassette_worker"):
            with psycopg.connect(pg_ledger, autocommit=True) as conn:
                conn.execute(f"SET ROLE {role_name}")
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute("SELECT cassette_append_time()")
    finally:
        with psycopg.connect(pg_ledger, autocommit=True) as conn:
            conn.execute(f"DROP ROLE {role}")


# ------------------------------------------------------------------ artifact files


def test_artifact_files_in_a_named_folder_on_both_backends(target: str, tmp_path: Path) -> None:
    folder = tmp_path / "arts"
    with CausalChain(target, artifact_dir=folder) as chain:
        stored = chain.append_action(act(action_id=uid(1), arguments=[BIG], result={"r": BIG}))
        assert chain.get_action(uid(1)) == stored
        assert stored.arguments == [BIG] and stored.result == {"r": BIG}
    (row,) = rows_of(target)
    assert row["arguments_json"] is None and row["result_json"] is None
    ref = json.loads(row["arguments_artifact"])
    data = json.dumps([BIG], separators=(",", ":")).encode()
    assert ref == {
        "sha256": hashlib.sha256(data).hexdigest(),
        "size": len(data),
        "path": f"arts/{hashlib.sha256(data).hexdigest()}",  # the same text on both
    }
    assert (folder / ref["sha256"]).read_bytes() == data
    assert verify_path(target, artifact_root=folder).ok
    (folder / ref["sha256"]).unlink()
    report = verify_path(target, artifact_root=folder)
    assert [(f.kind.value, f.key) for f in report.findings] == [("artifact_missing", uid(1))]
    with CausalChain(target, artifact_dir=folder, read_only=True) as chain:
        assert code_of(lambda: chain.get_action(uid(1))) == "ARTIFACT_MISSING"


def test_a_postgresql_ledger_without_a_folder_refuses_large_values(pg_ledger: str) -> None:
    with CausalChain(pg_ledger) as chain:
        with pytest.raises(CassetteError) as refused:
            chain.append_actions([act(), act(arguments=[BIG])])
        assert refused.value.code is ErrorCode.INVALID_ARGUMENT
        assert refused.value.detail["index"] == 1
        assert "artifact" in refused.value.message
        assert chain.find_actions() == []  # nothing written
        assert chain.append_action(act(arguments=["small"])).arguments == ["small"]


def test_reading_an_artifact_without_the_folder_says_what_is_missing(
    pg_ledger: str, tmp_path: Path
) -> None:
    with CausalChain(pg_ledger, artifact_dir=tmp_path / "a") as chain:
        chain.append_action(act(action_id=uid(1), result=BIG))
    with CausalChain(pg_ledger, read_only=True) as chain:
        assert code_of(lambda: chain.get_action(uid(1))) == "INVALID_ARGUMENT"
    report = verify_path(pg_ledger)
    assert report.ok and "artifact files not checked" in " ".join(report.notes)
    shown = run(pg_ledger, "action", "show", uid(1))
    assert shown.exit_code == 1 and "INVALID_ARGUMENT" in shown.output
    shown = run(pg_ledger, "action", "show", uid(1), artifact_dir=tmp_path / "a")
    assert shown.exit_code == 0 and json.loads(shown.stdout)["result"] == BIG


def test_the_cli_artifact_dir_on_both_backends(target: str, tmp_path: Path) -> None:
    folder = tmp_path / "cli-arts"
    items = tmp_path / "big.json"
    items.write_text(json.dumps(act(action_id=uid(1), arguments=[BIG])))
    appended = run(target, "action", "append", "--actions", str(items), artifact_dir=folder)
    assert appended.exit_code == 0, appended.output
    assert len(list(folder.iterdir())) == 1
    verified = run(target, "verify", artifact_dir=folder)
    assert verified.exit_code == 0, verified.output
    for file in folder.iterdir():
        file.write_bytes(b"altered")
    verified = run(target, "verify", artifact_dir=folder)
    assert verified.exit_code == 1 and "artifact_altered" in verified.stdout


def test_a_postgresql_copy_keeps_its_references(pg_ledger: str, tmp_path: Path) -> None:
    """A copy into SQLite reads the same artifacts by hash, from the folder it is given."""
    folder = tmp_path / "arts"
    with CausalChain(pg_ledger, artifact_dir=folder) as chain:
        stored = chain.append_action(act(action_id=uid(1), result=BIG))
    copy = tmp_path / "copy.db"
    assert run(pg_ledger, "copy", pg_ledger, str(copy)).exit_code == 0
    with CausalChain(copy, artifact_dir=folder, read_only=True) as chain:
        assert chain.get_action(uid(1)) == stored
    assert verify_path(str(copy), artifact_root=folder).ok


# ---------------------------------------------------------------- suggested causes


def _suggested(action: Any) -> list[str]:
    return [s["action_id"] for s in action.metadata["suggested_causes"]]


def test_suggested_causes_while_appending_on_both_backends(target: str) -> None:
    with CausalChain(target) as chain:
        chain.append_action(act(action_id=uid(1)))
        chain.append_action(act(action_id=uid(2), plan_id="other", session_id="s"))
        one = chain.append_action(act(action_id=uid(3)), suggest_causes=True)
        by_session = chain.append_action(act(action_id=uid(4)), suggest_causes="session")
        batch = chain.append_actions(
            [act(action_id=uid(5)), act(action_id=uid(6))], suggest_causes="plan"
        )
        none = chain.append_action(act(action_id=uid(7), plan_id="fresh"), suggest_causes=True)
        no_session = chain.append_action(
            act(action_id=uid(8), session_id=None), suggest_causes="session"
        )
        assert code_of(lambda: chain.append_action(act(), suggest_causes="nope")) == (
            "INVALID_ARGUMENT"
        )
        assert chain.get_action(uid(6)) == batch[1]
    assert _suggested(one) == [uid(1)]
    assert _suggested(by_session) == [uid(3), uid(2), uid(1)]
    assert _suggested(batch[0]) == [uid(4), uid(3), uid(1)]
    assert _suggested(batch[1]) == [uid(5), uid(4), uid(3), uid(1)]  # its batch's earlier item
    assert _suggested(none) == [] and _suggested(no_session) == []
    reason = one.metadata["suggested_causes"][0]["reason"]
    assert reason.startswith("same plan 'plan', ") and " ms earlier: " in reason
    assert len(rows_of(target)) == 8


def test_suggestions_and_signatures_together(target: str, keys: tuple[Path, Path]) -> None:
    with CausalChain(target, signing_key=keys[0]) as chain:
        chain.append_action(act(action_id=uid(1)))
        signed = chain.append_action(act(action_id=uid(2)), suggest_causes=True)
    assert _suggested(signed) == [uid(1)]
    assert verify_path(target, public_key=load_public(keys[1])).ok  # it signs the suggestions


# -------------------------------------------------- plan show, verify --session


def _plan(target: str) -> None:
    with CausalChain(target) as chain:
        chain.append_action(
            act(action_id=uid(1), action_type="PlanStarted", metadata={"plan_body": "# do it\n"})
        )
        chain.append_action(act(action_id=uid(2), parent_action_id=uid(1)))
        chain.append_action(act(action_id=uid(3), session_id="other"))


def test_plan_show_on_both_backends(target: str) -> None:
    _plan(target)
    shown = run(target, "plan", "show", "plan")
    assert shown.exit_code == 0 and shown.stdout == "# do it\n"
    as_json = json.loads(run(target, "plan", "show", "plan", "--json").stdout)
    assert as_json == {
        "plan_id": "plan",
        "action_id": uid(1),
        "plan_hash": hashlib.sha256(b"# do it\n").hexdigest(),
        "plan_body": "# do it\n",
    }
    missing = run(target, "plan", "show", "nope")
    assert missing.exit_code == 1 and "NOT_FOUND" in missing.output


def test_plan_show_reports_an_owner_edited_body(pg_ledger: str) -> None:
    _plan(pg_ledger)
    with psycopg.connect(pg_ledger, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute(
            "UPDATE cassette_actions SET metadata_json = replace(metadata_json, 'do it', 'undo')"
            " WHERE action_id = %s",
            (uid(1),),
        )
    shown = run(pg_ledger, "plan", "show", "plan")
    assert shown.exit_code == 1 and "PLAN_HASH_MISMATCH" in shown.output
    session = json.loads(run(pg_ledger, "verify", "--session", "s", "--json").stdout)
    assert [(f["kind"], f["action_id"]) for f in session["findings"]] == [
        ("row_changed", uid(1)),
        ("plan_hash", uid(1)),
    ]


def test_verify_session_gives_the_same_json_on_both(tmp_path: Path, pg_ledger: str) -> None:
    file = str(tmp_path / "twin.db")
    answers = []
    for target in (file, pg_ledger):
        _plan(target)
        result = run(target, "verify", "--session", "s", "--json")
        assert result.exit_code == 0, result.output
        answers.append(json.loads(result.stdout))
        missing = run(target, "verify", "--session", "nobody")
        assert missing.exit_code == 3 and "NOT_FOUND" in missing.output
    assert answers[0] == answers[1]
    assert answers[0]["actions"] == 2 and answers[0]["ok"] is True


# ------------------------------------------------------------- bundles and seals


@pytest.fixture
def sealed(pg_ledger: str, tmp_path: Path) -> Iterator[tuple[str, Path, Path, str]]:
    """A PostgreSQL ledger with a plan, sealed; its seal file, public key and origin."""
    _plan(pg_ledger)
    private, public = generate(str(tmp_path / "sealer"))
    seals = tmp_path / "seals"
    seals.mkdir()
    result = run(pg_ledger, "seal", "--key", str(private), "--out", str(seals))
    assert result.exit_code == 0, result.output
    (seal_file,) = seals.iterdir()
    origin = seal_file.read_text().splitlines()[0]
    yield pg_ledger, seal_file, public, origin


def test_a_bundle_from_postgresql_is_the_one_from_its_sqlite_copy(
    sealed: tuple[str, Path, Path, str], tmp_path: Path
) -> None:
    url, seal_file, public, origin = sealed
    copy = str(tmp_path / "copy.db")
    assert run(url, "copy", url, copy).exit_code == 0
    bundles = []
    for target in (url, copy):
        for args in ([], ["--seal", str(seal_file)]):
            out = tmp_path / f"{len(bundles)}.bundle"
            result = run(target, "export", "--session", "s", *args, "--out", str(out))
            assert result.exit_code == 0, result.output
            assert json.loads(result.stdout)["entries"] == 2
            bundles.append(out.read_bytes())
    assert len(set(bundles)) == 1  # the same bytes from either backend, either seal
    checked = run(
        url,
        "verify-bundle",
        str(tmp_path / "0.bundle"),
        "--public-key",
        str(public),
        "--origin",
        origin,
    )
    assert checked.exit_code == 0, checked.output
    assert json.loads(checked.stdout)["entries"] == 2
    against = run(
        url,
        "verify",
        "--session",
        "s",
        "--against",
        str(seal_file),
        "--public-key",
        str(public),
        "--origin",
        origin,
        "--json",
    )
    assert against.exit_code == 0, against.output
    assert json.loads(against.stdout)["anchors"][0]["status"] == "holds"


def test_export_refusals_on_postgresql(sealed: tuple[str, Path, Path, str]) -> None:
    url, _, _, _ = sealed
    assert "NOT_FOUND" in run(url, "export", "--plan", "nope").output
    with CausalChain(url) as chain:
        chain.append_action(act(session_id="late"))
    late = run(url, "export", "--session", "late")
    assert late.exit_code == 1 and "run `cassette seal` first" in late.output
    assert run(url, "export").exit_code == 2


def test_export_without_a_seal_on_both(target: str) -> None:
    _plan(target)
    result = run(target, "export", "--session", "s")
    assert result.exit_code == 1 and "NOT_FOUND" in result.output


def test_a_rewritten_session_entry_is_not_under_the_seal(
    sealed: tuple[str, Path, Path, str],
) -> None:
    """The owner rewrites an action of the sealed session and its journal entry (triggers
    off): the session verify against the seal names it; export refuses to prove it."""
    url, seal_file, public, origin = sealed
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute(
            "UPDATE cassette_actions SET rationale = 'forged' WHERE action_id = %s", (uid(2),)
        )
        conn.execute(
            "UPDATE cassette_journal SET body = replace(body, '\"rationale\":null',"
            " '\"rationale\":\"forged\"'), leaf_hash = sha256('\\x00'::bytea ||"
            " convert_to(replace(body, '\"rationale\":null', '\"rationale\":\"forged\"'), 'UTF8'))"
            " WHERE row_key = %s",
            (uid(2),),
        )
    result = run(
        url,
        "verify",
        "--session",
        "s",
        "--against",
        str(seal_file),
        "--public-key",
        str(public),
        "--origin",
        origin,
        "--json",
    )
    assert result.exit_code == 1
    kinds = {(f["kind"], f["action_id"]) for f in json.loads(result.stdout)["findings"]}
    assert ("not_included", uid(2)) in kinds
    exported = run(url, "export", "--session", "s", "--seal", str(seal_file))
    assert exported.exit_code == 1


def test_pg_chain_is_the_postgresql_class(pg_ledger: str, keys: tuple[Path, Path]) -> None:
    with CausalChain(pg_ledger, signing_key=keys[0], artifact_dir="somewhere") as chain:
        assert type(chain) is PgCausalChain


def test_an_action_entry_keeps_its_bare_key(pg_ledger: str) -> None:
    """Regression: verify expected every text key quoted, so each action and checkpoint
    entry (0004 stores their key bare, as SQLite's row_key) was a journal_columns finding.
    An honest ledger of actions verifies; a key moved to another action does not."""
    with CausalChain(pg_ledger) as chain:
        chain.append_action(act(action_id=uid(1), action_type="PlanStarted"))
        chain.pause("plan", {"at": 1})
    assert verify_path(pg_ledger).ok
    with psycopg.connect(pg_ledger, autocommit=True) as conn:
        conn.execute("SET session_replication_role = replica")
        conn.execute("UPDATE cassette_journal SET row_key = %s WHERE seq = 0", (f'"{uid(1)}"',))
    report = verify_path(pg_ledger)
    assert [(f.kind.value, f.seq) for f in report.findings] == [("journal_columns", 0)]


def test_a_refused_item_of_a_signed_batch_is_named_and_nothing_is_written(
    target: str, keys: tuple[Path, Path]
) -> None:
    with CausalChain(target, signing_key=keys[0]) as chain:
        chain.append_action(act(action_id=uid(1)))
        with pytest.raises(CassetteError) as refused:
            chain.append_actions(
                [act(action_id=uid(2)), act(action_id=uid(1))], suggest_causes=True
            )
        assert refused.value.code is ErrorCode.APPEND_ONLY
        assert refused.value.detail["index"] == 1
        assert [a.action_id for a in chain.find_actions()] == [uid(1)]
