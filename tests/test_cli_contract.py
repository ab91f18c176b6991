"""The exit contract (README, "Exit status"), command by command and mistake by mistake.

Every command of the click group has a row here (a new command without one fails), and
every class of mistake runs through every command it applies to: a missing file, a
directory where a file belongs, a FIFO, /dev/zero, a link or an oversized file for each
path on the command line, a value outside its set, a bad number or time, conflicting
flags, a reader that closed stdout (a real pipe), and SIGINT (a real process); the JSON
inputs, streams by design, are read to their cap. Each answers with its documented
status and exactly one ``error: CODE: ...`` line, no traceback, no hang.

These mistakes are all caught before a ledger is opened, so one backend shows them; the
ledger's own answers are tested on both in test_cli.py and test_cli_edges.py.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import click
import pytest
from click.testing import CliRunner, Result

from catalytic_cassette.chain import CausalChain
from catalytic_cassette.cli import cli
from catalytic_cassette.cli.output import FORMAT_FLAGS
from catalytic_cassette.cli.params import InputDirectory, InputFile, OutputPath

from .conftest import action_dict, file_digest
from .test_files_untrusted import promptly

CODE_LINE = re.compile(r"^error: ([A-Z][A-Z_]+): \S.*$")
TIMEOUT = 60  # seconds for a real process: far above an answer, far below a hang


@dataclass(frozen=True)
class Row:
    """How to run one command: ``base`` parses and runs it; the rest are its mistakes.

    ``conflicts``: argument lists whose options exclude each other (empty: the reason
    in ``no_conflict``). ``pipe``: whether a successful run writes stdout (so a closed
    reader makes it exit 141); ``sigint``: it runs until stopped, and is interrupted in a
    real process.
    """

    base: tuple[str, ...]
    stdin: bytes | None = None
    conflicts: tuple[tuple[str, ...], ...] = ()
    no_conflict: str = ""
    pipe: bool = True
    sigint: tuple[str, ...] | None = None
    extra: dict[str, Any] = field(default_factory=dict)


NONE = "no two of its options exclude each other"
OUT = ("--nl", "--csv"), ("--nl", "-t"), ("--csv", "--table")
RECEIPT = ("--receipt", "-", "--outcome", "SUCCESS")
ACTION = json.dumps(action_dict("InternalStep", "note")).encode()

ROWS: dict[tuple[str, ...], Row] = {
    ("action", "append"): Row(("--actions", "-"), stdin=ACTION, conflicts=OUT),
    ("action", "show"): Row(("{action}",), no_conflict=NONE),
    ("actions",): Row((), conflicts=OUT),
    ("batch",): Row(
        ("--input", "-"),
        stdin=b'{"command": "status", "args": {"run_id": "r"}}\n',
        no_conflict=NONE,
        sigint=("--input", "-"),  # waits for stdin
    ),
    ("backup",): Row(("{tmp}/new-backup.db", "--key", "{key}"), no_conflict=NONE),
    ("chain",): Row(("{action}",), no_conflict=NONE),
    ("checkpoint", "latest"): Row(("--plan", "p"), no_conflict=NONE),
    ("checkpoint", "save"): Row(("--plan", "p", "--context", "-"), stdin=b"{}", no_conflict=NONE),
    ("checkpoint", "show"): Row(("{checkpoint}",), no_conflict=NONE),
    ("children",): Row(("{action}",), conflicts=OUT),
    ("claim",): Row(("--run-id", "r", "--worker", "w"), no_conflict=NONE),
    ("complete",): Row(
        ("--run-id", "c", "--step", "2", "--worker", "w", "--token", "1", *RECEIPT),
        stdin=b"{}",
        conflicts=(("--ttl", "5"),),  # a next lease's length without --claim-next
    ),
    ("copy",): Row(("{db}", "{tmp}/new-copy.db"), no_conflict=NONE),
    ("demo",): Row((), conflicts=(("--db", "{db}"),)),  # an existing file: never written
    ("export",): Row(("--plan", "p"), conflicts=(("--session", "s"),)),
    ("init",): Row((), no_conflict=NONE),
    ("keygen",): Row(("--out", "{tmp}/new-key"), no_conflict=NONE),
    ("latest",): Row((), conflicts=(("--plan", "p", "--session", "s"),)),
    ("mcp",): Row(
        (),
        no_conflict=NONE,
        pipe=False,  # it writes only to answer a request: tests/test_postgres_mcp.py
    ),
    ("metrics",): Row(("--by", "plan"), no_conflict=NONE),
    ("migrate",): Row((), no_conflict=NONE),
    ("parent",): Row(("{action}",), no_conflict=NONE),
    ("plan", "show"): Row(("p",), no_conflict=NONE),
    ("plan", "status"): Row(("p",), no_conflict=NONE),
    ("post",): Row(
        ("--payload", "-", "--run-id", "r", "--source", "USER"),
        stdin=b"{}",
        conflicts=(("--json", "-"), ("--signer", "w")),
        sigint=("--payload", "-", "--run-id", "r", "--source", "USER"),  # waits for stdin
    ),
    ("prove", "consistency"): Row(("{seal}",), no_conflict=NONE),
    ("prove", "inclusion"): Row(("0",), no_conflict=NONE),
    ("prove", "receipt"): Row(("1",), no_conflict=NONE),
    ("requeue",): Row(("--run-id", "r"), conflicts=(("--signer", "w"),)),
    ("restore",): Row(
        ("{backup}", "{tmp}/new-restored.db", "--public-key", "{pub}", "--origin", "{origin}"),
        no_conflict=NONE,
    ),
    ("resume",): Row(("--plan", "p"), no_conflict=NONE),
    ("seal",): Row(("--key", "{key}"), no_conflict=NONE),
    ("stats",): Row((), no_conflict=NONE),
    ("status",): Row(("--run-id", "r"), no_conflict=NONE),
    ("suggest-causes",): Row(
        ("--plan", "p"),
        conflicts=(
            ("--session", "s"),
            ("--action", "{action}"),
            ("--scope", "session"),
            *OUT,
        ),
    ),
    ("tail",): Row(
        (),
        no_conflict=NONE,
        sigint=("--follow", "--interval", "0.05"),
    ),
    ("tree",): Row(
        ("--plan", "p"),
        conflicts=(("--json", "--format", "dot"), ("{action}",)),
    ),
    ("validate-chain",): Row(("{action}",), no_conflict=NONE),
    ("verify",): Row(
        (),
        conflicts=(("--public-key", "{pub}"), ("--against", "{seal}")),
    ),
    ("verify-bundle",): Row(
        ("{bundle}", "--public-key", "{pub}", "--origin", "{origin}"), no_conflict=NONE
    ),
    ("verify-proof",): Row(
        ("{proof}", "--public-key", "{pub}", "--origin", "{origin}"), no_conflict=NONE
    ),
    ("why",): Row(("{action}",), no_conflict=NONE),
}


def command_paths(group: click.Group, prefix: tuple[str, ...] = ()) -> list[tuple[str, ...]]:
    paths = []
    for name, command in sorted(group.commands.items()):
        if isinstance(command, click.Group):
            paths.extend(command_paths(command, (*prefix, name)))
        else:
            paths.append((*prefix, name))
    return paths


def command_of(path: tuple[str, ...]) -> click.Command:
    command: Any = cli
    for name in path:
        command = command.commands[name]
    return command  # type: ignore[no-any-return]


def answered(result: Result, code: str | None, status: int) -> str:
    """The status, one coded line on stderr (``code`` when given), no traceback."""
    assert result.exit_code == status, (result.exit_code, result.stdout, result.stderr)
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(
        result.exception
    )
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    match = CODE_LINE.match(lines[0])
    assert match is not None, lines[0]
    assert code is None or match.group(1) == code, lines[0]
    return lines[0]


@pytest.fixture(scope="module")
def world(tmp_path_factory: pytest.TempPathFactory) -> Iterator[dict[str, Any]]:
    """A ledger with an action, a message, a seal, a proof, a bundle and a backup; and
    the files an attacker plants: a FIFO, a link, an oversized (sparse) file."""
    tmp = tmp_path_factory.mktemp("contract")
    db = tmp / "ledger.db"

    def run(*args: str, stdin: bytes | None = None) -> Any:
        result = CliRunner().invoke(cli, ["--db", str(db), *args], input=stdin)
        assert result.exit_code == 0, result.stderr
        return json.loads(result.stdout) if result.stdout.strip() else None

    run("keygen", "--out", str(tmp / "k"))
    with CausalChain(db) as chain:  # a plan with its body, paused with a checkpoint
        started = {**action_dict("PlanStarted", "plan"), "metadata": {"plan_body": "1. go\n"}}
        first = chain.append_action(started)
        checkpoint = chain.pause("p", {"cursor": 1}).metadata["checkpoint_id"]
    for run_id in ("r", "c", "d"):  # r: pending; c: leased (token 1); d: receipt 1
        run("post", "--payload", "-", "--run-id", run_id, "--source", "USER", stdin=b"{}")
    run("claim", "--run-id", "c", "--worker", "w")
    done = run("claim", "--run-id", "d", "--worker", "w")
    run("complete", "--run-id", "d", "--step", str(done["step_id"]), "--worker", "w",
        "--token", str(done["fencing_token"]), *RECEIPT, stdin=b"{}")  # fmt: skip
    (tmp / "seals").mkdir()
    sealed = run("seal", "--key", str(tmp / "k.key"), "--out", str(tmp / "seals"))
    run("prove", "inclusion", "0", "--out", str(tmp / "entry.proof"))
    run("export", "--plan", "p", "--out", str(tmp / "plan.bundle"))
    run("backup", str(tmp / "backup.db"), "--key", str(tmp / "k.key"))
    os.mkfifo(tmp / "fifo")
    (tmp / "link").symlink_to(tmp / "k.pub")
    with (tmp / "huge").open("wb") as handle:  # sparse: nothing written, 3 GiB by its size
        handle.truncate(3 * 1024**3)
    (tmp / "folder").mkdir()
    yield {
        "db": db,
        "tmp": tmp,
        "key": tmp / "k.key",
        "pub": tmp / "k.pub",
        "action": first.action_id,
        "checkpoint": checkpoint,
        "seal": sealed["path"],
        "origin": sealed["origin"],
        "proof": tmp / "entry.proof",
        "bundle": tmp / "plan.bundle",
        "backup": tmp / "backup.db",
    }


def fill(args: tuple[str, ...], world: dict[str, Any]) -> list[str]:
    return [a.format(**{k: str(v) for k, v in world.items()}) for a in args]


def without(base: tuple[str, ...], names: tuple[str, ...]) -> tuple[str, ...]:
    """The base arguments less any of these options (each an option and its value)."""
    kept = list(base)
    for name in names:
        if name in kept:
            del kept[kept.index(name) : kept.index(name) + 2]
    return tuple(kept)


def invoke(world: dict[str, Any], path: tuple[str, ...], *mistake: str) -> Result:
    """The mistake first: click checks values in the order given, so it answers first;
    an option of the base arguments that the mistake gives again is left out."""
    row = ROWS[path]
    given = tuple(m for m in mistake if m.startswith("--"))
    args = [*path, *fill(mistake, world), *fill(without(row.base, given), world)]
    return CliRunner().invoke(cli, ["--db", str(world["db"]), *args], input=row.stdin)


ALL = command_paths(cli)


def test_every_command_has_a_row() -> None:
    assert set(ALL) == set(ROWS)
    for path, row in ROWS.items():  # each class either applies or says why not
        assert bool(row.conflicts) != bool(row.no_conflict), path


def _params(path: tuple[str, ...], kind: type | tuple[type, ...]) -> list[click.Parameter]:
    return [p for p in command_of(path).params if isinstance(p.type, kind)]


def _spelling(param: click.Parameter, value: str) -> tuple[str, ...]:
    """How to give ``param`` the value: an option's name, or an argument's place."""
    if isinstance(param, click.Option):
        return (param.opts[-1], value)
    return (value,)


def _with_argument(path: tuple[str, ...], param: click.Parameter, value: str) -> list[str]:
    """Base arguments with one positional replaced by ``value``."""
    arguments = [p for p in command_of(path).params if isinstance(p, click.Argument)]
    base = list(ROWS[path].base)
    positional = [i for i, a in enumerate(base) if not a.startswith("--")]
    # options in base are (name, value) pairs: positionals come before any option here
    index = positional[arguments.index(param)] if isinstance(param, click.Argument) else None
    if index is not None:
        base[index] = value
    return base


def _run_with(
    world: dict[str, Any], path: tuple[str, ...], param: click.Parameter, value: str
) -> Result:
    row = ROWS[path]
    if param.name == "new_seal":  # an optional second argument
        args = [*path, *fill(row.base, world), value]
    elif isinstance(param, click.Argument):
        args = [*path, *fill(tuple(_with_argument(path, param, value)), world)]
    else:
        same = ("--payload",) if param.name == "json_file" else ()  # its original spelling
        base = without(row.base, (*param.opts, *same))
        args = [*path, param.opts[-1], value, *fill(base, world)]
    return CliRunner().invoke(cli, ["--db", str(world["db"]), *args], input=row.stdin)


# Every path a command reads or writes by name, enumerated from the commands themselves.
READ_PATHS = [
    (path, param.name)
    for path in ALL
    for param in _params(path, (InputFile, InputDirectory, click.File))
]
WRITE_PATHS = [(path, param.name) for path in ALL for param in _params(path, OutputPath)]
ROOT_PATHS = [p.name for p in cli.params if isinstance(p.type, (InputFile, InputDirectory))]


def _param(path: tuple[str, ...], name: str | None) -> click.Parameter:
    return next(p for p in command_of(path).params if p.name == name)


@pytest.mark.parametrize(("path", "name"), READ_PATHS, ids=lambda v: str(v))
def test_a_path_that_is_not_there_is_a_usage_error(
    world: dict[str, Any], path: tuple[str, ...], name: str
) -> None:
    param = _param(path, name)
    code = "USAGE" if isinstance(param.type, click.File) else "NOT_FOUND"
    answered(_run_with(world, path, param, str(world["tmp"] / "absent")), code, 2)


@pytest.mark.parametrize(("path", "name"), READ_PATHS, ids=lambda v: str(v))
def test_the_wrong_kind_of_path_is_a_usage_error(
    world: dict[str, Any], path: tuple[str, ...], name: str
) -> None:
    """A directory where a file belongs, a file where a directory belongs."""
    param = _param(path, name)
    if isinstance(param.type, InputDirectory):
        wrong, code = str(world["pub"]), "UNSAFE_PATH"
    elif isinstance(param.type, InputFile) and param.type.dir_ok:
        wrong, code = "/dev/null", "UNSAFE_PATH"  # a file or a directory: neither
    else:
        wrong = str(world["tmp"] / "folder")
        code = "USAGE" if isinstance(param.type, click.File) else "UNSAFE_PATH"
    answered(_run_with(world, path, param, wrong), code, 2)


NAMED_FILES = [
    (path, name) for path, name in READ_PATHS if isinstance(_param(path, name).type, InputFile)
]


@pytest.mark.parametrize(("path", "name"), NAMED_FILES, ids=lambda v: str(v))
@pytest.mark.parametrize(
    ("planted", "code"),
    [
        ("fifo", "UNSAFE_PATH"),
        ("/dev/zero", "UNSAFE_PATH"),
        ("link", "UNSAFE_PATH"),
        ("huge", None),
    ],
)
def test_what_an_attacker_plants_is_refused_without_hanging(
    world: dict[str, Any], path: tuple[str, ...], name: str, planted: str, code: str | None
) -> None:
    """LAW 13: a FIFO is never opened, a device or link never read, a huge file never
    read (sparse: its size alone refuses it; a ledger has no cap, so it is not one)."""
    param = _param(path, name)
    target = planted if planted.startswith("/") else str(world["tmp"] / planted)
    fifo = world["tmp"] / "fifo"
    result = promptly(lambda: _run_with(world, path, param, target), fifos=(fifo,))
    assert isinstance(param.type, InputFile)
    if planted == "huge":
        if param.type.cap == "NO_CAP":  # a backup or a ledger: SQLite reads its pages
            assert "Traceback" not in result.stderr
            return
        code = "FILE_TOO_LARGE"
    if planted == "link" and param.type.follow_link:  # a ledger may be a link (LAW 13)
        assert "Traceback" not in result.stderr
        return
    line = answered(result, code, 2)
    assert target in line


STREAMS = [
    (path, name) for path, name in READ_PATHS if isinstance(_param(path, name).type, click.File)
]


@pytest.mark.parametrize(("path", "name"), STREAMS, ids=lambda v: str(v))
@pytest.mark.parametrize("endless", ["/dev/zero", "huge"])
def test_a_json_input_is_a_stream_read_to_its_cap(
    world: dict[str, Any], path: tuple[str, ...], name: str, endless: str
) -> None:
    """--payload and its kind read streams (a pipe, `-`), so a device or a huge file is
    read up to 16 MiB + 1 and refused as the value it is: the command's answer."""
    param = _param(path, name)
    target = endless if endless.startswith("/") else str(world["tmp"] / endless)
    result = promptly(lambda: _run_with(world, path, param, target))
    answered(result, "PAYLOAD_TOO_LARGE", 1)


