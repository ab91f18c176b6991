"""Artifact files: each one an action refers to, found by its hash under the artifacts
folder only (never by a stored path), exists as a regular file and hashes to its reference."""

from __future__ import annotations

import sqlite3
from contextlib import ExitStack
from pathlib import Path

from .findings import Collector, Finding, FindingKind

_DETAILS = {"artifact_missing": "is missing", "artifact_altered": "was altered"}


def check_artifacts(conn: sqlite3.Connection, out: Collector, artifact_root: Path) -> None:
    from ..artifacts import check_file
    from ..errors import CassetteError
    from ..payloads import loads
    from ..safe_files import lexists, open_directory

    query = (
        "SELECT action_id, arguments_artifact, result_artifact FROM cassette_actions NOT INDEXED"
        " WHERE arguments_artifact IS NOT NULL OR result_artifact IS NOT NULL ORDER BY action_seq"
    )
    with ExitStack() as stack:
        dir_fd: int | None = None
        if lexists(artifact_root):  # absent: every artifact is missing
            dir_fd = stack.enter_context(open_directory(artifact_root, what="artifacts folder"))
        for action_id, *refs in conn.execute(query):
            for ref_json in refs:
                if ref_json is None:
                    continue
                try:
                    ref = loads(ref_json)
                except CassetteError:  # stored by a client the API could not have been
                    ref = None
                problem = (
                    "artifact_missing"
                    if dir_fd is None or not isinstance(ref, dict)
                    else check_file(dir_fd, ref, artifact_root)
                )
                if problem is not None:
                    named = ref.get("sha256") if isinstance(ref, dict) else ref
                    out.add(
                        Finding(
                            FindingKind(problem),
                            f"artifact {named} {_DETAILS[problem]}",
                            None,
                            "cassette_actions",
                            action_id,
                        )
                    )
