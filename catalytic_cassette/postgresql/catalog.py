"""A PostgreSQL ledger's structure against the migrations' (verify, check 1).

``describe`` reads the catalog (pg_catalog only, plain SELECTs: verify.sql) into one
canonical description: every relation of schema public with its columns, constraints,
indexes, triggers (with their enabled state), rules, row-level security and policies,
inheritance, every function with its source, language, SECURITY DEFINER and settings,
every grant (the owner written ``<owner>``), types and operators, event triggers,
settings attached to the database, to the cassette_* roles or to every role
everywhere, those roles' powers, and who was granted SET on ``session_replication_role``.
Nothing in it depends on the cluster (no oid, no owner's name).

``catalog-<major>.json`` (beside the migrations) is the description of a database
migrated by this package, made on a fresh database of that PostgreSQL major version and
shipped; ``compare`` reports every object missing, extra or changed. One snapshot per
major, because the server prints the definitions it describes (``pg_get_indexdef``,
``pg_get_triggerdef``, ``pg_get_constraintdef``, ...) in its own words, which a new
major may change: a snapshot of another major would report false tampering, so verify
compares only with the server's own (``for_server``) and says when there is none.
Regenerate (or add, run against a server of another major) whenever what the migrations
make changes (the schema files with the baseline made from them, or a new migration)::

    CASSETTE_REGENERATE_CATALOG=1 python -m pytest tests/test_postgres_verify.py -k catalog

(the test fails whenever the server's shipped file is not what the migrations make).
"""

from __future__ import annotations

import json
import re
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

from ..verify.findings import Collector, Finding, FindingKind
from .sqlfiles import query

if TYPE_CHECKING:
    import psycopg

SNAPSHOTS = Path(__file__).resolve().parent.parent / "sql" / "postgresql"
_SNAPSHOT_NAME = re.compile(r"catalog-([1-9][0-9]*)\.json")

# A trigger in one of these states does not fire for ordinary sessions: 'D' disabled,
# 'R' only in replica sessions (ALTER TABLE ... DISABLE / ENABLE REPLICA TRIGGER).
NOT_FIRING = {"D": "disabled", "R": "enabled only for replica sessions"}
# Objects whose change makes the tables' rows unreadable as the law writes them (what a
# plain SELECT returns, or which rows a table holds): state and consistency are then
# not checked, as on SQLite when a table differs.
_TABLE_KINDS = ("relation", "constraint", "rule", "policy", "inherits")


_FUNCTION_FIELDS = (
    "language",
    "kind",
    "source",
    "binary",
    "security_definer",
    "config",
    "volatility",
    "strict",
    "leakproof",
    "parallel",
    "result",
)


def _rows(conn: psycopg.Connection[Any], name: str) -> list[tuple[Any, ...]]:
    return conn.execute(query(name)).fetchall()


def describe(conn: psycopg.Connection[Any]) -> dict[str, Any]:
    """The canonical description of the ledger's objects (run in verify's transaction,
    after ``verify_settings``: names are qualified as seen from search_path pg_catalog)."""
    objects: dict[str, Any] = {}
    columns: dict[str, list[list[Any]]] = {}
    for rel, *column in _rows(conn, "catalog_columns"):
        columns.setdefault(rel, []).append(list(column))
    for rel, kind, persistence, rls, force, partition in _rows(conn, "catalog_relations"):
        objects[f"relation {rel}"] = {
            "kind": kind,
            "persistence": persistence,
            "row_security": rls,
            "force_row_security": force,
            "partition": partition,
            "columns": columns.get(rel, []),
        }
    for rel, name, *rest in _rows(conn, "catalog_constraints"):
        objects[f"constraint {rel}.{name}"] = list(rest)
    for rel, name, *rest in _rows(conn, "catalog_indexes"):
        objects[f"index {rel}.{name}"] = list(rest)
    for rel, name, definition, enabled in _rows(conn, "catalog_triggers"):
        objects[f"trigger {rel}.{name}"] = {"definition": definition, "enabled": enabled}
    for signature, *rest in _rows(conn, "catalog_functions"):
        objects[f"function {signature}"] = dict(zip(_FUNCTION_FIELDS, rest, strict=True))
    grants: dict[str, list[list[Any]]] = {}
    for rel, *grant in _rows(conn, "catalog_relation_grants"):
        grants.setdefault(f"grants {rel}", []).append(grant)
    for rel, column, *grant in _rows(conn, "catalog_column_grants"):
        grants.setdefault(f"grants {rel}.{column}", []).append(grant)
    for signature, *grant in _rows(conn, "catalog_function_grants"):
        grants.setdefault(f"grants function {signature}", []).append(grant)
    for schema_grant in _rows(conn, "catalog_schema_grants"):
        grants.setdefault("grants schema public", []).append(list(schema_grant))
    objects.update({key: sorted(value) for key, value in grants.items()})
    for rel, name, *rest in _rows(conn, "catalog_rules"):
        objects[f"rule {rel}.{name}"] = list(rest)
    for rel, name, *rest in _rows(conn, "catalog_policies"):
        objects[f"policy {rel}.{name}"] = list(rest)
    for parent, child in _rows(conn, "catalog_inheritance"):
        objects[f"inherits {child} {parent}"] = True
    for name, kind in _rows(conn, "catalog_types"):
        objects[f"type {name}"] = kind
    for (signature,) in _rows(conn, "catalog_operators"):
        objects[f"operator {signature}"] = True
    for name, *rest in _rows(conn, "catalog_event_triggers"):
        objects[f"event trigger {name}"] = list(rest)
    for role, everywhere, config in _rows(conn, "catalog_settings"):
        where = "in every database" if everywhere else "in this database"
        objects[f"settings of {role or 'every role'} {where}"] = sorted(config or [])
    parameters: dict[str, list[list[Any]]] = {}
    for parameter, *grant in _rows(conn, "catalog_parameter_grants"):
        parameters.setdefault(f"grants parameter {parameter}", []).append(grant)
    objects.update({key: sorted(value) for key, value in parameters.items()})
    for name, *powers in _rows(conn, "catalog_roles"):
        objects[f"role {name}"] = dict(
            zip(("superuser", "bypass_rls", "create_role", "replication"), powers, strict=True)
        )
    objects["meta keys"] = [row[0] for row in _rows(conn, "verify_meta_keys")]
    return dict(sorted(objects.items()))