@pytest.mark.parametrize(("path", "name"), WRITE_PATHS, ids=lambda v: str(v))
def test_an_output_path_in_a_missing_directory_is_a_usage_error(
    world: dict[str, Any], path: tuple[str, ...], name: str
) -> None:
    param = _param(path, name)
    answered(_run_with(world, path, param, str(world["tmp"] / "absent" / "out")), "USAGE", 2)


@pytest.mark.parametrize("name", ROOT_PATHS)
@pytest.mark.parametrize("planted", ["absent", "fifo", "link", "folder"])
def test_the_root_options_paths_are_checked_alike(
    world: dict[str, Any], name: str, planted: str
) -> None:
    param = next(p for p in cli.params if p.name == name)
    value = str(world["tmp"] / planted)
    other = {
        "seal_dir": ("--seal-key", str(world["key"])),
        "seal_key": ("--seal-dir", str(world["tmp"] / "seals")),
    }[name]
    if isinstance(param.type, InputDirectory) and planted == "folder":
        value = str(world["pub"])
    args = ["--db", str(world["db"]), param.opts[-1], value, *other, "status", "--run-id", "r"]
    result = promptly(lambda: CliRunner().invoke(cli, args), fifos=(world["tmp"] / "fifo",))
    answered(result, "NOT_FOUND" if planted == "absent" else "UNSAFE_PATH", 2)


