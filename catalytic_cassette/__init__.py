"""catalytic-cassette: a DB-first, tamper-evident execution ledger on SQLite.

Names are imported on first use (PEP 562), so ``cassette`` commands start fast.
"""

from __future__ import annotations

from importlib import import_module
from typing import TYPE_CHECKING, Any

__version__ = "0.1.0"

_EXPORTS = {
    "CassetteError": "errors",
    "ErrorCode": "errors",
    "Clock": "clock",
    "ManualClock": "clock",
    "SystemClock": "clock",
    "MessageCassette": "cassette",
    "CausalChain": "chain",
    "Action": "actions",
    "connect": "connection",
    "connect_readonly": "connection",
    "write_transaction": "connection",
    "Finding": "verify",
    "VerifyReport": "verify",
    "verify_path": "verify",
    "WorkerKey": "worker_keys",
}

__all__ = [
    "Action",
    "CassetteError",
    "CausalChain",
    "Clock",
    "ErrorCode",
    "Finding",
    "ManualClock",
    "MessageCassette",
    "SystemClock",
    "VerifyReport",
    "WorkerKey",
    "__version__",
    "connect",
    "connect_readonly",
    "verify_path",
    "write_transaction",
]

if TYPE_CHECKING:
    from .actions import Action
    from .cassette import MessageCassette
    from .chain import CausalChain
    from .clock import Clock, ManualClock, SystemClock
    from .connection import connect, connect_readonly, write_transaction
    from .errors import CassetteError, ErrorCode
    from .verify import Finding, VerifyReport, verify_path
    from .worker_keys import WorkerKey


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'catalytic_cassette' has no attribute {name!r}")
    value = getattr(import_module(f".{module}", __name__), name)
    globals()[name] = value
    return value
