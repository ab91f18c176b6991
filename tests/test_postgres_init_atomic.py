"""A failed `init` or `migrate` on PostgreSQL changes nothing (LAW.md 14, "The owner"):
the owner's powers are checked before anything is written (PERMISSION_DENIED), and the
migrations run in one transaction, so a failure half-way (the check bypassed, or a
migration that fails) leaves the catalog exactly as it was."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from catalytic_cassette import CassetteError, ErrorCode, MessageCassette
from catalytic_cassette.postgresql import connection, sqlfiles
from catalytic_cassette.verify import verify_path

from . import postgres
from .pg_later import later_migration

psycopg = pytest.importorskip("psycopg")

# Everything a migration could leave behind, as text: the schema's objects with their
# owners and grants, the schema's and the database's owner and grants, the ledger's roles
# and their memberships, and the settings attached to the database.
CATALOG_DUMP = """
SELECT 'relation ' || c.relname || ' ' || c.relkind::text || ' ' || pg_get_userbyid(c.relowner)
       || ' ' || coalesce(c.relacl::text, '')
  FROM pg_class c WHERE c.relnamespace = 'public'::regnamespace
UNION ALL
SELECT 'function ' || p.oid::regprocedure::text || ' ' || md5(p.prosrc) || ' '
       || coalesce(p.proacl::text, '')
  FROM pg_proc p WHERE p.pronamespace = 'public'::regnamespace
UNION ALL
SELECT 'type ' || t.typname FROM pg_type t WHERE t.typnamespace = 'public'::regnamespace
UNION ALL
SELECT 'trigger ' || t.tgname || ' ' || t.tgenabled::text FROM pg_trigger t
  JOIN pg_class c ON c.oid = t.tgrelid WHERE c.relnamespace = 'public'::regnamespace
UNION ALL
SELECT 'schema ' || pg_get_userbyid(n.nspowner) || ' ' || coalesce(n.nspacl::text, '')
  FROM pg_namespace n WHERE n.nspname = 'public'
UNION ALL
SELECT 'database ' || pg_get_userbyid(d.datdba) || ' ' || coalesce(d.datacl::text, '')
  FROM pg_database d WHERE d.datname = current_database()
UNION ALL
SELECT 'role ' || r.rolname || ' ' || r.rolcreaterole::text || ' ' || r.rolcanlogin::text
  FROM pg_roles r WHERE r.rolname IN ('cassette_worker', 'cassette_appender', 'cassette_auditor')
UNION ALL
SELECT 'member ' || pg_get_userbyid(m.member) || ' in ' || pg_get_userbyid(m.roleid)
  FROM pg_auth_members m
 WHERE pg_get_userbyid(m.roleid) LIKE 'cassette\\_%'
    OR pg_get_userbyid(m.member) LIKE 'cassette\\_%'
UNION ALL
SELECT 'settings ' || coalesce(s.setconfig::text, '') FROM pg_db_role_setting s
 WHERE s.setdatabase = (SELECT oid FROM pg_database WHERE datname = current_database())
ORDER BY 1
"""


def dump(url: str) -> list[str]:
    with psycopg.connect(url, autocommit=True) as conn:
        return [row[0] for row in conn.execute(CATALOG_DUMP)]


def as_role(url: str, role: str) -> str:
    head, _, rest = url.partition("://")
    return f"{head}://{role}{rest[rest.index('@') :]}"


def refused(url: str) -> CassetteError:
    with pytest.raises(CassetteError) as caught:
        MessageCassette(url)
    return caught.value


@pytest.fixture
def weak_owner(pg_server: str) -> Iterator[str]:
    """A login role with no CREATEROLE, dropped after the test."""
    name = f"cassette_test_weak_{uuid.uuid4().hex[:8]}"
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{name}" LOGIN')
    yield name
    with psycopg.connect(pg_server, autocommit=True) as conn:
        conn.execute(f'DROP ROLE IF EXISTS "{name}"')


@pytest.fixture
def database(weak_owner: str, pg_server: str) -> Iterator[str]:
    """An empty database (dropped before ``weak_owner``, which may own it)."""
    url = postgres.create_database(pg_server)
    yield url
    postgres.drop_database(pg_server, url)


def owned_by(url: str, role: str) -> None:
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(f'ALTER DATABASE "{postgres.database_name(url)}" OWNER TO "{role}"')


def test_an_owner_without_createrole_is_refused_before_anything(
    weak_owner: str, database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The owner's own login, and a superuser migrating for it: PERMISSION_DENIED, the
    catalog as it was. With the check bypassed, the baseline fails half-way where it
    creates the roles (schema/70_roles.sql), and everything before it (the tables and
    functions) is rolled back with it."""
    owned_by(database, weak_owner)
    before = dump(database)
    for url in (as_role(database, weak_owner), database):
        error = refused(url)
        assert error.code is ErrorCode.PERMISSION_DENIED and "CREATEROLE" in error.message
        assert dump(database) == before

    def without_checks(conn: Any, version: int) -> None:
        conn.execute(sqlfiles.query("become_owner"))

    monkeypatch.setattr(connection, "_become_owner", without_checks)
    error = refused(as_role(database, weak_owner))
    assert error.code is ErrorCode.MIGRATION_FAILED and "migration 1 " in error.message
    assert "permission denied to create role" in error.message
    assert dump(database) == before


