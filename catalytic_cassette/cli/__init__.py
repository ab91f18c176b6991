"""The `cassette` click group; mount it into another click CLI with add_command."""

from .commands import cli, main
from .lazy import LazyCommands

# Which module defines each command; each module's register() adds its own, and a
# module is imported only when one of its commands is named (cli/lazy.py).
_COMMANDS_OF = {
    "commands": (
        *("init", "post", "claim", "complete", "requeue", "status"),
        *("verify", "migrate", "demo", "copy"),
    ),
    "batch": ("batch",),
    "chain_commands": ("action", "actions", "children", "keygen", "parent"),
    "reasoning_commands": ("chain", "checkpoint", "plan", "resume", "stats", "tree", "why"),
    "anchor_commands": ("backup", "prove", "restore", "seal", "verify-proof"),
    "live_commands": (
        *("export", "latest", "mcp", "metrics", "suggest-causes", "tail"),
        *("validate-chain", "verify-bundle"),
    ),
}
COMMAND_MODULES = {name: module for module, names in _COMMANDS_OF.items() for name in names}

cli.commands = LazyCommands(cli, COMMAND_MODULES, __name__)

__all__ = ["cli", "main"]
