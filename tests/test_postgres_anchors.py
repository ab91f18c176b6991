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


# ---------------------------------------------------------------- automatic seals


@pytest.fixture(params=["sqlite", "postgresql"])
def either(request: pytest.FixtureRequest, tmp_path: Path) -> str:
    """A new ledger: a SQLite file, or a fresh PostgreSQL database."""
    if request.param == "sqlite":
        return str(tmp_path / "ledger.db")
    return str(request.getfixturevalue("pg_database"))


def _seal_sizes(directory: Path) -> list[int]:
    return [int(p.name[-25:-5]) for p in sorted(directory.glob("*.seal"))]


def _rows(target: str, query: str) -> list[tuple[Any, ...]]:
    """A raw read of either backend's ledger, outside the package."""
    if target.startswith("postgresql"):
        with psycopg.connect(target) as conn:
            return [tuple(r) for r in conn.execute(query)]
    import sqlite3

    conn = sqlite3.connect(target)
    try:
        return [tuple(r) for r in conn.execute(query)]
    finally:
        conn.close()


def _recorded_sizes(target: str) -> list[int]:
    return [int(r[0]) for r in _rows(target, "SELECT tree_size FROM cassette_seals ORDER BY 1")]


def _origin_of(target: str) -> str:
    from catalytic_cassette.seals import ORIGIN_PREFIX

    (row,) = _rows(target, "SELECT value FROM cassette_meta WHERE key = 'ledger_id'")
    return ORIGIN_PREFIX + str(row[0])


def _anchors_hold(target: str, seals: Path) -> list[str]:
    """What verify against the seal files says of each (pinned key and origin)."""
    from catalytic_cassette.anchor import load_anchors
    from catalytic_cassette.verify import verify_path

    report = verify_path(
        target, anchors=load_anchors(seals), seal_key=KEY.public_key(), origin=_origin_of(target)
    )
    assert report.ok, report.findings
    return [a["status"] for a in report.anchors]


def test_auto_seal_seals_every_n_entries_and_at_close_on_both_backends(
    either: str, tmp_path: Path
) -> None:
    """The cadence of test_anchors' SQLite test, on either backend: a plain message is
    three entries; every=5 seals once 5 or more entries are unsealed (the seal's own entry
    counts as sealed), and once at close; an unchanged ledger reopened seals nothing."""
    from catalytic_cassette.seals import AutoSeal

    seals = tmp_path / "seals"
    seals.mkdir()
    with MessageCassette(either, auto_seal=AutoSeal(KEY, seals, every=5)) as cassette:
        for n in range(5):
            cassette.post_message({"n": n}, "run", "USER")
        assert _seal_sizes(seals) == [6, 13]
    assert _seal_sizes(seals) == [6, 13, 17]
    for _ in range(2):
        MessageCassette(either, auto_seal=AutoSeal(KEY, seals, every=5)).close()
    assert _seal_sizes(seals) == _recorded_sizes(either) == [6, 13, 17]
    assert _anchors_hold(either, seals) == ["holds"] * 3


def test_auto_seal_of_a_causal_chain_and_its_checkpoints(either: str, tmp_path: Path) -> None:
    """One entry per action and per checkpoint: sealed at 4 (entry 4 is the seal), at 9,
    then the batch of six takes the journal to 16 entries: sealed at 17 with the seal."""
    from catalytic_cassette import CausalChain
    from catalytic_cassette.seals import AutoSeal

    seals = tmp_path / "seals"
    seals.mkdir()
    act = {"plan_id": "p", "intent_id": "i", "action_type": "CapabilityCall"}
    with CausalChain(either, auto_seal=AutoSeal(KEY, seals, every=4)) as chain:
        for n in range(8):
            chain.append_action({**act, "function_name": f"f{n}"})
        chain.save_checkpoint("p", {"at": 8})
        chain.append_actions([{**act, "function_name": f"g{n}"} for n in range(6)])
    assert _seal_sizes(seals) == _recorded_sizes(either) == [4, 9, 17]


