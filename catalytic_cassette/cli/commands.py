"""cassette commands: parse -> call the API -> print JSON. Nothing is decided here."""

from __future__ import annotations

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import IO, TYPE_CHECKING, Any

import click

from .boundary import EXIT_CANNOT_VERIFY, CassetteGroup, emit

if TYPE_CHECKING:
    from ..cassette import MessageCassette
    from ..seals import AutoSeal


def _open(ctx: click.Context) -> MessageCassette:
    from ..cassette import MessageCassette

    settings = ctx.find_object(Settings)
    assert settings is not None
    cassette = MessageCassette(
        settings.db, durability=settings.durability, auto_seal=settings.auto_seal()
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
    ) -> None:
        self.db = db
        self.durability = durability
        self.seal_dir = seal_dir
        self.seal_key = seal_key
        self.seal_every = seal_every

    def auto_seal(self) -> AutoSeal | None:
        if self.seal_dir is None or self.seal_key is None:
            return None
        from ..seals import AutoSeal

        return AutoSeal(self.seal_key, self.seal_dir, every=self.seal_every)


def _read_object(stream: IO[bytes], what: str) -> dict[str, Any]:
    from ..payloads import MAX_PAYLOAD_BYTES, parse_object

    return parse_object(stream.read(MAX_PAYLOAD_BYTES + 1), what)


def _parse_int(value: str | None, code_name: str, what: str) -> int | None:
    from ..errors import CassetteError, ErrorCode

    if value is None:
        return None
    try:
        return int(value, 10)
    except ValueError:
        raise CassetteError(
            ErrorCode[code_name], f"{what} must be an integer, not {value!r}"
        ) from None


def _parse_ttl(value: str) -> float:
    from ..errors import CassetteError, ErrorCode

    try:
        return float(value)
    except ValueError:
        raise CassetteError(
            ErrorCode.INVALID_TTL, f"ttl must be a number of seconds: {value!r}"
        ) from None


