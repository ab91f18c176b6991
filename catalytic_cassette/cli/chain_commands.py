"""Commands of the causal chain: actions, their tree, signing keys."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import IO, TYPE_CHECKING, Any

import click

from .boundary import emit
from .commands import Settings
from .output import output_options
from .params import OUTPUT_FILE, PRIVATE_KEY, TIME, ChoiceOf, renamed

if TYPE_CHECKING:
    from ..actions import Action
    from ..chain import CausalChain


def open_chain(
    ctx: click.Context, signing_key: str | None = None, *, read_only: bool = False
) -> CausalChain:
    """The ledger for this command; ``read_only`` never creates, migrates or writes it."""
    from ..chain import CausalChain

    settings = ctx.find_object(Settings)
    assert settings is not None
    chain = CausalChain(
        settings.db,
        durability=settings.durability,
        signing_key=signing_key,
        artifact_dir=settings.artifact_dir,
        auto_seal=settings.auto_seal(),
        read_only=read_only,
    )
    ctx.call_on_close(chain.close)
    return chain


@click.group()
def action() -> None:
    """Append and show actions."""


@action.command("append")
@click.option(
    "--actions",
    "source",
    type=click.File("rb"),
    required=True,
    help="One action object or a JSON array of them (one transaction), or - for stdin.",
)
@click.option(
    "--signing-key",
    envvar="CASSETTE_SIGNING_KEY",
    type=PRIVATE_KEY,
    default=None,
    help="Ed25519 private key file (from `cassette keygen`); signs each action.",
)
@renamed("--json", "--actions")
@output_options
@click.pass_context
def action_append(ctx: click.Context, source: IO[bytes], signing_key: str | None) -> list[Action]:
    """Append actions; print them as stored (with action_seq and timestamp)."""
    from ..payloads import MAX_PAYLOAD_BYTES, parse_json

    parsed: Any = parse_json(source.read(MAX_PAYLOAD_BYTES + 1), "actions")
    items = parsed if isinstance(parsed, list) else [parsed]
    return open_chain(ctx, signing_key).append_actions(items)


@action.command("show")
@click.argument("action_id")
@click.pass_context
def action_show(ctx: click.Context, action_id: str) -> None:
    """Print one action (NOT_FOUND when there is none)."""
    emit(open_chain(ctx, read_only=True).get_action(action_id).to_dict())


def _action_types() -> tuple[str, ...]:
    from ..actions import ACTION_TYPES

    return ACTION_TYPES


@click.command()
@click.option("--plan", default=None, help="Only this plan_id.")
@click.option("--intent", default=None, help="Only this intent_id.")
@click.option("--session", default=None, help="Only this session_id.")
@click.option(
    "--type",
    "action_type",
    type=ChoiceOf(_action_types),
    default=None,
    help="Only this action_type.",
)
@click.option("--limit", type=click.IntRange(min=1), default=None, help="At most N actions.")
@click.option(
    "--offset", type=click.IntRange(min=0), default=0, help="Skip the first N matching actions."
)
@click.option("--function", "function_name", default=None, help="Only this function_name.")
@click.option("--since-seq", type=int, default=None, help="Only action_seq greater than N.")
@click.option(
    "--after", type=TIME, default=None, help="Only timestamp >= T (ISO 8601 or epoch ms)."
)
@click.option(
    "--before", type=TIME, default=None, help="Only timestamp < T (ISO 8601 or epoch ms)."
)
@click.option("--desc", is_flag=True, help="Newest first (with --limit 1: the latest).")
@output_options
@click.pass_context
def actions(
    ctx: click.Context,
    plan: str | None,
    intent: str | None,
    session: str | None,
    action_type: str | None,
    limit: int | None,
    offset: int,
    function_name: str | None,
    since_seq: int | None,
    after: int | None,
    before: int | None,
    desc: bool,
) -> Iterator[Action]:
    """List actions in insertion order (--desc: newest first), streamed as they are read."""
    chain = open_chain(ctx, read_only=True)
    rows = chain.iter_actions(
        plan_id=plan,
        intent_id=intent,
        session_id=session,
        action_type=action_type,
        limit=limit,
        offset=offset,
        function_name=function_name,
        since_seq=since_seq,
        after=after,
        before=before,
        newest_first=desc,
    )
    return rows if function_name is None else _unless_unknown(chain, function_name, iter(rows))


def _unless_unknown(chain: CausalChain, name: str, rows: Iterator[Action]) -> Iterator[Action]:
    """The rows; when none match, a function name the ledger has never seen is refused
    with the names it has (a typo answers, not an empty list)."""
    first = next(rows, None)
    if first is not None:
        return itertools.chain([first], rows)
    known = sorted({str(group["function"]) for group in chain.metrics("function")})
    if name not in known:
        from ..errors import CassetteError, ErrorCode

        shown = ", ".join(known[:_SHOWN_NAMES]) + (", ..." if len(known) > _SHOWN_NAMES else "")
        raise CassetteError(
            ErrorCode.NOT_FOUND,
            f"no action has function_name {name!r}; the ledger's: {shown or 'none'}",
        )
    return iter(())


_SHOWN_NAMES = 20


@click.command()
@click.argument("action_id")
@output_options
@click.pass_context
def children(ctx: click.Context, action_id: str) -> Iterator[Action]:
    """List the actions whose execution parent is ACTION_ID, streamed as they are read."""
    return open_chain(ctx, read_only=True).iter_children(action_id)


@click.command()
@click.argument("action_id")
@click.pass_context
def parent(ctx: click.Context, action_id: str) -> None:
    """Print the execution parent of ACTION_ID (null for a root)."""
    found = open_chain(ctx, read_only=True).get_parent(action_id)
    emit(None if found is None else found.to_dict())


@click.command()
@click.option(
    "--out",
    "prefix",
    type=OUTPUT_FILE,
    required=True,
    help="Writes PREFIX.key (private) and PREFIX.pub.",
)
def keygen(prefix: str) -> None:
    """Generate an Ed25519 signing key pair. The private key never enters the ledger."""
    from ..signing import generate, key_id, load_public

    private_path, public_path = generate(prefix)
    emit(
        {
            "private_key": str(private_path),
            "public_key": str(public_path),
            "key_id": key_id(load_public(public_path)),
        }
    )


def register(group: click.Group) -> None:
    """Add this module's commands to ``group``."""
    for command in (action, actions, children, parent, keygen):
        group.add_command(command)
