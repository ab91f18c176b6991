"""Copy a ledger into another, of either backend, with its journal byte for byte.

The copy replays the source's journal in seq order: each entry that is not the side
effect of an earlier write (a receipt commits its step, a release requeues it) becomes
the same INSERT or UPDATE on the destination, dated at the entry's own time, through the
destination's own triggers. Its new entries must then equal the source's, body, leaf and
chain hash, or the whole copy is refused and rolled back. So the copy holds the same
journal (seals and proofs of the source hold on it, LAW.md "Copies"), every row passed
the destination's law, and the source's hashes were recomputed on the way.

The destination is empty or holds a prefix of the source's journal (a copy made earlier):
only the rest is copied. Everything is written in one transaction of the destination and
read in one snapshot of the source. A destination file this call created is removed when
the copy is refused.
"""

from __future__ import annotations

import os
from contextlib import suppress
from typing import Any

import orjson

from .backends import open_destination as open_destination  # (re-exported: a copy's ends)
from .backends import open_source as open_source
from .copy_ends import Destination as Destination
from .copy_ends import Entry as Entry
from .copy_ends import Source as Source
from .errors import CassetteError, ErrorCode
from .hashing import ZERO_HASH, chain_hash, leaf_hash
from .law import LEASE_CAP_MS
from .redaction import shown
from .targets import names_file


def copy_ledger(source: str, dest: str, *, durability: str | None = None) -> dict[str, Any]:
    """Copy ``source`` into ``dest`` (paths or postgresql:// URLs); what was copied."""
    if os.fspath(source) == os.fspath(dest):
        raise CassetteError(ErrorCode.INVALID_ARGUMENT, "a ledger is not copied onto itself")
    made_file = names_file(dest) and not os.path.lexists(dest)
    reader = open_source(source)
    try:
        try:
            writer = open_destination(dest, durability, reader.ledger_id())
        except BaseException:
            _remove_new_file(dest, made_file)
            raise
        try:
            return _copy(reader, writer, source, dest)
        except BaseException:
            writer.close()
            _remove_new_file(dest, made_file)
            raise
        finally:
            writer.close()
    finally:
        reader.close()


def _remove_new_file(path: str, made: bool) -> None:
    if made:
        for suffix in ("", "-wal", "-shm", "-journal"):
            with suppress(FileNotFoundError):
                os.remove(path + suffix)


def _copy(reader: Source, writer: Destination, source: str, dest: str) -> dict[str, Any]:
    missing = reader.tables() - writer.tables
    if missing:
        raise CassetteError(
            ErrorCode.BACKEND_UNSUPPORTED,
            f"the destination has no {', '.join(sorted(missing))} yet: not copied",
        )
    with writer.transaction():
        writer.adopt_ledger_id(reader.ledger_id())
        start = writer.size()
        previous = ZERO_HASH
        pending: list[Entry] = []  # entries the destination already made (side effects)
        copied = 0
        for entry in reader.entries(max(start - 1, 0)):
            if entry.seq < start:  # the destination's last entry: a prefix of the source?
                # (its chain hash commits to every entry before it, on both sides)
                if writer.chain_at(entry.seq) != entry.chain:
                    raise CassetteError(
                        ErrorCode.JOURNAL_BROKEN,
                        "the destination's journal is not a prefix of the source's"
                        f" (entry {entry.seq})",
                    )
                previous = entry.chain
                continue
            _check_entry(entry, previous)
            previous = entry.chain
            if not pending:
                pending = _replay(writer, entry)
            made = pending.pop(0)
            if made != entry:
                raise CassetteError(
                    ErrorCode.JOURNAL_BROKEN,
                    f"entry {entry.seq} came out different on the destination: not copied",
                )
            copied += 1
        if pending:
            raise CassetteError(
                ErrorCode.JOURNAL_BROKEN,
                "the destination wrote entries the source does not have: not copied",
            )
        if start > 0 and previous == ZERO_HASH:  # the source ended before the destination
            raise CassetteError(
                ErrorCode.JOURNAL_BROKEN,
                f"the destination holds {start} entries, more than the source: not copied",
            )
        size = start + copied
    return {
        "source": shown(source),
        "dest": shown(dest),
        "copied": copied,
        "size": size,
        "head": previous.hex() if size else None,
    }


def _check_entry(entry: Entry, previous: bytes) -> None:
    """The source's hashes, recomputed: a copy never carries a broken chain onward."""
    leaf = leaf_hash(entry.body.encode("utf-8"))
    if entry.leaf != leaf or entry.chain != chain_hash(entry.seq, previous, leaf):
        raise CassetteError(
            ErrorCode.JOURNAL_BROKEN, f"the source's entry {entry.seq} does not hash to its chain"
        )


def _replay(writer: Destination, entry: Entry) -> list[Entry]:
    """Write the row of ``entry`` on the destination; the entries that made."""
    try:
        parsed = orjson.loads(entry.body)
        table, op, row = parsed["table"], parsed["op"], parsed["row"]
    except (orjson.JSONDecodeError, KeyError, TypeError) as exc:
        raise CassetteError(
            ErrorCode.JOURNAL_BROKEN, f"the source's entry {entry.seq} is not a journal body"
        ) from exc
    if op == "INSERT":
        at = _created(table, row, entry.seq)
    elif op == "UPDATE" and table == "cassette_steps":
        at = _step_update_time(writer, row)
    else:
        raise CassetteError(ErrorCode.JOURNAL_BROKEN, f"entry {entry.seq}: no {op} of {table}")
    return writer.write(max(at, writer.ledger_time()), op, table, row)


def _created(table: str, row: dict[str, Any], seq: int) -> int:
    value = row.get("timestamp" if table == "cassette_actions" else "created_at")
    if type(value) is not int:
        raise CassetteError(ErrorCode.JOURNAL_BROKEN, f"entry {seq} has no time")
    return value


def _step_update_time(writer: Destination, row: dict[str, Any]) -> int:
    """No time is journaled with a lease or a requeue: the earliest time the rules allow,
    which is never after the original (a lease expires at most 30 days after it was
    granted; an expired lease is requeued after it expired)."""
    if row["status"] == "LEASED":
        return int(row["lease_expires_at"]) - LEASE_CAP_MS
    expiry = writer.lease_expiry(int(row["step_id"]))
    released = row["status"] == "PENDING"
    return int(expiry) if released and expiry is not None else 0
