"""Every statement the package sends to PostgreSQL is named (issue 15, item 8).

Two guards. ``inline_sql`` reads the source of the modules that talk to psycopg and
reports SQL written in Python: a literal that reads as SQL, or any literal passed as the
statement of ``execute``, ``statement`` or ``batch``. ``recording`` watches, while a test
runs, what the package's own code hands psycopg to execute (the tests' raw SQL, an
attacker's, is not the package's), and ``unnamed`` keeps what is neither a named query
(``sql/postgresql/*.sql``, a template's ``{...}`` filled in) nor a migration file.
"""

from __future__ import annotations

import ast
import re
import sys
from collections.abc import Iterator
from contextlib import contextmanager
from functools import cache
from pathlib import Path
from typing import Any

from catalytic_cassette.postgresql import sqlfiles

PACKAGE = Path(sqlfiles.__file__).resolve().parent.parent

# The keywords a statement starts with (upper case: how the package writes SQL; the
# call check below catches a statement in any case that is sent as a literal).
_SQL_START = re.compile(
    r"^\s*(SELECT|INSERT|UPDATE|DELETE|WITH|SET|SHOW|RESET|CREATE|ALTER|DROP|REVOKE|GRANT"
    r"|BEGIN|START|COMMIT|END|ROLLBACK|ABORT|SAVEPOINT|RELEASE|LOCK|TRUNCATE|COPY|VALUES"
    r"|TABLE|DECLARE|FETCH|MOVE|CLOSE|PREPARE|EXECUTE|DEALLOCATE|LISTEN|NOTIFY|UNLISTEN"
    r"|ANALYZE|VACUUM|EXPLAIN|CALL|DO|DISCARD|COMMENT|SECURITY|REFRESH|PRAGMA)\s+\S"
)
# Calls whose argument at this position is the statement sent (psycopg's, and the
# backend's connection.statement and connection.batch).
_SENDERS = {"execute": 0, "executemany": 0, "copy": 0, "statement": 1, "batch": 1}

# SQL the PostgreSQL modules write for a sqlite3 connection, by module and function:
# how many statements each holds. verify copies what it read into a private SQLite
# database and runs the SQLite verifier there; an export rewrites its SQLite file's
# journal mode. A statement added to one of these functions fails the check until it is
# counted here, so a PostgreSQL statement cannot hide among them.
SQLITE_STATEMENTS = {
    ("postgresql/verify.py", "_check_artifact_files"): 1,
    ("postgresql/verify.py", "_check_head_time"): 1,
    ("postgresql/verify.py", "check_journal_columns"): 1,
    ("postgresql/verify.py", "Mirror.__init__"): 5,
    ("postgresql/verify.py", "Mirror.entries"): 1,
    ("postgresql/verify.py", "Mirror.copy_table"): 1,
    ("postgresql/verify.py", "Mirror.commit"): 2,
    ("postgresql/verify.py", "Mirror.shape_for_worker_keys"): 5,
    ("postgresql/ledger.py", "PgLedger.export_snapshot"): 1,
}


def postgresql_modules() -> list[Path]:
    """The backend's modules, and any other module of the package that imports psycopg."""
    found = sorted((PACKAGE / "postgresql").glob("*.py"))
    for path in sorted(PACKAGE.rglob("*.py")):
        if path not in found and _imports_psycopg(ast.parse(path.read_text("utf-8"))):
            found.append(path)
    return found


def _imports_psycopg(tree: ast.AST) -> bool:
    for node in ast.walk(tree):
        if isinstance(node, ast.Import) and any(
            a.name.split(".")[0] == "psycopg" for a in node.names
        ):
            return True
        if isinstance(node, ast.ImportFrom) and (node.module or "").split(".")[0] == "psycopg":
            return True
    return False


def inline_sql(source: str, module: str) -> list[str]:
    """Each piece of SQL written in Python in ``source`` (named ``module``, relative to
    the package), as 'module:line: function: text'; the counted SQLite statements aside
    (a count that no longer matches is reported too)."""
    tree = ast.parse(source)
    found: dict[str, list[str]] = {}
    reported: set[int] = set()  # (a piece of text is reported once, where it is outermost)
    for scope, node in _scoped(tree, ""):
        if id(node) in reported:
            continue
        piece = _sql_piece(node)
        if piece is not None:
            reported.update(id(inner) for inner in ast.walk(piece))
            text = _literal(piece) or ""
            line = f"{module}:{getattr(piece, 'lineno', 0)}: {scope}: {text[:80]!r}"
            found.setdefault(scope, []).append(line)
    problems: list[str] = []
    for scope, hits in found.items():
        expected = SQLITE_STATEMENTS.get((module, scope), 0)
        if len(hits) != expected:
            problems.extend(
                hits
                if expected == 0
                else [f"{module}: {scope}: {len(hits)} SQLite statements, {expected} counted"]
            )
    for (counted_module, scope), expected in SQLITE_STATEMENTS.items():
        if counted_module == module and scope not in found:
            problems.append(f"{module}: {scope}: no SQLite statement left, {expected} counted")
    return problems