def server_major(conn: psycopg.Connection[Any]) -> int:
    """The server's major version (15 for 15.x): the server reports it when the
    connection starts (server_version_num), and no session can change it."""
    return int(conn.info.server_version) // 10000


def snapshot_path(major: int) -> Path:
    """Where the description made on PostgreSQL ``major`` is shipped."""
    return SNAPSHOTS / f"catalog-{major}.json"


def shipped_majors() -> list[int]:
    """The PostgreSQL majors with a shipped snapshot, lowest first."""
    found = (_SNAPSHOT_NAME.fullmatch(p.name) for p in SNAPSHOTS.iterdir())
    return sorted(int(m.group(1)) for m in found if m is not None)


@cache
def reference(major: int) -> dict[str, Any] | None:
    """The description shipped for PostgreSQL ``major`` ({"version": N, "objects":
    {...}}), None when none was made on that major."""
    path = snapshot_path(major)
    if not path.is_file():
        return None
    loaded: dict[str, Any] = json.loads(path.read_text("utf-8"))
    return loaded


def column_types(major: int) -> dict[str, dict[str, str]]:
    """Each ledger table's columns and their types (``format_type``), as the migrations
    make them: the server's snapshot, or the newest shipped one on a major without its
    own (type names, unlike definitions, are printed alike by every major)."""
    chosen = reference(major) or reference(shipped_majors()[-1])
    assert chosen is not None
    return {
        key.removeprefix("relation "): {str(c[0]): str(c[1]) for c in value["columns"]}
        for key, value in chosen["objects"].items()
        if key.startswith("relation ")
    }


def render(version: int, objects: dict[str, Any]) -> str:
    """A snapshot's text for ``objects`` at schema ``version`` (stable: sorted keys)."""
    return json.dumps({"version": version, "objects": objects}, indent=1, sort_keys=True) + "\n"


def _table_of(key: str) -> str | None:
    kind, _, name = key.partition(" ")
    if kind in ("relation", "constraint", "index", "trigger", "rule", "policy", "grants"):
        if name.startswith(("function ", "parameter ")):
            return None
        return name.split(".", 1)[0] or None
    return None


def compare(expected: dict[str, Any], actual: dict[str, Any], out: Collector) -> bool:
    """Report every object missing, extra or changed; True when the tables (and what
    decides which rows a plain SELECT returns) are as the migrations make them."""
    intact = True
    for key in sorted(expected.keys() | actual.keys()):
        want, have = expected.get(key), actual.get(key)
        if want == have:
            continue
        table = _table_of(key)
        if key.split(" ", 1)[0] in _TABLE_KINDS:
            intact = False
        if have is None:
            out.add(Finding(FindingKind.SCHEMA_MISSING, f"{key} is missing", table=table))
        elif want is None:
            out.add(
                Finding(FindingKind.SCHEMA_EXTRA, f"{key} is not part of the schema", table=table)
            )
        elif (
            key.startswith("trigger ")
            and isinstance(want, dict)
            and isinstance(have, dict)
            and want.get("definition") == have.get("definition")
            and have.get("enabled") in NOT_FIRING
        ):
            state = NOT_FIRING[str(have["enabled"])]
            out.add(Finding(FindingKind.TRIGGER_DISABLED, f"{key} is {state}", table=table))
        else:
            out.add(
                Finding(
                    FindingKind.SCHEMA_CHANGED,
                    f"{key} was changed: {_what(want, have)}",
                    table=table,
                )
            )
    return intact


def _what(want: Any, have: Any) -> str:
    """Which fields of an object differ; for a list of grants or settings, which items
    were added (+) and removed (-); else the whole definition."""
    if isinstance(want, dict) and isinstance(have, dict):
        fields = sorted(k for k in want.keys() | have.keys() if want.get(k) != have.get(k))
        return ", ".join(fields)
    if (
        isinstance(want, list)
        and isinstance(have, list)
        and all(isinstance(item, (list, str)) for item in want + have)
    ):
        added = [item for item in have if item not in want]
        removed = [item for item in want if item not in have]
        return (
            " ".join(
                [f"+{json.dumps(item)}" for item in added]
                + [f"-{json.dumps(item)}" for item in removed]
            )
            or "its order"
        )
    return "its definition"
