"""`cassette batch`: many ledger commands through one process and one open ledger.

JSON lines in, JSON lines out, in order. Each input line is one command,
``{"command": "claim", "args": {"run_id": "r1", "worker": "w1"}}``; its arguments are the
command's CLI options without their dashes (``--run-id`` is ``run_id``), and the files of
``--payload`` and ``--receipt`` are inline objects. Each line is its own transaction and
gets one answer line: ``{"line": N, "ok": true, "result": ...}`` with what the command
prints, or ``{"line": N, "ok": false, "error": {"code": ..., "message": ...}}`` with the
code the command would refuse with. The batch goes on after a refusal; it exits 0 when
every line succeeded, 2 when a line was malformed (not a JSON object, an unknown command
or argument, a wrong type: what the CLI calls usage), else 1 when the ledger refused one,
and then writes one line on stderr, as any command does: ``error: USAGE: ...`` naming the
first malformed line, or the first refusal's code. Blank lines are skipped.

The answers are written out whenever the batch has read every line available so far (the
next read may wait for the writer) and at its end: a script that writes a line and waits
for its answer gets it at once, one that writes ahead gets its answers in chunks.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import IO, TYPE_CHECKING, Any

import click

from ..lease_limits import DEFAULT_TTL_SECONDS
from .boundary import EXIT_REFUSED, EXIT_USAGE, Refusal

if TYPE_CHECKING:
    from ..cassette import MessageCassette

# A line is one JSON document, held to the size of a payload file (payloads.py; not
# imported here, so that listing the commands, `cassette --help`, does not load it).
MAX_LINE_BYTES = 16 * 1024 * 1024

# What each argument must be in JSON; the CLI's click types check the same on its options.
_TEXT, _INT, _NUMBER, _FLAG, _OBJECT = "a string", "an integer", "a number", "a boolean", "JSON"
_KINDS: dict[str, Callable[[Any], bool]] = {
    _TEXT: lambda v: isinstance(v, str),
    _INT: lambda v: isinstance(v, int) and not isinstance(v, bool),
    _NUMBER: lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
    _FLAG: lambda v: isinstance(v, bool),
    _OBJECT: lambda v: True,  # the API refuses a non-object with the CLI's INVALID_PAYLOAD
}


class _Malformed(Exception):
    """A line the CLI would answer with a usage error: the ledger is not asked."""


def _post(cassette: MessageCassette, a: dict[str, Any]) -> Any:
    from ..payloads import require_object

    payload = require_object(a["payload"], "payload")
    message_id, job_id = cassette.post_message(
        payload, a["run_id"], a["source"], a.get("idempotency_key")
    )
    return {"message_id": message_id, "job_id": job_id}


def _claim(cassette: MessageCassette, a: dict[str, Any]) -> Any:
    return cassette.claim_step(a["run_id"], a["worker"], a.get("ttl", DEFAULT_TTL_SECONDS))


def _complete(cassette: MessageCassette, a: dict[str, Any]) -> Any:
    from ..payloads import require_object

    if "ttl" in a and not a.get("claim_next"):
        raise _Malformed("ttl is the length of the next lease: give claim_next")
    receipt = require_object(a["receipt"], "receipt")
    run_id, step, worker, token, outcome = (
        a[name] for name in ("run_id", "step", "worker", "token", "outcome")
    )
    if a.get("claim_next"):
        ttl = a.get("ttl", DEFAULT_TTL_SECONDS)
        return cassette.complete_and_claim(run_id, step, worker, token, receipt, outcome, ttl)
    receipt_id = cassette.complete_step(run_id, step, worker, token, receipt, outcome)
    return {"receipt_id": receipt_id, "step_id": step}


def _requeue(cassette: MessageCassette, a: dict[str, Any]) -> Any:
    steps = cassette.requeue(
        a["run_id"],
        a.get("step"),
        worker_id=a.get("worker"),
        fencing_token=a.get("token"),
        max_attempts=a.get("max_attempts"),
    )
    return {"run_id": a["run_id"], "steps": steps}


def _status(cassette: MessageCassette, a: dict[str, Any]) -> Any:
    return cassette.status(a["run_id"])


# command -> (its call, {argument: (kind, required)})
COMMANDS: dict[str, tuple[Callable[[MessageCassette, dict[str, Any]], Any], dict[str, Any]]] = {
    "post": (
        _post,
        {
            "payload": (_OBJECT, True),
            "run_id": (_TEXT, True),
            "source": (_TEXT, True),
            "idempotency_key": (_TEXT, False),
        },
    ),
    "claim": (_claim, {"run_id": (_TEXT, True), "worker": (_TEXT, True), "ttl": (_NUMBER, False)}),
    "complete": (
        _complete,
        {
            "run_id": (_TEXT, True),
            "step": (_INT, True),
            "worker": (_TEXT, True),
            "token": (_INT, True),
            "receipt": (_OBJECT, True),
            "outcome": (_TEXT, True),
            "claim_next": (_FLAG, False),
            "ttl": (_NUMBER, False),
        },
    ),
    "requeue": (
        _requeue,
        {
            "run_id": (_TEXT, True),
            "step": (_INT, False),
            "worker": (_TEXT, False),
            "token": (_INT, False),
            "max_attempts": (_INT, False),
        },
    ),
    "status": (_status, {"run_id": (_TEXT, True)}),
}


def _parse(raw: bytes) -> tuple[Callable[[MessageCassette, dict[str, Any]], Any], dict[str, Any]]:
    """The call and checked arguments of one line, or _Malformed saying what is wrong."""
    from ..errors import CassetteError
    from ..payloads import parse_json

    try:
        line = parse_json(raw, "the line")
    except CassetteError as exc:
        raise _Malformed(exc.message) from None
    if not isinstance(line, dict):
        raise _Malformed(f"a line is a JSON object, not {type(line).__name__}")
    unknown = sorted(set(line) - {"command", "args"})
    if unknown:
        raise _Malformed(f"unknown key {unknown[0]!r}; a line has 'command' and 'args'")
    name = line.get("command")
    if not isinstance(name, str) or name not in COMMANDS:
        shown = repr(name) if isinstance(name, str) else "missing or not a string"
        raise _Malformed(f"unknown command {shown}; one of: {', '.join(sorted(COMMANDS))}")
    call, spec = COMMANDS[name]
    args = line.get("args", {})
    if not isinstance(args, dict):
        raise _Malformed(f"args is a JSON object, not {type(args).__name__}")
    for key, value in args.items():
        if key not in spec:
            raise _Malformed(f"{name} takes no argument {key!r}; it takes: {', '.join(spec)}")
        kind = spec[key][0]
        if not _KINDS[kind](value):
            raise _Malformed(f"{name}: {key} must be {kind}")
    missing = [key for key, (_, required) in spec.items() if required and key not in args]
    if missing:
        raise _Malformed(f"{name} needs {', '.join(missing)}")
    return call, args


def _lines(stream: IO[bytes], before_waiting: Callable[[], object]) -> Iterator[bytes | None]:
    """Each line's bytes; None for a line longer than MAX_LINE_BYTES, which ends the
    input: the stream is read no further than its cap (an endless device, a huge file),
    as every JSON input of the CLI is. ``before_waiting`` runs before a read that may
    wait for the writer (``_would_wait``)."""
    would_wait = _would_wait(stream)
    while True:
        if would_wait():
            before_waiting()
        raw = stream.readline(MAX_LINE_BYTES + 1)
        if not raw:
            return
        if len(raw) > MAX_LINE_BYTES and not raw.endswith(b"\n"):
            yield None
            return
        yield raw


def _would_wait(stream: IO[bytes]) -> Callable[[], bool]:
    """A test of whether reading ``stream`` now may wait: its descriptor has nothing to
    read (no data and no end of input). It may still hold a line in its own buffer, so a
    true answer only says a wait is possible; a false one, that no read waits. A stream
    without a descriptor (in memory) never waits; where ``poll`` is missing, every read
    may."""
    try:
        fd = stream.fileno()
    except (AttributeError, OSError, ValueError):  # io.UnsupportedOperation is both
        return lambda: False
    import select

    if not hasattr(select, "poll"):
        return lambda: True
    ready = select.poll()
    ready.register(fd, select.POLLIN)
    return lambda: not ready.poll(0)


def _write(answer: dict[str, Any], out: IO[bytes]) -> None:
    import orjson

    try:
        text = orjson.dumps(answer)
    except TypeError:  # a lone surrogate: the standard encoder writes it as an escape
        import json

        text = json.dumps(answer, ensure_ascii=True, separators=(",", ":")).encode()
    out.write(text + b"\n")


def run_batch(cassette: MessageCassette, stream: IO[bytes], out: IO[bytes]) -> Refusal | None:
    """Answer every line of ``stream`` on ``out``. None when every line succeeded; else
    the batch's own answer: USAGE (exit 2) naming the first malformed line, or else the
    first refusal's code (exit 1), with how many lines failed."""
    from ..errors import CassetteError, ErrorCode

    answered = 0
    malformed: list[int] = []
    refused: list[tuple[int, str]] = []
    # The answers are flushed whenever the next read may wait, not after every line: a
    # flush is a write into the reader's pipe that wakes the reader, and cost about 35 us
    # a line, a sixth of a line's whole cost (docs/BENCHMARKS.md). A script that waits for
    # each answer before writing its next line still gets each answer at once; one that
    # writes ahead gets them in chunks, each as soon as the batch has caught up with it.
    try:
        for number, raw in enumerate(_lines(stream, out.flush), start=1):
            if raw is not None and not raw.strip():
                continue
            answered += 1
            try:
                if raw is None:
                    raise CassetteError(
                        ErrorCode.PAYLOAD_TOO_LARGE,
                        f"the line is longer than {MAX_LINE_BYTES} bytes:"
                        " the input is read no further",
                    )
                call, args = _parse(raw)
                result = call(cassette, args)
            except _Malformed as exc:
                error = {"code": ErrorCode.USAGE.value, "message": str(exc)}
                malformed.append(number)
            except CassetteError as exc:
                error = {"code": exc.code.value, "message": exc.message}
                refused.append((number, exc.code.value))
            else:
                _write({"line": number, "ok": True, "result": result}, out)
                continue
            _write({"line": number, "ok": False, "error": error}, out)
    finally:  # what was answered reaches the reader, whatever ends the batch
        out.flush()
    counts = f"{len(malformed)} malformed and {len(refused)} refused of {answered} lines"
    if malformed:  # usage outranks a refusal, as for a single command
        message = f"{counts} (the first malformed: line {malformed[0]})"
        return Refusal(ErrorCode.USAGE.value, message, EXIT_USAGE)
    if refused:
        line, code = refused[0]
        return Refusal(code, f"{counts} (the first refused: line {line})", EXIT_REFUSED)
    return None


@click.command()
@click.option(
    "--input",
    "input_file",
    type=click.File("rb"),
    default="-",
    show_default=True,
    help="JSON lines file, or - for stdin.",
)
@click.pass_context
def batch(ctx: click.Context, input_file: IO[bytes]) -> None:
    """Run post, claim, complete, requeue and status lines (JSON, one per line) with
    one open ledger; answer each on one JSON line. Exit 0 all ok, 1 a line refused,
    2 a line malformed. Lines: {"command": "claim", "args": {"run_id": "r1",
    "worker": "w1"}}; args are the command's options (run_id for --run-id), with
    payload and receipt as inline objects."""
    from .commands import _open

    cassette = _open(ctx)
    failed = run_batch(cassette, input_file, sys.stdout.buffer)
    if failed is not None:
        raise failed  # its one line on stderr, and the batch's exit status


def register(group: click.Group) -> None:
    """Add this module's commands to ``group``."""
    group.add_command(batch)