CHOICES = [(path, p.name) for path in ALL for p in _params(path, click.Choice)]


@pytest.mark.parametrize(("path", "name"), CHOICES, ids=lambda v: str(v))
def test_a_value_outside_its_set_is_refused_with_the_valid_names(
    world: dict[str, Any], path: tuple[str, ...], name: str
) -> None:
    param = _param(path, name)
    line = answered(invoke(world, path, *_spelling(param, "Typo")), "USAGE", 2)
    choice = param.type
    assert isinstance(choice, click.Choice) and choice.choices  # (ChoiceOf: loaded on use)
    assert all(f"'{c}'" in line for c in choice.choices), line


NUMBERS = [
    (path, p.name)
    for path in ALL
    for p in command_of(path).params
    if isinstance(p.type, (click.types.IntParamType, click.types.FloatParamType))
    or type(p.type).__name__ == "TimeParam"
]


@pytest.mark.parametrize(("path", "name"), NUMBERS, ids=lambda v: str(v))
def test_a_bad_number_or_time_is_a_usage_error(
    world: dict[str, Any], path: tuple[str, ...], name: str
) -> None:
    param = _param(path, name)
    if isinstance(param, click.Argument):
        result = _run_with(world, path, param, "soon")
    else:
        result = invoke(world, path, param.opts[-1], "soon")
    answered(result, "USAGE", 2)