def test_a_refused_write_seals_nothing(either: str, tmp_path: Path) -> None:
    from catalytic_cassette.seals import AutoSeal

    seals = tmp_path / "seals"
    seals.mkdir()
    with MessageCassette(either, auto_seal=AutoSeal(KEY, seals, every=1)) as cassette:
        cassette.post_message({"n": 1}, "run", "USER")
        assert _seal_sizes(seals) == [3]
        with pytest.raises(CassetteError) as refused:
            cassette.complete_step("run", 1, "nobody", 1, {}, "SUCCESS")
        assert refused.value.code is ErrorCode.NOT_LEASED
        assert _seal_sizes(seals) == [3]
    assert _seal_sizes(seals) == [3]  # (the seal's own entry: nothing new to seal at close)


def test_a_read_only_open_never_seals(either: str, tmp_path: Path) -> None:
    from catalytic_cassette.seals import AutoSeal

    seals = tmp_path / "seals"
    seals.mkdir()
    with MessageCassette(either) as cassette:
        cassette.post_message({"n": 1}, "run", "USER")
    with MessageCassette(
        either, read_only=True, auto_seal=AutoSeal(KEY, seals, every=1)
    ) as cassette:
        cassette.status("run")
    assert _seal_sizes(seals) == [] == _recorded_sizes(either)


def test_automatic_seals_on_the_command_line_on_both_backends(either: str, tmp_path: Path) -> None:
    """--seal-dir/--seal-key/--seal-every on any command: the same files on either."""
    private, public = generate(str(tmp_path / "k"))
    seals = tmp_path / "seals"
    seals.mkdir()
    payload = tmp_path / "p.json"
    payload.write_text('{"jobs": [{"intent": "i", "steps": [{}, {}]}]}')
    options = ["--seal-dir", str(seals), "--seal-key", str(private), "--seal-every", "4"]
    post = ["--run-id", "r", "--source", "USER", "--idempotency-key"]
    runner = CliRunner()
    for n in range(2):
        result = runner.invoke(
            cli,
            ["--db", either, *options, "post", "--payload", str(payload), *post, f"k{n}"],
        )
        assert result.exit_code == 0, result.stderr
    origin = ["--origin", _origin_of(either)]
    # each post is 4 entries (message, job, two steps): sealed after it (4, then 9)
    assert _seal_sizes(seals) == _recorded_sizes(either) == [4, 9]
    result = runner.invoke(
        cli,
        ["--db", either, "verify", "--against", str(seals), "--public-key", str(public), *origin],
    )
    assert result.exit_code == 0, result.output


def test_a_role_that_cannot_seal_is_refused_before_it_writes(
    pg_database: str, tmp_path: Path
) -> None:
    """Sealing is the owner's (INSERT on cassette_seals): a worker login asking for
    automatic seals is refused when it opens, PERMISSION_DENIED, rather than after
    its first write committed; nothing was written."""
    import uuid

    from psycopg import sql

    from catalytic_cassette.seals import AutoSeal

    MessageCassette(pg_database).close()
    seals = tmp_path / "seals"
    seals.mkdir()
    name = "runner_" + uuid.uuid4().hex[:8]
    with psycopg.connect(pg_database, autocommit=True) as owner:
        owner.execute(
            sql.SQL("CREATE ROLE {} LOGIN IN ROLE cassette_worker").format(sql.Identifier(name))
        )
    try:
        url = pg_database.replace("postgresql://postgres@", f"postgresql://{name}@", 1)
        assert url != pg_database
        before = Ledger("postgresql", pg_database).journal()
        with pytest.raises(CassetteError) as refused:
            MessageCassette(url, auto_seal=AutoSeal(KEY, seals, every=1))
        assert refused.value.code is ErrorCode.PERMISSION_DENIED
        with MessageCassette(url) as cassette:  # (without automatic seals it works)
            cassette.post_message({"n": 1}, "run", "WORKER")
        assert len(Ledger("postgresql", pg_database).journal()) > len(before)
        assert _seal_sizes(seals) == []
    finally:
        with psycopg.connect(pg_database, autocommit=True) as owner:
            owner.execute(sql.SQL("DROP OWNED BY {}").format(sql.Identifier(name)))
            owner.execute(sql.SQL("DROP ROLE {}").format(sql.Identifier(name)))


