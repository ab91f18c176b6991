"""What a `cassette` process imports: each command pays for its own modules only.

Start-up is most of what a short command costs (docs/BENCHMARKS.md, "CLI start-up per
call"); these tests fail when an import at module level pulls one of the measured costs
back onto a path that does not use it. Each runs a fresh interpreter and reads its
``sys.modules`` at exit.
"""

from __future__ import annotations

import fcntl
import os
import struct
import subprocess
import sys
import termios
from importlib.util import find_spec
from pathlib import Path
from typing import Any

import click
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalytic_cassette import MessageCassette
from catalytic_cassette.cli import COMMAND_MODULES, SHORT_HELP

# Never needed to import the CLI or to run its hot commands: third-party packages of
# other commands or extras, the package's sealing, verifying and signing, and the
# standard modules that measured at a millisecond or more of start-up.
HEAVY = (
    "cryptography",
    "psycopg",
    "psycopg_pool",
    "mcp",
    "hypothesis",
    "catalytic_cassette.verify",
    "catalytic_cassette.seals",
    "catalytic_cassette.merkle",
    "catalytic_cassette.proofs",
    "catalytic_cassette.signing",
    "catalytic_cassette.worker_keys",
    "catalytic_cassette.render",
    "catalytic_cassette.chain",
    "catalytic_cassette.cli.output",
    "pathlib",
    "secrets",
    "csv",
    "urllib",
)
OTHER_COMMAND_MODULES = tuple(
    f"catalytic_cassette.cli.{module}" for module in set(COMMAND_MODULES.values()) - {"commands"}
)
# Importing the CLI builds the group only: not even the ledger's modules.
DENIED_AT_IMPORT = (
    *HEAVY,
    *OTHER_COMMAND_MODULES,
    "catalytic_cassette.cassette",
    "catalytic_cassette.connection",
    "catalytic_cassette.errors",
    "orjson",
    "json",
    "hashlib",
)
# hashlib loads OpenSSL (about 3 ms): the journal hashes with the interpreter's builtin
# SHA-256 when it has one (hashing.py).
BUILTIN_SHA256 = find_spec("_sha2") is not None or find_spec("_sha256") is not None
OPENSSL_HASHES = ("hashlib", "_hashlib") if BUILTIN_SHA256 else ()
DENIED_ON_HOT_PATHS = (*HEAVY, *OTHER_COMMAND_MODULES, *OPENSSL_HASHES)

# Written at exit, after the command (and without json: the report imports nothing).
_REPORT = """
import atexit, sys
report = sys.argv.pop(1)
atexit.register(lambda: open(report, "w").write("\\n".join(sorted(sys.modules))))
{body}
"""


def imported(tmp_path: Path, body: str, *args: str) -> set[str]:
    """The modules loaded by a fresh interpreter running ``body`` with ``args``."""
    report = tmp_path / "modules.json"
    script = _REPORT.format(body=body)
    subprocess.run(
        [sys.executable, "-c", script, str(report), *args],
        capture_output=True,
        check=False,
        timeout=60,
    )
    return set(report.read_text().split("\n"))


def denied(loaded: set[str], deny: tuple[str, ...]) -> list[str]:
    """Loaded modules that are, or are inside, a denied one."""
    return sorted(m for m in loaded for d in deny if m == d or m.startswith(d + "."))


def test_the_check_sees_a_denied_import(tmp_path: Path) -> None:
    loaded = imported(tmp_path, "import catalytic_cassette.cli, csv, catalytic_cassette.seals")
    assert {"csv", "catalytic_cassette.seals", "catalytic_cassette.cli.commands"} <= loaded
    assert "csv" in denied(loaded, DENIED_AT_IMPORT)


def test_importing_the_cli_loads_no_denied_module(tmp_path: Path) -> None:
    loaded = imported(tmp_path, "import catalytic_cassette.cli")
    assert "catalytic_cassette.cli.commands" in loaded
    assert denied(loaded, DENIED_AT_IMPORT) == []