def test_the_enumerations_cover_what_the_contract_names() -> None:
    """The lists above are not empty by accident: each names what the contract does."""
    assert (("actions",), "action_type") in CHOICES and (("tail",), "table") in CHOICES
    assert (("suggest-causes",), "scope") in CHOICES
    assert (("actions",), "after") in NUMBERS and (("requeue",), "max_attempts") in NUMBERS
    names = {(p, n) for p, n in READ_PATHS}
    assert {(("verify-bundle",), "bundle_file"), (("export",), "seal_file")} <= names
    assert (("verify",), "worker_keys") in names and (("copy",), "source") in names
    assert set(FORMAT_FLAGS) == {"nl", "csv", "table"}


def test_range_limits_are_usage_errors(world: dict[str, Any]) -> None:
    answered(invoke(world, ("requeue",), "--max-attempts", "0"), "USAGE", 2)
    answered(invoke(world, ("actions",), "--after", "yesterday"), "USAGE", 2)
    answered(invoke(world, ("suggest-causes",), "--at", "noon"), "USAGE", 2)


CONFLICTS = [(path, c) for path in ALL for c in ROWS[path].conflicts]


@pytest.mark.parametrize(("path", "conflict"), CONFLICTS, ids=lambda v: str(v))
def test_conflicting_flags_are_a_usage_error_and_change_nothing(
    world: dict[str, Any], path: tuple[str, ...], conflict: tuple[str, ...]
) -> None:
    before = file_digest(world["db"])
    answered(invoke(world, path, *conflict), "USAGE", 2)
    assert file_digest(world["db"]) == before


