"""Seals, backups and restores of a PostgreSQL ledger (issue 15, item 5)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from catalytic_cassette import CassetteError, ErrorCode, MessageCassette
from catalytic_cassette.backup import backup, restore
from catalytic_cassette.cli import cli
from catalytic_cassette.merkle import root_from_leaves
from catalytic_cassette.note import open_note
from catalytic_cassette.signing import generate

from .backends import Ledger

psycopg = pytest.importorskip("psycopg")
KEY = Ed25519PrivateKey.generate()


def some_work(url: str) -> None:
    with MessageCassette(url) as cassette:
        cassette.post_message({"jobs": [{"intent": "i", "steps": [{}, {}, {}]}]}, "run", "USER")
        lease = cassette.claim_step("run", "w")
        cassette.complete_step("run", lease["step_id"], "w", 1, {"ok": 1}, "SUCCESS")


def test_a_seal_signs_the_root_of_the_servers_journal(pg_ledger: str) -> None:
    some_work(pg_ledger)
    with MessageCassette(pg_ledger) as cassette:
        sealed = cassette.seal(KEY)
    entries = Ledger("postgresql", pg_ledger).journal()
    assert sealed.tree_size == len(entries) - 1  # the seal's own entry comes after
    assert sealed.root == root_from_leaves([leaf for _, _, leaf, _ in entries[: sealed.tree_size]])
    text = open_note(sealed.note, sealed.origin, KEY.public_key()).decode()
    assert text.splitlines()[:2] == [sealed.origin, str(sealed.tree_size)]
    with psycopg.connect(pg_ledger) as conn:
        (ledger_id,) = conn.execute(
            "SELECT value FROM cassette_meta WHERE key = 'ledger_id'"
        ).fetchone()
    assert sealed.origin == f"catalytic-cassette/ledger/{ledger_id}"


def test_a_seal_refuses_a_journal_whose_leaf_is_not_its_body(pg_ledger: str) -> None:
    some_work(pg_ledger)
    with psycopg.connect(pg_ledger, autocommit=True) as conn:  # a superuser, triggers off
        conn.execute("SET session_replication_role = replica")
        conn.execute(
            "UPDATE cassette_journal SET body = replace(body, 'USER', 'EVIL') WHERE seq = 0"
        )
    before = Ledger("postgresql", pg_ledger).journal()
    with MessageCassette(pg_ledger) as cassette, pytest.raises(CassetteError) as caught:
        cassette.seal(KEY)
    assert caught.value.code is ErrorCode.TREE_BROKEN
    assert Ledger("postgresql", pg_ledger).journal() == before  # nothing signed or written


def test_the_worker_role_cannot_seal(pg_ledger: str) -> None:
    some_work(pg_ledger)
    with psycopg.connect(pg_ledger, autocommit=True) as conn:
        conn.execute("SET ROLE cassette_worker")
        with pytest.raises(psycopg.Error) as caught:
            conn.execute(
                "INSERT INTO cassette_seals (tree_size, root_hex, origin, key_id, note)"
                " VALUES (1, repeat('0', 64), 'o', 'abcdef01', 'o' || chr(10) || '1' || chr(10))"
            )
    assert caught.value.sqlstate == "42501"


def test_backup_of_a_postgres_ledger_restores_into_either_backend(
    tmp_path: Path, pg_ledger: str, pg_database: str
) -> None:
    some_work(pg_ledger)
    result = backup(pg_ledger, tmp_path / "b.db", KEY)
    entries = Ledger("postgresql", pg_ledger).journal()
    assert result["entries"] == len(entries) - 1  # the seal recorded in the source after
    assert Ledger("sqlite", str(tmp_path / "b.db")).journal() == entries[:-1]
    origin = result["origin"]
    restored = restore(tmp_path / "b.db", tmp_path / "r.db", KEY.public_key(), origin)
    assert restored["entries"] == result["entries"]
    into_pg = restore(tmp_path / "b.db", pg_database, KEY.public_key(), origin)
    assert into_pg["restored"] == pg_database
    assert Ledger("postgresql", pg_database).journal() == entries[:-1]
    with pytest.raises(CassetteError) as caught:  # never over a ledger
        restore(tmp_path / "b.db", pg_ledger, KEY.public_key(), origin)
    assert caught.value.code is ErrorCode.INVALID_ARGUMENT


def test_seal_backup_and_restore_on_the_command_line(
    tmp_path: Path, pg_ledger: str, pg_database: str
) -> None:
    some_work(pg_ledger)
    private, public = generate(str(tmp_path / "k"))
    sealed = invoke(pg_ledger, "seal", "--key", str(private), "--out", str(tmp_path))
    assert Path(sealed["path"]).is_file() and sealed["tree_size"] == 8
    done = invoke(pg_ledger, "backup", str(tmp_path / "b.db"), "--key", str(private))
    restored = CliRunner().invoke(
        cli,
        [
            "restore",
            str(tmp_path / "b.db"),
            pg_database,
            "--public-key",
            str(public),
            "--origin",
            done["origin"],
        ],
    )
    assert restored.exit_code == 0, restored.stderr
    assert json.loads(restored.stdout)["entries"] == done["entries"]


def invoke(url: str, *args: str) -> Any:
    result = CliRunner().invoke(cli, ["--db", url, *args])
    assert result.exit_code == 0, result.stderr
    return json.loads(result.stdout)


def test_proofs_of_a_postgres_ledger_check_offline(tmp_path: Path, pg_ledger: str) -> None:
    """Inclusion, receipt and consistency proofs built from the server's journal check
    with `verify-proof` and the public key alone, as a SQLite ledger's do."""
    some_work(pg_ledger)
    private, public = generate(str(tmp_path / "k"))
    first = invoke(pg_ledger, "seal", "--key", str(private), "--out", str(tmp_path / "1.seal"))
    some_work(pg_ledger)
    invoke(pg_ledger, "seal", "--key", str(private), "--out", str(tmp_path / "2.seal"))
    origin = first["origin"]
    proofs = {
        "inclusion": ("prove", "inclusion", "3", "--seal", str(tmp_path / "1.seal")),
        "receipt": ("prove", "receipt", "2"),
        "consistency": ("prove", "consistency", str(tmp_path / "1.seal"), str(tmp_path / "2.seal")),
        "to_head": ("prove", "consistency", str(tmp_path / "1.seal")),
    }
    for name, args in proofs.items():
        out = tmp_path / f"{name}.proof"
        invoke(pg_ledger, *args, "--out", str(out))
        checked = CliRunner().invoke(
            cli, ["verify-proof", str(out), "--public-key", str(public), "--origin", origin]
        )
        assert checked.exit_code == 0, (name, checked.stdout, checked.stderr)
    # a proof of another ledger's seal is refused when it is built, not by the auditor
    other = CliRunner().invoke(
        cli, ["--db", pg_ledger, "prove", "inclusion", "0", "--seal", str(tmp_path / "2.seal")]
    )
    assert other.exit_code == 0
    tampered = tmp_path / "other.seal"
    tampered.write_bytes((tmp_path / "1.seal").read_bytes().replace(b"\n8\n", b"\n9\n"))
    refused = CliRunner().invoke(
        cli, ["--db", pg_ledger, "prove", "inclusion", "0", "--seal", str(tampered)]
    )
    assert refused.exit_code == 1 and refused.stderr.startswith("error: SEAL_MISMATCH: ")
