"""Connection settings that trade nothing of the law for speed (issue 12)."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from catalytic_cassette import MessageCassette, connect
from catalytic_cassette.connection import WAL_AUTOCHECKPOINT_PAGES

pytestmark = pytest.mark.sqlite_only(reason="SQLite PRAGMAs of the package's connection")


def test_a_writer_checkpoints_after_the_package_s_wal_size(db_path: Path) -> None:
    conn = connect(db_path)
    try:
        assert conn.execute("PRAGMA wal_autocheckpoint").fetchone()[0] == WAL_AUTOCHECKPOINT_PAGES
        assert WAL_AUTOCHECKPOINT_PAGES > 1000  # above SQLite's default, or it buys nothing
    finally:
        conn.close()


def test_the_wal_grows_past_sqlite_s_default_before_it_is_copied_back(db_path: Path) -> None:
    """With SQLite's default (1,000 pages) the WAL would be reset near 1,000 frames."""
    with MessageCassette(db_path, durability="normal") as cassette:
        page = cassette.conn.execute("PRAGMA page_size").fetchone()[0]

        def wal_frames() -> int:
            return (os.path.getsize(f"{db_path}-wal") - 32) // (page + 24)

        most = 0
        for n in range(400):  # each post writes several pages: well past 1,500 frames
            cassette.post_message({"n": n}, "run", "USER")
            most = max(most, wal_frames())
        # SQLite reuses the WAL file from its start after a checkpoint, so its size is the
        # most frames it ever held: past the default's 1,000, within the package's bound.
        assert 1_500 < most <= WAL_AUTOCHECKPOINT_PAGES + 100
