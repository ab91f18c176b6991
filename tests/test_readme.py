"""README.md runs as written: every bash, sh, python and console block, in order, in one
empty directory, as a new user following it would; shown `$` output is compared.
A block marked ``<!-- needs: the clone's scripts/ -->`` runs in a second directory that
has the clone's ``scripts/`` (as the README tells its reader); every other block runs in
one that holds nothing but what the blocks before it wrote.

A block that is not meant to run is marked by an HTML comment on the line before it,
``<!-- not run: reason -->``; there must be few of them (counted below). A block the
README shows as a file's content is marked ``<!-- file: NAME -->`` and written to NAME
when its turn comes; one that shows a command's output (a diagram, say) is marked
``<!-- output of: COMMAND -->`` and compared with what COMMAND prints.
Sections added to the README are picked up without touching this file.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
README = ROOT / "README.md"
RUNNABLE = {"bash", "sh", "python", "console"}
SHOWN_ONLY = {"", "sql", "mermaid", "text", "toml"}  # never executed: code or output shown
NOT_RUN = re.compile(r"^<!-- not run: (.+) -->$")
FILE = re.compile(r"^<!-- file: ([\w.-]+) -->$")
OUTPUT_OF = re.compile(r"^<!-- output of: (.+) -->$")
NEEDS_CLONE = "<!-- needs: the clone's scripts/ -->"
FENCE = re.compile(r"^```([\w-]*)\s*$")
EXPECTED_NOT_RUN = 2  # installing the package, the test suite itself
TIMEOUT_SECONDS = 180


@dataclass(frozen=True)
class Block:
    line: int  # of the opening fence, 1-based
    language: str
    text: str
    not_run: str | None  # the reason, when marked
    file_name: str | None = None  # written to this file, when marked
    output_of: str | None = None  # the command whose output the block shows, when marked
    needs_clone: bool = False  # runs where the clone's scripts/ is


def readme_blocks(text: str) -> list[Block]:
    blocks: list[Block] = []
    lines = text.splitlines()
    index = 0
    while index < len(lines):
        opening = FENCE.match(lines[index])
        if opening is None:
            index += 1
            continue
        start = index
        index += 1
        body: list[str] = []
        while index < len(lines) and lines[index].strip() != "```":
            body.append(lines[index])
            index += 1
        comments = []  # the marker lines right above the fence
        above = start - 1
        while above >= 0 and lines[above].startswith("<!-- "):
            comments.append(lines[above])
            above -= 1
        marker = next(filter(None, map(NOT_RUN.match, comments)), None)
        named = next(filter(None, map(FILE.match, comments)), None)
        output = next(filter(None, map(OUTPUT_OF.match, comments)), None)
        blocks.append(
            Block(
                start + 1,
                opening.group(1),
                "\n".join(body) + "\n",
                marker.group(1) if marker else None,
                named.group(1) if named else None,
                output.group(1) if output else None,
                NEEDS_CLONE in comments,
            )
        )
        index += 1
    return blocks


def _environment() -> dict[str, str]:
    """The installed package first on PATH (`cassette`, `python`); no ledger settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("CASSETTE_")}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    env["PYTHONUNBUFFERED"] = "1"
    return env


def _run(argv: list[str], cwd: Path, stdin: str | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        argv,
        cwd=cwd,
        env=_environment(),
        input=stdin,
        capture_output=True,
        text=True,
        timeout=TIMEOUT_SECONDS,
        check=False,
    )


def console_steps(text: str) -> list[tuple[str, list[str]]]:
    """``$ command`` lines, each with the output lines shown after it."""
    steps: list[tuple[str, list[str]]] = []
    for line in text.splitlines():
        if line.startswith("$ "):
            steps.append((line[2:], []))
        elif steps:
            steps[-1][1].append(line)
        else:
            raise AssertionError(f"console block output before any command: {line!r}")
    return steps


