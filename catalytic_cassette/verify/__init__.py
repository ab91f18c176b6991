"""verify: the file against the law, the journal chain, state against history,
consistency, time, seals and signatures (LAW.md, "Verify").

Reads only; streams the journal, so memory stays constant. One module per check:

    schema       header fields and every schema object, SQLite's own included
    chain        contiguous seq, leaf and link hashes, the rebuilt Merkle tree
    state        replaying the journal gives exactly the tables (both directions)
    consistency  rows agree with each other; checkpoint ids are their context's hash
    timeline     time never runs backwards or into the future; leases within the cap
    seals        recorded seals and seal files (anchors) against recomputed roots
    artifacts    artifact files against their references
    signatures   action signatures against a pinned key
    run          which checks run where, and in what order
"""

from .chain import PROGRESS_EVERY
from .findings import MAX_FINDINGS_PER_KIND, Finding, FindingKind, Severity, VerifyReport
from .options import Level, Progress, VerifyOptions
from .run import _same_snapshot, verify_connection, verify_path
from .seals import UNANCHORED_NOTE
from .tables import LEDGER_TABLES, TABLES

__all__ = [
    "LEDGER_TABLES",
    "MAX_FINDINGS_PER_KIND",
    "PROGRESS_EVERY",
    "TABLES",
    "UNANCHORED_NOTE",
    "Finding",
    "FindingKind",
    "Level",
    "Progress",
    "Severity",
    "VerifyOptions",
    "VerifyReport",
    "_same_snapshot",
    "verify_connection",
    "verify_path",
]
