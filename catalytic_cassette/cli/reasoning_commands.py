"""Commands that explain why: cause chains, reasoning, statistics, trees, plans, checkpoints."""

from __future__ import annotations

from typing import IO, Any

import click
from click.core import ParameterSource

from .boundary import emit
from .chain_commands import open_chain
from .params import renamed

json_flag = click.option("--json", "as_json", is_flag=True, help="JSON instead of text.")


@click.command()
@click.argument("action_id")
@click.option("--max-depth", type=click.IntRange(min=0), default=None, help="Causes to walk up.")
@json_flag
@click.pass_context
def chain(ctx: click.Context, action_id: str, max_depth: int | None, as_json: bool) -> None:
    """The cause chain from the root cause down to ACTION_ID, as a numbered list."""
    from ..render import chain_text

    result = open_chain(ctx, read_only=True).build_causal_chain(action_id, max_depth)
    emit(result) if as_json else click.echo(chain_text(result))


@click.command()
@click.argument("action_id")
@json_flag
@click.pass_context
def why(ctx: click.Context, action_id: str, as_json: bool) -> None:
    """Why ACTION_ID happened: its category, rationale, direct cause and parent."""
    from ..render import reasoning_text

    result = open_chain(ctx, read_only=True).reconstruct_reasoning(action_id)
    emit(result) if as_json else click.echo(reasoning_text(result))


@click.command()
@click.option("--plan", default=None, help="Only this plan_id.")
@click.option("--session", default=None, help="Only this session_id.")
@json_flag
@click.pass_context
def stats(ctx: click.Context, plan: str | None, session: str | None, as_json: bool) -> None:
    """Causality statistics over every matching action."""
    from ..render import stats_text

    result = open_chain(ctx, read_only=True).causality_stats(plan, session)
    emit(result) if as_json else click.echo(stats_text(result))


@click.command()
@click.argument("action_id", required=False)
@click.option("--plan", default=None, help="Draw every action of this plan.")
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["text", "mermaid", "dot"]),
    default="text",
    show_default=True,
)
@json_flag
@click.pass_context
def tree(
    ctx: click.Context, action_id: str | None, plan: str | None, fmt: str, as_json: bool
) -> None:
    """The execution tree (parent edges) with cause edges, of a plan or below ACTION_ID."""
    from ..render import tree_dot, tree_mermaid, tree_text

    if (action_id is None) == (plan is None):
        raise click.UsageError("give either ACTION_ID or --plan")
    if as_json and ctx.get_parameter_source("fmt") is not ParameterSource.DEFAULT:
        raise click.UsageError("--json and --format are different outputs: give one")
    chain_ = open_chain(ctx, read_only=True)
    actions = chain_.actions_for_plan(plan) if plan is not None else chain_.subtree(str(action_id))
    if as_json:
        emit([a.to_dict() for a in actions])
        return
    render = {"text": tree_text, "mermaid": tree_mermaid, "dot": tree_dot}[fmt]
    click.echo(render(actions))


@click.group()
def plan() -> None:
    """Plan lifecycle."""


@plan.command("status")
@click.argument("plan_id")
@click.pass_context
def plan_status(ctx: click.Context, plan_id: str) -> None:
    """State, steps with their states and retry counts, total cost and duration."""
    emit(open_chain(ctx, read_only=True).plan_status(plan_id))


@plan.command("show")
@click.argument("plan_id")
@click.option("--json", "as_json", is_flag=True, help="Print the body with its hash as JSON.")
@click.pass_context
def plan_show(ctx: click.Context, plan_id: str, as_json: bool) -> None:
    """Print the plan body archived on PLAN_ID's PlanStarted (its hash checked)."""
    import sys

    found = open_chain(ctx, read_only=True).plan_body(plan_id)
    if as_json:
        emit(found)
    else:
        sys.stdout.write(found["plan_body"])
        sys.stdout.flush()


@click.group()
def checkpoint() -> None:
    """Content-addressed checkpoints of plan execution contexts."""


@checkpoint.command("save")
@click.option("--plan", "plan_id", required=True)
@click.option(
    "--context", "source", type=click.File("rb"), required=True, help="Context JSON file, or -."
)
@renamed("--json", "--context")
@click.pass_context
def checkpoint_save(ctx: click.Context, plan_id: str, source: IO[bytes]) -> None:
    """Store a context; print its id (the same context gives the same id)."""
    from ..payloads import MAX_PAYLOAD_BYTES, parse_json

    context: Any = parse_json(source.read(MAX_PAYLOAD_BYTES + 1), "context")
    emit({"checkpoint_id": open_chain(ctx).save_checkpoint(plan_id, context)})


@checkpoint.command("latest")
@click.option("--plan", "plan_id", required=True)
@click.pass_context
def checkpoint_latest(ctx: click.Context, plan_id: str) -> None:
    """The checkpoint of the plan's last pause (null when there is none)."""
    emit(open_chain(ctx, read_only=True).latest_checkpoint(plan_id))


@checkpoint.command("show")
@click.argument("checkpoint_id")
@click.pass_context
def checkpoint_show(ctx: click.Context, checkpoint_id: str) -> None:
    """A stored checkpoint, its hash checked on read."""
    emit(open_chain(ctx, read_only=True).load_checkpoint(checkpoint_id))


@click.command()
@click.option("--plan", "plan_id", required=True)
@click.option("--checkpoint", "checkpoint_id", default=None, help="Default: the latest.")
@click.pass_context
def resume(ctx: click.Context, plan_id: str, checkpoint_id: str | None) -> None:
    """Record PlanResumed for a paused plan and print the stored context."""
    result = open_chain(ctx).resume(plan_id, checkpoint_id)
    emit({**result, "action": result["action"].to_dict()})


def register(group: click.Group) -> None:
    """Add this module's commands to ``group``."""
    for command in (chain, why, stats, tree, plan, checkpoint, resume):
        group.add_command(command)
