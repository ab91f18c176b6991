"""Text, Mermaid and Graphviz DOT renderings of the execution tree with cause edges.

Stored text (function names, rationales, ids) goes through ``printable``: a field
cannot move the cursor, hide a marker or start a line of its own.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .actions import Action
from .reasoning import summary
from .terminal import printable


def _label(action: Action) -> str:
    return printable(summary(action.action_type, action.function_name, None, action.success))


def _short(action_id: str) -> str:
    return printable(action_id[:8])


def tree_text(actions: Sequence[Action]) -> str:
    """Indented execution tree; a cause edge is noted after the effect."""
    present = {a.action_id for a in actions}
    children: dict[str | None, list[Action]] = {}
    for action in actions:
        parent = action.parent_action_id if action.parent_action_id in present else None
        children.setdefault(parent, []).append(action)
    lines: list[str] = []
    # Depth first with an explicit stack: a chain thousands deep needs no recursion.
    stack: list[tuple[Action, int]] = [(a, 0) for a in reversed(children.get(None, []))]
    while stack:
        action, depth = stack.pop()
        note = f"  <- caused by {_short(action.caused_by)}" if action.caused_by else ""
        category = f" [{printable(action.category)}]" if action.category else ""
        lines.append(f"{'  ' * depth}{_short(action.action_id)} {_label(action)}{category}{note}")
        stack.extend((child, depth + 1) for child in reversed(children.get(action.action_id, [])))
    return "\n".join(lines)


def _node_ids(actions: Sequence[Action]) -> dict[str, str]:
    return {a.action_id: f"a{n}" for n, a in enumerate(actions, start=1)}


def tree_mermaid(actions: Sequence[Action]) -> str:
    """A Mermaid flowchart: solid arrows for the execution parent, dotted for causes."""
    ids = _node_ids(actions)
    lines = ["flowchart TD"]
    for action in actions:
        text = _label(action).replace('"', "#quot;")
        lines.append(f'    {ids[action.action_id]}["{text}"]')
    for action in actions:
        if action.parent_action_id in ids:
            lines.append(f"    {ids[action.parent_action_id]} --> {ids[action.action_id]}")
    for action in actions:
        if action.caused_by in ids:
            lines.append(f"    {ids[action.caused_by]} -. caused .-> {ids[action.action_id]}")
    return "\n".join(lines)


def tree_dot(actions: Sequence[Action]) -> str:
    """A Graphviz digraph: solid edges for the execution parent, dashed for causes."""
    ids = _node_ids(actions)

    def quote(text: str) -> str:
        return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'

    lines = ["digraph cassette {", "    node [shape=box];"]
    for action in actions:
        lines.append(f"    {ids[action.action_id]} [label={quote(_label(action))}];")
    for action in actions:
        if action.parent_action_id in ids:
            lines.append(f"    {ids[action.parent_action_id]} -> {ids[action.action_id]};")
    for action in actions:
        if action.caused_by in ids:
            lines.append(
                f"    {ids[action.caused_by]} -> {ids[action.action_id]}"
                ' [style=dashed, label="caused"];'
            )
    lines.append("}")
    return "\n".join(lines)


def chain_text(result: dict[str, Any]) -> str:
    """The cause chain as an indented, numbered list, root first."""
    lines = []
    for entry in result["chain"]:
        category = f" [{printable(entry['category'])}]" if entry["category"] else ""
        lines.append(
            f"{'   ' * entry['depth']}{entry['depth'] + 1}. {printable(entry['summary'])}{category}"
            f" ({_short(entry['action_id'])}, t={entry['timestamp']})"
        )
    if result["truncated"]:
        lines.append("(walk cut at the depth limit: entry 1 has a cause of its own)")
    return "\n".join(lines)


def reasoning_text(result: dict[str, Any]) -> str:
    cause, parent = result["cause"], result["parent"]
    lines = [
        f"action:    {result['action_id']}",
        f"summary:   {result['summary']}",
        f"category:  {result['category'] or '-'}",
        f"rationale: {result['rationale'] or '-'}",
        f"cause:     {cause['action_id'] + ' ' + cause['summary'] if cause else '-'}",
        f"parent:    {parent['action_id'] + ' ' + parent['summary'] if parent else '-'}",
    ]
    if "message" in result:
        lines.append(result["message"])
    lines = [printable(line) for line in lines]  # each line is built from one or two fields
    return "\n".join(lines)


def stats_text(stats: dict[str, Any]) -> str:
    scope = (
        ", ".join(
            f"{k}={printable(stats[k])}" for k in ("plan_id", "session_id") if stats[k] is not None
        )
        or "whole ledger"
    )
    lines = [
        f"scope:                   {scope}",
        f"actions:                 {stats['actions']}",
        f"with causality data:     {stats['with_causality']}",
        f"with a cause:            {stats['with_cause']}",
        f"cause without rationale: {stats['cause_without_rationale']}",
        f"root causes:             {stats['root_causes']}",
        f"average chain length:    {stats['average_chain_length']}",
        f"max chain length:        {stats['max_chain_length']}",
        f"roots incl. isolated:    {stats['root_causes_including_isolated']}",
        f"average chain nodes:     {stats['average_chain_nodes']}",
        f"max chain nodes:         {stats['max_chain_nodes']}",
    ]
    lines += [f"category {name + ':':14s} {count}" for name, count in stats["categories"].items()]
    return "\n".join(lines)
