"""The `cassette` CLI on a PostgreSQL ledger: the same commands, JSON and exit codes as on
a file; `--db` (or CASSETTE_DB) takes a postgresql:// URL."""

from __future__ import annotations

import json
import subprocess
import sys
from typing import Any

import pytest
from click.testing import CliRunner, Result

from catalytic_cassette.cli import cli
from catalytic_cassette.postgresql import sqlfiles


def invoke(url: str, *args: str, stdin: str | None = None) -> Result:
    return CliRunner().invoke(cli, ["--db", url, *args], input=stdin)


def out(result: Result) -> Any:
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
    return json.loads(result.stdout)


def test_init_migrate_and_a_whole_cycle(pg_database: str) -> None:
    latest = len(sqlfiles.migrations())
    check = invoke(pg_database, "migrate", "--check")
    assert check.exit_code == 1 and json.loads(check.stdout)["pending"] == list(
        range(1, latest + 1)
    )
    assert out(invoke(pg_database, "init")) == {
        "db": pg_database,
        "created": True,
        "schema_version": latest,
    }
    assert out(invoke(pg_database, "init"))["created"] is False
    assert out(invoke(pg_database, "migrate", "--check"))["pending"] == []
    post = ("post", "--run-id", "r", "--source", "USER", "--payload", "-")
    posted = out(invoke(pg_database, *post, stdin='{"a": 1}'))
    assert posted == {"message_id": 1, "job_id": 1}
    lease = out(invoke(pg_database, "claim", "--run-id", "r", "--worker", "w"))
    assert (lease["step_id"], lease["fencing_token"], lease["payload"]) == (1, 1, {"a": 1})
    done = invoke(
        pg_database,
        "complete",
        "--run-id",
        "r",
        "--step",
        "1",
        "--worker",
        "w",
        "--token",
        "1",
        "--outcome",
        "SUCCESS",
        "--receipt",
        "-",
        stdin="{}",
    )
    assert out(done) == {"receipt_id": 1, "step_id": 1}
    assert out(invoke(pg_database, "status", "--run-id", "r"))["steps"]["COMMITTED"] == 1


def test_refusals_have_the_same_codes_and_exit_status(pg_ledger: str) -> None:
    empty = invoke(pg_ledger, "claim", "--run-id", "r", "--worker", "w")
    assert empty.exit_code == 1 and empty.stderr.startswith("error: NO_PENDING_STEPS: ")
    stale = invoke(
        pg_ledger,
        "complete",
        "--run-id",
        "r",
        "--step",
        "9",
        "--worker",
        "w",
        "--token",
        "1",
        "--outcome",
        "SUCCESS",
        "--receipt",
        "-",
        stdin="{}",
    )
    assert stale.exit_code == 1 and stale.stderr.startswith("error: STEP_NOT_FOUND: ")


def test_an_unreachable_server_is_cannot_open_without_a_traceback(pg_server: str) -> None:
    url = "postgresql://nobody@/nodb?host=/nonexistent-socket-dir&port=1"
    result = subprocess.run(
        [sys.executable, "-m", "catalytic_cassette", "--db", url, "status", "--run-id", "r"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert result.returncode == 1, result
    assert result.stderr.startswith("error: CANNOT_OPEN: ") and "Traceback" not in result.stderr
    assert result.stdout == ""


def test_the_url_comes_from_cassette_db_too(pg_ledger: str) -> None:
    result = CliRunner().invoke(cli, ["status", "--run-id", "r"], env={"CASSETTE_DB": pg_ledger})
    assert out(result)["messages"] == 0


@pytest.mark.parametrize(
    ("args", "code"),
    [
        (("export", "--plan", "p"), "NOT_FOUND"),  # ported (the chain's extras)
        (("plan", "show", "p"), "NOT_FOUND"),
    ],
)
def test_the_last_ported_commands_answer_as_on_sqlite(
    pg_ledger: str, args: tuple[str, ...], code: str
) -> None:
    """The commands ported last answer an empty PostgreSQL ledger as they answer an empty
    file (NOT_FOUND, exit 1): none takes the URL for a file name or refuses the backend."""
    result = invoke(pg_ledger, *args)
    assert result.exit_code == 1, result.stderr
    assert result.stderr.startswith(f"error: {code}: ")


def test_tail_follows_a_postgres_journal(pg_ledger: str) -> None:
    """`tail` prints the server's entries as JSON lines, then (with --since-seq) only the
    ones after; the same restart rule as on a file."""
    from catalytic_cassette import MessageCassette

    with MessageCassette(pg_ledger) as cassette:
        cassette.post_message({"a": 1}, "r", "USER")
    first = invoke(pg_ledger, "tail")
    lines = [json.loads(line) for line in first.stdout.splitlines()]
    assert [(x["seq"], x["table"]) for x in lines] == [
        (0, "cassette_messages"),
        (1, "cassette_jobs"),
        (2, "cassette_steps"),
    ]
    with MessageCassette(pg_ledger) as cassette:
        cassette.claim_step("r", "w")
    more = invoke(pg_ledger, "tail", "--since-seq", "2", "--follow", "--timeout", "0.3")
    assert [json.loads(line)["row"]["status"] for line in more.stdout.splitlines()] == ["LEASED"]


def test_reasoning_commands_answer_on_postgres(pg_ledger: str) -> None:
    """metrics, validate-chain and suggest-causes reach the PostgreSQL chain."""
    from catalytic_cassette.chain import CausalChain

    with CausalChain(pg_ledger) as chain:
        first = chain.append_action(
            {
                "plan_id": "p",
                "intent_id": "i",
                "action_type": "InternalStep",
                "function_name": "f",
                "arguments": [1],
                "duration_ms": 5,
            }
        )
    rows = invoke(pg_ledger, "metrics", "--by", "plan", "--json")
    assert [(r["plan"], r["count"]) for r in json.loads(rows.stdout)] == [("p", 1)]
    checked = invoke(pg_ledger, "validate-chain", first.action_id)
    assert json.loads(checked.stdout)["ok"] is True
    suggested = json.loads(invoke(pg_ledger, "suggest-causes", "--plan", "p").stdout)
    assert [s["action_id"] for s in suggested] == [first.action_id]
    assert suggested[0]["reason"].startswith("same plan 'p'")
