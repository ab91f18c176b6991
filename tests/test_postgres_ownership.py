"""Who owns a PostgreSQL ledger, who may act as its roles, and the session that writes it
(LAW.md 10b, 14): verify reports objects not the one owner's and memberships the
migrations do not make, each as the attacker who would make it (a superuser, a CREATEROLE
holder, the owner); opening refuses a writing session whose triggers would not fire.

Roles and memberships are the cluster's, shared by every test database: each attack
undoes itself."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import pytest

from catalytic_cassette import CassetteError, ErrorCode, MessageCassette
from catalytic_cassette.verify import VerifyReport, verify_path

from . import postgres

psycopg = pytest.importorskip("psycopg")

PAYLOAD = {"jobs": [{"intent": "a", "steps": [{"n": 1}]}]}


def kinds(report: VerifyReport) -> set[str]:
    return {str(f.kind) for f in report.errors}


def details(report: VerifyReport, kind: str) -> list[str]:
    return [f.detail for f in report.findings if str(f.kind) == kind]


def as_role(url: str, role: str) -> str:
    """``url`` with ``role`` as its user (the test cluster trusts every local login)."""
    head, _, rest = url.partition("://")
    return f"{head}://{role}{rest[rest.index('@') :]}"


@contextmanager
def admin(url: str) -> Iterator[Any]:
    with psycopg.connect(url, autocommit=True) as conn:
        yield conn


@pytest.fixture
def ledger(pg_ledger: str) -> str:
    """A ledger with one message posted (its owner is postgres.OWNER, no superuser)."""
    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message(PAYLOAD, "r", "USER")
    return pg_ledger


@pytest.fixture
def login(pg_server: str) -> Iterator[str]:
    """A fresh login role of the cluster, dropped after the test with its grants (ask for it
    before ``ledger``: the ledger's database, which may hold its objects, goes first)."""
    name = f"cassette_test_login_{uuid.uuid4().hex[:8]}"
    with admin(pg_server) as conn:
        conn.execute(f'DROP ROLE IF EXISTS "{name}"')
        conn.execute(f'CREATE ROLE "{name}" LOGIN')
    yield name
    with admin(pg_server) as conn:
        conn.execute(f'DROP OWNED BY "{name}"')  # (in the server's database; grants elsewhere)
        conn.execute(f'REVOKE SET ON PARAMETER session_replication_role FROM "{name}"')
        conn.execute(f'DROP ROLE "{name}"')


def test_a_ledger_made_by_its_database_owner_verifies_clean(ledger: str) -> None:
    report = verify_path(ledger)
    assert report.ok and not kinds(report)
    with admin(ledger) as conn:  # a superuser made it: the objects are the owner's anyway
        owners = conn.execute(
            "SELECT DISTINCT pg_get_userbyid(relowner) FROM pg_class"
            " WHERE relnamespace = 'public'::regnamespace"
        ).fetchall()
    assert owners == [(postgres.OWNER,)]


# An object handed to another role: by a superuser (ALTER ... OWNER TO needs membership in
# the new owner) or by the owner to a role of its own; each undone before the next.
OWNER_CHANGES = {
    "a SECURITY DEFINER function to the superuser": (
        "ALTER FUNCTION cassette_claim(text, text, integer, bigint) OWNER TO {to}",
        "SECURITY DEFINER function that runs as a superuser",
        "superuser",
    ),
    "a table to another role": ("ALTER TABLE cassette_steps OWNER TO {to}", "table", "login"),
    "the database to another role": (
        'ALTER DATABASE "{database}" OWNER TO {to}',
        "database",
        "login",
    ),
    "schema public to another role": (
        "ALTER SCHEMA public OWNER TO {to}",
        "schema public",
        "login",
    ),
    "a trigger function to another role": (
        "ALTER FUNCTION cassette_steps_update() OWNER TO {to}",
        "function public.cassette_steps_update()",
        "login",
    ),
}


def test_an_object_owned_by_another_role_is_reported(login: str, ledger: str) -> None:
    with admin(ledger) as conn:
        superuser = conn.execute("SELECT current_user").fetchone()[0]
    roles = {"superuser": f'"{superuser}"', "login": f'"{login}"'}
    database = postgres.database_name(ledger)
    for change, (statement, expected, to) in OWNER_CHANGES.items():
        with admin(ledger) as conn:
            conn.execute(statement.format(to=roles[to], database=database))
        try:
            report = verify_path(ledger)
        finally:
            with admin(ledger) as conn:
                conn.execute(statement.format(to=postgres.OWNER, database=database))
        assert kinds(report) == {"ownership"}, (change, report.findings)
        assert any(expected in d for d in details(report, "ownership")), (change, report.findings)
    assert verify_path(ledger).ok  # (each undone: as the migrations left it)


def test_a_ledger_made_by_a_superuser_is_reported(pg_server: str) -> None:
    """A database the superuser owns: the migrations run as it, so every worker function
    would run as a superuser."""
    with admin(pg_server) as conn:
        superuser = conn.execute("SELECT current_user").fetchone()[0]
    url = postgres.create_database(pg_server)
    try:
        name = postgres.database_name(url)
        with admin(pg_server) as conn:
            conn.execute(f'ALTER DATABASE "{name}" OWNER TO "{superuser}"')
        MessageCassette(url).close()
        report = verify_path(url)
        assert kinds(report) == {"ownership"}
        (finding,) = details(report, "ownership")
        assert f"owner {superuser} is a superuser" in finding
        assert "SECURITY DEFINER" in finding
    finally:
        postgres.drop_database(pg_server, url)


# Memberships into and out of the ledger's roles, as a superuser or a CREATEROLE holder
# would grant them; each revoked afterwards.
MEMBERSHIPS = {
    "the worker role made a member of the owner": (
        "GRANT {owner} TO cassette_worker",
        "REVOKE {owner} FROM cassette_worker",
        "ledger role cassette_worker is a member of",
    ),
    "pg_write_all_data granted to the auditor": (
        "GRANT pg_write_all_data TO cassette_auditor",
        "REVOKE pg_write_all_data FROM cassette_auditor",
        "ledger role cassette_auditor is a member of pg_write_all_data",
    ),
    "pg_signal_backend granted to the worker": (
        "GRANT pg_signal_backend TO cassette_worker",
        "REVOKE pg_signal_backend FROM cassette_worker",
        "member of pg_signal_backend",
    ),
    "the owner made a member of the worker role": (
        "GRANT cassette_worker TO {owner}",
        "REVOKE cassette_worker FROM {owner}",
        "owner cassette_test_owner is a member of the ledger role cassette_worker",
    ),
    "the auditor made a member of the worker role": (
        "GRANT cassette_worker TO cassette_auditor",
        "REVOKE cassette_worker FROM cassette_auditor",
        "ledger role cassette_auditor is a member of cassette_worker",
    ),
    "a login given the worker role with ADMIN OPTION": (
        "GRANT cassette_worker TO {login} WITH ADMIN OPTION",
        "REVOKE cassette_worker FROM {login}",
        "WITH ADMIN OPTION",
    ),
    "a predefined role given the appender role": (
        "GRANT cassette_appender TO pg_monitor",
        "REVOKE cassette_appender FROM pg_monitor",
        "predefined role pg_monitor is a member of cassette_appender",
    ),
    "a worker's login made a member of the owner": (
        "GRANT cassette_worker TO {login}; GRANT {owner} TO {login}",
        "REVOKE {owner} FROM {login}; REVOKE cassette_worker FROM {login}",
        "is a member of the ledger's owner",
    ),
}


def test_a_membership_the_migrations_do_not_make_is_reported(
    login: str, ledger: str, pg_server: str
) -> None:
    names = {"owner": postgres.OWNER, "login": f'"{login}"'}
    for attack, (grant, revoke, expected) in MEMBERSHIPS.items():
        with admin(pg_server) as conn:
            for part in grant.split("; "):
                conn.execute(part.format(**names))
        try:
            report = verify_path(ledger)
        finally:
            with admin(pg_server) as conn:
                for part in revoke.split("; "):
                    conn.execute(part.format(**names))
        assert kinds(report) == {"role_membership"}, (attack, report.findings)
        found = details(report, "role_membership")
        assert any(expected in d for d in found), (attack, found)
    assert verify_path(ledger).ok  # (each revoked: as the migrations left it)


def test_a_hosts_plain_login_is_lawful(login: str, ledger: str, pg_server: str) -> None:
    """The documented way to give a host its role (README, PostgreSQL) is no finding."""
    with admin(pg_server) as conn:
        conn.execute(f'GRANT cassette_worker TO "{login}"')
        conn.execute(f'GRANT cassette_auditor TO "{login}"')
    try:
        assert verify_path(ledger).ok
    finally:
        with admin(pg_server) as conn:
            conn.execute(f'REVOKE cassette_worker, cassette_auditor FROM "{login}"')


# ------------------------------------------------------------------ the writing session


def test_a_session_with_replica_triggers_is_refused_before_anything(
    login: str, ledger: str
) -> None:
    """session_replication_role from the URL's options (a superuser's: the server refuses
    the option to anyone else), from ALTER ROLE (a login's, and ALL), and from ALTER
    DATABASE: every writing open is refused UNSAFE_SESSION; nothing is written; a reader
    still verifies and reports the setting on the database or on every role."""
    before = verify_path(ledger).journal_rows
    replica = f"{ledger}&options=-c%20session_replication_role%3Dreplica"
    with pytest.raises(CassetteError) as refused:
        MessageCassette(replica)
    assert refused.value.code is ErrorCode.UNSAFE_SESSION
    with admin(ledger) as conn:
        conn.execute(f'ALTER ROLE "{login}" SET session_replication_role = replica')
        conn.execute(f'GRANT cassette_worker TO "{login}"')
    try:
        with pytest.raises(CassetteError) as refused:
            MessageCassette(as_role(ledger, login))
        assert refused.value.code is ErrorCode.UNSAFE_SESSION
    finally:
        with admin(ledger) as conn:
            conn.execute(f'ALTER ROLE "{login}" RESET session_replication_role')
            conn.execute(f'REVOKE cassette_worker FROM "{login}"')
    with admin(ledger) as conn:  # (every role, every database: the whole cluster's)
        conn.execute("ALTER ROLE ALL SET session_replication_role = replica")
    try:
        with pytest.raises(CassetteError) as refused:
            MessageCassette(ledger)
        assert refused.value.code is ErrorCode.UNSAFE_SESSION
        report = verify_path(ledger)
        assert kinds(report) == {"schema_extra"}
        assert "settings of every role in every database" in report.errors[0].detail
    finally:
        with admin(ledger) as conn:
            conn.execute("ALTER ROLE ALL RESET session_replication_role")
    name = postgres.database_name(ledger)
    with admin(ledger) as conn:
        conn.execute(f'ALTER DATABASE "{name}" SET session_replication_role = replica')
    with pytest.raises(CassetteError) as refused:
        MessageCassette(ledger)
    assert refused.value.code is ErrorCode.UNSAFE_SESSION
    report = verify_path(ledger)  # (a reader's open is not refused: it reports)
    assert kinds(report) == {"schema_extra"} and report.journal_rows == before


def test_only_a_superuser_or_a_granted_role_can_ask_for_replica(login: str, ledger: str) -> None:
    """The owner cannot set the option at all (the server refuses the connection); a role
    granted SET on the parameter can, and opening refuses its session, while verify
    reports the grant."""
    owner_replica = as_role(ledger, postgres.OWNER) + (
        "&options=-c%20session_replication_role%3Dreplica"
    )
    with pytest.raises(CassetteError) as refused:
        MessageCassette(owner_replica)
    assert refused.value.code is ErrorCode.CANNOT_OPEN
    assert "permission denied to set parameter" in refused.value.message
    with admin(ledger) as conn:
        conn.execute(f'GRANT SET ON PARAMETER session_replication_role TO "{login}"')
        conn.execute(f'GRANT cassette_worker TO "{login}"')
    try:
        with pytest.raises(CassetteError) as refused:
            MessageCassette(
                as_role(ledger, login) + "&options=-c%20session_replication_role%3Dreplica"
            )
        assert refused.value.code is ErrorCode.UNSAFE_SESSION
        report = verify_path(ledger)
        assert kinds(report) == {"schema_extra"}
        assert "grants parameter session_replication_role" in report.errors[0].detail
    finally:
        with admin(ledger) as conn:
            conn.execute(f'REVOKE cassette_worker FROM "{login}"')