@pytest.fixture
def ledger(tmp_path: Path) -> dict[str, Any]:
    db = tmp_path / "ledger.db"
    with MessageCassette(db) as cassette:
        cassette.post_message({"jobs": [{"intent": "i", "steps": [{}, {}]}]}, "r1", "USER")
        lease = cassette.claim_step("r1", "w1")
    payload = tmp_path / "payload.json"
    payload.write_text('{"task": "x"}')
    return {"db": str(db), "payload": str(payload), "lease": lease}


def _hot_command(name: str, ledger: dict[str, Any]) -> list[str]:
    lease = ledger["lease"]
    return {
        "--help": ["--help"],
        "status": ["status", "--run-id", "r1"],
        "post": ["post", "--run-id", "r1", "--source", "USER", "--payload", ledger["payload"]],
        "claim": ["claim", "--run-id", "r1", "--worker", "w1"],
        "complete": [
            *("complete", "--run-id", "r1", "--worker", "w1", "--outcome", "SUCCESS"),
            *("--step", str(lease["step_id"]), "--token", str(lease["fencing_token"])),
            *("--receipt", ledger["payload"]),
        ],
    }[name]


@pytest.mark.parametrize("name", ["status", "post", "claim", "complete"])
def test_a_hot_command_loads_no_denied_module(
    tmp_path: Path, ledger: dict[str, Any], name: str
) -> None:
    body = "from catalytic_cassette.cli import main\nmain()"
    args = ["cassette", "--db", ledger["db"], *_hot_command(name, ledger)]
    loaded = imported(tmp_path, f"sys.argv[1:] = {args[1:]!r}\n{body}", *args)
    assert "catalytic_cassette.cassette" in loaded  # it ran
    # status prints counts through the standard encoder (emit_plain): no orjson at all.
    deny = (*DENIED_ON_HOT_PATHS, *(("orjson", "dataclasses") if name == "status" else ()))
    assert denied(loaded, deny) == []
    with MessageCassette(ledger["db"], read_only=True) as cassette:  # and it did its work
        assert cassette.status("r1")["messages"] == (2 if name == "post" else 1)


# click's formatter finds the terminal's width through shutil (2.2 ms with the modules it
# imports); the root context carries the width worked out without it (boundary.help_width).
DENIED_FOR_HELP = (*DENIED_AT_IMPORT, "shutil", "fnmatch", "bz2", "lzma")


def test_the_help_listing_loads_no_command_module(tmp_path: Path) -> None:
    body = "from catalytic_cassette.cli import main\nsys.argv[1:] = ['--help']\nmain()"
    loaded = imported(tmp_path, body)
    assert "click._textwrap" in loaded  # it ran: the help was written
    assert denied(loaded, DENIED_FOR_HELP) == []


@pytest.mark.parametrize("columns", [None, "", "0", "-5", "wide", "30", "52", "80", "81", "300"])
@pytest.mark.parametrize("max_width", [None, 60, 120])
def test_the_help_width_is_click_s_own(
    monkeypatch: pytest.MonkeyPatch, columns: str | None, max_width: int | None
) -> None:
    """What click's formatter works out through shutil, for COLUMNS set or not and a
    stdout that is no terminal (the tests') or a terminal of several sizes."""
    from catalytic_cassette.cli.boundary import help_width

    if columns is None:
        monkeypatch.delenv("COLUMNS", raising=False)
    else:
        monkeypatch.setenv("COLUMNS", columns)
    assert help_width(max_width) == click.HelpFormatter(max_width=max_width).width
    leader, follower = os.openpty()
    try:
        with os.fdopen(follower, "w", closefd=False) as terminal:
            monkeypatch.setattr(sys, "__stdout__", terminal)
            for size in (20, 70, 100, 0):
                fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, size, 0, 0))
                expected = click.HelpFormatter(max_width=max_width).width
                assert help_width(max_width) == expected, size
    finally:
        os.close(leader)
        os.close(follower)
    monkeypatch.setattr(click.formatting, "FORCED_WIDTH", 66)
    assert help_width(max_width) is None  # click's own rule then: the forced width


def test_a_command_s_help_loads_its_module(tmp_path: Path) -> None:
    body = "from catalytic_cassette.cli import main\nsys.argv[1:] = ['tail', '--help']\nmain()"
    loaded = imported(tmp_path, body)
    assert "catalytic_cassette.cli.live_commands" in loaded
    assert "catalytic_cassette.cli.batch" not in loaded


