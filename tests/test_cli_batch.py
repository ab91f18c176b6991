"""`cassette batch`: JSON lines in and out, one transaction per line, the CLI's codes per
line, the batch going on after a refusal, and one exit status for the whole batch."""

from __future__ import annotations

import io
import json
import os
import select
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner, Result

from catalytic_cassette import MessageCassette
from catalytic_cassette.cli import batch as batch_module
from catalytic_cassette.cli import cli
from catalytic_cassette.payloads import MAX_PAYLOAD_BYTES

pytestmark = pytest.mark.both_backends

RUN = "r1"
TWO_STEPS = {"jobs": [{"intent": "i", "steps": [{"n": 1}, {"n": 2}]}]}


def run(db: Path | str, *lines: Any, raw: str | None = None) -> tuple[Result, list[Any]]:
    """Invoke `cassette batch` with ``lines`` (JSON-encoded unless str) on stdin."""
    text = (
        raw
        if raw is not None
        else "".join((line if isinstance(line, str) else json.dumps(line)) + "\n" for line in lines)
    )
    result = CliRunner().invoke(cli, ["--db", str(db), "batch"], input=text)
    answers = [json.loads(line) for line in result.stdout.splitlines()]
    return result, answers


def line(command: str, **args: Any) -> dict[str, Any]:
    return {"command": command, "args": args}


def counts(db: Path | str) -> dict[str, Any]:
    with MessageCassette(db, read_only=True) as cassette:
        return cassette.status(RUN)


def test_every_command_answers_what_the_cli_prints(db_path: Path) -> None:
    result, answers = run(
        db_path,
        line("post", payload=TWO_STEPS, run_id=RUN, source="USER", idempotency_key="k1"),
        line("claim", run_id=RUN, worker="w1", ttl=60),
        line("status", run_id=RUN),
    )
    assert result.exit_code == 0, result.output
    assert result.stderr == ""
    assert [a["line"] for a in answers] == [1, 2, 3] and all(a["ok"] for a in answers)
    posted, lease, status = (a["result"] for a in answers)
    assert set(posted) == {"message_id", "job_id"}
    assert lease["payload"] == {"n": 1} and lease["fencing_token"] == 1
    assert status["steps"] == {"PENDING": 1, "LEASED": 1, "COMMITTED": 0}
    step, token = lease["step_id"], lease["fencing_token"]
    result, answers = run(
        db_path,
        line(
            "complete",
            run_id=RUN,
            step=step,
            worker="w1",
            token=token,
            receipt={"ok": True},
            outcome="SUCCESS",
            claim_next=True,
            ttl=30,
        ),
        line("requeue", run_id=RUN),
        line("post", payload=TWO_STEPS, run_id=RUN, source="USER", idempotency_key="k1"),
    )
    assert result.exit_code == 0, result.output
    completed, requeued, again = (a["result"] for a in answers)
    assert completed["receipt_id"] >= 1 and completed["next"]["payload"] == {"n": 2}
    assert requeued == {"run_id": RUN, "steps": []}  # the new lease has not expired
    assert again == posted  # the same key and payload: the first post's ids
    # the CLI itself prints the same documents
    cli_status = CliRunner().invoke(cli, ["--db", str(db_path), "status", "--run-id", RUN])
    _, answers = run(db_path, line("status", run_id=RUN))
    assert answers[0]["result"] == json.loads(cli_status.stdout)


def test_a_refusal_mid_batch_keeps_the_earlier_lines_and_writes_nothing_itself(
    db_path: Path,
) -> None:
    result, answers = run(
        db_path,
        line("post", payload=TWO_STEPS, run_id=RUN, source="USER", idempotency_key="k"),
        line("claim", run_id=RUN, worker="w1"),
        # the same key with another payload: refused, no message written
        line("post", payload={"other": 1}, run_id=RUN, source="USER", idempotency_key="k"),
        line(
            "complete",
            run_id=RUN,
            step=1,
            worker="w1",
            token=7,
            receipt={"ok": True},
            outcome="SUCCESS",
        ),
        line("claim", run_id=RUN, worker="w2"),
    )
    assert result.exit_code == 1, result.output
    assert result.stderr == (
        "error: IDEMPOTENCY_CONFLICT: 0 malformed and 2 refused of 5 lines"
        " (the first refused: line 3)\n"
    )
    assert [a["ok"] for a in answers] == [True, True, False, False, True]
    assert answers[2]["error"]["code"] == "IDEMPOTENCY_CONFLICT"
    assert answers[3]["error"]["code"] == "STALE_FENCING_TOKEN"
    assert set(answers[3]["error"]) == {"code", "message"}
    status = counts(db_path)
    assert status["messages"] == 1  # the refused post left no message
    assert status["steps"] == {"PENDING": 0, "LEASED": 2, "COMMITTED": 0}
    assert status["receipts"] == {"SUCCESS": 0, "FAILURE": 0, "ABORTED": 0}