def test_a_function_name_the_ledger_never_saw_is_refused_with_the_ones_it_has(
    world: dict[str, Any],
) -> None:
    """Its valid names are the ledger's own data: a ledger answer (1), never `[]`."""
    line = answered(invoke(world, ("actions",), "--function", "plann"), "NOT_FOUND", 1)
    assert "'plann'" in line and "plan" in line.split("the ledger's: ")[1].split(", ")
    known = invoke(world, ("actions",), "--function", "plan", "--plan", "elsewhere")
    assert known.exit_code == 0 and json.loads(known.stdout) == []  # known, none match
    found = invoke(world, ("actions",), "--function", "plan")
    assert [a["function_name"] for a in json.loads(found.stdout)] == ["plan"]


@pytest.mark.parametrize("mode", [0o644, 0o600])
def test_a_public_key_where_a_private_one_belongs_is_named_as_such(
    tmp_path: Path, mode: int
) -> None:
    """Not "private key ... mode 0644": the file is the wrong half of the pair."""
    assert CliRunner().invoke(cli, ["keygen", "--out", str(tmp_path / "k")]).exit_code == 0
    public = tmp_path / "k.pub"
    public.chmod(mode)
    assert CliRunner().invoke(cli, ["--db", str(tmp_path / "l.db"), "init"]).exit_code == 0
    result = CliRunner().invoke(cli, ["--db", str(tmp_path / "l.db"), "seal", "--key", str(public)])
    line = answered(result, "KEY_ERROR", 1)
    assert "is a public key; a private key is needed here" in line and "mode" not in line


