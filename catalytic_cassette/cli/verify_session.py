"""`cassette verify --session S`: one session checked, without reading the rest of the
ledger (``session_verify``)."""

from __future__ import annotations

import click

from .boundary import EXIT_CANNOT_VERIFY, emit


def verify_session(
    ctx: click.Context,
    db: str,
    session_id: str,
    *,
    as_json: bool,
    against: str | None,
    seal_key_path: str | None,
    origin: str | None,
    action_key_path: str | None,
) -> None:
    """`cassette verify --session S`: one session, without reading the rest of the file."""
    from ..session_verify import verify_session_path
    from ..signing import load_public

    # Under `verify`, a refusal here exits 3 (the boundary): nothing was checked.
    seal_key = load_public(seal_key_path) if against and seal_key_path else None
    key = load_public(action_key_path) if action_key_path is not None else None
    anchors = None
    if against is not None:
        from ..anchor import load_anchors

        anchors = load_anchors(against)
    report = verify_session_path(
        db,
        session_id,
        public_key=key,
        anchors=anchors,
        seal_key=seal_key,
        origin=origin,
    )
    if as_json:
        emit(report.to_dict())
    else:
        for f in report.findings:
            where = f" seq={f['seq']}" if f["seq"] is not None else ""
            click.echo(f"error: {f['kind']}{where} action[{f['action_id']}]: {f['detail']}")
        for anchor in report.anchors:
            click.echo(f"anchor: {anchor['status']} size={anchor['size']} {anchor['path']}")
        for note in report.notes:
            click.echo(f"note: {note}")
    if not report.ok:
        click.echo(f"FAIL: {len(report.findings)} issue(s) found", err=True)
        ctx.exit(1)
    if report.unverifiable:
        click.echo("CANNOT VERIFY: an anchor could not be checked", err=True)
        ctx.exit(EXIT_CANNOT_VERIFY)
    click.echo(f"PASS: session {session_id} verified ({report.actions} actions)", err=True)
