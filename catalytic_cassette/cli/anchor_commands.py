"""Commands for anchors: seal, prove, verify-proof, backup, restore."""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING

import click

from .boundary import EXIT_CANNOT_VERIFY, emit
from .commands import Settings
from .output import progress_bar
from .params import (
    BACKUP_FILE,
    OUTPUT_FILE,
    OUTPUT_FILE_OR_DIR,
    OUTPUT_LEDGER,
    PRIVATE_KEY,
    PROOF_FILE,
    PUBLIC_KEY,
    SEAL_FILE,
)

if TYPE_CHECKING:
    import sqlite3

    from ..proofs import ProofSource, Signer


@contextmanager
def _reading(ctx: click.Context) -> Iterator[sqlite3.Connection]:
    """A read-only connection to an existing ledger file: reading never creates or
    changes it."""
    from ..connection import connect_reader

    settings = ctx.find_object(Settings)
    assert settings is not None
    conn = connect_reader(settings.db)
    try:
        yield conn
    finally:
        conn.close()


@contextmanager
def _proving(ctx: click.Context) -> Iterator[ProofSource]:
    """What proofs are built from, read-only: proving never creates or changes a ledger.
    The backend is chosen by ``backends``, when the ledger is opened."""
    from ..backends import open_proof_source

    settings = ctx.find_object(Settings)
    assert settings is not None
    with open_proof_source(settings.db) as source:
        yield source


def _write_or_print(data: bytes, out: str | None, summary: dict[str, object]) -> None:
    if out is None:
        sys.stdout.buffer.write(data)
        sys.stdout.flush()
        return
    from ..safe_files import write_new

    write_new(out, data, what="proof file")  # never overwrites, never through a link
    emit({"path": out, **summary})


def _read_seal(path: str) -> bytes:
    from ..safe_files import SEAL_MAX_BYTES, read_file

    return read_file(path, what="seal file", max_bytes=SEAL_MAX_BYTES)


@click.command()
@click.option(
    "--key",
    "key_path",
    type=PRIVATE_KEY,
    required=True,
    help="Ed25519 private key (cassette keygen).",
)
@click.option(
    "--out",
    type=OUTPUT_FILE_OR_DIR,
    default=None,
    help="Write the seal to this file, or into this directory (*.seal).",
)
@click.option(
    "--origin",
    default=None,
    help="The ledger's name in the seal (default catalytic-cassette/ledger/<ledger_id>).",
)
@click.pass_context
def seal(ctx: click.Context, key_path: str, out: str | None, origin: str | None) -> None:
    """Sign the ledger's current head (a C2SP checkpoint), record it, print it.

    Keep the seal somewhere the ledger's writers cannot change it; `verify --against`
    then detects any rewrite of the first sealed entries.
    """
    from ..cassette import MessageCassette
    from ..seals import Seal, require_ledger, write_seal_file
    from ..signing import load_private

    settings = ctx.find_object(Settings)
    assert settings is not None
    require_ledger(settings.db)
    key = load_private(key_path)  # before opening: a bad key changes nothing
    written: list[Path] = []

    def write_file(sealed: Seal) -> None:  # inside the transaction: a refusal records nothing
        if out is not None:
            written.append(write_seal_file(sealed, out))

    with MessageCassette(settings.db, durability=settings.durability) as cassette:
        sealed = cassette.seal(key, origin=origin, before_commit=write_file)
    emit({**sealed.to_dict(), "path": str(written[0]) if written else None})


@click.group()
def prove() -> None:
    """Portable proofs that an auditor checks offline with `cassette verify-proof`."""


def seal_signer(public_key: str | None, origin: str | None) -> Signer | None:
    """The pinned key and origin a recorded seal must verify under to be chosen (both,
    or neither: then the newest recorded seal is taken)."""
    if public_key is None and origin is None:
        return None
    if public_key is None or origin is None:
        raise click.UsageError("--public-key and --origin pin the seal together: give both")
    from ..signing import load_public

    return load_public(public_key), origin


SIGNER_OPTIONS = (
    click.option(
        "--public-key",
        type=PUBLIC_KEY,
        default=None,
        help="Take the newest recorded seal whose signature verifies under this key.",
    ),
    click.option("--origin", default=None, help="With --public-key: the origin it signs."),
)


def _signer_options(command: Callable[..., None]) -> Callable[..., None]:
    for option in reversed(SIGNER_OPTIONS):
        command = option(command)
    return command


def _inclusion(
    ctx: click.Context, seq: int, seal_file: str | None, out: str | None, signer: Signer | None
) -> None:
    from ..proofs import inclusion_proof

    note = _read_seal(seal_file) if seal_file is not None else None
    with _proving(ctx) as source:
        proof = inclusion_proof(source, seq, note, signer)
    _write_or_print(proof.to_bytes(), out, {"index": seq, "path_length": len(proof.path)})


@prove.command("inclusion")
@click.argument("seq", type=click.IntRange(min=0))
@click.option(
    "--seal", "seal_file", type=SEAL_FILE, default=None, help="Seal file (default: newest)."
)
@click.option(
    "--out", type=OUTPUT_FILE, default=None, help="Write the proof here (default: stdout)."
)
@_signer_options
@click.pass_context
def prove_inclusion_command(
    ctx: click.Context,
    seq: int,
    seal_file: str | None,
    out: str | None,
    public_key: str | None,
    origin: str | None,
) -> None:
    """Proof (c2sp.org/tlog-proof, entry body as extra) that journal entry SEQ is sealed."""
    _inclusion(ctx, seq, seal_file, out, seal_signer(public_key, origin))