def test_a_seal_while_another_host_writes_is_not_busy(
    pg_ledger: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Another host commits between the seal's snapshot (the tree rebuilt from the
    bodies) and its insert: the seal of the entries it rebuilt is still recorded (the
    entries it covers cannot change; the server checks the root again), rather than
    refused BUSY after the write it followed had committed."""
    from catalytic_cassette.postgresql import anchors

    some_work(pg_ledger)
    rebuild = anchors.rebuilt_tree

    def rebuilt_while_another_writes(conn: Any, size: int, *judged: Any) -> Any:
        tree = rebuild(conn, size, *judged)
        with MessageCassette(pg_ledger) as other:
            other.post_message({"meanwhile": True}, "run", "USER")
        return tree

    monkeypatch.setattr(anchors, "rebuilt_tree", rebuilt_while_another_writes)
    before = len(Ledger("postgresql", pg_ledger).journal())
    with MessageCassette(pg_ledger) as cassette:
        sealed = cassette.seal(KEY)
    entries = Ledger("postgresql", pg_ledger).journal()
    assert sealed.tree_size == before  # what the snapshot held
    assert len(entries) == before + 3 + 1  # the other host's message, then the seal
    assert sealed.root == root_from_leaves([leaf for _, _, leaf, _ in entries[:before]])


def test_the_seal_benchmark_script_runs(pg_server: str, capsys: pytest.CaptureFixture[str]) -> None:
    import sys

    from . import postgres

    sys.path.insert(0, str(postgres.SCRIPTS))
    try:
        import bench_seal_pg
    finally:
        sys.path.remove(str(postgres.SCRIPTS))
    assert bench_seal_pg.main([pg_server, "--posts", "5", "--rounds", "1", "--entries", "30"]) == 0
    printed = capsys.readouterr().out
    assert "automatic, never due" in printed and "seal of       30 entries" in printed


def test_a_seal_over_entries_committed_while_it_waited_for_the_head(pg_ledger: str) -> None:
    """0011 folds a seal's root before the insert takes the head. A seal that covers an
    entry another session has written but not committed folds too few leaves then; it
    waits for the head, and once the writer committed the root is folded again under the
    head: the seal holds (and a wrong root at that size is still SEAL_MISMATCH)."""
    import threading

    some_work(pg_ledger)
    writer = psycopg.connect(pg_ledger)  # one transaction, holding the head until commit
    writer.execute(
        "SELECT * FROM cassette_post('run', 'USER', NULL, %s, ARRAY['i'], ARRAY[1], ARRAY['{}'])",
        ('{"jobs":[{"intent":"i","steps":[{}]}]}',),
    )
    leaves = [
        bytes(leaf)
        for (leaf,) in writer.execute("SELECT leaf_hash FROM cassette_journal ORDER BY seq")
    ]
    size = len(leaves)  # the writer's own entry included, not yet visible elsewhere
    root = root_from_leaves(leaves).hex()
    outcome: list[Any] = []

    def insert(root_hex: str) -> None:
        with psycopg.connect(pg_ledger, autocommit=True) as sealer:
            try:
                sealer.execute(
                    "INSERT INTO cassette_seals (tree_size, root_hex, origin, key_id, note)"
                    " VALUES (%s, %s, 'o', 'abcdef01', 'o' || chr(10) || %s || chr(10))",
                    (size, root_hex, str(size)),
                )
                outcome.append("recorded")
            except psycopg.Error as exc:
                outcome.append(str(exc).split(":")[0])

    sealing = threading.Thread(target=insert, args=(root,))
    sealing.start()
    sealing.join(1.0)
    assert sealing.is_alive() and outcome == []  # waiting for the head
    writer.commit()
    writer.close()
    sealing.join(30)
    assert outcome == ["recorded"]
    wrong = threading.Thread(target=insert, args=("0" * 64,))
    wrong.start()
    wrong.join(30)
    assert outcome == ["recorded", "SEAL_MISMATCH"]