def run_block(block: Block, cwd: Path) -> str | None:
    """None when the block ran as shown; else what went wrong."""
    where = f"README.md line {block.line} ({block.language})"
    if block.output_of is not None:
        return run_block(
            Block(block.line, "console", f"$ {block.output_of}\n{block.text}", None), cwd
        )
    if block.file_name is not None:
        (cwd / block.file_name).write_text(block.text, encoding="utf-8")
        return None
    if block.language in {"bash", "sh"}:
        done = _run(["bash", "-e", "-o", "pipefail", "-s"], cwd, stdin=block.text)
        if done.returncode != 0:
            return f"{where}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return None
    if block.language == "python":
        script = cwd / f"readme_block_{block.line}.py"
        script.write_text(block.text, encoding="utf-8")
        done = _run([sys.executable, str(script)], cwd)
        if done.returncode != 0:
            return f"{where}: exit {done.returncode}\n{done.stdout}\n{done.stderr}"
        return None
    for command, shown in console_steps(block.text):
        # What a terminal shows: stdout and stderr together. A transcript may show a
        # refusal, so the exit status is not checked; the output is.
        done = _run(["bash", "-o", "pipefail", "-c", f"{{ {command}\n}} 2>&1"], cwd)
        if done.stdout.splitlines() != shown:
            return f"{where}: `{command}` printed\n{done.stdout}\ninstead of\n" + "\n".join(shown)
    return None


BLOCKS = readme_blocks(README.read_text(encoding="utf-8"))


def test_every_fenced_block_is_runnable_or_shown_only() -> None:
    unknown = [(b.line, b.language) for b in BLOCKS if b.language not in RUNNABLE | SHOWN_ONLY]
    assert unknown == []
    # A shell transcript hidden in an unlabelled fence would escape the harness.
    hidden = [b.line for b in BLOCKS if b.language == "" and "\n$ " in "\n" + b.text]
    assert hidden == []


def test_few_blocks_are_not_run_and_each_says_why() -> None:
    skipped = [b for b in BLOCKS if b.not_run is not None]
    assert len(skipped) == EXPECTED_NOT_RUN, [(b.line, b.not_run) for b in skipped]
    assert all(b.language in RUNNABLE for b in skipped)


def test_the_harness_finds_blocks_and_compares_output(tmp_path: Path) -> None:
    """The harness itself can fail: a wrong shown output and a failing command are caught."""
    text = "intro\n```console\n$ echo hello\nhullo\n```\n\n```sh\nfalse\necho after\n```\n"
    console, shell = readme_blocks(text)
    assert (console.language, console.line, shell.language) == ("console", 2, "sh")
    assert "instead of" in str(run_block(console, tmp_path))
    assert "exit 1" in str(run_block(shell, tmp_path))
    good = readme_blocks("```python\nprint('ok')\n```\n")[0]
    assert run_block(good, tmp_path) is None
    named = readme_blocks("<!-- file: a.sql -->\n```sql\nSELECT 1;\n```\n")[0]
    assert run_block(named, tmp_path) is None
    assert (tmp_path / "a.sql").read_text() == "SELECT 1;\n"
    diagram = readme_blocks("<!-- output of: echo a -->\n```mermaid\nb\n```\n")[0]
    assert "instead of" in str(run_block(diagram, tmp_path))
    marked = readme_blocks(f"{NEEDS_CLONE}\n<!-- output of: echo a -->\n```text\na\n```\n")[0]
    assert marked.needs_clone and marked.output_of == "echo a" and not diagram.needs_clone
    shown_on_stderr = readme_blocks("```console\n$ echo oops >&2; false\noops\n```\n")[0]
    assert run_block(shown_on_stderr, tmp_path) is None


def test_every_block_that_runs_the_clones_scripts_says_so() -> None:
    runs = [b for b in BLOCKS if b.language in RUNNABLE or b.output_of]
    unmarked = [b.line for b in runs if "scripts/" in b.text and not b.needs_clone]
    assert unmarked == [] and all(b.not_run is None for b in BLOCKS if b.needs_clone)
    assert sum(b.needs_clone for b in BLOCKS) == 7  # as the README's introduction counts


@pytest.mark.slow
def test_readme_blocks_run_as_written_in_order(tmp_path: Path) -> None:
    empty, clone = tmp_path / "empty", tmp_path / "clone"
    empty.mkdir()
    clone.mkdir()
    # Where a clone has them: the scripts the marked blocks name.
    (clone / "scripts").symlink_to(ROOT / "scripts", target_is_directory=True)
    runnable = [
        b
        for b in BLOCKS
        if b.not_run is None and (b.language in RUNNABLE or b.file_name or b.output_of)
    ]
    assert len(runnable) >= 8  # the README's examples, not an empty selection
    failures = [
        failure
        for b in runnable
        if (failure := run_block(b, clone if b.needs_clone else empty)) is not None
    ]
    assert failures == [], "\n\n".join(failures)
