"""Subcommands imported when they are named: `cassette claim` loads claim's module only.

A module of commands costs its imports and the building of its click commands; a
command line names one command, so the others are never built (docs/BENCHMARKS.md,
"CLI start-up per call"). Listing the group (``cassette --help``) shows each command not
yet imported through a stand-in carrying its short help from the table, so it imports no
command module; ``cassette CMD --help`` imports CMD's.
"""

from __future__ import annotations

from collections.abc import Iterator, MutableMapping
from contextlib import contextmanager
from importlib import import_module

import click


class LazyCommands(MutableMapping[str, "click.Command"]):
    """A group's ``commands``: each name maps to the module that defines it, imported on
    the first lookup of one of its names; its ``register(group)`` then adds its commands.
    Iterating lists the names without importing anything."""

    def __init__(
        self,
        group: click.Group,
        modules: dict[str, str],
        package: str,
        short_help: dict[str, str],
    ) -> None:
        self._group = group
        self._modules = dict(modules)  # command name -> module (relative to package)
        self._package = package
        self._short_help = short_help  # command name -> its short help
        self._loaded: dict[str, click.Command] = {}
        self._listing = False

    @contextmanager
    def listing(self) -> Iterator[None]:
        """Within: a command not yet imported is a stand-in with only its name and short
        help, enough for the group's listing; click shortens the text as it shortens the
        command's own (tests/test_cli_startup.py compares them)."""
        self._listing = True
        try:
            yield
        finally:
            self._listing = False

    def __getitem__(self, name: str) -> click.Command:
        if self._listing and name not in self._loaded and name in self._modules:
            return click.Command(name, help=self._short_help[name])
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
