"""Who owns a PostgreSQL ledger and who may act as its roles (verify, check 1).

The catalog snapshot (``catalog.py``) names no role but the ledger's own: an owner's
name differs from cluster to cluster, and so do the logins the hosts are given. This
module judges what depends on them, from pg_catalog only (``verify.sql``):

- **Ownership** (``ownership``): the ledger's owner is the role that owns
  ``cassette_migrations`` (the first object the migrations make, as the database's
  owner: ``connection.migrate``). The database, schema ``public`` (or
  ``pg_database_owner``, which stands for the database's owner) and every object in it
  (tables, indexes, sequences, views, functions, types, operators) are that role's, and
  it is no superuser: a SECURITY DEFINER function runs as its owner, so the worker's
  functions owned by a superuser would run every call with every power.
- **Memberships** (``role_membership``): the migrations make ``cassette_worker``,
  ``cassette_appender`` and ``cassette_auditor`` members of no role, and give no role
  membership in them; a host's login is made a plain member of one
  (``CREATE ROLE runner_a LOGIN IN ROLE cassette_worker``). Reported: a ledger role
  that is a member of any role (the owner, another ledger role, a predefined role such
  as ``pg_write_all_data``); a membership in a ledger role held by the owner, by another
  ledger role or by a predefined role (every holder of that would hold it), or with
  ADMIN OPTION (its holder can hand the role on); a member of a ledger role that is
  also a member of the owner (a worker's login that can act as the owner). On
  PostgreSQL 16 and later, the owner's own grant that CREATE ROLE gives its creator
  (ADMIN OPTION, neither INHERIT nor SET) is what the migrations make, and is not
  reported.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from ..verify.findings import Collector, Finding, FindingKind
from .sqlfiles import query

if TYPE_CHECKING:
    import psycopg

LEDGER_ROLES = ("cassette_worker", "cassette_appender", "cassette_auditor")
# The predefined role that stands for the owner of the current database (PostgreSQL 15
# makes it the owner of schema public).
_DATABASE_OWNER = "pg_database_owner"


def check_ownership(conn: psycopg.Connection[Any], out: Collector) -> None:
    """Every object of the ledger, its schema and its database are the ledger owner's,
    who is no superuser."""
    row = conn.execute(query("verify_ledger_owner")).fetchone()
    if row is None:
        return  # (no cassette_migrations: the catalog check reports it missing)
    owner, owner_is_superuser = str(row[0]), bool(row[1])
    if owner_is_superuser:
        definers = sum(1 for r in conn.execute(query("verify_owners")) if r[5] and r[4])
        out.add(
            Finding(
                FindingKind.OWNERSHIP,
                f"the ledger's owner {owner} is a superuser: its {definers} SECURITY DEFINER"
                " functions run every call as a superuser; make the ledger in a database a"
                " role that is no superuser owns (LAW.md 14)",
            )
        )
    for kind, name, table, role, superuser, definer, is_owner in conn.execute(
        query("verify_owners")
    ):
        if is_owner or (kind == "schema" and role == _DATABASE_OWNER):
            continue
        detail = f"{kind} {name} is owned by {role}, not by the ledger's owner {owner}"
        if definer and superuser:
            detail += ": a SECURITY DEFINER function that runs as a superuser"
        out.add(Finding(FindingKind.OWNERSHIP, detail, table=table))


def check_memberships(conn: psycopg.Connection[Any], out: Collector) -> None:
    """Memberships into and out of the ledger's roles beyond a host's plain login."""
    for role, member, admin, inherit, set_option, into_owner, member_is_owner in conn.execute(
        query("verify_memberships")
    ):
        problem = _membership_problem(
            str(role), str(member), bool(admin), inherit, set_option, into_owner, member_is_owner
        )
        if problem is not None:
            out.add(Finding(FindingKind.ROLE_MEMBERSHIP, problem, key=f"{member} in {role}"))


def _membership_problem(
    role: str,
    member: str,
    admin: bool,
    inherit: str | None,
    set_option: str | None,
    into_owner: bool,
    member_is_owner: bool,
) -> str | None:
    """Why ``member``'s membership in ``role`` is not one the law allows, or None."""
    if member in LEDGER_ROLES:
        return f"the ledger role {member} is a member of {role}: it holds that role's powers"
    if into_owner:
        return f"{member}, a member of a ledger role, is a member of the ledger's owner {role}"
    if member_is_owner:
        if admin and inherit == "false" and set_option == "false":
            return None  # (PostgreSQL 16+: CREATE ROLE's grant to its creator)
        return f"the ledger's owner {member} is a member of the ledger role {role}"
    if member.startswith("pg_"):
        return f"the predefined role {member} is a member of {role}: every holder of it is"
    if admin:
        return f"{member} holds {role} WITH ADMIN OPTION: it can grant {role} to any role"
    return None