@click.group(cls=CassetteGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option(
    "--db",
    envvar="CASSETTE_DB",
    default="cassette.db",
    show_default=True,
    help="Ledger file (env CASSETTE_DB). Created on first write.",
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
    default=None,
    help="Seal automatically into this directory (env CASSETTE_SEAL_DIR); needs --seal-key.",
)
@click.option(
    "--seal-key",
    envvar="CASSETTE_SEAL_KEY",
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
@click.version_option(package_name="catalytic-cassette")
@click.pass_context
def cli(
    ctx: click.Context,
    db: str,
    durability: str | None,
    seal_dir: str | None,
    seal_key: str | None,
    seal_every: int,
) -> None:
    """A DB-first, tamper-evident execution ledger on SQLite.

    Results are JSON on stdout. A refusal exits 1 with one line on stderr
    holding its stable code; usage errors exit 2.
    """
    if (seal_dir is None) != (seal_key is None):
        raise click.UsageError("automatic sealing needs both --seal-dir and --seal-key")
    ctx.obj = Settings(db, durability, seal_dir, seal_key, seal_every)


@cli.command()
@click.pass_context
def init(ctx: click.Context) -> None:
    """Create the ledger (or apply pending migrations) and print its version."""
    from ..migrate import current_version

    existed = os.path.exists(ctx.find_object(Settings).db)  # type: ignore[union-attr]
    cassette = _open(ctx)
    emit({"db": cassette.db_path, "created": not existed, "schema_version": current_version()})


@cli.command()
@click.option(
    "--json",
    "payload_file",
    type=click.File("rb"),
    required=True,
    help="Payload JSON object file, or - for stdin.",
)
@click.option("--run-id", required=True, help="The run this message belongs to.")
@click.option("--source", required=True, help="USER, PLANNER, SYSTEM or WORKER.")
@click.option(
    "--idempotency-key",
    default=None,
    help="Re-posting the same key and payload returns the same ids.",
)
@click.pass_context
def post(
    ctx: click.Context,
    payload_file: IO[bytes],
    run_id: str,
    source: str,
    idempotency_key: str | None,
) -> None:
    """Post a message; print its message_id and first job_id."""
    payload = _read_object(payload_file, "payload")
    message_id, job_id = _open(ctx).post_message(payload, run_id, source, idempotency_key)
    emit({"message_id": message_id, "job_id": job_id})


@cli.command()
@click.option("--run-id", required=True)
@click.option("--worker", required=True, help="The worker taking the lease.")
@click.option("--ttl", default="300", show_default=True, help="Lease length in seconds.")
@click.pass_context
def claim(ctx: click.Context, run_id: str, worker: str, ttl: str) -> None:
    """Lease the next pending step of a run (NO_PENDING_STEPS when none)."""
    emit(_open(ctx).claim_step(run_id, worker, _parse_ttl(ttl)))


@cli.command()
@click.option("--run-id", required=True)
@click.option("--step", required=True, help="step_id from the claim.")
@click.option("--worker", required=True)
@click.option("--token", required=True, help="fencing_token from the claim.")
@click.option(
    "--receipt",
    "receipt_file",
    type=click.File("rb"),
    required=True,
    help="Receipt JSON object file, or -.",
)
@click.option("--outcome", required=True, help="SUCCESS, FAILURE or ABORTED.")
@click.pass_context
def complete(
    ctx: click.Context,
    run_id: str,
    step: str,
    worker: str,
    token: str,
    receipt_file: IO[bytes],
    outcome: str,
) -> None:
    """Complete a leased step with its one receipt; print the receipt_id."""
    step_id = _parse_int(step, "STEP_NOT_FOUND", "step")
    fencing_token = _parse_int(token, "INVALID_TOKEN", "token")
    receipt = _read_object(receipt_file, "receipt")
    assert step_id is not None and fencing_token is not None
    receipt_id = _open(ctx).complete_step(run_id, step_id, worker, fencing_token, receipt, outcome)
    emit({"receipt_id": receipt_id, "step_id": step_id})


@cli.command()
@click.option("--run-id", required=True)
@click.option("--step", default=None, help="Only this step.")
@click.option(
    "--worker", default=None, help="Release as this lease holder (needs --step and --token)."
)
@click.option("--token", default=None, help="The holder's fencing_token, for a release.")
@click.option(
    "--max-attempts",
    default=None,
    help="Close a step with an ABORTED receipt after this many claims.",
)
@click.pass_context
def requeue(
    ctx: click.Context,
    run_id: str,
    step: str | None,
    worker: str | None,
    token: str | None,
    max_attempts: str | None,
) -> None:
    """Return expired leases (or a released step) to PENDING."""
    result = _open(ctx).requeue(
        run_id,
        _parse_int(step, "STEP_NOT_FOUND", "step"),
        worker_id=worker,
        fencing_token=_parse_int(token, "INVALID_TOKEN", "token"),
        max_attempts=_parse_int(max_attempts, "INVALID_ARGUMENT", "max-attempts"),
    )
    emit({"run_id": run_id, "steps": result})


@cli.command()
@click.option("--run-id", required=True)
@click.pass_context
def status(ctx: click.Context, run_id: str) -> None:
    """Counts of steps by state, receipts by outcome, expired leases."""
    emit(_open(ctx).status(run_id))


@cli.command()
@click.option(
    "--run-id", default=None, help="Limit the row checks to one run (the chain is always whole)."
)
@click.option("--json", "as_json", is_flag=True, help="Print the report as JSON on stdout.")
@click.option(
    "--against",
    default=None,
    help="A seal file, or a directory of *.seal files, kept outside the ledger.",
)
@click.option(
    "--public-key",
    default=None,
    help="Ed25519 public key (PEM). With --against it pins the seals' signer; without,"
    " every action's signature is checked against it.",
)
@click.option("--origin", default=None, help="With --against: the origin the seals must name.")
@click.option(
    "--action-key",
    default=None,
    help="Check every action's signature against this public key (with or without --against).",
)
@click.option(
    "--session", default=None, help="Verify only this session's actions (see LAW.md 10a)."
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
    session: str | None,
) -> None:
    """Check the whole ledger. Exit 0 intact, 1 tampered or inconsistent, 3 cannot verify.

    Findings print one per line (kind, seq, table[key], detail); PASS or FAIL goes
    to stderr. A progress bar shows on a terminal for long journals. With --against,
    the ledger is also checked against every seal (--public-key and --origin pin who
    signed them and which ledger they name; neither is ever taken from the ledger).
    """
    from ..errors import CassetteError
    from ..verify import verify_path

    settings = ctx.find_object(Settings)
    assert settings is not None
    if against is not None and (public_key is None or origin is None):
        raise click.UsageError("--against needs --public-key and --origin to pin the seals")
    if session is not None:
        from .live_commands import verify_session

        verify_session(
            ctx,
            session,
            as_json=as_json,
            against=against,
            seal_key_path=public_key,
            origin=origin,
            action_key_path=action_key,
        )
        return
    try:
        from ..signing import load_public

        seal_key = load_public(public_key) if against and public_key else None
        actions_by = action_key or (public_key if against is None else None)
        key = load_public(actions_by) if actions_by is not None else None
        anchors = None
        if against is not None:
            from ..anchor import load_anchors

            anchors = load_anchors(against)
        with _progress(settings.db) as progress:
            report = verify_path(
                settings.db,
                run_id=run_id,
                public_key=key,
                progress=progress,
                anchors=anchors,
                seal_key=seal_key,
                origin=origin,
            )
    except CassetteError as error:
        error.exit_code = EXIT_CANNOT_VERIFY
        raise
    if as_json:
        emit(report.to_dict())
    else:
        for finding in report.findings:
            where = f" seq={finding.seq}" if finding.seq is not None else ""
            row = f" {finding.table}[{finding.key}]" if finding.table else ""
            click.echo(f"{finding.severity}: {finding.kind}{where}{row}: {finding.detail}")
        for anchor in report.anchors:
            click.echo(f"anchor: {anchor['status']} size={anchor['size']} {anchor['path']}")
            if "evidence" in anchor:
                import orjson

                click.echo("evidence: " + orjson.dumps(anchor["evidence"]).decode("utf-8"))
        for note in report.notes:
            click.echo(f"note: {note}")
    if not report.ok:
        click.echo(f"FAIL: {len(report.errors)} issue(s) found", err=True)
        ctx.exit(1)
    if report.unverifiable:
        click.echo("CANNOT VERIFY: an anchor could not be checked (see findings)", err=True)
        ctx.exit(EXIT_CANNOT_VERIFY)
    click.echo(f"PASS: All invariants verified ({report.journal_rows} journal entries)", err=True)


@contextmanager
def _progress(db: str) -> Iterator[Callable[[int], None] | None]:
    """A progress bar on stderr when it is a terminal and the journal is long."""
    if not sys.stderr.isatty():
        yield None
        return
    import sqlite3

    try:
        conn = sqlite3.connect(f"file:{db}?mode=ro", uri=True)
        total = conn.execute("SELECT max(seq) + 1 FROM cassette_journal").fetchone()[0] or 0
        conn.close()
    except sqlite3.Error:
        total = 0
    if total < 50_000:
        yield None
        return
    with click.progressbar(length=total, label="verifying journal", file=sys.stderr) as bar:
        yield bar.update


@cli.command()
@click.option("--check", is_flag=True, help="Only report pending migrations; exit 1 if any.")
@click.pass_context
def migrate(ctx: click.Context, check: bool) -> None:
    """Apply pending schema migrations in one transaction (a failure changes nothing)."""
    from ..migrate import current_version, pending_versions

    settings = ctx.find_object(Settings)
    assert settings is not None
    pending = pending_versions(settings.db)
    if check:
        emit({"db": settings.db, "latest": current_version(), "pending": pending})
        if pending:
            click.echo(f"pending: {len(pending)} migration(s)", err=True)
            ctx.exit(1)
        return
    _open(ctx)
    emit({"db": settings.db, "applied": pending, "schema_version": current_version()})


@cli.command()
@click.option(
    "--db", "demo_db", default=None, help="Write the demo ledger here instead of a temporary file."
)
@click.option("--workers", default=3, show_default=True, type=click.IntRange(1, 8))
def demo(demo_db: str | None, workers: int) -> None:
    """Run the main job end to end on a fresh ledger and tell what happened."""
    from ..demo import run_demo

    ok = run_demo(demo_db, workers=workers, echo=click.echo)
    if not ok:
        raise SystemExit(1)


def main() -> None:
    cli(prog_name="cassette")
