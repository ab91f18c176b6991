"""Subcommands imported when they are named: `cassette claim` loads claim's module only.

A module of commands costs its imports and the building of its click commands; a
command line names one command, so the others are never built (docs/BENCHMARKS.md,
"CLI start-up per call"). Listing the group (``--help``) builds them all.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from importlib import import_module
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import click


class LazyCommands(MutableMapping[str, "click.Command"]):
    """A group's ``commands``: each name maps to the module that defines it, imported on
    the first lookup of one of its names; its ``register(group)`` then adds its commands.
    Iterating lists the names without importing anything."""

    def __init__(self, group: click.Group, modules: dict[str, str], package: str) -> None:
        self._group = group
        self._modules = dict(modules)  # command name -> module (relative to package)
        self._package = package
        self._loaded: dict[str, click.Command] = {}

    def __getitem__(self, name: str) -> click.Command:
        if name not in self._loaded and name in self._modules:
            module = self._modules[name]
            import_module(f".{module}", self._package).register(self._group)
            # Its names are registered now: the module is never imported again from here.
            for registered in [n for n, m in self._modules.items() if m == module]:
                del self._modules[registered]
        return self._loaded[name]

    def __setitem__(self, name: str, command: click.Command) -> None:
        self._loaded[name] = command

    def __delitem__(self, name: str) -> None:
        found = self._modules.pop(name, None)
        if self._loaded.pop(name, None) is None and found is None:
            raise KeyError(name)

    def __iter__(self) -> Iterator[str]:
        return iter({**self._loaded, **dict.fromkeys(self._modules)})

    def __len__(self) -> int:
        return len(self._loaded.keys() | self._modules.keys())

    def __contains__(self, name: object) -> bool:
        return name in self._loaded or name in self._modules
