"""Commands of the ledger as a live source: newest first, suggested causes, chain
validation, tail, metrics, session verify, plan bodies, bundles and the MCP server."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

import click
import orjson
from click.core import ParameterSource

from .anchor_commands import (
    _proving,
    _read_seal,
    _signer_options,
    _write_or_print,
    seal_signer,
)
from .boundary import EXIT_CANNOT_VERIFY, emit
from .chain_commands import open_chain
from .commands import Settings
from .output import output_options, render
from .params import BUNDLE_FILE, OUTPUT_FILE, PUBLIC_KEY, SEAL_FILE, TIME, ChoiceOf

if TYPE_CHECKING:
    from ..follow import JournalReader


def _one_scope(plan: str | None, session: str | None, intent: str | None) -> None:
    if sum(v is not None for v in (plan, session, intent)) > 1:
        raise click.UsageError("give at most one of --plan, --session, --intent")


@click.command()
@click.option("--plan", default=None, help="The newest action of this plan_id.")
@click.option("--session", default=None, help="... of this session_id.")
@click.option("--intent", default=None, help="... of this intent_id.")
@click.pass_context
def latest(ctx: click.Context, plan: str | None, session: str | None, intent: str | None) -> None:
    """The newest action (by action_seq) of a plan, session or intent, or of the ledger;
    null when there is none."""
    _one_scope(plan, session, intent)
    found = open_chain(ctx, read_only=True).latest(
        plan_id=plan, session_id=session, intent_id=intent
    )
    emit(None if found is None else found.to_dict())


@click.command("suggest-causes")
@click.option("--action", "action_id", default=None, help="Causes for this existing action.")
@click.option(
    "--scope",
    type=click.Choice(["plan", "session", "intent"]),
    default="plan",
    show_default=True,
    help="With --action: neighbours in its plan, session or intent.",
)
@click.option("--plan", default=None, help="Without --action: candidates in this plan.")
@click.option("--session", default=None, help="... in this session.")
@click.option("--intent", default=None, help="... in this intent.")
@click.option(
    "--at", type=TIME, default=None, help="Without --action: the time (ISO 8601 or epoch ms)."
)
@click.option("--window-ms", type=click.IntRange(min=1), default=3_600_000, show_default=True)
@click.option("--limit", type=click.IntRange(min=1, max=20), default=5, show_default=True)
@output_options
@click.pass_context
def suggest_causes(
    ctx: click.Context,
    action_id: str | None,
    scope: str,
    plan: str | None,
    session: str | None,
    intent: str | None,
    at: int | None,
    window_ms: int,
    limit: int,
) -> list[dict[str, Any]]:
    """Candidate causes, newest first, each with its reason. Proposals only: nothing is
    written, and `caused_by` stays what the orchestrator observed."""
    given = (("--plan", plan), ("--session", session), ("--intent", intent))
    named = [name for name, value in given if value is not None]
    if action_id is not None and (named or at is not None):
        raise click.UsageError(
            "--action takes its scope with --scope; no --plan, --session,"
            " --intent or --at beside it"
        )
    if action_id is None and len(named) != 1:
        raise click.UsageError("give --action, or exactly one of --plan, --session, --intent")
    if action_id is None and ctx.get_parameter_source("scope") is not ParameterSource.DEFAULT:
        raise click.UsageError("--scope goes with --action (else the scope is the option given)")
    return open_chain(ctx, read_only=True).detect_dependencies(
        plan_id=plan,
        session_id=session,
        intent_id=intent,
        action_id=action_id,
        scope=scope,
        at_ms=at,
        window_ms=window_ms,
        limit=limit,
    )


@click.command("validate-chain")
@click.argument("action_id")
@click.pass_context
def validate_chain(ctx: click.Context, action_id: str) -> None:
    """Does every cause up ACTION_ID's chain exist and precede its effect? Exit 1 if not."""
    result = open_chain(ctx, read_only=True).validate_causal_chain(action_id)
    emit(result)
    if not result["ok"]:
        click.echo(f"FAIL: {len(result['problems'])} problem(s) in the cause chain", err=True)
        ctx.exit(1)


@contextmanager
def _journal(ctx: click.Context) -> Iterator[JournalReader]:
    """Polls of the journal, read-only; ``backends`` chooses the reader of the ledger."""
    from ..backends import open_journal_reader

    settings = ctx.find_object(Settings)
    assert settings is not None
    with open_journal_reader(settings.db) as read:
        yield read


def _journaled_tables() -> frozenset[str]:
    from ..copying_sqlite import JOURNALED

    return JOURNALED


