"""A ledger target's kind is told in one module, ``targets``, and its implementation chosen
in one, ``backends``: every other module asks them and none tells a URL from a path, or
imports PostgreSQL's modules, itself."""

from __future__ import annotations

import ast
import subprocess
import sys
from pathlib import Path

import pytest

import catalytic_cassette
from catalytic_cassette import backends, targets
from catalytic_cassette.cassette import MessageCassette
from catalytic_cassette.chain import CausalChain
from catalytic_cassette.copying_sqlite import SqliteDestination, SqliteSource
from catalytic_cassette.errors import CassetteError, ErrorCode
from catalytic_cassette.migrate import current_version

PACKAGE = Path(catalytic_cassette.__file__).parent
DECIDER = PACKAGE / "targets.py"
CHOOSER = PACKAGE / "backends.py"
POSTGRESQL = PACKAGE / "postgresql"
# the decision's own names, which only ``targets`` may use (postgresql/__init__.py
# re-exports them for code written against their former home)
DECISION_NAMES = frozenset({"is_postgres_url", "URL_PREFIXES"})
REEXPORT = POSTGRESQL / "__init__.py"


def kind_tests(source: str) -> list[str]:
    """Where ``source`` reads a target's kind itself: a call of the decision, or a
    ``startswith`` on a ``postgres`` URL prefix."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        name = func.id if isinstance(func, ast.Name) else getattr(func, "attr", None)
        if name in DECISION_NAMES:
            found.append(f"line {node.lineno}: {name}()")
        if name == "startswith":
            for arg in ast.walk(node):
                if isinstance(arg, ast.Constant) and str(arg.value).startswith("postgres"):
                    found.append(f"line {node.lineno}: startswith({arg.value!r})")
    return found


def decision_imports(source: str) -> list[str]:
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.ImportFrom):
            for alias in node.names:
                if alias.name in DECISION_NAMES:
                    found.append(f"line {node.lineno}: import {alias.name}")
    return found


def postgresql_imports(source: str, module: str) -> list[str]:
    """The PostgreSQL modules ``source`` (the module ``module``) imports, but for a
    class naming its own counterpart (``LedgerFile._postgresql_class``), which is asked
    by ``backends``."""
    package = module.rsplit(".", 1)[0]
    tree = ast.parse(source)
    counterparts = {
        id(inner)
        for node in ast.walk(tree)
        if isinstance(node, ast.FunctionDef) and node.name == "_postgresql_class"
        for inner in ast.walk(node)
    }
    found = []
    for node in ast.walk(tree):
        if id(node) in counterparts:
            continue
        if isinstance(node, ast.ImportFrom):
            base = package
            for _ in range(node.level - 1):
                base = base.rsplit(".", 1)[0]
            target = node.module or ""
            if node.level:
                target = f"{base}.{target}" if target else base
            names = [f"{target}.{alias.name}" for alias in node.names]
        elif isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        else:
            continue
        found += [
            f"line {node.lineno}: {name}"
            for name in names
            if name.startswith("catalytic_cassette.postgresql.")
            and name.rsplit(".", 1)[1] not in DECISION_NAMES
        ]
    return found


def test_the_checks_see_a_kind_test() -> None:
    assert kind_tests("from .postgresql import is_postgres_url\nis_postgres_url(db)\n")
    assert kind_tests("x = db.startswith(('postgresql://', 'postgres://'))\n")
    assert kind_tests("x = p.is_postgres_url(db)\n")
    assert decision_imports("from ..backends import is_postgres_url\n")
    assert not kind_tests("names_file(db)\nname.startswith('cassette')\n")
    module = "catalytic_cassette.cli.commands"
    assert postgresql_imports("from ..postgresql import connection\n", module)
    assert postgresql_imports("from ..postgresql.verify import verify_url\n", module)
    assert postgresql_imports("import catalytic_cassette.postgresql.anchors\n", module)
    assert not postgresql_imports("from ..targets import names_file\n", module)
    naming = "def _postgresql_class(cls):\n    from .postgresql.chain import PgCausalChain\n"
    assert not postgresql_imports(naming, "catalytic_cassette.chain")
    assert postgresql_imports(
        naming.replace("_postgresql_class", "other"), "catalytic_cassette.chain"
    )


def test_no_module_but_backends_reads_a_targets_kind() -> None:
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == DECIDER:
            continue  # (its own definition)
        source = path.read_text(encoding="utf-8")
        found = kind_tests(source) + ([] if path == REEXPORT else decision_imports(source))
        if found:
            offenders[str(path.relative_to(PACKAGE))] = found
    assert offenders == {}


def test_no_module_but_backends_chooses_a_postgresql_implementation() -> None:
    offenders = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        if path == CHOOSER or POSTGRESQL in path.parents:
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = ".".join(parts[:-1] if parts[-1] == "__init__" else parts)
        if parts[-1] == "__init__":
            module += ".__init__"
        found = postgresql_imports(path.read_text(encoding="utf-8"), module)
        if found:
            offenders[str(path.relative_to(PACKAGE))] = found
    assert offenders == {}


def test_the_decision() -> None:
    assert targets.is_postgres_url("postgresql://u@h/db")
    assert targets.is_postgres_url("postgres://h/db")
    assert not targets.names_file("postgresql://h/db")
    assert targets.names_file("cassette.db")
    assert targets.names_file(Path("dir") / "postgresql:")
    assert targets.names_file(":memory:")
    # the former home of the decision still answers, with the same function
    from catalytic_cassette import postgresql

    assert postgresql.is_postgres_url is targets.is_postgres_url


def test_a_file_is_served_by_the_sqlite_implementations(tmp_path: Path) -> None:
    db = str(tmp_path / "a.db")
    for cls in (MessageCassette, CausalChain):
        assert targets.ledger_class(cls, db, cls._postgresql_class) is cls
        assert type(cls(db)) is cls
    assert backends.server_verify(db) is None
    with MessageCassette(db) as cassette:
        cassette.post_message({"a": 1}, run_id="r", source="USER")
    assert backends.pending_migrations(db) == ([], current_version())
    assert backends.snapshot_replays_journal(db) is False
    assert backends.restore_by_copy(str(tmp_path / "new.db")) is False
    source = backends.open_source(db)
    try:
        assert isinstance(source, SqliteSource)
        destination = backends.open_destination(str(tmp_path / "b.db"), None, source.ledger_id())
        assert isinstance(destination, SqliteDestination)
        destination.close()
    finally:
        source.close()
    with backends.open_journal_reader(db) as read:
        assert len(read(0, 10)) >= 1
    with backends.open_proof_source(db) as proofs:
        assert proofs is not None


def test_a_url_is_served_by_the_postgresql_implementations() -> None:
    url = "postgresql://nobody@127.0.0.1:1/none"
    from catalytic_cassette.postgresql.cassette import PgMessageCassette
    from catalytic_cassette.postgresql.chain import PgCausalChain
    from catalytic_cassette.postgresql.verify import verify_url

    for cls, pg_class in ((MessageCassette, PgMessageCassette), (CausalChain, PgCausalChain)):
        assert targets.ledger_class(cls, url, cls._postgresql_class) is pg_class
        # a PostgreSQL class serves itself, a subclass of the SQLite one is not ported
        assert targets.ledger_class(pg_class, url, pg_class._postgresql_class) is pg_class
        subclass = type("Mine", (cls,), {})
        with pytest.raises(CassetteError) as caught:
            subclass(url)
        assert caught.value.code is ErrorCode.BACKEND_UNSUPPORTED
        assert "Mine is not available on a PostgreSQL ledger yet" in caught.value.message
    assert backends.server_verify(url) is verify_url
    assert backends.snapshot_replays_journal(url) is True
    assert backends.journal_length_unopened(url) == 0


def test_a_url_where_only_a_file_will_do_is_refused() -> None:
    with pytest.raises(CassetteError) as caught:
        targets.require_file("postgresql://h/db")
    assert caught.value.code is ErrorCode.BACKEND_UNSUPPORTED
    targets.require_file("cassette.db")  # a path passes


@pytest.mark.parametrize(
    ("module", "loaded"),
    [
        ("targets", ["catalytic_cassette.targets"]),
        ("backends", ["catalytic_cassette.backends", "catalytic_cassette.targets"]),
    ],
)
def test_choosing_imports_no_implementation_at_load(module: str, loaded: list[str]) -> None:
    code = (
        "import sys, catalytic_cassette; before = set(sys.modules);"
        f" import catalytic_cassette.{module};"
        " print(sorted(m for m in set(sys.modules) - before if m.startswith('catalytic')))"
    )
    out = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    ).stdout
    assert out.strip() == str(loaded)
