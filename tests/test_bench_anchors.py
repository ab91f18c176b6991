"""scripts/bench_anchors.py still runs (tiny sizes) and reports every workload, so it cannot
rot unseen. It checks the output is well formed, never how fast anything was."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_anchors_quick_run_reports_every_workload(tmp_path: Path) -> None:
    results = tmp_path / "anchors.json"
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "bench_anchors.py"),
            "--quick",
            "--json",
            str(results),
            "--tmpdir",
            str(tmp_path),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    ).stdout
    for expected in (
        "python 3.",
        "durability normal (synchronous=NORMAL) and full (synchronous=FULL)",
        "action 257 bytes of JSON input",
        "DROP TRIGGER cassette_journal_grow_tree",
        "append_action one per transaction (300 per rep), with tree",
        "append_action one per transaction (300 per rep), without",
        "append_actions batches of 100 (300 per rep), with tree",
        "post_message one per transaction (100 per rep; 3 journal entries each), without",
        "ratio with tree / without",
        "added by the tree",
        "built a ledger of 3,000 journal entries",
        "StoredTree.root(n), n = 3,000",
        "seal (record_seal + write_seal_file) of the head",
        "inclusion proof under a seal of",
        "consistency proof, seals of",
        "offline check (check_proof_file)",
        "verify plain    1,005 journal rows",
        "verify anchored 3,005 journal rows",
        "rows/s",
        "peak RSS",
        "ratio of times anchored / plain",
        "== targets",
    ):
        assert expected in out, f"{expected!r} missing from:\n{out}"
    # Each of 3 workloads x 2 durabilities has its ratio and verdict: well formed, any value.
    verdicts = re.findall(
        r"ratio with tree / without = \d+\.\d\d \(target >= 0\.80: (met|MISSED)\)", out
    )
    assert len(verdicts) == 6, out
    data = json.loads(results.read_text())
    assert {"1_appends", "2_anchors", "2_verify", "3_bytes"} <= set(data["workloads"])
    appends = data["workloads"]["1_appends"]
    assert {f"{k}_{d}" for k in ("single", "batched", "post") for d in ("normal", "full")} == set(
        appends
    )
    for case in appends.values():
        with_tree, without = case["sizes"]["with tree"], case["sizes"]["without"]
        assert with_tree["entries"] == without["entries"] > 0
        assert with_tree["tree_nodes"] > 0 and without["tree_nodes"] == 0
    assert set(data["workloads"]["2_verify"]) == {"1005", "3005"}
    for summary in data["workloads"]["2_verify"].values():
        assert set(summary) >= {"plain", "anchored", "ratio_anchored_plain"}
    assert len(data["targets"]) == 6
    assert not list(tmp_path.glob("bench-anchors-*")), "scratch files were left behind"
