"""cassette commands: parse -> call the API -> print JSON. Nothing is decided here."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any

import click
from click.core import ParameterSource

from ..lease_limits import DEFAULT_TTL_SECONDS
from .boundary import EXIT_CANNOT_VERIFY, CassetteGroup, emit, emit_plain
from .params import (
    INPUT_LEDGER,
    KEY_DIRECTORY,
    OUTPUT_FILE,
    OUTPUT_LEDGER,
    PRIVATE_KEY,
    PUBLIC_KEY,
    SEAL_DIRECTORY,
    SEAL_FILE_OR_DIR,
)

if TYPE_CHECKING:
    from ..cassette import MessageCassette
    from ..seals import AutoSeal
    from ..worker_keys import WorkerKey


def _open(
    ctx: click.Context, worker_key: WorkerKey | None = None, *, read_only: bool = False
) -> MessageCassette:
    """The ledger for this command; ``read_only`` never creates, migrates or writes it."""
    from ..cassette import MessageCassette

    settings = ctx.find_object(Settings)
    assert settings is not None
    cassette = MessageCassette(
        settings.db,
        durability=settings.durability,
        auto_seal=settings.auto_seal(),
        worker_key=worker_key,
        read_only=read_only,
        # a command compiles the TEMP triggers of the tables it writes, not all 15
        lazy_temp_triggers=True,
    )
    ctx.call_on_close(cassette.close)
    return cassette


class Settings:
    def __init__(
        self,
        db: str,
        durability: str | None,
        seal_dir: str | None = None,
        seal_key: str | None = None,
        seal_every: int = 10_000,
        artifact_dir: str | None = None,
    ) -> None:
        self.db = db
        self.artifact_dir = artifact_dir
        self.durability = durability
        self.seal_dir = seal_dir
        self.seal_key = seal_key
        self.seal_every = seal_every

    def auto_seal(self) -> AutoSeal | None:
        if self.seal_dir is None or self.seal_key is None:
            return None
        from ..seals import AutoSeal

        return AutoSeal(self.seal_key, self.seal_dir, every=self.seal_every)


def _shown(target: str) -> str:
    """A ledger target as output shows it: a URL without its password."""
    from ..redaction import shown

    return shown(target)


def _worker_key(path: str | None, worker: str | None) -> WorkerKey | None:
    """The worker key of --worker-key, signing as ``worker``; None without the option."""
    if path is None:
        return None  # (post and requeue refuse a --signer without a key: _signer_needs_key)
    if worker is None:
        raise click.UsageError("--worker-key needs the worker it signs as (--worker or --signer)")
    from ..worker_keys import WorkerKey

    return WorkerKey.load(worker, path)


def _signer_needs_key(signer: str | None, path: str | None) -> None:
    if signer is not None and path is None:
        raise click.UsageError("--signer names who signs with --worker-key; give both")


_WORKER_KEY_HELP = "Sign this act with the worker's Ed25519 private key (from keygen)."


def _read_object(stream: IO[bytes], what: str) -> dict[str, Any]:
    from ..payloads import MAX_PAYLOAD_BYTES, parse_object

    return parse_object(stream.read(MAX_PAYLOAD_BYTES + 1), what)


@click.group(cls=CassetteGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--db",
    envvar="CASSETTE_DB",
    default="cassette.db",
    show_default=True,
    help="Ledger file (env CASSETTE_DB). Created by writing commands; read commands"
    " need it to exist.",
)
@click.option(
    "--durability",
    envvar="CASSETTE_DURABILITY",
    type=click.Choice(["full", "normal"], case_sensitive=False),
    default=None,
    help="full (default): survives power loss. normal: survives crashes (env CASSETTE_DURABILITY).",
)
@click.option(
    "--seal-dir",
    envvar="CASSETTE_SEAL_DIR",
    type=SEAL_DIRECTORY,
    default=None,
    help="Seal automatically into this directory (env CASSETTE_SEAL_DIR); needs --seal-key.",
)
@click.option(
    "--seal-key",
    envvar="CASSETTE_SEAL_KEY",
    type=PRIVATE_KEY,
    default=None,
    help="Private key for automatic seals (env CASSETTE_SEAL_KEY).",
)
@click.option(
    "--seal-every",
    envvar="CASSETTE_SEAL_EVERY",
    type=click.IntRange(min=1),
    default=10_000,
    show_default=True,
    help="Automatic seals: every N journal entries, and when a command ends.",
)
@click.option(
    "--artifact-dir",
    envvar="CASSETTE_ARTIFACT_DIR",
    default=None,
    help="Artifact files of large values (env CASSETTE_ARTIFACT_DIR). Default for a"
    " file: <db>.artifacts beside it; a postgresql:// ledger has none, so give it there.",
)
@click.version_option(package_name="catalytic-cassette")
@click.pass_context
def cli(
    ctx: click.Context,
    db: str,
    durability: str | None,
    seal_dir: str | None,
    seal_key: str | None,
    seal_every: int,
    artifact_dir: str | None,
) -> None:
    """A DB-first, tamper-evident execution ledger on SQLite.

    Results are JSON on stdout. Exit 0 success, 1 refused (one line on stderr
    holding its stable code), 2 usage (anything wrong before the ledger is asked,
    a bad path included), 3 cannot verify, 130 interrupted, 141 stdout closed.
    """
    if (seal_dir is None) != (seal_key is None):
        raise click.UsageError("automatic sealing needs both --seal-dir and --seal-key")
    ctx.obj = Settings(db, durability, seal_dir, seal_key, seal_every, artifact_dir)


@click.command()
@click.pass_context
def init(ctx: click.Context) -> None:
    """Create the ledger (or apply pending migrations) and print its version."""
    cassette = _open(ctx)
    emit(
        {
            "db": _shown(cassette.db_path),
            "created": cassette.created,
            "schema_version": cassette.schema_version,
        }
    )


@click.command()
@click.option(
    "--payload",
    "payload_file",
    type=click.File("rb"),
    default=None,
    help="Payload JSON object file, or - for stdin.  [required]",
)
# The original design's CLI reference spells it `post --json <file>`: still accepted.
@click.option("--json", "json_file", type=click.File("rb"), default=None, hidden=True)
@click.option("--run-id", required=True, help="The run this message belongs to.")
@click.option("--source", required=True, help="USER, PLANNER, SYSTEM or WORKER.")
@click.option(
    "--idempotency-key",
    default=None,
    help="Re-posting the same key and payload returns the same ids.",
)
@click.option("--worker-key", type=PRIVATE_KEY, default=None, help=_WORKER_KEY_HELP)
@click.option("--signer", default=None, help="With --worker-key: the worker that posts.")
@click.pass_context
def post(
    ctx: click.Context,
    payload_file: IO[bytes] | None,
    json_file: IO[bytes] | None,
    run_id: str,
    source: str,
    idempotency_key: str | None,
    worker_key: str | None,
    signer: str | None,
) -> None:
    """Post a message; print its message_id and first job_id."""
    if payload_file is not None and json_file is not None:
        raise click.UsageError("--json is the original spelling of --payload: give one")
    payload_file = payload_file or json_file
    if payload_file is None:
        raise click.MissingParameter(ctx=click.get_current_context(), param_hint="'--payload'")
    _signer_needs_key(signer, worker_key)
    payload = _read_object(payload_file, "payload")
    cassette = _open(ctx, _worker_key(worker_key, signer))
    message_id, job_id = cassette.post_message(payload, run_id, source, idempotency_key)
    emit({"message_id": message_id, "job_id": job_id})


@click.command()
@click.option("--run-id", required=True)
@click.option("--worker", required=True, help="The worker taking the lease.")
@click.option(
    "--ttl",
    type=float,
    default=DEFAULT_TTL_SECONDS,
    show_default=True,
    help="Lease length in seconds.",
)
@click.option("--worker-key", type=PRIVATE_KEY, default=None, help=_WORKER_KEY_HELP)
@click.pass_context
def claim(ctx: click.Context, run_id: str, worker: str, ttl: float, worker_key: str | None) -> None:
    """Lease the next pending step of a run (NO_PENDING_STEPS when none)."""
    cassette = _open(ctx, _worker_key(worker_key, worker))
    emit(cassette.claim_step(run_id, worker, ttl))


@click.command()
@click.option("--run-id", required=True)
@click.option("--step", type=int, required=True, help="step_id from the claim.")
@click.option("--worker", required=True)
@click.option("--token", type=int, required=True, help="fencing_token from the claim.")
@click.option(
    "--receipt",
    "receipt_file",
    type=click.File("rb"),
    required=True,
    help="Receipt JSON object file, or -.",
)
@click.option("--outcome", required=True, help="SUCCESS, FAILURE or ABORTED.")
@click.option(
    "--claim-next",
    is_flag=True,
    help="In the same transaction, lease the worker's next pending step of the run and"
    ' print it as "next" (null when none is pending).',
)
@click.option(
    "--ttl",
    type=float,
    default=None,
    help=f"With --claim-next: the new lease's length in seconds.  [default: {DEFAULT_TTL_SECONDS}]",
)
@click.option("--worker-key", type=PRIVATE_KEY, default=None, help=_WORKER_KEY_HELP)
@click.pass_context
def complete(
    ctx: click.Context,
    run_id: str,
    step: int,
    worker: str,
    token: int,
    receipt_file: IO[bytes],
    outcome: str,
    claim_next: bool,
    ttl: float | None,
    worker_key: str | None,
) -> None:
    """Complete a leased step with its one receipt; print the receipt_id. With
    --claim-next, also lease the next step (one transaction) and print it as "next"."""
    if ttl is not None and not claim_next:
        raise click.UsageError("--ttl is the length of the next lease: give --claim-next")
    receipt = _read_object(receipt_file, "receipt")
    cassette = _open(ctx, _worker_key(worker_key, worker))
    if claim_next:
        emit(
            cassette.complete_and_claim(
                run_id,
                step,
                worker,
                token,
                receipt,
                outcome,
                DEFAULT_TTL_SECONDS if ttl is None else ttl,
            )
        )
        return
    receipt_id = cassette.complete_step(run_id, step, worker, token, receipt, outcome)
    emit({"receipt_id": receipt_id, "step_id": step})


@click.command()
@click.option("--run-id", required=True)
@click.option("--step", type=int, default=None, help="Only this step.")
@click.option(
    "--worker", default=None, help="Release as this lease holder (needs --step and --token)."
)
@click.option("--token", type=int, default=None, help="The holder's fencing_token, for a release.")
@click.option(
    "--max-attempts",
    type=click.IntRange(min=1),
    default=None,
    help="Close a step with an ABORTED receipt after this many claims.",
)
@click.option("--worker-key", type=PRIVATE_KEY, default=None, help=_WORKER_KEY_HELP)
@click.option(
    "--signer", default=None, help="With --worker-key: the worker requeueing (default --worker)."
)
@click.pass_context
def requeue(
    ctx: click.Context,
    run_id: str,
    step: int | None,
    worker: str | None,
    token: int | None,
    max_attempts: int | None,
    worker_key: str | None,
    signer: str | None,
) -> None:
    """Return expired leases (or a released step) to PENDING."""
    _signer_needs_key(signer, worker_key)
    result = _open(ctx, _worker_key(worker_key, signer or worker)).requeue(
        run_id, step, worker_id=worker, fencing_token=token, max_attempts=max_attempts
    )
    emit({"run_id": run_id, "steps": result})


@click.command()
@click.option("--run-id", required=True)
@click.pass_context
def status(ctx: click.Context, run_id: str) -> None:
    """Counts of steps by state, receipts by outcome, expired leases."""
    emit_plain(_open(ctx, read_only=True).status(run_id))  # (counts and the run's name)


@click.command()
@click.option(
    "--run-id", default=None, help="Limit the row checks to one run (the chain is always whole)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@click.option(
    "--against",
    type=SEAL_FILE_OR_DIR,
    default=None,
    help="A seal file, or a directory of *.seal files, kept outside the ledger.",
)
@click.option(
    "--public-key",
    type=PUBLIC_KEY,
    default=None,
    help="The ledger's Ed25519 public key (PEM), which signed the seals; with --against.",
)
@click.option("--origin", default=None, help="With --against: the origin the seals must name.")
@click.option(
    "--action-key",
    type=PUBLIC_KEY,
    default=None,
    help="Check every action's signature against this public key (cassette keygen's .pub).",
)
@click.option(
    "--worker-keys",
    type=KEY_DIRECTORY,
    default=None,
    help="A directory of <worker_id>.pub keys: check every worker attestation against them.",
)
@click.option(
    "--session", default=None, help="Verify only this session's actions (see LAW.md 10a)."
)
@click.option(
    "--quick",
    is_flag=True,
    help="Only the header, the schema and the hash chain (LAW.md, verify levels).",
)
@click.option(
    "--max-time-jump",
    type=click.IntRange(min=1),
    default=None,
    help="Report dated entries further apart than this many ms (default: one day).",
)
@click.pass_context
def verify(
    ctx: click.Context,
    run_id: str | None,
    as_json: bool,
    against: str | None,
    public_key: str | None,
    origin: str | None,
    action_key: str | None,
    worker_keys: str | None,
    session: str | None,
    quick: bool,
    max_time_jump: int | None,
) -> None:
    """Check the whole ledger. Exit 0 intact, 1 tampered or inconsistent, 3 cannot verify.

    Findings print one per line (kind, seq, table[key], detail); PASS or FAIL goes
    to stderr. A progress bar shows on a terminal for long journals. With --against,
    the ledger is also checked against every seal (--public-key and --origin pin who
    signed them and which ledger they name; neither is ever taken from the ledger).
    """
    from pathlib import Path

    from ..terminal import printable
    from ..verify import Level, verify_path

    settings = ctx.find_object(Settings)
    assert settings is not None
    if against is not None and (public_key is None or origin is None):
        raise click.UsageError("--against needs --public-key and --origin to pin the seals")
    if session is not None:
        from .verify_session import verify_session

        verify_session(
            ctx,
            settings.db,
            session,
            as_json=as_json,
            against=against,
            seal_key_path=public_key,
            origin=origin,
            action_key_path=action_key,
        )
        return
    if against is None and (public_key is not None or origin is not None):
        # One meaning per option: --public-key is the seals' signer, as for verify-proof
        # and restore; an action signer is --action-key.
        raise click.UsageError(
            "--public-key and --origin pin the seals of --against; check action"
            " signatures with --action-key"
        )
    from ..signing import load_public

    seal_key = load_public(public_key) if public_key is not None else None
    key = load_public(action_key) if action_key is not None else None
    anchors = None
    if against is not None:
        from ..anchor import load_anchors

        anchors = load_anchors(against)
    pinned = None
    if worker_keys is not None:
        from ..worker_keys import load_pinned_keys

        pinned = load_pinned_keys(worker_keys)
    # Without --max-time-jump, VerifyOptions keeps its own default (one day).
    bound = {} if max_time_jump is None else {"max_time_jump_ms": max_time_jump}
    # Without --artifact-dir, a file's artifacts are looked for beside it (verify_path).
    artifacts = (
        {} if settings.artifact_dir is None else {"artifact_root": Path(settings.artifact_dir)}
    )
    with _progress(settings.db) as progress:
        report = verify_path(
            settings.db,
            run_id=run_id,
            public_key=key,
            progress=progress,
            anchors=anchors,
            seal_key=seal_key,
            origin=origin,
            worker_keys=pinned,
            level=Level.QUICK if quick else Level.FULL,
            **bound,
            **artifacts,
        )
    if as_json:
        emit(report.to_dict())
    else:
        for finding in report.findings:
            where = f" seq={finding.seq}" if finding.seq is not None else ""
            row = f" {finding.table}[{finding.key}]" if finding.table else ""
            line = f"{finding.severity}: {finding.kind}{where}{row}: {finding.detail}"
            click.echo(printable(line))
        for anchor in report.anchors:
            line = f"anchor: {anchor['status']} size={anchor['size']} {anchor['path']}"
            click.echo(printable(line))
            if "evidence" in anchor:
                import orjson

                click.echo("evidence: " + orjson.dumps(anchor["evidence"]).decode("utf-8"))
        for note in report.notes:
            click.echo(printable(f"note: {note}"))
    if not report.ok:
        click.echo(f"FAIL: {len(report.errors)} issue(s) found", err=True)
        ctx.exit(1)
    if report.unverifiable:
        click.echo(
            "CANNOT VERIFY: something asked for could not be checked (see findings)", err=True
        )
        ctx.exit(EXIT_CANNOT_VERIFY)
    click.echo(f"PASS: All invariants verified ({report.journal_rows} journal entries)", err=True)


@contextmanager
def _progress(db: str) -> Iterator[Callable[[int], None] | None]:
    """A progress bar on stderr when it is a terminal and the journal is long."""
    from ..backends import journal_length_unopened
    from .output import progress_bar

    total = journal_length_unopened(db) if sys.stderr.isatty() else 0
    with progress_bar(total, "verifying journal") as update:
        yield update


@click.command()
@click.option("--check", is_flag=True, help="Only report pending migrations; exit 1 if any.")
@click.pass_context
def migrate(ctx: click.Context, check: bool) -> None:
    """Apply pending schema migrations in one transaction (a failure changes nothing)."""
    from ..backends import pending_migrations

    settings = ctx.find_object(Settings)
    assert settings is not None
    pending, latest = pending_migrations(settings.db)
    if check:
        emit({"db": _shown(settings.db), "latest": latest, "pending": pending})
        if pending:
            click.echo(f"pending: {len(pending)} migration(s)", err=True)
            ctx.exit(1)
        return
    cassette = _open(ctx)
    emit({"db": _shown(settings.db), "applied": pending, "schema_version": cassette.schema_version})


@click.command()
@click.option(
    "--db",
    "demo_db",
    type=OUTPUT_FILE,
    default=None,
    help="Write the demo ledger to this new file (as `cassette --db PATH demo`) and keep it;"
    " default: a temporary ledger, removed afterwards.",
)
@click.option("--keep", is_flag=True, help="Keep the temporary ledger and print where it is.")
@click.option("--workers", default=3, show_default=True, type=click.IntRange(1, 8))
@click.pass_context
def demo(ctx: click.Context, demo_db: str | None, keep: bool, workers: int) -> None:
    """Run the main job end to end on a fresh ledger and tell what happened."""
    from ..demo import run_demo

    settings = ctx.find_object(Settings)
    root = ctx.parent
    named = root is not None and root.get_parameter_source("db") is not ParameterSource.DEFAULT
    if named and settings is not None:  # `cassette --db PATH demo` (or CASSETTE_DB)
        from ..targets import names_file

        if not names_file(settings.db):
            raise click.UsageError("the demo writes a SQLite file: give --db a file name")
        if demo_db is not None and demo_db != settings.db:
            raise click.UsageError(f"two ledgers named: --db {settings.db} and demo --db {demo_db}")
        demo_db = OUTPUT_FILE.convert(settings.db, None, ctx)
    if demo_db is not None and os.path.lexists(demo_db):
        raise click.UsageError(f"{demo_db} exists; the demo writes a new ledger")
    ok = run_demo(demo_db, workers=workers, echo=click.echo, keep=keep)
    if not ok:
        ctx.exit(1)


@click.command("copy")
@click.argument("source", type=INPUT_LEDGER)
@click.argument("dest", type=OUTPUT_LEDGER)
@click.pass_context
def copy_command(ctx: click.Context, source: str, dest: str) -> None:
    """Copy ledger SOURCE into DEST (files or postgresql:// URLs, either way) with its
    journal byte for byte, every row passing DEST's rules; DEST is new, empty, or an
    earlier copy (only the rest is copied). A refusal changes nothing."""
    from ..copying import copy_ledger

    settings = ctx.find_object(Settings)
    emit(copy_ledger(source, dest, durability=settings.durability if settings else None))


def register(group: click.Group) -> None:
    """Add this module's commands to ``group``."""
    for command in (
        init,
        post,
        claim,
        complete,
        requeue,
        status,
        verify,
        migrate,
        demo,
        copy_command,
    ):
        group.add_command(command)


def main() -> None:
    cli(prog_name="cassette")
