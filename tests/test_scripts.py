"""The benchmark and example scripts still run (tiny sizes), so they cannot rot unseen."""

from __future__ import annotations

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[1]


@pytest.mark.slow
def test_bench_chain_quick_run_reports_every_workload() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_chain.py"), "--quick"],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    for expected in (
        "append one per transaction, ours",
        "append one per transaction, floor",
        "append batches of 100, raw",
        "ratio ours/raw",
        "; peak RSS",
        "ratio verify/floor",
        "load_session of 100 actions",
        "durability full",
        "build_causal_chain depth 300",
        "causality_stats over 2,000 actions",
        "metrics --by capability",
        "follow() from seq 0: 2,000 entries",
        "cassette tail (JSON lines to /dev/null): 2,000 entries",
        "record_seal on 2,000 journal entries",
        "first seal (no checkpoint), checked",
        "seal of the head 1,000 entries after it, unchecked",
    ):
        assert expected in out, out


def test_example_orchestrator_writes_a_ledger_the_readme_can_quote(tmp_path: Path) -> None:
    from click.testing import CliRunner

    from catalytic_cassette.cli import cli
    from catalytic_cassette.verify import verify_path

    db = tmp_path / "example.db"
    subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "example_orchestrator.py"), str(db)],
        check=True,
        capture_output=True,
        timeout=120,
    )
    assert verify_path(str(db)).ok
    readme = (ROOT / "README.md").read_text()
    runner = CliRunner()
    for command in (
        ["chain", "1d6d0ded-fcfc-52dd-ba49-269f6a6e42f9"],
        ["why", "08da1132-34e9-5f21-bea6-4fa38cdb56b7"],
        ["stats", "--plan", "incident-42"],
        ["tree", "--plan", "incident-42"],
        ["tree", "--plan", "incident-42", "--format", "mermaid"],
    ):
        result = runner.invoke(cli, ["--db", str(db), *command])
        assert result.exit_code == 0, result.output
        assert result.output.strip() in readme, command  # the README shows this very output


@pytest.mark.slow
def test_bench_cli_output_quick_run_reports_every_workload() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_cli_output.py"), "--quick"],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    for expected in ("actions --nl | head -1: median", "actions -t | head -1", "peak RSS"):
        assert expected in out, out


@pytest.mark.slow
def test_bench_cli_quick_run_pairs_every_command_and_the_batch() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_cli.py"), "--quick"],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    for command in ("--help", "status", "post", "claim", "complete"):
        assert f"\n{command} " in out, out
    for expected in ("CLI per call: 3 paired rounds", "batch: 60 operations", "an empty batch"):
        assert expected in out, out


@pytest.mark.slow
def test_bench_cli_trees_reports_each_tree() -> None:
    """Two trees (this checkout twice), complete: a claim then the timed complete."""
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "bench_cli_trees.py"),
            *("--trees", f"{ROOT},{ROOT / 'catalytic_cassette' / '..'}"),
            *("--command", "complete", "--rounds", "2", "--steps", "20"),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    lines = out.splitlines()
    assert lines[0] == "complete: CPU ms per call, median of 2 alternating rounds", out
    assert len(lines) == 3 and all(float(line.split()[0]) > 0 for line in lines[1:]), out


