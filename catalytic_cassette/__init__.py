"""catalytic-cassette: a DB-first, tamper-evident execution ledger on SQLite."""

from .cassette import MessageCassette
from .clock import Clock, ManualClock, SystemClock
from .connection import connect, connect_readonly, write_transaction
from .errors import CassetteError, ErrorCode
from .verify import Finding, VerifyReport

__version__ = "0.1.0"

__all__ = [
    "CassetteError",
    "Clock",
    "ErrorCode",
    "Finding",
    "ManualClock",
    "MessageCassette",
    "SystemClock",
    "VerifyReport",
    "__version__",
    "connect",
    "connect_readonly",
    "write_transaction",
]