def test_an_owner_who_may_not_create_in_public_is_refused(database: str) -> None:
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute("REVOKE CREATE ON SCHEMA public FROM pg_database_owner")
    before = dump(database)
    error = refused(database)
    assert error.code is ErrorCode.PERMISSION_DENIED and "schema public" in error.message
    assert dump(database) == before


def test_a_role_that_is_not_the_databases_owner_is_refused(weak_owner: str, database: str) -> None:
    """CREATEROLE, but the database is another's: the ledger would not be its owner's."""
    with psycopg.connect(database, autocommit=True) as conn:
        conn.execute(f'ALTER ROLE "{weak_owner}" CREATEROLE')
        conn.execute(f'GRANT CREATE ON SCHEMA public TO "{weak_owner}"')
    before = dump(database)
    error = refused(as_role(database, weak_owner))
    assert error.code is ErrorCode.PERMISSION_DENIED
    assert "database's owner (cassette_test_owner)" in error.message
    assert dump(database) == before


def test_the_owner_needs_no_create_on_the_database(database: str) -> None:
    """What the migrations use is the schema, not the database: an owner whose CREATE on
    the database was revoked still makes a ledger that verifies."""
    with psycopg.connect(database, autocommit=True) as conn:
        name = postgres.database_name(database)
        conn.execute(f'REVOKE CREATE ON DATABASE "{name}" FROM PUBLIC, "{postgres.OWNER}"')
    MessageCassette(as_role(database, postgres.OWNER)).close()
    assert verify_path(database).ok


@contextmanager
def fault(url: str, command: str, identity: str) -> Iterator[None]:
    """The server refuses the DDL ``command`` on an object whose identity holds
    ``identity`` (an event trigger, in a schema of its own that the dump leaves out):
    a migration fails half-way, at that statement."""
    setup = f"""
    CREATE SCHEMA cassette_test_fault;
    CREATE FUNCTION cassette_test_fault.fail() RETURNS event_trigger LANGUAGE plpgsql AS $$
    BEGIN
        IF EXISTS (SELECT 1 FROM pg_event_trigger_ddl_commands()
                    WHERE command_tag = '{command}' AND object_identity LIKE '%{identity}%') THEN
            RAISE EXCEPTION 'the injected fault';
        END IF;
    END $$;
    CREATE EVENT TRIGGER cassette_test_fault ON ddl_command_end
        EXECUTE FUNCTION cassette_test_fault.fail();
    """
    with psycopg.connect(url, autocommit=True) as conn:
        conn.execute(setup)
    try:
        yield
    finally:
        with psycopg.connect(url, autocommit=True) as conn:
            conn.execute("DROP EVENT TRIGGER cassette_test_fault")
            conn.execute("DROP SCHEMA cassette_test_fault CASCADE")


def test_a_migration_failing_half_way_leaves_an_empty_database_empty(database: str) -> None:
    """The baseline fails at a trigger of the steps (schema/30_steps.sql), after the
    ledger's, the messages' and the steps' tables and functions are made."""
    before = dump(database)
    with fault(database, "CREATE TRIGGER", "cassette_steps_update"):
        error = refused(database)
        assert error.code is ErrorCode.MIGRATION_FAILED and "migration 1 " in error.message
        assert "the injected fault" in error.message
        assert dump(database) == before
    MessageCassette(database).close()  # (and then it migrates, whole)
    assert verify_path(database).ok


# A later migration whose last statement the fault refuses (its others change nothing the
# catalog describes, so the upgraded ledger verifies against the snapshot).
LATER = """
CREATE FUNCTION cassette_later_count() RETURNS bigint
LANGUAGE sql AS $$ SELECT count(*) FROM cassette_steps $$;
ALTER FUNCTION cassette_steps_update() SET search_path = public, pg_temp;
DROP FUNCTION cassette_later_count();
"""


def test_a_failing_upgrade_leaves_the_ledger_as_it_was(
    database: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A ledger at the baseline with a message; a later migration fails at its ALTER
    FUNCTION: the ledger is at the baseline as it was, and opens there again."""
    shipped = len(sqlfiles.migrations())
    with MessageCassette(database) as cassette:
        cassette.post_message({"jobs": [{"intent": "a", "steps": [{}]}]}, "r", "USER")
    before = dump(database)
    with later_migration(monkeypatch, LATER) as later:
        with fault(database, "ALTER FUNCTION", "cassette_steps_update()"):
            error = refused(database)
            assert error.code is ErrorCode.MIGRATION_FAILED
            assert f"migration {later.version} " in error.message
            assert dump(database) == before
        with MessageCassette(database) as cassette:  # (upgraded now, the message kept)
            assert cassette.schema_version == later.version == shipped + 1
            assert cassette.status("r")["steps"]["PENDING"] == 1
        assert verify_path(database).ok