@pytest.mark.slow
def test_bench_levers_quick_run_reports_every_variant_and_statement() -> None:
    script = str(ROOT / "scripts" / "bench_levers.py")
    variants = "base,ckpt:1000,drop:cassette_journal_grow_tree,droptemp:cassette_steps_clock_guard"
    out = subprocess.run(
        [
            sys.executable,
            script,
            "--ops",
            "20",
            "--warm",
            "5",
            "--reps",
            "1",
            "--variants",
            variants,
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    for workload in ("cycle", "fused", "single", "batch"):
        for variant in variants.split(","):
            assert any(
                line.split()[1:3] == [workload, variant] and "us/op" in line
                for line in out.splitlines()
            ), out
    out = subprocess.run(
        [sys.executable, script, "--statements", "--ops", "20", "--warm", "5"],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    for workload in ("cycle", "fused"):  # the separate calls and the fused worker loop
        lines = [line for line in out.splitlines() if line.split()[1:2] == [workload]]
        assert any("INSERT INTO cassette_receipts" in line for line in lines), out
        assert any("UPDATE cassette_steps" in line for line in lines), out
        assert any("us per cycle in all" in line for line in lines), out
    python = subprocess.run(
        [sys.executable, script, "--python", "--ops", "50", "--reps", "1"],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    for call in ("claim_step", "complete_step", "complete_and_claim"):
        assert f"[python] {call} " in python and "us per call outside SQLite" in python, python
    commits = [line for line in out.splitlines() if line.endswith("COMMIT")]
    assert [line.split()[1] + " " + line.split()[4] for line in commits] == [
        "cycle x2",
        "fused x1",
    ], out


@pytest.mark.slow
def test_bench_verify_reports_both_levels_and_every_piece(tmp_path: Path) -> None:
    sys.path.insert(0, str(ROOT / "scripts"))
    try:
        from bench_chain import build_ledger
    finally:
        sys.path.remove(str(ROOT / "scripts"))
    ledger = tmp_path / "ledger.db"
    build_ledger(ledger, 3000, 1000, "normal")
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_verify.py"), str(ledger), "--reps", "1"],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    for expected in (
        "verify quick:",
        "verify full:",
        "private memory at the end",
        "floor (fetch, leaf, link):",
        "chain, tree, state and time streamed (the walk)",
        "pages and indexes (integrity_check, every table)",
        "verify full without the history judge:",
        "history by its own scan of the journal",
    ):
        assert expected in out, out


@pytest.mark.slow
def test_bench_history_reports_the_judges_cost_and_copys_rate(tmp_path: Path) -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "bench_history.py"),
            *("--entries", "2000", "--copy-entries", "1000", "--reps", "1"),
            *("--keep", str(tmp_path)),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=600,
    ).stdout
    for expected in (
        "full verify without the history judge:",
        "CPU seconds of the verifying process, with/without the judge:",
        "copy (replay through the law)",
        "a seal's history check, last 10000",
        "ratio verify/copy (rate):",
    ):
        assert expected in out, out


def test_the_raw_baseline_has_the_ledgers_tables_and_indexes_and_no_trigger(
    tmp_path: Path,
) -> None:
    """The benchmarks' raw sqlite3 side (scripts/bench_raw.py) writes the same tables with
    the same indexes as the ledger, so "raw with the same indexes" cannot drift."""
    import sqlite3

    from catalytic_cassette.connection import connect

    sys.path.insert(0, str(ROOT / "scripts"))
    import bench_raw

    ledger, raw = tmp_path / "ledger.db", tmp_path / "raw.db"
    connect(ledger).close()
    bench_raw.create(raw)

    def schema(path: Path, kinds: tuple[str, ...]) -> set[tuple[str, str, str | None]]:
        conn = sqlite3.connect(path)
        try:
            marks = ", ".join("?" for _ in kinds)
            rows = conn.execute(
                f"SELECT type, name, sql FROM sqlite_schema WHERE type IN ({marks})", kinds
            ).fetchall()
            return {(kind, name, sql) for kind, name, sql in rows}
        finally:
            conn.close()

    assert schema(raw, ("table", "index")) == schema(ledger, ("table", "index"))
    assert len(schema(ledger, ("index",))) > 20
    assert schema(raw, ("trigger",)) == set() != schema(ledger, ("trigger",))
    conn = bench_raw.connect_raw(raw, "full")
    try:
        assert conn.execute("PRAGMA journal_mode").fetchone() == ("wal",)
        assert conn.execute("PRAGMA synchronous").fetchone() == (2,)
        indexes = len(conn.execute("PRAGMA index_list('cassette_actions')").fetchall())
        described = bench_raw.describe(raw, ("cassette_actions",))
        assert described[0].startswith(f"cassette_actions: {indexes} indexes (")
    finally:
        conn.close()


@pytest.mark.slow
def test_bench_forms_quick_run_reports_every_pair() -> None:
    out = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_forms.py"), "--reps", "1", "--ops", "5"],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    for pair in ("claim", "complete", "post", "append", "batch"):
        lines = [line for line in out.splitlines() if line.split()[1:2] == [pair]]
        assert len(lines) == 2 and "cpu x" in lines[1], out


def test_bench_instructions_runs_every_contender_natively() -> None:
    """The instruction-count benchmark's workloads run (natively: valgrind counts them in
    the benchmark itself, not here), and an unknown workload is refused."""
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "bench_instructions.py"),
            *("--native", "--n1", "3", "--n2", "6"),
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    huey = ("huey",) if importlib.util.find_spec("huey") is not None else ()
    for workload, sides in (
        ("cycle", ("ours", "ours-fused", "raw", "floor", *huey)),
        ("post", ("ours", "raw", "floor")),
        ("single", ("ours", "raw", "floor")),
        ("batch", ("ours", "raw", "floor")),
    ):
        for side in sides:
            assert f"{workload:7s} {side:11s}" in out, out
    refused = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "bench_instructions.py"), "--workloads", "x"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert refused.returncode != 0 and "unknown workload" in refused.stderr


def test_the_floor_journal_is_a_hash_chain_of_every_write(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The instruction benchmark's floor does the work it claims: one chained entry per
    write of the cycle (a claim, a receipt, a commit), each naming its row."""
    import hashlib
    import json
    import sqlite3

    monkeypatch.syspath_prepend(str(ROOT / "scripts"))
    module = importlib.import_module("bench_instructions")
    module._cycle_floor(tmp_path, 5)
    (ledger,) = (tmp_path / "templates").glob("raw-*.db")
    conn = sqlite3.connect(ledger)
    rows = conn.execute("SELECT seq, body, leaf_hash, chain_hash FROM floor_journal ORDER BY seq")
    chain = bytes(32)
    seen = []
    for seq, body, leaf, linked in rows:
        assert leaf == hashlib.sha256(b"\x00" + body.encode()).digest()
        chain = hashlib.sha256(b"\x02" + seq.to_bytes(8, "big") + chain + leaf).digest()
        assert linked == chain
        entry = json.loads(body)
        seen.append((entry["table"], entry["op"], entry["row"].get("status")))
    conn.close()
    one_cycle = [
        ("cassette_steps", "UPDATE", "LEASED"),
        ("cassette_receipts", "INSERT", None),
        ("cassette_steps", "UPDATE", "COMMITTED"),
    ]
    assert seen == one_cycle * (module.WARM + 5)


@pytest.mark.slow
def test_bench_tree_heal_quick_run_heals_and_reports_each_k() -> None:
    out = subprocess.run(
        [
            sys.executable,
            str(ROOT / "scripts" / "bench_tree_heal.py"),
            "--ks",
            "0,2",
            "--reps",
            "1",
        ],
        check=True,
        capture_output=True,
        text=True,
        timeout=300,
    ).stdout
    assert "skipped    0:" in out and "skipped    2:" in out, out
    assert "per healed block" in out, out
