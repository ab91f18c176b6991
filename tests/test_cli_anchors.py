"""The anchor commands' contract: JSON out, stable exit codes, refusals change nothing."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from catalytic_cassette.cli import cli

from .backends import Ledger, raw_script
from .conftest import file_digest

pytestmark = pytest.mark.both_backends


def run(db: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--db", str(db), *args])


def ok(result: Result) -> Any:
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
    return json.loads(result.stdout)


@pytest.fixture
def sealed(tmp_path: Path, db_path: Path) -> dict[str, Any]:
    """A ledger with a few messages, a key pair and one seal in a directory."""
    db = db_path
    ok(run(db, "keygen", "--out", str(tmp_path / "k")))
    ok(run(db, "keygen", "--out", str(tmp_path / "other")))
    payload = tmp_path / "m.json"
    for n in range(3):
        payload.write_text(json.dumps({"n": n}))
        ok(run(db, "post", "--payload", str(payload), "--run-id", "r", "--source", "USER"))
    seals = tmp_path / "seals"
    seals.mkdir()
    seal = ok(run(db, "seal", "--key", str(tmp_path / "k.key"), "--out", str(seals)))
    return {
        "db": db,
        "key": tmp_path / "k.key",
        "pub": tmp_path / "k.pub",
        "other_pub": tmp_path / "other.pub",
        "seals": seals,
        "seal": seal,
        "origin": seal["origin"],
        "tmp": tmp_path,
    }


def _verify(s: dict[str, Any], *extra: str, pub: Path | None = None) -> Result:
    return run(
        s["db"],
        "verify",
        "--json",
        "--against",
        str(s["seals"]),
        "--public-key",
        str(pub or s["pub"]),
        "--origin",
        s["origin"],
        *extra,
    )


def test_seal_prints_the_checkpoint_and_writes_the_file(sealed: dict[str, Any]) -> None:
    seal = sealed["seal"]
    assert seal["tree_size"] == 9  # three messages: message, job, step each
    path = Path(seal["path"])
    assert path.parent == sealed["seals"]
    assert path.read_text() == seal["note"]
    assert seal["note"].startswith(f"{seal['origin']}\n9\n")


def test_verify_against_a_holding_seal_exits_0(sealed: dict[str, Any]) -> None:
    report = ok(_verify(sealed))
    assert [a["status"] for a in report["anchors"]] == ["holds"]
    assert report["anchored"]["entries_after_anchor"] == 1  # the seal's own entry


def test_verify_against_needs_a_pinned_key_and_origin(sealed: dict[str, Any]) -> None:
    result = run(sealed["db"], "verify", "--against", str(sealed["seals"]))
    assert result.exit_code == 2
    assert "--origin" in result.stderr


def test_a_seal_under_another_key_cannot_be_checked(sealed: dict[str, Any]) -> None:
    result = _verify(sealed, pub=sealed["other_pub"])
    assert result.exit_code == 3
    report = json.loads(result.stdout)
    assert [f["kind"] for f in report["findings"]] == ["unknown_key"]
    assert report["ok"] is True  # nothing is reported tampered


def test_a_truncated_ledger_is_named(sealed: dict[str, Any], backend: Ledger) -> None:
    if backend.postgresql:  # the superuser's session fires no ordinary trigger
        # (PostgreSQL keeps no tree nodes: its tree is rebuilt from the journal)
        assert raw_script(
            backend.target,
            "SET LOCAL session_replication_role = replica",
            "DELETE FROM cassette_journal WHERE seq >= 5",
        )
        result = _verify(sealed)
        assert result.exit_code == 1
        kinds = {f["kind"] for f in json.loads(result.stdout)["findings"]}
        assert "truncated" in kinds
        return
    raw = sqlite3.connect(sealed["db"])
    triggers = raw.execute(
        "SELECT name, sql FROM sqlite_master WHERE type = 'trigger' AND tbl_name IN"
        " ('cassette_journal', 'cassette_tree_nodes')"
    ).fetchall()
    for name, _ in triggers:
        raw.execute(f"DROP TRIGGER {name}")
    raw.execute("DELETE FROM cassette_journal WHERE seq >= 5")
    raw.execute("DELETE FROM cassette_tree_nodes WHERE leaf_end >= 5")
    for _, sql in triggers:
        raw.execute(sql)
    raw.commit()
    raw.close()
    result = _verify(sealed)
    assert result.exit_code == 1
    kinds = {f["kind"] for f in json.loads(result.stdout)["findings"]}
    assert "truncated" in kinds


def test_prove_and_verify_proof_offline(sealed: dict[str, Any]) -> None:
    proof = sealed["tmp"] / "p.proof"
    summary = ok(run(sealed["db"], "prove", "inclusion", "4", "--out", str(proof)))
    assert summary["index"] == 4
    assert proof.read_bytes().startswith(b"c2sp.org/tlog-proof@v1\n")
    elsewhere = sealed["tmp"] / "absent.db"
    args = ["verify-proof", str(proof), "--public-key", str(sealed["pub"])]
    checked = ok(run(elsewhere, *args, "--origin", sealed["origin"]))
    assert checked["ok"] is True and checked["index"] == 4
    assert not elsewhere.exists()
    assert run(elsewhere, *args, "--origin", "someone/else").exit_code == 3
    other = ["verify-proof", str(proof), "--public-key", str(sealed["other_pub"])]
    assert run(elsewhere, *other, "--origin", sealed["origin"]).exit_code == 3
    data = bytearray(proof.read_bytes())
    index_line = data.index(b"index 4")
    data[index_line + len("index ")] = ord("5")  # claim the path proves another entry
    proof.write_bytes(bytes(data))
    assert run(elsewhere, *args, "--origin", sealed["origin"]).exit_code == 1


def test_prove_receipt_finds_the_committing_entry(sealed: dict[str, Any]) -> None:
    db = sealed["db"]
    claim = ok(run(db, "claim", "--run-id", "r", "--worker", "w"))
    receipt = sealed["tmp"] / "r.json"
    receipt.write_text('{"done": true}')
    done = ok(
        run(db, "complete", "--run-id", "r", "--step", str(claim["step_id"]), "--worker", "w",
            "--token", str(claim["fencing_token"]), "--receipt", str(receipt),
            "--outcome", "SUCCESS")
    )  # fmt: skip
    assert run(db, "prove", "receipt", str(done["receipt_id"])).exit_code == 1  # not sealed yet
    ok(run(db, "seal", "--key", str(sealed["key"])))
    result = run(db, "prove", "receipt", str(done["receipt_id"]))
    assert result.exit_code == 0, result.stderr
    assert b"cassette_receipts" in __import__("base64").b64decode(
        result.stdout.split("extra ")[1].split("\n")[0]
    )


def test_a_consistency_proof_from_a_newer_seal_to_an_older_is_refused(
    sealed: dict[str, Any],
) -> None:
    """INVALID_ARGUMENT, exit 1, one line on stderr, on both backends (on PostgreSQL the
    tree rebuilt from the bodies raised a bare ValueError until this test: a traceback)."""
    db, older = sealed["db"], sealed["seal"]["path"]
    payload = sealed["tmp"] / "more.json"
    payload.write_text('{"more": 1}')
    ok(run(db, "post", "--payload", str(payload), "--run-id", "r", "--source", "USER"))
    newer = ok(run(db, "seal", "--key", str(sealed["key"]), "--out", str(sealed["tmp"])))["path"]
    before = file_digest(db)
    result = run(db, "prove", "consistency", newer, older)
    assert result.exit_code == 1, (result.stdout, result.stderr, result.exception)
    assert result.stderr.startswith("error: INVALID_ARGUMENT: ") and result.stdout == ""
    assert result.stderr.count("\n") == 1
    assert file_digest(db) == before
    assert ok(run(db, "prove", "consistency", older, newer))["old_size"] == 9


def test_refusals_change_nothing(sealed: dict[str, Any], backend: Ledger) -> None:
    db = sealed["db"]
    before = file_digest(db)
    # the ledger itself as the backup's file: it exists (1); a URL names no file (usage, 2)
    onto_itself = 2 if backend.postgresql else 1
    assert run(db, "seal", "--key", str(sealed["pub"])).exit_code == 1  # not a private key
    assert run(db, "prove", "inclusion", "999").exit_code == 1
    assert run(db, "prove", "consistency", str(sealed["pub"])).exit_code == 1  # not a seal
    assert (
        run(db, "backup", str(sealed["db"]), "--key", str(sealed["key"])).exit_code == onto_itself
    )
    assert file_digest(db) == before
    missing = sealed["tmp"] / "missing.db"
    assert run(missing, "prove", "inclusion", "0").exit_code == 1
    assert run(missing, "seal", "--key", str(sealed["key"])).exit_code == 1
    assert (
        run(missing, "backup", str(sealed["tmp"] / "b.db"), "--key", str(sealed["key"])).exit_code
        == 1
    )
    assert not missing.exists()
    assert not (sealed["tmp"] / "b.db").exists()


def test_backup_and_restore(sealed: dict[str, Any]) -> None:
    copy = sealed["tmp"] / "backup.db"
    made = ok(run(sealed["db"], "backup", str(copy), "--key", str(sealed["key"])))
    assert Path(made["seal"]).exists()
    target = sealed["tmp"] / "restored.db"
    restore = ["restore", str(copy), str(target), "--public-key", str(sealed["pub"])]
    ok(run(sealed["db"], *restore, "--origin", made["origin"]))
    assert ok(run(target, "verify", "--json"))["ok"] is True
    again = run(sealed["db"], *restore, "--origin", made["origin"])
    assert again.exit_code == 1 and "INVALID_ARGUMENT" in again.stderr
    other = sealed["tmp"] / "other-target.db"
    wrong = ["restore", str(copy), str(other), "--public-key", str(sealed["other_pub"])]
    assert run(sealed["db"], *wrong, "--origin", made["origin"]).exit_code == 3
    assert not other.exists()


def test_automatic_seals_from_the_global_options(tmp_path: Path, db_path: Path) -> None:
    db = db_path
    ok(run(db, "keygen", "--out", str(tmp_path / "k")))
    seals = tmp_path / "auto-seals"
    seals.mkdir()
    payload = tmp_path / "m.json"
    payload.write_text('{"x": 1}')
    opts = ["--seal-dir", str(seals), "--seal-key", str(tmp_path / "k.key"), "--seal-every", "4"]
    for _ in range(2):
        ok(run(db, *opts, "post", "--payload", str(payload), "--run-id", "r", "--source", "USER"))
    sizes = sorted(int(p.name.rsplit("-", 1)[1].split(".")[0]) for p in seals.iterdir())
    # Each command seals at close: 3 entries, then the seal's own entry and 3 more. Neither
    # command reached 4 new entries after a write, so no seal came from --seal-every.
    assert sizes == [3, 7]
    assert run(db, *opts, "status", "--run-id", "r").exit_code == 0
    assert len(list(seals.iterdir())) == 2  # nothing new to seal
    half = run(db, "--seal-dir", str(seals), "status", "--run-id", "r")
    assert half.exit_code == 2
