"""Shared fixtures: a fresh ledger per test, a clock tests drive, raw access."""

from __future__ import annotations

import hashlib
import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from catalytic_cassette import ManualClock, MessageCassette


@pytest.fixture
def clock() -> ManualClock:
    return ManualClock()


@pytest.fixture
def db_path(tmp_path: Path) -> Path:
    return tmp_path / "ledger.db"


@pytest.fixture
def cassette(db_path: Path, clock: ManualClock) -> Iterator[MessageCassette]:
    with MessageCassette(db_path, clock=clock) as opened:
        yield opened


@pytest.fixture
def raw(db_path: Path, cassette: MessageCassette) -> Iterator[sqlite3.Connection]:
    """A raw sqlite3 connection with default settings, as an attacker would open it."""
    conn = sqlite3.connect(db_path)
    yield conn
    conn.close()


def dump(path: Path) -> list[str]:
    """Every schema object and row of the ledger, as SQL text."""
    conn = sqlite3.connect(path)
    try:
        return list(conn.iterdump())
    finally:
        conn.close()


def file_digest(path: Path) -> str:
    """SHA-256 of the database file and its WAL: the bytes on disk."""
    digest = hashlib.sha256()
    for suffix in ("", "-wal"):
        part = Path(str(path) + suffix)
        if part.exists():
            digest.update(part.read_bytes())
    return digest.hexdigest()