def test_the_codes_are_the_cli_s(db_path: Path) -> None:
    run(db_path, line("post", payload={"t": 1}, run_id=RUN, source="USER"))
    for args, batch_line in (
        (["claim", "--run-id", "no", "--worker", "w"], line("claim", run_id="no", worker="w")),
        (["status", "--run-id", ""], line("status", run_id="")),
        (
            ["claim", "--run-id", RUN, "--worker", "w", "--ttl", "-1"],
            line("claim", run_id=RUN, worker="w", ttl=-1),
        ),
    ):
        direct = CliRunner().invoke(cli, ["--db", str(db_path), *args])
        _, answers = run(db_path, batch_line)
        assert direct.exit_code == 1
        assert direct.stderr.startswith(f"error: {answers[0]['error']['code']}: ")


MALFORMED = [
    ("not json", "is not JSON"),
    ("[1, 2]", "a line is a JSON object, not list"),
    (json.dumps({"command": "fly", "args": {}}), "one of: claim, complete, post, requeue, status"),
    (json.dumps({"args": {}}), "unknown command missing or not a string"),
    (json.dumps({"command": "claim", "args": {"run_id": RUN}}), "claim needs worker"),
    (json.dumps(line("claim", run_id=RUN, worker="w", when=1)), "claim takes no argument 'when'"),
    (json.dumps(line("claim", run_id=RUN, worker="w", ttl="60")), "ttl must be a number"),
    (json.dumps(line("claim", run_id=7, worker="w")), "run_id must be a string"),
    (json.dumps({"command": "claim", "args": [RUN]}), "args is a JSON object, not list"),
    (json.dumps({"command": "status", "args": {"run_id": RUN}, "x": 1}), "unknown key 'x'"),
    (
        json.dumps(
            line(
                "complete",
                run_id=RUN,
                step=True,
                worker="w",
                token=1,
                receipt={},
                outcome="SUCCESS",
            )
        ),
        "step must be an integer",
    ),
    (
        json.dumps(
            line(
                "complete",
                run_id=RUN,
                step=1,
                worker="w",
                token=1,
                receipt={},
                outcome="SUCCESS",
                ttl=5,
            )
        ),
        "give claim_next",
    ),
    ("\udcff", "the line is not valid UTF-8"),
]


@pytest.mark.parametrize(("text", "says"), MALFORMED, ids=[m[1] for m in MALFORMED])
def test_a_malformed_line_is_usage_and_the_batch_goes_on(
    db_path: Path, text: str, says: str
) -> None:
    raw = f"{json.dumps(line('post', payload={'t': 1}, run_id=RUN, source='USER'))}\n{text}\n"
    raw += json.dumps(line("status", run_id=RUN)) + "\n"
    result = CliRunner().invoke(
        cli, ["--db", str(db_path), "batch"], input=raw.encode("utf-8", "surrogateescape")
    )
    answers = [json.loads(a) for a in result.stdout.splitlines()]
    assert result.exit_code == 2, result.output
    assert result.stderr == (
        "error: USAGE: 1 malformed and 0 refused of 3 lines (the first malformed: line 2)\n"
    )
    assert [a["ok"] for a in answers] == [True, False, True]
    assert answers[1]["line"] == 2 and answers[1]["error"]["code"] == "USAGE"
    assert says in answers[1]["error"]["message"]
    assert answers[2]["result"]["messages"] == 1


def test_usage_outranks_a_refusal_and_blank_lines_are_skipped(db_path: Path) -> None:
    result, answers = run(
        db_path,
        line("claim", run_id=RUN, worker="w"),  # NO_PENDING_STEPS: refused
        "",
        "   ",
        "{}",
    )
    assert result.exit_code == 2
    assert result.stderr.startswith("error: USAGE: 1 malformed and 1 refused of 2 lines")
    assert [(a["line"], a["error"]["code"]) for a in answers] == [
        (1, "NO_PENDING_STEPS"),
        (4, "USAGE"),
    ]
    empty, answers = run(db_path, raw="")
    assert empty.exit_code == 0 and answers == []