def _scoped(node: ast.AST, scope: str) -> Iterator[tuple[str, ast.AST]]:
    """Every node under ``node`` with the qualified name of the function or class holding it;
    docstrings left out."""
    body = getattr(node, "body", None)
    docstring = None
    if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
        first = body[0] if body else None
        if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
            docstring = first.value
    for child in ast.iter_child_nodes(node):
        if child is docstring or (isinstance(child, ast.Expr) and child.value is docstring):
            continue
        if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            inner = f"{scope}.{child.name}" if scope else child.name
            yield inner, child
            yield from _scoped(child, inner)
        else:
            yield scope, child
            if not isinstance(child, ast.JoinedStr):  # (an f-string is one piece of text)
                yield from _scoped(child, scope)


def _sql_piece(node: ast.AST) -> ast.AST | None:
    """The expression of ``node`` that is SQL written in Python: any literal sent as the
    statement of a call that sends one, or a literal (an f-string's fixed text, a sum of
    literals) that starts like a statement."""
    if isinstance(node, ast.Call):
        func = node.func
        name = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", "")
        position = _SENDERS.get(name, -1)
        if 0 <= position < len(node.args) and _literal(node.args[position]) is not None:
            return node.args[position]
        return None
    text = _literal(node)
    if text is not None and _SQL_START.match(text):
        return node
    return None


def _literal(node: ast.AST) -> str | None:
    """A string written in the source: a constant, an f-string, bytes, or a sum of them."""
    if isinstance(node, ast.Constant) and isinstance(node.value, (str, bytes)):
        value = node.value
        return value.decode("utf-8", "replace") if isinstance(value, bytes) else value
    if isinstance(node, ast.JoinedStr):
        return "".join(v.value if isinstance(v, ast.Constant) else "{...}" for v in node.values)
    if isinstance(node, ast.BinOp) and isinstance(node.op, (ast.Add, ast.Mod)):
        left = _literal(node.left)
        return None if left is None else left + (_literal(node.right) or "...")
    if (
        isinstance(node, ast.Call)
        and isinstance(node.func, ast.Attribute)
        and node.func.attr in ("format", "encode", "replace", "strip")
    ):
        return _literal(node.func.value)
    return None


def used_names(sources: list[str]) -> set[str]:
    """Every string constant of ``sources``: a named query is used when its name is one."""
    names: set[str] = set()
    for source in sources:
        for node in ast.walk(ast.parse(source)):
            if isinstance(node, ast.Constant) and isinstance(node.value, str):
                names.add(node.value)
    return names


# ------------------------------------------------------------- what is sent


@cache
def _named() -> tuple[frozenset[str], tuple[re.Pattern[str], ...]]:
    exact = set(sqlfiles.queries().values())
    exact.update(m.sql for m in sqlfiles.migrations())
    templates = []
    for text in sqlfiles.queries().values():
        pieces = re.split(r"\{[a-z_]+\}", text)
        if len(pieces) > 1:
            pattern = ".+?".join(re.escape(piece) for piece in pieces) + r"\Z"
            templates.append(re.compile(pattern, re.DOTALL))
    return frozenset(exact), tuple(templates)


# Migrations a test ships beside the package's (tests/pg_later.py): sent as migrations are.
LATER_MIGRATIONS: set[str] = set()


def is_named(text: str) -> bool:
    exact, templates = _named()
    return text in exact or text in LATER_MIGRATIONS or any(t.match(text) for t in templates)


def unnamed(sent: list[str]) -> list[str]:
    return [text for text in sent if not is_named(text)]


@contextmanager
def recording() -> Iterator[list[str]]:
    """The statements the package's code sends through psycopg meanwhile (each as text)."""
    import psycopg

    sent: list[str] = []
    plain, server = psycopg.Cursor.execute, psycopg.ServerCursor.execute
    plain_many = psycopg.Cursor.executemany

    def note(cursor: Any, statement: Any) -> None:
        frame = sys._getframe(2)
        while frame is not None and frame.f_globals.get("__name__", "").startswith("psycopg"):
            frame = frame.f_back  # type: ignore[assignment]
        if frame is None or not frame.f_globals.get("__name__", "").startswith(
            "catalytic_cassette"
        ):
            return  # the test's own SQL (or a script's), not the package's
        if isinstance(statement, bytes):
            sent.append(statement.decode("utf-8"))
        elif isinstance(statement, str):
            sent.append(statement)
        else:
            sent.append(statement.as_string(cursor))

    def execute(self: Any, statement: Any, *args: Any, **kwargs: Any) -> Any:
        note(self, statement)
        return plain(self, statement, *args, **kwargs)

    def execute_server(self: Any, statement: Any, *args: Any, **kwargs: Any) -> Any:
        note(self, statement)
        return server(self, statement, *args, **kwargs)

    def executemany(self: Any, statement: Any, *args: Any, **kwargs: Any) -> Any:
        note(self, statement)
        return plain_many(self, statement, *args, **kwargs)

    psycopg.Cursor.execute = execute  # type: ignore[method-assign]
    psycopg.ServerCursor.execute = execute_server  # type: ignore[method-assign]
    psycopg.Cursor.executemany = executemany  # type: ignore[method-assign]
    try:
        yield sent
    finally:
        psycopg.Cursor.execute = plain  # type: ignore[method-assign]
        psycopg.ServerCursor.execute = server  # type: ignore[method-assign]
        psycopg.Cursor.executemany = plain_many  # type: ignore[method-assign]