@click.command()
@click.option(
    "--since-seq",
    type=click.IntRange(min=-1),
    default=-1,
    show_default=True,
    help="Print entries after this seq (the last one a previous run printed).",
)
@click.option("--follow", "keep_following", is_flag=True, help="Keep printing as entries commit.")
@click.option(
    "--table",
    type=ChoiceOf(_journaled_tables),
    default=None,
    help="Only entries of this table, e.g. cassette_actions.",
)
@click.option("--max-entries", type=click.IntRange(min=1), default=None, help="Stop after N.")
@click.option(
    "--timeout",
    type=click.FloatRange(min=0),
    default=None,
    help="With --follow: stop after this many seconds.",
)
@click.option(
    "--interval",
    type=click.FloatRange(min=0.001),
    default=0.2,
    show_default=True,
    help="Seconds between polls.",
)
@click.pass_context
def tail(
    ctx: click.Context,
    since_seq: int,
    keep_following: bool,
    table: str | None,
    max_entries: int | None,
    timeout: float | None,
    interval: float,
) -> None:
    """Journal entries as JSON lines, in seq order, as they commit. Read-only; restart
    with --since-seq LAST for no gap and no duplicate."""
    from ..follow import follow_reader

    printed = 0
    with _journal(ctx) as read:  # Ctrl-C: the boundary's INTERRUPTED, exit 130
        for item in follow_reader(
            read,
            since_seq,
            table=table,
            keep_following=keep_following,
            poll_seconds=interval,
            timeout_seconds=timeout,
        ):
            sys.stdout.write(orjson.dumps(item).decode("utf-8") + "\n")
            sys.stdout.flush()  # a line is out before the next poll: restarts lose nothing
            printed += 1
            if max_entries is not None and printed >= max_entries:
                break


@click.command()
@click.option(
    "--by",
    type=click.Choice(["plan", "intent", "session", "function", "capability"]),
    required=True,
)
@click.option("--json", "as_json", is_flag=True, help="A JSON array instead of a table.")
@click.pass_context
def metrics(ctx: click.Context, by: str, as_json: bool) -> None:
    """Count, failures, failure rate, total/p50/p95 duration and total cost per group."""
    rows = open_chain(ctx, read_only=True).metrics(by)
    emit(rows) if as_json else render(rows, "table")


@click.command()
@click.option("--session", default=None, help="Export this session's actions.")
@click.option("--plan", default=None, help="Export this plan's actions.")
@click.option(
    "--seal",
    "seal_file",
    type=SEAL_FILE,
    default=None,
    help="Seal file (default: newest recorded).",
)
@click.option(
    "--out", type=OUTPUT_FILE, default=None, help="Write the bundle here (default: stdout)."
)
@_signer_options
@click.pass_context
def export(
    ctx: click.Context,
    session: str | None,
    plan: str | None,
    seal_file: str | None,
    out: str | None,
    public_key: str | None,
    origin: str | None,
) -> None:
    """A self-verifying bundle: entries as JSON lines with inclusion proofs, and the seal."""
    from ..bundle import bundle_lines

    if (session is None) == (plan is None):
        raise click.UsageError("give exactly one of --session or --plan")
    signer = seal_signer(public_key, origin)
    scope, value = ("session_id", session) if session is not None else ("plan_id", plan)
    note = _read_seal(seal_file) if seal_file is not None else None
    with _proving(ctx) as source:
        lines = list(bundle_lines(source, scope, str(value), note, signer))
    _write_or_print(b"\n".join(lines) + b"\n", out, {"entries": len(lines) - 1})


@click.command("verify-bundle")
@click.argument("bundle_file", type=BUNDLE_FILE)
@click.option(
    "--public-key", type=PUBLIC_KEY, required=True, help="The seal signer's public key (pinned)."
)
@click.option("--origin", required=True, help="The origin the seal must name (pinned).")
@click.pass_context
def verify_bundle_command(
    ctx: click.Context, bundle_file: str, public_key: str, origin: str
) -> None:
    """Check a bundle offline. Exit 0 holds, 1 a bad entry or signature, 3 cannot check."""
    from ..bundle import verify_bundle
    from ..safe_files import BUNDLE_MAX_BYTES, read_file
    from ..signing import load_public

    # A refusal here means nothing was checked: the boundary exits 3 for verify-bundle.
    key = load_public(public_key)
    data = read_file(bundle_file, what="bundle", max_bytes=BUNDLE_MAX_BYTES)
    result = verify_bundle(data, key, origin)
    emit(result)
    if not result["ok"]:
        click.echo(f"FAIL: {result['problem']}", err=True)
        ctx.exit(1 if result["problem"] in ("bad_entry", "bad_signature") else EXIT_CANNOT_VERIFY)
    click.echo(f"PASS: {result['entries']} entries proven under the seal", err=True)


@click.command()
@click.pass_context
def mcp(ctx: click.Context) -> None:
    """Serve the ledger's read-only queries as MCP tools over stdio (extra: mcp)."""
    try:
        from ..mcp_server import serve
    except ImportError as exc:
        # Only the extra's own packages missing (or an mcp older than 2) is the user's
        # install to fix; any other failed import is a bug and keeps its traceback.
        if (exc.name or "").split(".")[0] not in {"mcp", "pydantic"}:
            raise
        from ..errors import ErrorCode
        from .boundary import EXIT_USAGE, Refusal

        raise Refusal(
            ErrorCode.MISSING_EXTRA.value,
            "the MCP server needs the mcp extra: pip install 'catalytic-cassette[mcp]'",
            EXIT_USAGE,
        ) from exc
    settings = ctx.find_object(Settings)
    assert settings is not None
    serve(settings.db)


def register(group: click.Group) -> None:
    """Add this module's commands to ``group`` (``plan show`` joins the ``plan`` group)."""
    for command in (
        latest,
        suggest_causes,
        validate_chain,
        tail,
        metrics,
        export,
        verify_bundle_command,
        mcp,
    ):
        group.add_command(command)