def test_a_payload_that_is_not_an_object_is_refused_as_by_post(db_path: Path) -> None:
    result, answers = run(db_path, line("post", payload=[1], run_id=RUN, source="USER"))
    assert result.exit_code == 1
    assert answers[0]["error"]["code"] == "INVALID_PAYLOAD"
    assert counts(db_path)["messages"] == 0


def test_an_overlong_line_is_refused_and_ends_the_input(
    db_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Read to its cap and no further, like every JSON input of the CLI: an endless
    device or a huge file never hangs the batch. The lines before it stand."""
    assert batch_module.MAX_LINE_BYTES == MAX_PAYLOAD_BYTES  # a line holds a payload file
    monkeypatch.setattr(batch_module, "MAX_LINE_BYTES", 120)
    first = line("post", payload={"t": 1}, run_id=RUN, source="USER")
    long_line = json.dumps(line("post", payload={"t": "x" * 200}, run_id=RUN, source="USER"))
    result, answers = run(db_path, first, long_line, line("status", run_id=RUN))
    assert result.exit_code == 1
    assert answers[0]["ok"] is True
    assert answers[1]["line"] == 2 and answers[1]["error"]["code"] == "PAYLOAD_TOO_LARGE"
    assert len(answers) == 2  # nothing after it was read
    assert counts(db_path)["messages"] == 1


def test_input_from_a_file_and_a_missing_file(db_path: Path, tmp_path: Path) -> None:
    lines = tmp_path / "lines.jsonl"
    lines.write_text(json.dumps(line("post", payload={"t": 1}, run_id=RUN, source="USER")) + "\n")
    result = CliRunner().invoke(cli, ["--db", str(db_path), "batch", "--input", str(lines)])
    assert result.exit_code == 0 and json.loads(result.stdout)["ok"] is True
    missing = CliRunner().invoke(
        cli, ["--db", str(db_path), "batch", "--input", str(tmp_path / "none")]
    )
    assert missing.exit_code == 2 and missing.stderr.startswith("error: USAGE: ")
    assert counts(db_path)["messages"] == 1


def _answer_within(process: subprocess.Popen[bytes], seconds: float) -> Any:
    """The next answer line of ``process``, or a failure once ``seconds`` passed without
    one (an answer held back until more input came would hang a script forever)."""
    assert process.stdout is not None
    ready, _, _ = select.select([process.stdout], [], [], seconds)
    assert ready, f"no answer within {seconds} s"
    return json.loads(process.stdout.readline())


def test_a_script_that_waits_for_each_answer_gets_it_before_writing_on(db_path: Path) -> None:
    """Answers are flushed when the batch would wait for input, not after every line: a
    script in conversation with the batch (the next line made from the last answer)
    still gets every answer as soon as its line is done."""
    command = [sys.executable, "-m", "catalytic_cassette", "--db", str(db_path), "batch"]
    process = subprocess.Popen(
        command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.PIPE
    )
    assert process.stdin is not None
    try:
        for request in (
            line("post", payload=TWO_STEPS, run_id=RUN, source="USER"),
            line("claim", run_id=RUN, worker="w1"),
        ):
            process.stdin.write(json.dumps(request).encode() + b"\n")
            process.stdin.flush()
            answer = _answer_within(process, 60)
            assert answer["ok"] is True, answer
        lease = answer["result"]
        done = line(
            "complete",
            run_id=RUN,
            step=lease["step_id"],
            worker="w1",
            token=lease["fencing_token"],
            receipt={"ok": True},
            outcome="SUCCESS",
        )
        process.stdin.write(json.dumps(done).encode() + b"\n")
        process.stdin.flush()
        assert _answer_within(process, 60)["line"] == 3
        process.stdin.close()
        assert process.wait(timeout=60) == 0
    finally:
        if process.poll() is None:
            process.kill()
            process.wait()
    assert counts(db_path)["receipts"]["SUCCESS"] == 1


def test_whether_a_read_may_wait() -> None:
    """An empty pipe may wait; one with data, or at its end, does not; a stream in memory
    never does."""
    read_end, write_end = os.pipe()
    with os.fdopen(read_end, "rb") as reader:
        would_wait = batch_module._would_wait(reader)
        assert would_wait() is True
        os.write(write_end, b"{}\n")
        assert would_wait() is False
        assert reader.readline() == b"{}\n"
        assert would_wait() is True
        os.close(write_end)
        assert would_wait() is False  # the end of input: a read returns at once
        assert reader.readline() == b""
    assert batch_module._would_wait(io.BytesIO(b"{}\n"))() is False
