"""The `cassette` click group; mount it into another click CLI with add_command."""

from .commands import cli, main
from .lazy import LazyCommands

# Which module defines each command, and the command's short help (its docstring's
# first sentence, as `cassette --help` lists it); each module's register() adds its own
# commands, and a module is imported only when one of its commands is named
# (cli/lazy.py). tests/test_cli_startup.py checks each text against the command's own.
_COMMANDS_OF = {
    "commands": {
        "init": "Create the ledger (or apply pending migrations) and print its version.",
        "post": "Post a message; print its message_id and first job_id.",
        "claim": "Lease the next pending step of a run (NO_PENDING_STEPS when none).",
        "complete": "Complete a leased step with its one receipt; print the receipt_id.",
        "requeue": "Return expired leases (or a released step) to PENDING.",
        "status": "Counts of steps by state, receipts by outcome, expired leases.",
        "verify": "Check the whole ledger.",
        "migrate": (
            "Apply pending schema migrations in one transaction (a failure changes nothing)."
        ),
        "demo": "Run the main job end to end on a fresh ledger and tell what happened.",
        "copy": (
            "Copy ledger SOURCE into DEST (files or postgresql:// URLs, either way) with "
            "its journal byte for byte, every row passing DEST's rules; DEST is new, empty, "
            "or an earlier copy (only the rest is copied)."
        ),
    },
    "batch": {
        "batch": (
            "Run post, claim, complete, requeue and status lines (JSON, one per line) with "
            "one open ledger; answer each on one JSON line."
        ),
    },
    "chain_commands": {
        "action": "Append and show actions.",
        "actions": (
            "List actions in insertion order (--desc: newest first), streamed as they are read."
        ),
        "children": (
            "List the actions whose execution parent is ACTION_ID, streamed as they are read."
        ),
        "keygen": "Generate an Ed25519 signing key pair.",
        "parent": "Print the execution parent of ACTION_ID (null for a root).",
    },
    "reasoning_commands": {
        "chain": "The cause chain from the root cause down to ACTION_ID, as a numbered list.",
        "checkpoint": "Content-addressed checkpoints of plan execution contexts.",
        "plan": "Plan lifecycle.",
        "resume": "Record PlanResumed for a paused plan and print the stored context.",
        "stats": "Causality statistics over every matching action.",
        "tree": "The execution tree (parent edges) with cause edges, of a plan or below ACTION_ID.",
        "why": "Why ACTION_ID happened: its category, rationale, direct cause and parent.",
    },
    "anchor_commands": {
        "backup": (
            "Snapshot the ledger to DEST while writers keep working, verify the copy, and "
            "write its seal to DEST.seal."
        ),
        "prove": "Portable proofs that an auditor checks offline with `cassette verify-proof`.",
        "restore": (
            "Copy backup SOURCE to DEST only if it verifies and is exactly what its seal "
            "signed (DEST: a new file, or an empty PostgreSQL ledger's URL)."
        ),
        "seal": "Sign the ledger's current head (a C2SP checkpoint), record it, print it.",
        "verify-proof": "Check a proof file offline, without the ledger.",
    },
    "live_commands": {
        "export": (
            "A self-verifying bundle: entries as JSON lines with inclusion proofs, and the seal."
        ),
        "latest": (
            "The newest action (by action_seq) of a plan, session or intent, or of the "
            "ledger; null when there is none."
        ),
        "mcp": "Serve the ledger's read-only queries as MCP tools over stdio (extra: mcp).",
        "metrics": (
            "Count, failures, failure rate, total/p50/p95 duration and total cost per group."
        ),
        "suggest-causes": "Candidate causes, newest first, each with its reason.",
        "tail": "Journal entries as JSON lines, in seq order, as they commit.",
        "validate-chain": (
            "Does every cause up ACTION_ID's chain exist and precede its effect? Exit 1 if not."
        ),
        "verify-bundle": "Check a bundle offline.",
    },
}
COMMAND_MODULES = {name: module for module, names in _COMMANDS_OF.items() for name in names}
SHORT_HELP = {name: text for names in _COMMANDS_OF.values() for name, text in names.items()}

cli.commands = LazyCommands(cli, COMMAND_MODULES, __name__, SHORT_HELP)

__all__ = ["cli", "main"]
