"""A package connection writes only while its TEMP schema is the one it installed.

A client's TEMP trigger runs before the file's (and can skip the file's AFTER triggers with
RAISE(IGNORE)); a TEMP table or view named like a ledger object takes its place in every
unqualified statement of the package. So each write transaction of the package refuses,
with FOREIGN_TEMP_OBJECT and nothing written, while the connection carries a TEMP object it
did not install, or lacks one it did.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from catalytic_cassette import ErrorCode, ManualClock, MessageCassette
from catalytic_cassette.errors import CassetteError

from .conftest import dump, file_digest

pytestmark = pytest.mark.sqlite_only(
    reason="SQLite's per-connection TEMP schema; a PostgreSQL session resolves pg_temp last"
    " (opening.sql)"
)

FOREIGN = {
    "trigger": "CREATE TEMP TRIGGER mine AFTER INSERT ON main.cassette_journal"
    " WHEN NEW.seq % 256 = 255 BEGIN SELECT RAISE(IGNORE); END",
    "shadowing table": "CREATE TEMP TABLE cassette_steps AS SELECT * FROM main.cassette_steps",
    "shadowing view": "CREATE TEMP VIEW cassette_ledger_time (ms) AS SELECT 0",
    "unrelated table": "CREATE TEMP TABLE scratch (x)",
    "package trigger dropped": "DROP TRIGGER temp.cassette_steps_clock_guard",
}


@pytest.fixture
def ledger(tmp_path: Path) -> tuple[Path, MessageCassette]:
    path = tmp_path / "ledger.db"
    cassette = MessageCassette(path, clock=ManualClock())
    cassette.post_message({"n": 0}, "r", "USER")
    return path, cassette


@pytest.mark.parametrize("sql", FOREIGN.values(), ids=FOREIGN.keys())
def test_a_write_is_refused_while_the_connection_carries_a_foreign_temp_object(
    ledger: tuple[Path, MessageCassette], sql: str
) -> None:
    path, cassette = ledger
    cassette.conn.execute(sql)
    before = (dump(path), file_digest(path))
    for write in (
        lambda: cassette.post_message({"n": 1}, "r", "USER"),
        lambda: cassette.claim_step("r", "w", 60),
    ):
        with pytest.raises(CassetteError) as refused:
            write()
        assert refused.value.code is ErrorCode.FOREIGN_TEMP_OBJECT
        assert not cassette.conn.in_transaction
    assert (dump(path), file_digest(path)) == before
    assert cassette.get_step(1)["status"] == "PENDING"  # reads are not checked
    cassette.close()


def test_writes_go_on_once_the_foreign_object_is_gone(
    ledger: tuple[Path, MessageCassette],
) -> None:
    path, cassette = ledger
    cassette.conn.execute(FOREIGN["trigger"])
    with pytest.raises(CassetteError):
        cassette.post_message({"n": 1}, "r", "USER")
    cassette.conn.execute("DROP TRIGGER temp.mine")
    cassette.post_message({"n": 1}, "r", "USER")
    # a TEMP table created and dropped again (verify does so) moves the cookie, not the schema
    cassette.conn.execute("CREATE TEMP TABLE passing (x)")
    cassette.conn.execute("DROP TABLE temp.passing")
    cassette.post_message({"n": 2}, "r", "USER")
    cassette.close()
    assert len(dump(path)) > 0
