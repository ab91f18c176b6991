"""Commands for anchors: seal, prove, verify-proof, backup, restore."""

from __future__ import annotations

import sqlite3
import sys
from collections.abc import Iterator
from contextlib import contextmanager

import click

from .boundary import EXIT_CANNOT_VERIFY, emit
from .commands import Settings, cli


@contextmanager
def _reading(ctx: click.Context) -> Iterator[sqlite3.Connection]:
    """A read-only connection to an existing ledger: proving never creates or changes it."""
    from ..connection import connect_readonly
    from ..errors import CassetteError, ErrorCode
    from ..migrate import current_version, schema_version

    settings = ctx.find_object(Settings)
    assert settings is not None
    conn = connect_readonly(settings.db)
    try:
        version = schema_version(conn)
        if version < current_version():
            raise CassetteError(
                ErrorCode.SCHEMA_OUTDATED,
                f"schema version {version}: run `cassette migrate` first",
            )
        yield conn
    finally:
        conn.close()


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


@cli.command()
@click.option("--key", "key_path", required=True, help="Ed25519 private key (cassette keygen).")
@click.option(
    "--out", default=None, help="Write the seal to this file, or into this directory (*.seal)."
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
    from ..seals import record_seal, require_ledger, write_seal_file
    from ..signing import load_private

    settings = ctx.find_object(Settings)
    assert settings is not None
    require_ledger(settings.db)
    key = load_private(key_path)  # before opening: a bad key changes nothing
    with MessageCassette(settings.db, durability=settings.durability) as cassette:
        sealed = record_seal(cassette.conn, key, now_ms=cassette.now_ms(), origin=origin)
    written = write_seal_file(sealed, out) if out is not None else None
    emit({**sealed.to_dict(), "path": str(written) if written else None})


@cli.group()
def prove() -> None:
    """Portable proofs that an auditor checks offline with `cassette verify-proof`."""


def _inclusion(ctx: click.Context, seq: int, seal_file: str | None, out: str | None) -> None:
    from ..proofs import prove_inclusion

    note = _read_seal(seal_file) if seal_file is not None else None
    with _reading(ctx) as conn:
        proof = prove_inclusion(conn, seq, note)
    _write_or_print(proof.to_bytes(), out, {"index": seq, "path_length": len(proof.path)})


@prove.command("inclusion")
@click.argument("seq", type=click.IntRange(min=0))
@click.option("--seal", "seal_file", default=None, help="Seal file (default: newest recorded).")
@click.option("--out", default=None, help="Write the proof here (default: stdout).")
@click.pass_context
def prove_inclusion_command(
    ctx: click.Context, seq: int, seal_file: str | None, out: str | None
) -> None:
    """Proof (c2sp.org/tlog-proof, entry body as extra) that journal entry SEQ is sealed."""
    _inclusion(ctx, seq, seal_file, out)


@prove.command("receipt")
@click.argument("receipt_id", type=click.IntRange(min=1))
@click.option("--seal", "seal_file", default=None, help="Seal file (default: newest recorded).")
@click.option("--out", default=None, help="Write the proof here (default: stdout).")
@click.pass_context
def prove_receipt(
    ctx: click.Context, receipt_id: int, seal_file: str | None, out: str | None
) -> None:
    """Inclusion proof of the journal entry that committed receipt RECEIPT_ID."""
    from ..proofs import receipt_entry

    with _reading(ctx) as conn:
        seq = receipt_entry(conn, receipt_id)
    _inclusion(ctx, seq, seal_file, out)


@prove.command("consistency")
@click.argument("old_seal", type=click.Path(exists=True, dir_okay=False))
@click.argument("new_seal", type=click.Path(exists=True, dir_okay=False), required=False)
@click.option("--out", default=None, help="Write the proof here (default: stdout).")
@click.pass_context
def prove_consistency_command(
    ctx: click.Context, old_seal: str, new_seal: str | None, out: str | None
) -> None:
    """RFC 9162 proof that OLD_SEAL's tree is a prefix of NEW_SEAL's (or of the head)."""
    import orjson

    from ..proofs import prove_consistency

    new_note = _read_seal(new_seal) if new_seal is not None else None
    with _reading(ctx) as conn:
        doc = prove_consistency(conn, _read_seal(old_seal), new_note)
    data = orjson.dumps(doc, option=orjson.OPT_INDENT_2) + b"\n"
    _write_or_print(data, out, {"old_size": doc["old_size"], "new_size": doc["new_size"]})


@cli.command("verify-proof")
@click.argument("proof_file", type=click.Path(exists=True, dir_okay=False))
@click.option("--public-key", required=True, help="The ledger's Ed25519 public key (PEM).")
@click.option("--origin", required=True, help="The ledger's origin, as you expect it.")
def verify_proof(proof_file: str, public_key: str, origin: str) -> None:
    """Check a proof file offline, without the ledger. Exit 0 valid, 1 invalid, 3 cannot
    check (another key or origin, or not a proof)."""
    from ..errors import CassetteError
    from ..proofs import check_proof_file
    from ..safe_files import PROOF_MAX_BYTES, read_file
    from ..signing import load_public

    try:
        data = read_file(proof_file, what="proof file", max_bytes=PROOF_MAX_BYTES)
        key = load_public(public_key)
    except CassetteError as error:
        error.exit_code = EXIT_CANNOT_VERIFY  # nothing was checked
        raise
    result = check_proof_file(data, origin, key)
    emit(result.to_dict())
    if not result.ok:
        unverifiable = result.problem in {"unknown_key", "wrong_origin", "malformed"}
        click.echo(f"FAIL: {result.problem}", err=True)
        sys.exit(EXIT_CANNOT_VERIFY if unverifiable else 1)
    click.echo(f"PASS: {result.kind} proof holds", err=True)


@cli.command()
@click.argument("dest")
@click.option("--key", "key_path", required=True, help="Ed25519 private key that seals the copy.")
@click.option("--origin", default=None, help="The ledger's origin (default: its own).")
@click.pass_context
def backup(ctx: click.Context, dest: str, key_path: str, origin: str | None) -> None:
    """Snapshot the ledger to DEST while writers keep working, verify the copy, and write
    its seal to DEST.seal. Nothing is left behind if any step fails."""
    from ..backup import backup as run_backup
    from ..signing import load_private

    settings = ctx.find_object(Settings)
    assert settings is not None
    emit(run_backup(settings.db, dest, load_private(key_path), origin=origin))


@cli.command()
@click.argument("source", type=click.Path(exists=True, dir_okay=False))
@click.argument("dest")
@click.option("--public-key", required=True, help="Public key the backup's seal must verify under.")
@click.option("--origin", required=True, help="The origin the seal must name.")
@click.option("--seal", "seal_file", default=None, help="Seal file (default: SOURCE.seal).")
def restore(source: str, dest: str, public_key: str, origin: str, seal_file: str | None) -> None:
    """Copy backup SOURCE to DEST only if it verifies and is exactly what its seal signed."""
    from ..backup import restore as run_restore
    from ..signing import load_public

    emit(run_restore(source, dest, load_public(public_key), origin, seal=seal_file))