def _every_command() -> dict[str, click.Command]:
    from importlib import import_module

    group = click.Group()
    for module_name in set(COMMAND_MODULES.values()):
        import_module(f"catalytic_cassette.cli.{module_name}").register(group)
    return group.commands


@pytest.mark.parametrize("limit", [12, 25, 40, 47, 60, 74, 100, 10_000])
def test_the_table_s_short_help_is_each_command_s_own(limit: int) -> None:
    """The listing shows a stand-in's text for a command not imported: at any width it
    must read as the command's own would."""
    assert SHORT_HELP.keys() == COMMAND_MODULES.keys()
    for name, command in _every_command().items():
        stand_in = click.Command(name, help=SHORT_HELP[name])
        assert stand_in.get_short_help_str(limit) == command.get_short_help_str(limit), name


@pytest.mark.parametrize("width", [40, 80, 200])
def test_the_listing_is_the_same_with_every_command_imported(width: int) -> None:
    from catalytic_cassette.cli.boundary import CassetteGroup
    from catalytic_cassette.cli.lazy import LazyCommands

    def listing(short_help: dict[str, str], load: bool = False) -> str:
        group = CassetteGroup()  # a fresh group: none of its commands built yet
        group.commands = LazyCommands(group, COMMAND_MODULES, "catalytic_cassette.cli", short_help)
        if load:
            assert all(group.commands[name].name == name for name in COMMAND_MODULES)
        formatter = click.HelpFormatter(width=width)
        group.format_commands(click.Context(group), formatter)
        return formatter.getvalue()

    lazy = listing(SHORT_HELP)
    assert "Commands:" in lazy and lazy == listing(SHORT_HELP, load=True)
    # (the lazy listing shows the table's texts: a wrong one would show)
    assert listing({**SHORT_HELP, "tail": "Wrong."}) != lazy


def test_each_command_is_listed_with_the_module_that_registers_it() -> None:
    """The lazy group finds a command through COMMAND_MODULES: a command missing there
    would be unknown until its module happened to be imported."""
    from importlib import import_module

    assert _every_command().keys() == COMMAND_MODULES.keys()
    for module_name in set(COMMAND_MODULES.values()):
        group = click.Group()
        import_module(f"catalytic_cassette.cli.{module_name}").register(group)
        listed = {name for name, module in COMMAND_MODULES.items() if module == module_name}
        assert set(group.commands) == listed, module_name


def test_a_command_s_module_is_imported_when_the_command_is_named(tmp_path: Path) -> None:
    body = (
        "from catalytic_cassette.cli import cli\n"
        "before = 'catalytic_cassette.cli.live_commands' in sys.modules\n"
        "assert 'tail' in cli.commands and not before\n"
        "assert cli.commands['tail'].name == 'tail'\n"
        "assert 'catalytic_cassette.cli.anchor_commands' in sys.modules  # (live uses it)\n"
        "assert 'catalytic_cassette.cli.batch' not in sys.modules\n"
        "print('checked')\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", _REPORT.format(body=body), str(tmp_path / "m.json")],
        capture_output=True,
        text=True,
        check=False,
        timeout=60,
    )
    assert done.stdout == "checked\n", done.stderr


# The values emit_plain is for: text (never a lone surrogate: every name is checked as
# UTF-8 first), 64-bit integers, booleans, null, and arrays and objects of them.
_PLAIN = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**63), 2**63 - 1) | st.text(),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(), inner, max_size=4),
    max_leaves=20,
)


@settings(max_examples=300, deadline=None)
@given(_PLAIN)
def test_the_standard_encoder_writes_orjson_s_bytes_for_plain_values(value: Any) -> None:
    import io
    from contextlib import redirect_stdout

    from catalytic_cassette.cli.boundary import emit, emit_plain

    written = []
    for write in (emit, emit_plain):
        with redirect_stdout(io.StringIO()) as out:
            write(value)
        written.append(out.getvalue())
    assert written[0] == written[1]


def test_a_float_is_not_a_plain_value() -> None:
    """Why emit_plain is kept to plain values: the two encoders write some floats apart."""
    import json

    import orjson

    assert json.dumps(1e-7) != orjson.dumps(1e-7).decode()  # "1e-07", "1e-7"
