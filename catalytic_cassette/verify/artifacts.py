"""Artifact files: each one an action refers to exists and hashes to its reference."""

from __future__ import annotations

import sqlite3
from pathlib import Path

from .findings import Collector, Finding, FindingKind


def check_artifacts(conn: sqlite3.Connection, out: Collector, db_dir: Path) -> None:
    import hashlib

    from ..payloads import loads

    query = (
        "SELECT action_id, arguments_artifact, result_artifact FROM cassette_actions"
        " WHERE arguments_artifact IS NOT NULL OR result_artifact IS NOT NULL ORDER BY action_seq"
    )
    for action_id, *refs in conn.execute(query):
        for ref_json in refs:
            if ref_json is None:
                continue
            ref = loads(ref_json)
            path = db_dir / str(ref.get("path", ""))
            if not path.is_file():
                out.add(
                    Finding(
                        FindingKind.ARTIFACT_MISSING,
                        f"artifact {ref.get('path')} is missing",
                        None,
                        "cassette_actions",
                        action_id,
                    )
                )
                continue
            digest = hashlib.sha256()
            size = 0
            with path.open("rb") as handle:
                for chunk in iter(lambda: handle.read(1 << 20), b""):
                    digest.update(chunk)
                    size += len(chunk)
            if digest.hexdigest() != ref.get("sha256") or size != ref.get("size"):
                out.add(
                    Finding(
                        FindingKind.ARTIFACT_ALTERED,
                        f"artifact {ref.get('path')} was altered",
                        None,
                        "cassette_actions",
                        action_id,
                    )
                )