@prove.command("receipt")
@click.argument("receipt_id", type=click.IntRange(min=1))
@click.option(
    "--seal", "seal_file", type=SEAL_FILE, default=None, help="Seal file (default: newest)."
)
@click.option(
    "--out", type=OUTPUT_FILE, default=None, help="Write the proof here (default: stdout)."
)
@_signer_options
@click.pass_context
def prove_receipt(
    ctx: click.Context,
    receipt_id: int,
    seal_file: str | None,
    out: str | None,
    public_key: str | None,
    origin: str | None,
) -> None:
    """Inclusion proof of the journal entry that committed receipt RECEIPT_ID."""
    from ..proofs import receipt_seq

    signer = seal_signer(public_key, origin)
    with _proving(ctx) as source:
        seq = receipt_seq(source, receipt_id)
    _inclusion(ctx, seq, seal_file, out, signer)


@prove.command("consistency")
@click.argument("old_seal", type=SEAL_FILE)
@click.argument("new_seal", type=SEAL_FILE, required=False)
@click.option(
    "--out", type=OUTPUT_FILE, default=None, help="Write the proof here (default: stdout)."
)
@click.pass_context
def prove_consistency_command(
    ctx: click.Context, old_seal: str, new_seal: str | None, out: str | None
) -> None:
    """RFC 9162 proof that OLD_SEAL's tree is a prefix of NEW_SEAL's (or of the head)."""
    import orjson

    from ..proofs import consistency_proof

    new_note = _read_seal(new_seal) if new_seal is not None else None
    with _proving(ctx) as source:
        doc = consistency_proof(source, _read_seal(old_seal), new_note)
    data = orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n"
    _write_or_print(data, out, {"old_size": doc["old_size"], "new_size": doc["new_size"]})


@click.command("verify-proof")
@click.argument("proof_file", type=PROOF_FILE)
@click.option(
    "--public-key", type=PUBLIC_KEY, required=True, help="The ledger's Ed25519 public key (PEM)."
)
@click.option("--origin", required=True, help="The ledger's origin, as you expect it.")
@click.pass_context
def verify_proof(ctx: click.Context, proof_file: str, public_key: str, origin: str) -> None:
    """Check a proof file offline, without the ledger. Exit 0 valid, 1 invalid, 3 cannot
    check (another key or origin, or not a proof)."""
    from ..proofs import check_proof_file
    from ..safe_files import PROOF_MAX_BYTES, read_file
    from ..signing import load_public

    # A refusal here means nothing was checked: the boundary exits 3 for verify-proof.
    data = read_file(proof_file, what="proof file", max_bytes=PROOF_MAX_BYTES)
    key = load_public(public_key)
    result = check_proof_file(data, origin, key)
    emit(result.to_dict())
    if not result.ok:
        unverifiable = result.problem in {"unknown_key", "wrong_origin", "malformed"}
        click.echo(f"FAIL: {result.problem}", err=True)
        ctx.exit(EXIT_CANNOT_VERIFY if unverifiable else 1)
    click.echo(f"PASS: {result.kind} proof holds", err=True)


@click.command()
@click.argument("dest", type=OUTPUT_FILE)
@click.option(
    "--key",
    "key_path",
    type=PRIVATE_KEY,
    required=True,
    help="Ed25519 private key that seals the copy.",
)
@click.option("--origin", default=None, help="The ledger's origin (default: its own).")
@click.pass_context
def backup(ctx: click.Context, dest: str, key_path: str, origin: str | None) -> None:
    """Snapshot the ledger to DEST while writers keep working, verify the copy, and write
    its seal to DEST.seal. Nothing is left behind if any step fails."""
    from ..backup import backup as run_backup
    from ..signing import load_private

    settings = ctx.find_object(Settings)
    assert settings is not None
    from ..tree import journal_size

    key = load_private(key_path)
    total = journal_size(settings.db) if sys.stderr.isatty() else 0
    with progress_bar(total, "verifying the copy") as progress:
        result = run_backup(settings.db, dest, key, origin=origin, progress=progress)
    emit(result)


@click.command()
@click.argument("source", type=BACKUP_FILE)
@click.argument("dest", type=OUTPUT_LEDGER)
@click.option(
    "--public-key",
    type=PUBLIC_KEY,
    required=True,
    help="Public key the backup's seal must verify under.",
)
@click.option("--origin", required=True, help="The origin the seal must name.")
@click.option(
    "--seal", "seal_file", type=SEAL_FILE, default=None, help="Seal file (default: SOURCE.seal)."
)
def restore(source: str, dest: str, public_key: str, origin: str, seal_file: str | None) -> None:
    """Copy backup SOURCE to DEST only if it verifies and is exactly what its seal signed
    (DEST: a new file, or an empty PostgreSQL ledger's URL)."""
    from ..backup import restore as run_restore
    from ..signing import load_public
    from ..tree import journal_size

    key = load_public(public_key)
    total = journal_size(source) if sys.stderr.isatty() else 0
    with progress_bar(total, "verifying the backup") as progress:
        result = run_restore(source, dest, key, origin, seal=seal_file, progress=progress)
    emit(result)


def register(group: click.Group) -> None:
    """Add this module's commands to ``group``."""
    for command in (seal, prove, verify_proof, backup, restore):
        group.add_command(command)