def test_renamed_options_answer_with_their_new_name(world: dict[str, Any]) -> None:
    line = answered(invoke(world, ("action", "append"), "--json", "-"), "USAGE", 2)
    assert "--json was renamed --actions" in line
    line = answered(invoke(world, ("checkpoint", "save"), "--json", "-"), "USAGE", 2)
    assert "--json was renamed --context" in line


def test_post_json_is_the_original_spelling_of_payload(tmp_path: Path) -> None:
    """The original design's reference: post --json <file> --run-id --source [--idempotency-key]."""
    payload = tmp_path / "payload.json"
    payload.write_text('{"task": "t"}')
    args = ["--db", str(tmp_path / "l.db"), "post", "--json", str(payload), "--run-id", "r"]
    first = CliRunner().invoke(cli, [*args, "--source", "USER", "--idempotency-key", "k"])
    again = CliRunner().invoke(cli, [*args, "--source", "USER", "--idempotency-key", "k"])
    assert first.exit_code == 0 and json.loads(first.stdout) == json.loads(again.stdout)
    missing = CliRunner().invoke(
        cli, ["--db", str(tmp_path / "l.db"), "post", "--run-id", "r", "--source", "USER"]
    )
    assert "--payload" in answered(missing, "USAGE", 2)


# ------------------------------------------------------------------ real processes


def _cassette(*args: str) -> list[str]:
    return [sys.executable, "-m", "catalytic_cassette", *args]


def _env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if not k.startswith("CASSETTE_")}


PIPED = [path for path in ALL if ROWS[path].pipe]


@pytest.mark.parametrize("path", PIPED, ids=" ".join)
def test_a_reader_that_went_away_gives_141(world: dict[str, Any], path: tuple[str, ...]) -> None:
    """stdout is a real pipe whose reader closed before the command wrote: exit 141 and
    nothing on stderr but, at most, what a refusal would print (none here)."""
    row = ROWS[path]
    # the demo writes a new ledger where --db says (one that exists is refused)
    db = world["tmp"] / "new-demo.db" if path == ("demo",) else world["db"]
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            _cassette("--db", str(db), *path, *fill(row.base, world)),
            input=row.stdin or b"",
            stdout=write_end,
            stderr=subprocess.PIPE,
            env=_env(),
            cwd=world["tmp"],
            timeout=TIMEOUT,
            check=False,
        )
    finally:
        os.close(write_end)
        for made in world["tmp"].glob("new-*"):  # what the writing ones created: run again
            made.unlink()
    assert done.returncode == 141, done.stderr.decode()
    assert b"Traceback" not in done.stderr and b"BrokenPipe" not in done.stderr


