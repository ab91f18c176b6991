"""The declared runtime dependencies are exactly the third-party packages the code imports."""

from __future__ import annotations

import ast
import re
import sys
from pathlib import Path

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "catalytic_cassette"
# Import names that differ from the distribution name on PyPI.
DISTRIBUTION_OF = {"yaml": "pyyaml"}


# Modules that only an optional extra serves: the module's path in the package (a folder
# ends in "/": every module under it) -> (the extra, the import names it provides: the
# extra's package and those it depends on by contract, as the MCP SDK does on pydantic).
OPTIONAL_MODULES = {
    "mcp_server.py": ("mcp", {"mcp", "pydantic"}),
    "postgresql/": ("postgresql", {"psycopg"}),
}


def _optional(package: Path, source: Path, name: str) -> bool:
    relative = source.relative_to(package).as_posix()
    return relative == name or (name.endswith("/") and relative.startswith(name))


def imported_top_level_modules(package: Path, *, only: str | None = None) -> set[str]:
    """Every absolute import of the package's modules, reduced to its top-level name,
    including imports inside functions and under TYPE_CHECKING. The modules of optional
    extras are left out, or read alone with ``only``."""
    found: set[str] = set()
    for source in package.rglob("*.py"):
        optional = any(_optional(package, source, name) for name in OPTIONAL_MODULES)
        if (only is None and optional) or (
            only is not None and not _optional(package, source, only)
        ):
            continue
        tree = ast.parse(source.read_text(encoding="utf-8"), filename=str(source))
        for node in ast.walk(tree):
            if isinstance(node, ast.Import):
                found.update(alias.name.split(".")[0] for alias in node.names)
            elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
                found.add(node.module.split(".")[0])
    return found


# The standard library's private SHA-256 modules: each Python has one of them
# (hashing.py), so the running one's sys.stdlib_module_names lacks the other.
STDLIB_OF_OTHER_PYTHONS = frozenset({"_sha2", "_sha256"})


def third_party(modules: set[str]) -> set[str]:
    own = {PACKAGE.name}
    stdlib = sys.stdlib_module_names | STDLIB_OF_OTHER_PYTHONS
    return {
        DISTRIBUTION_OF.get(m, m)
        for m in modules
        if m not in stdlib and m not in own and m != "__future__"
    }


def declared_runtime_dependencies() -> set[str]:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    names = set()
    for requirement in project["dependencies"]:
        match = re.match(r"[A-Za-z0-9][A-Za-z0-9._-]*", requirement)
        assert match is not None, requirement
        names.add(match.group().lower().replace("_", "-"))
    return names


def test_declared_runtime_dependencies_are_exactly_the_imported_ones() -> None:
    imported = third_party(imported_top_level_modules(PACKAGE))
    assert declared_runtime_dependencies() == imported


def test_an_optional_module_imports_only_the_runtime_ones_and_its_extra() -> None:
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    for module, (extra, provided) in OPTIONAL_MODULES.items():
        assert extra in project["optional-dependencies"]
        imported = third_party(imported_top_level_modules(PACKAGE, only=module))
        assert imported <= declared_runtime_dependencies() | provided
        assert provided & imported


def test_the_import_scan_sees_nested_and_type_checking_imports(tmp_path: Path) -> None:
    """The scan cannot pass by missing imports: a lazy and a TYPE_CHECKING import count."""
    package = tmp_path / "pkg"
    package.mkdir()
    (package / "m.py").write_text(
        "from __future__ import annotations\n"
        "import os\n"
        "from typing import TYPE_CHECKING\n"
        "from . import sibling\n"
        "if TYPE_CHECKING:\n    from tabulate import tabulate\n"
        "def f():\n    import sqlite_utils.db\n",
        encoding="utf-8",
    )
    assert third_party(imported_top_level_modules(package)) == {"tabulate", "sqlite_utils"}
