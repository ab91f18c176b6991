"""A PostgreSQL ledger made by an older set of migrations and upgraded in place: its
journal, rows and seals come through whole, verify is clean on the upgraded ledger, and
work goes on linked to the journal's end.

Migration 0017 drops the head's copy of the journal's end and the commit-time follower:
the upgrade must not need them, and what they left (a head at the journal's end) must not
matter to the entries that follow.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from catalytic_cassette import MessageCassette
from catalytic_cassette.anchor import load_anchors
from catalytic_cassette.postgresql import sqlfiles
from catalytic_cassette.seals import ORIGIN_PREFIX, AutoSeal
from catalytic_cassette.verify import verify_path

from .pg_chain import journal_end

psycopg = pytest.importorskip("psycopg")

KEY = Ed25519PrivateKey.generate()
ONE_STEP = {"jobs": [{"intent": "i", "steps": [{}, {}]}]}


def work(url: str, seals: Path, worker: str) -> None:
    """Posts, claims and completes, a step left leased, sealed at close."""
    with MessageCassette(url, auto_seal=AutoSeal(KEY, seals, every=10_000)) as cassette:
        cassette.post_message(ONE_STEP, "run", "USER")
        lease = cassette.claim_step("run", worker, ttl_seconds=600)
        assert lease is not None
        cassette.complete_step(
            "run", lease["step_id"], worker, lease["fencing_token"], {"ok": 1}, "SUCCESS"
        )
        assert cassette.claim_step("run", worker, ttl_seconds=600) is not None


@pytest.mark.parametrize("older", [16])
def test_an_older_ledger_upgrades_whole(
    pg_database: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, older: int
) -> None:
    every = sqlfiles.migrations()
    assert len(every) > older
    seals = tmp_path / "seals"
    seals.mkdir()
    with monkeypatch.context() as patch:
        patch.setattr(sqlfiles, "migrations", lambda: every[:older])
        work(pg_database, seals, "w1")
        with psycopg.connect(pg_database) as conn:
            before = conn.execute("SELECT * FROM cassette_journal ORDER BY seq").fetchall()
            (version,) = conn.execute("SELECT max(version) FROM cassette_migrations").fetchone()
    assert version == older
    work(pg_database, seals, "w2")  # opened with every migration: upgraded first
    with psycopg.connect(pg_database) as conn:
        (version,) = conn.execute("SELECT max(version) FROM cassette_migrations").fetchone()
        after = conn.execute("SELECT * FROM cassette_journal ORDER BY seq").fetchall()
        size, _ = journal_end(conn)  # every entry, old and new, at its seq and linked
        (ledger_id,) = conn.execute(
            "SELECT value FROM cassette_meta WHERE key = 'ledger_id'"
        ).fetchone()
    assert version == len(every)
    assert after[: len(before)] == before
    assert size > len(before)
    report = verify_path(
        pg_database,
        anchors=load_anchors(seals),
        seal_key=KEY.public_key(),
        origin=ORIGIN_PREFIX + ledger_id,
    )
    assert report.ok, report.findings
    assert [a["status"] for a in report.anchors] == ["holds", "holds"]