@pytest.mark.parametrize("args", [("--help",), ("--version",), ("status", "--help")])
def test_help_and_version_into_a_closed_pipe_give_141(args: tuple[str, ...]) -> None:
    """Printed while the root parses its options, where click's own answer is exit 1."""
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        done = subprocess.run(
            _cassette(*args), stdout=write_end, stderr=subprocess.PIPE, env=_env(),
            timeout=TIMEOUT, check=False,
        )  # fmt: skip
    finally:
        os.close(write_end)
    assert done.returncode == 141 and done.stderr == b"", done.stderr


@pytest.fixture(scope="module")
def long_ledger(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Output far longer than a pipe holds (64 KiB on Linux): a reader that leaves after
    one byte is gone before the writer is done, whatever the scheduling."""
    db = tmp_path_factory.mktemp("long") / "long.db"
    with CausalChain(db) as chain:
        root = chain.append_action(action_dict("PlanStarted", "plan"))
        chain.append_actions(
            [
                {
                    **action_dict("InternalStep", f"step-{n}", root.action_id),
                    "arguments": ["x" * 1024],
                }
                for n in range(200)
            ]
        )
    return db


@pytest.mark.parametrize(
    "args",
    [("actions", "--nl"), ("tail",), ("tree", "--plan", "p", "--json"), ("stats",)],
    ids=" ".join,
)
def test_head_c1_gives_141(long_ledger: Path, args: tuple[str, ...]) -> None:
    """`cassette ... | head -c1` as a shell runs it. A document that fits the pipe whole
    is written before head leaves and exits 0, as `echo` does (`stats` here)."""
    shell = " ".join([*_cassette("--db", str(long_ledger), *args), "| head -c1 >/dev/null"])
    done = subprocess.run(
        ["bash", "-c", shell + "; exit ${PIPESTATUS[0]}"],
        env=_env(),
        capture_output=True,
        timeout=TIMEOUT,
        check=False,
    )
    assert done.returncode == (0 if args == ("stats",) else 141), done.stderr
    assert done.stderr == b""


def _interrupt_as_a_terminal_would() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)
    signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})


SIGINTED = [path for path in ALL if ROWS[path].sigint is not None]


@pytest.mark.parametrize("path", SIGINTED, ids=" ".join)
def test_sigint_to_a_long_running_command_gives_130(
    world: dict[str, Any], path: tuple[str, ...]
) -> None:
    args = ROWS[path].sigint
    assert args is not None
    proc = subprocess.Popen(
        _cassette("--db", str(world["db"]), *path, *args),
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        env=_env(),
        preexec_fn=_interrupt_as_a_terminal_would,
    )
    assert proc.stdout is not None and proc.stderr is not None and proc.stdin is not None
    try:
        if path == ("tail",):
            assert proc.stdout.readline()  # it has printed: now it polls for more
        else:
            from .test_cli_edges import _wait_until_reading_stdin

            _wait_until_reading_stdin(proc.pid)
        proc.send_signal(signal.SIGINT)
        proc.wait(timeout=TIMEOUT)
    finally:
        proc.kill()
        proc.stdin.close()
        err = proc.stderr.read().decode()
        proc.stdout.close()
        proc.stderr.close()
    assert proc.returncode == 130, err
    lines = err.splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: INTERRUPTED: "), err


def test_the_demo_refuses_a_ledger_that_exists(tmp_path: Path) -> None:
    existing = tmp_path / "mine.db"
    existing.write_bytes(b"not the demo's")
    for args in (["--db", str(existing), "demo"], ["demo", "--db", str(existing)]):
        answered(CliRunner().invoke(cli, args), "USAGE", 2)
    assert existing.read_bytes() == b"not the demo's"


@pytest.mark.parametrize("keep", [False, True])
def test_the_demo_says_where_its_temporary_ledger_is_and_whether_it_stays(
    monkeypatch: pytest.MonkeyPatch, keep: bool
) -> None:
    """Its own temporary directory only: removed unless --keep (the story itself runs in
    tests/test_cli.py)."""
    written: list[Path] = []

    def story(path: str, workers: int, echo: Any) -> bool:
        Path(path).write_bytes(b"ledger")
        written.append(Path(path))
        echo(f"Ledger: {path}")
        return True

    monkeypatch.setattr("catalytic_cassette.demo._story", story)
    result = CliRunner().invoke(cli, ["demo", *(["--keep"] if keep else [])])
    assert result.exit_code == 0, result.stderr
    (ledger,) = written
    assert ledger.exists() is keep
    assert ("kept at" if keep else "is removed") in result.stdout and str(ledger) in result.stdout
    if keep:
        shutil.rmtree(ledger.parent)
