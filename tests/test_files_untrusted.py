"""Files are never trusted: the attacks of someone who controls the seal, proof, key,
artifact and backup paths (links, FIFOs, devices, huge files, loose key modes), and a
ledger that cannot be read for reasons that are not damage (LAW.md, section 13).

Every attack is made as an attacker would make it (real links, real FIFOs, /dev/zero,
another process holding the lock, a read-only directory), through the API and the CLI,
and each refusal is checked for its code, its exit status, that it returns in time,
and that the file the attacker aimed at is unchanged byte for byte.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import sqlite3
import stat
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any, TypeVar

import pytest
from click.testing import CliRunner, Result
from hypothesis import given, settings
from hypothesis import strategies as st

from catalytic_cassette import CassetteError, ErrorCode, MessageCassette, connection, safe_files
from catalytic_cassette.anchor import load_anchors
from catalytic_cassette.artifacts import ArtifactStore
from catalytic_cassette.backup import backup, restore
from catalytic_cassette.chain import CausalChain
from catalytic_cassette.cli import cli
from catalytic_cassette.seals import SEAL_SUFFIX, record_seal, write_seal_file
from catalytic_cassette.signing import generate, load_private, load_public
from catalytic_cassette.verify import verify_path

from .conftest import action_dict, file_digest

pytestmark = pytest.mark.sqlite_only(
    reason=("file bytes, links, FIFOs and permissions of the ledger file and its companions")
)

CODE_LINE = re.compile(r"^error: ([A-Z][A-Z_]+): \S.*$")
PROMPT = 10.0  # seconds: far above any honest answer, far below a hang
VICTIM_BYTES = b"the attacker's target: must never change\n"
T = TypeVar("T")


# ------------------------------------------------------------------------ helpers


def run(db: Path, *args: str) -> Result:
    return CliRunner().invoke(cli, ["--db", str(db), *args])


def ok(result: Result) -> Any:
    assert result.exit_code == 0, (result.exit_code, result.stdout, result.stderr)
    return json.loads(result.stdout)


def refused(result: Result, code: str, exit_code: int = 1) -> None:
    """A coded refusal: the exit status, one stderr line with the code, no traceback."""
    assert result.exit_code == exit_code, (result.exit_code, result.stdout, result.stderr)
    lines = result.stderr.splitlines()
    assert len(lines) == 1, lines
    match = CODE_LINE.match(lines[0])
    assert match is not None and match.group(1) == code, lines[0]
    assert "Traceback" not in result.stderr and "corrupt" not in result.stdout


def code_of(call: Callable[[], object]) -> ErrorCode:
    with pytest.raises(CassetteError) as caught:
        call()
    return caught.value.code


def promptly(call: Callable[[], T], *, fifos: tuple[Path, ...] = ()) -> T:
    """``call()``, failing the test if it takes longer than PROMPT seconds. A reader
    stuck on one of ``fifos`` is released (a writer opens and closes it) so that a
    failing test does not hang the run."""
    box: dict[str, Any] = {}

    def target() -> None:
        try:
            box["value"] = call()
        except BaseException as exc:  # re-raised below, in the test's thread
            box["error"] = exc

    worker = threading.Thread(target=target, daemon=True)
    started = time.monotonic()
    worker.start()
    worker.join(PROMPT)
    hung = worker.is_alive()
    if hung:
        for fifo in fifos:
            _release(fifo)
        worker.join(PROMPT)
    assert not hung, f"still blocked after {time.monotonic() - started:.1f}s"
    if "error" in box:
        raise box["error"]
    return box["value"]  # type: ignore[no-any-return]


def _release(fifo: Path) -> None:
    try:
        fd = os.open(fifo, os.O_WRONLY | os.O_NONBLOCK)
    except OSError:
        return
    os.close(fd)


def victim(tmp_path: Path) -> Path:
    target = tmp_path / "victim.txt"
    target.write_bytes(VICTIM_BYTES)
    return target


def unchanged(target: Path) -> bool:
    return target.read_bytes() == VICTIM_BYTES and not target.is_symlink()


@pytest.fixture
def sealed(tmp_path: Path) -> dict[str, Any]:
    """A ledger with three messages, a key pair from keygen, one seal in a directory."""
    db = tmp_path / "ledger.db"
    with MessageCassette(db) as cassette:
        for n in range(3):
            cassette.post_message({"n": n}, "r", "USER")
    key, pub = generate(str(tmp_path / "k"))
    seals = tmp_path / "seals"
    seals.mkdir()
    seal = ok(run(db, "seal", "--key", str(key), "--out", str(seals)))
    return {"db": db, "key": key, "pub": pub, "seals": seals, "seal": seal, "tmp": tmp_path}


def _verify_against(s: dict[str, Any], against: Path) -> Result:
    return run(
        s["db"],
        "verify",
        "--json",
        "--against",
        str(against),
        "--public-key",
        str(s["pub"]),
        "--origin",
        s["seal"]["origin"],
    )


def _next_seal_name(db: Path) -> str:
    """The file name the next `cassette seal` of this ledger writes: its origin and the
    journal size (LAW.md, seal files), recomputed here from the ledger itself."""
    with sqlite3.connect(db) as conn:
        ledger_id = conn.execute("SELECT value FROM cassette_meta WHERE key = 'ledger_id'")
        origin = f"catalytic-cassette/ledger/{ledger_id.fetchone()[0]}"
        size = conn.execute("SELECT count(*) FROM cassette_journal").fetchone()[0]
    conn.close()
    return f"{re.sub(r'[^A-Za-z0-9._-]', '_', origin)}-{size:020d}{SEAL_SUFFIX}"


# ------------------------------------------------------------ writing seal files


class TestSealWrites:
    """`cassette seal --out DIR` and AutoSeal write through an exclusive temporary."""

    def test_a_link_at_the_partial_name_is_never_written_through(
        self, sealed: dict[str, Any]
    ) -> None:
        target = victim(sealed["tmp"])
        name = _next_seal_name(sealed["db"])
        planted = sealed["seals"] / f"{name}.partial"
        planted.symlink_to(target)
        made = ok(promptly(lambda: run(sealed["db"], "seal", "--key", str(sealed["key"]),
                                       "--out", str(sealed["seals"]))))  # fmt: skip
        written = Path(made["path"])
        assert written.name == name
        assert unchanged(target)
        assert planted.is_symlink() and os.readlink(planted) == str(target)
        assert not written.is_symlink() and written.read_text() == made["note"]
        assert sorted(p.name for p in sealed["seals"].iterdir() if ".partial" in p.name) == [
            planted.name
        ]  # no temporary of ours is left behind

    def test_a_link_at_the_seal_name_is_refused_not_followed(self, sealed: dict[str, Any]) -> None:
        target = victim(sealed["tmp"])
        planted = sealed["seals"] / _next_seal_name(sealed["db"])
        planted.symlink_to(target)
        result = promptly(
            lambda: run(
                sealed["db"], "seal", "--key", str(sealed["key"]), "--out", str(sealed["seals"])
            )
        )
        refused(result, "UNSAFE_PATH")
        assert unchanged(target) and planted.is_symlink()

    def test_a_fifo_at_the_seal_name_is_refused_without_blocking(
        self, sealed: dict[str, Any]
    ) -> None:
        with MessageCassette(sealed["db"]) as cassette:
            seal = record_seal(
                cassette.conn, load_private(sealed["key"]), now_ms=cassette.now_ms(), origin=None
            )
        fifo = sealed["seals"] / seal.file_name()
        os.mkfifo(fifo)
        code = code_of(lambda: promptly(lambda: write_seal_file(seal, fifo), fifos=(fifo,)))
        assert code is ErrorCode.UNSAFE_PATH
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode)

    def test_another_seal_at_an_existing_name_is_refused(self, sealed: dict[str, Any]) -> None:
        path = Path(sealed["seal"]["path"])
        before = path.read_bytes()
        result = run(sealed["db"], "seal", "--key", str(sealed["key"]), "--out", str(path))
        refused(result, "INVALID_ARGUMENT")  # a newer seal never replaces an older one
        assert path.read_bytes() == before

    def test_auto_seal_refuses_a_seal_directory_that_is_a_link(
        self, sealed: dict[str, Any]
    ) -> None:
        from catalytic_cassette.seals import AutoSeal

        link = sealed["tmp"] / "seals-link"
        link.symlink_to(sealed["seals"], target_is_directory=True)
        assert code_of(lambda: AutoSeal(sealed["key"], link)) is ErrorCode.CANNOT_OPEN


# ----------------------------------------------------------- reading seal files


class TestSealReads:
    """`verify --against` a seal file or directory: only regular files are read."""

    def test_a_fifo_in_the_seal_directory_does_not_hang_verify(
        self, sealed: dict[str, Any]
    ) -> None:
        fifo = sealed["seals"] / "planted.seal"
        os.mkfifo(fifo)
        before = file_digest(sealed["db"])
        result = promptly(lambda: _verify_against(sealed, sealed["seals"]), fifos=(fifo,))
        refused(result, "UNSAFE_PATH", exit_code=3)
        assert file_digest(sealed["db"]) == before

    def test_a_link_to_dev_zero_in_the_seal_directory_is_never_read(
        self, sealed: dict[str, Any]
    ) -> None:
        (sealed["seals"] / "zero.seal").symlink_to("/dev/zero")
        result = promptly(lambda: _verify_against(sealed, sealed["seals"]))
        refused(result, "UNSAFE_PATH", exit_code=3)

    def test_a_link_to_a_genuine_seal_is_not_followed_either(self, sealed: dict[str, Any]) -> None:
        elsewhere = sealed["tmp"] / "elsewhere.seal"
        shutil.move(sealed["seal"]["path"], elsewhere)
        (sealed["seals"] / "moved.seal").symlink_to(elsewhere)
        refused(_verify_against(sealed, sealed["seals"]), "UNSAFE_PATH", exit_code=3)
        # named on the command line: wrong before anything is read, a usage error
        refused(_verify_against(sealed, sealed["seals"] / "moved.seal"), "UNSAFE_PATH", 2)
        assert ok(_verify_against(sealed, elsewhere))["ok"] is True

    def test_a_fifo_or_device_named_as_the_seal_file_is_refused(
        self, sealed: dict[str, Any]
    ) -> None:
        fifo = sealed["tmp"] / "fifo.seal"
        os.mkfifo(fifo)
        refused(promptly(lambda: _verify_against(sealed, fifo), fifos=(fifo,)), "UNSAFE_PATH", 2)
        assert code_of(lambda: load_anchors("/dev/zero")) is ErrorCode.UNSAFE_PATH

    def test_a_seal_directory_that_is_a_link_is_refused(self, sealed: dict[str, Any]) -> None:
        link = sealed["tmp"] / "seals-link"
        link.symlink_to(sealed["seals"], target_is_directory=True)
        refused(_verify_against(sealed, link), "UNSAFE_PATH", exit_code=2)

    def test_an_oversized_seal_is_refused_before_it_is_read(self, sealed: dict[str, Any]) -> None:
        huge = sealed["seals"] / "huge.seal"
        with huge.open("wb") as handle:  # sparse: the size alone must refuse it
            handle.truncate(safe_files.SEAL_MAX_BYTES + 1)
        refused(_verify_against(sealed, sealed["seals"]), "FILE_TOO_LARGE", exit_code=3)
        huge.write_bytes(b"x" * safe_files.SEAL_MAX_BYTES)  # at the cap: read, and malformed
        report = json.loads(_verify_against(sealed, sealed["seals"]).stdout)
        assert {a["status"] for a in report["anchors"]} == {"holds", "malformed_seal"}

    def test_the_cap_holds_while_reading_a_file_that_says_it_is_empty(self) -> None:
        # procfs files report size 0 and then yield bytes: only the read can stop them
        maps = Path("/proc/self/maps")
        if not maps.exists():
            pytest.skip("no procfs")
        assert os.stat(maps).st_size == 0
        with pytest.raises(CassetteError) as caught:
            safe_files.read_file(maps, what="seal file", max_bytes=16)
        assert caught.value.code is ErrorCode.FILE_TOO_LARGE


# --------------------------------------------------------------------- artifacts

BIG = ["artifact " * 20]


@pytest.fixture
def with_artifact(tmp_path: Path) -> dict[str, Any]:
    db = tmp_path / "chain.db"
    with CausalChain(db, artifact_threshold=64) as chain:
        stored = chain.append_action(action_dict("CapabilityCall", "big") | {"arguments": BIG})
        row = chain.conn.execute(
            "SELECT arguments_artifact FROM cassette_actions WHERE action_id = ?",
            (stored.action_id,),
        ).fetchone()
    ref = json.loads(row[0])
    folder = tmp_path / "chain.db.artifacts"
    return {"db": db, "id": stored.action_id, "ref": ref, "folder": folder, "tmp": tmp_path}


def _show(a: dict[str, Any]) -> Result:
    return run(a["db"], "action", "show", a["id"])


class TestArtifacts:
    def test_a_fifo_in_place_of_an_artifact_does_not_hang_show_or_verify(
        self, with_artifact: dict[str, Any]
    ) -> None:
        a = with_artifact
        file = a["folder"] / a["ref"]["sha256"]
        file.unlink()
        os.mkfifo(file)
        refused(promptly(lambda: _show(a), fifos=(file,)), "UNSAFE_PATH")
        report = promptly(lambda: verify_path(str(a["db"])), fifos=(file,))
        assert [(f.kind, f.key) for f in report.errors] == [("artifact_altered", a["id"])]
        assert promptly(lambda: run(a["db"], "verify"), fifos=(file,)).exit_code == 1

    def test_a_link_to_the_right_bytes_elsewhere_is_not_followed(
        self, with_artifact: dict[str, Any]
    ) -> None:
        a = with_artifact
        file = a["folder"] / a["ref"]["sha256"]
        copy = a["tmp"] / "copy"
        shutil.move(file, copy)
        file.symlink_to(copy)
        refused(_show(a), "UNSAFE_PATH")
        kinds = [f.kind for f in verify_path(str(a["db"])).errors]
        assert kinds == ["artifact_altered"]

    def test_the_stored_path_is_never_used_to_find_the_file(
        self, with_artifact: dict[str, Any]
    ) -> None:
        a = with_artifact
        digest = a["ref"]["sha256"]
        assert a["ref"]["path"] == f"chain.db.artifacts/{digest}"
        # moved out of the folder: the row's path would no longer lead to it either way,
        # so put it where a path "../x/<digest>" would, and rename the folder
        moved = a["tmp"] / "moved"
        a["folder"].rename(moved)
        store = ArtifactStore(a["folder"], a["tmp"])
        ref = {**a["ref"], "path": f"moved/{digest}"}
        assert code_of(lambda: store.read_checked(ref)) is ErrorCode.ARTIFACT_MISSING
        store_moved = ArtifactStore(moved, a["tmp"])
        assert json.loads(store_moved.read_checked(ref)) == BIG

    @settings(max_examples=60, deadline=None)
    @given(name=st.text(min_size=1, max_size=80))
    def test_a_reference_names_a_file_only_by_its_hash(self, name: str) -> None:
        store = ArtifactStore(Path("/nonexistent-artifacts"), Path("/"))
        ref = {"sha256": name, "size": 3, "path": name}
        if re.fullmatch(r"[0-9a-f]{64}", name):
            expected = ErrorCode.ARTIFACT_MISSING
        else:
            expected = ErrorCode.INVALID_ARTIFACT  # "../../etc/passwd", "/dev/zero", ...
        assert code_of(lambda: store.read_checked(ref)) is expected

    def test_an_artifacts_folder_that_is_a_link_is_refused(
        self, with_artifact: dict[str, Any]
    ) -> None:
        a = with_artifact
        real = a["tmp"] / "real-folder"
        a["folder"].rename(real)
        a["folder"].symlink_to(real, target_is_directory=True)
        refused(_show(a), "UNSAFE_PATH")
        assert promptly(lambda: run(a["db"], "verify")).exit_code == 3
        before = sorted(p.name for p in real.iterdir())
        with CausalChain(a["db"], artifact_threshold=64) as chain:
            new = action_dict("CapabilityCall", "other") | {"arguments": ["other " * 30]}
            assert code_of(lambda: chain.append_action(new)) is ErrorCode.UNSAFE_PATH
        assert sorted(p.name for p in real.iterdir()) == before

    def test_a_longer_file_is_altered_and_read_no_further_than_its_size(
        self, with_artifact: dict[str, Any]
    ) -> None:
        a = with_artifact
        file = a["folder"] / a["ref"]["sha256"]
        with file.open("ab") as handle:
            handle.write(b" ")
        refused(_show(a), "ARTIFACT_CORRUPT")
        assert [f.kind for f in verify_path(str(a["db"])).errors] == ["artifact_altered"]

    def test_a_planted_file_at_the_hash_name_is_never_referenced_silently(
        self, with_artifact: dict[str, Any]
    ) -> None:
        a = with_artifact
        value = ["planted " * 30]
        from catalytic_cassette import payloads

        data = payloads.dumps(value).encode("utf-8")
        import hashlib

        fifo = a["folder"] / hashlib.sha256(data).hexdigest()
        os.mkfifo(fifo)
        with CausalChain(a["db"], artifact_threshold=64) as chain:
            appended = action_dict("CapabilityCall", "x") | {"arguments": value}
            code = code_of(lambda: promptly(lambda: chain.append_action(appended)))
        assert code is ErrorCode.ARTIFACT_CORRUPT
        assert stat.S_ISFIFO(os.lstat(fifo).st_mode)


# --------------------------------------------------------------------------- keys


class TestKeys:
    def test_keygen_writes_the_private_key_0600_and_the_public_one_0644(
        self, tmp_path: Path
    ) -> None:
        old = os.umask(0o022)
        try:
            key, pub = generate(str(tmp_path / "fresh"))
        finally:
            os.umask(old)
        assert stat.S_IMODE(os.lstat(key).st_mode) == 0o600
        assert stat.S_IMODE(os.lstat(pub).st_mode) == 0o644
        assert [p.name for p in tmp_path.iterdir() if "partial" in p.name] == []

    @pytest.mark.parametrize("mode", [0o644, 0o640, 0o604, 0o660, 0o601])
    def test_a_private_key_others_may_read_is_refused_like_ssh_does(
        self, sealed: dict[str, Any], mode: int
    ) -> None:
        os.chmod(sealed["key"], mode)
        assert code_of(lambda: load_private(sealed["key"])) is ErrorCode.KEY_PERMISSIONS
        before = file_digest(sealed["db"])
        out = sealed["tmp"] / "never"
        out.mkdir()
        result = run(sealed["db"], "seal", "--key", str(sealed["key"]), "--out", str(out))
        refused(result, "KEY_PERMISSIONS")
        assert "chmod 600" in result.stderr
        assert file_digest(sealed["db"]) == before and list(out.iterdir()) == []
        os.chmod(sealed["key"], 0o400)  # owner-only is fine, read-only too
        load_private(sealed["key"])

    def test_a_key_path_that_is_a_link_is_refused(self, sealed: dict[str, Any]) -> None:
        link = sealed["tmp"] / "link.key"
        link.symlink_to(sealed["key"])
        assert code_of(lambda: load_private(link)) is ErrorCode.UNSAFE_PATH
        pub_link = sealed["tmp"] / "link.pub"
        pub_link.symlink_to(sealed["pub"])
        assert code_of(lambda: load_public(pub_link)) is ErrorCode.UNSAFE_PATH

    def test_a_fifo_as_the_public_key_does_not_hang_verify(self, sealed: dict[str, Any]) -> None:
        fifo = sealed["tmp"] / "fifo.pub"
        os.mkfifo(fifo)
        result = promptly(
            lambda: run(sealed["db"], "verify", "--action-key", str(fifo)), fifos=(fifo,)
        )
        refused(result, "UNSAFE_PATH", exit_code=2)

    def test_keygen_never_writes_through_a_planted_link(self, tmp_path: Path) -> None:
        target = victim(tmp_path)
        absent = tmp_path / "absent-target"
        for suffix, points_to in ((".key", target), (".pub", absent)):
            prefix = tmp_path / f"planted{suffix.strip('.')}"
            Path(f"{prefix}{suffix}").symlink_to(points_to)
            result = CliRunner().invoke(cli, ["keygen", "--out", str(prefix)])
            refused(result, "KEY_ERROR")
        assert unchanged(target) and not absent.exists()


# ------------------------------------------------------------------------- proofs


class TestProofs:
    def test_a_fifo_as_the_proof_does_not_hang_verify_proof(self, sealed: dict[str, Any]) -> None:
        fifo = sealed["tmp"] / "proof.fifo"
        os.mkfifo(fifo)
        args = ["verify-proof", str(fifo), "--public-key", str(sealed["pub"])]
        args += ["--origin", sealed["seal"]["origin"]]
        result = promptly(lambda: CliRunner().invoke(cli, args), fifos=(fifo,))
        refused(result, "UNSAFE_PATH", exit_code=2)

    def test_a_fifo_as_the_seal_to_prove_under_does_not_hang(self, sealed: dict[str, Any]) -> None:
        fifo = sealed["tmp"] / "seal.fifo"
        os.mkfifo(fifo)
        result = promptly(
            lambda: run(sealed["db"], "prove", "inclusion", "0", "--seal", str(fifo)),
            fifos=(fifo,),
        )
        refused(result, "UNSAFE_PATH", exit_code=2)

    def test_a_proof_is_never_written_through_a_link(self, sealed: dict[str, Any]) -> None:
        absent = sealed["tmp"] / "created-elsewhere"
        out = sealed["tmp"] / "proof.txt"
        out.symlink_to(absent)
        refused(run(sealed["db"], "prove", "inclusion", "0", "--out", str(out)), "INVALID_ARGUMENT")
        assert not absent.exists() and out.is_symlink()
        fresh = sealed["tmp"] / "fresh-proof.txt"
        ok(run(sealed["db"], "prove", "inclusion", "0", "--out", str(fresh)))
        args = ["verify-proof", str(fresh), "--public-key", str(sealed["pub"])]
        passed = CliRunner().invoke(cli, [*args, "--origin", sealed["seal"]["origin"]])
        assert passed.exit_code == 0, passed.stderr


# ------------------------------------------------------------------------ backups


class TestBackups:
    def test_a_link_at_the_seal_temporary_of_a_backup_is_never_written_through(
        self, sealed: dict[str, Any]
    ) -> None:
        target = victim(sealed["tmp"])
        dest = sealed["tmp"] / "copy.db"
        planted = [Path(f"{dest}.partial"), Path(f"{dest}.seal.partial")]
        for link in planted:
            link.symlink_to(target)
        made = promptly(lambda: backup(sealed["db"], dest, load_private(sealed["key"])))
        assert unchanged(target) and all(link.is_symlink() for link in planted)
        assert not Path(made["seal"]).is_symlink()
        anchors = load_anchors(made["seal"])
        report = verify_path(
            str(dest), anchors=anchors, seal_key=load_public(sealed["pub"]), origin=made["origin"]
        )
        assert report.ok and report.anchors[0]["status"] == "holds"
        leftovers = [p.name for p in sealed["tmp"].iterdir() if p.name.startswith(".copy.db")]
        assert leftovers == []

    def test_a_backup_destination_that_is_a_dangling_link_is_refused(
        self, sealed: dict[str, Any]
    ) -> None:
        absent = sealed["tmp"] / "absent"
        dest = sealed["tmp"] / "copy.db"
        dest.symlink_to(absent)
        code = code_of(lambda: backup(sealed["db"], dest, load_private(sealed["key"])))
        assert code is ErrorCode.INVALID_ARGUMENT
        assert not absent.exists() and dest.is_symlink()

    def test_restore_refuses_a_backup_that_is_a_link(self, sealed: dict[str, Any]) -> None:
        dest = sealed["tmp"] / "copy.db"
        made = backup(sealed["db"], dest, load_private(sealed["key"]))
        link = sealed["tmp"] / "link.db"
        link.symlink_to(dest)
        public = load_public(sealed["pub"])
        restored = sealed["tmp"] / "restored.db"
        code = code_of(lambda: restore(link, restored, public, made["origin"], seal=made["seal"]))
        assert code is ErrorCode.UNSAFE_PATH and not restored.exists()


# --------------------------------------------- a ledger that cannot be read now

HOLDER = """
import sqlite3, sys
conn = sqlite3.connect(sys.argv[1], isolation_level=None)
conn.execute("PRAGMA locking_mode = EXCLUSIVE")
conn.execute("BEGIN IMMEDIATE")
conn.execute("INSERT INTO cassette_meta (key, value) SELECT 'x', 'y' WHERE 0")
print("held", flush=True)
sys.stdin.readline()
conn.execute("ROLLBACK")
"""


@contextmanager
def exclusive_writer(db: Path) -> Iterator[None]:
    """Another process holding the file with locking_mode=EXCLUSIVE in a write
    transaction, as a raw sqlite3 shell can."""
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(db)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "held"
        yield
    finally:
        assert holder.stdin is not None
        holder.stdin.write("\n")
        holder.stdin.flush()
        holder.wait(timeout=PROMPT)


class TestLedgerCannotBeRead:
    WAIT_MS = 600

    @pytest.fixture(autouse=True)
    def short_busy_timeout(self, monkeypatch: pytest.MonkeyPatch) -> None:
        monkeypatch.setattr(connection, "DEFAULT_BUSY_TIMEOUT_MS", self.WAIT_MS)

    def test_a_ledger_held_by_an_exclusive_writer_is_busy_not_corrupt(
        self, sealed: dict[str, Any]
    ) -> None:
        db = sealed["db"]
        before = file_digest(db)
        with exclusive_writer(db):
            started = time.monotonic()
            with pytest.raises(CassetteError) as caught:
                promptly(lambda: verify_path(str(db)))
            waited = time.monotonic() - started
            assert (
                caught.value.code is ErrorCode.BUSY
                and caught.value.detail.get("unverifiable") is True
            )
            assert waited >= self.WAIT_MS / 1000 * 0.9  # it waited the busy timeout
            result = promptly(lambda: run(db, "verify"))
            refused(result, "BUSY", exit_code=3)
        assert file_digest(db) == before
        assert promptly(lambda: run(db, "verify")).exit_code == 0  # and once released

    def test_genuine_damage_is_still_corrupt(self, sealed: dict[str, Any]) -> None:
        db = sealed["db"]
        size = db.stat().st_size
        with db.open("r+b") as handle:
            handle.truncate(size // 2)
            handle.seek(4096)
            handle.write(b"\xff" * 4096)
        result = run(db, "verify", "--json")
        assert result.exit_code == 1, result.stderr
        assert "corrupt" in {f["kind"] for f in json.loads(result.stdout)["findings"]}


def _cli_without_root_privileges(db: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """The CLI in a real process for which permission bits hold: as root (tests run as
    root here, and root ignores them), with the capabilities that bypass them dropped."""
    command = [sys.executable, "-m", "catalytic_cassette", "--db", str(db), *args]
    if os.geteuid() == 0:
        setpriv = shutil.which("setpriv")
        if setpriv is None:
            pytest.skip("running as root without setpriv: permission bits cannot be tested")
        command = [setpriv, "--bounding-set=-dac_override,-dac_read_search", "--", *command]
    return subprocess.run(command, capture_output=True, text=True, timeout=60, check=False)


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    folder = tmp_path / "ro"
    folder.mkdir()
    yield folder
    folder.chmod(0o755)


class TestReadOnlyPlaces:
    def test_a_ledger_in_a_read_only_directory_is_verified_read_only(
        self, read_only_dir: Path
    ) -> None:
        db = read_only_dir / "ledger.db"
        with MessageCassette(db) as cassette:
            cassette.post_message({"n": 1}, "r", "USER")
        assert not Path(f"{db}-wal").exists()  # a clean close leaves no WAL
        before = file_digest(db)
        read_only_dir.chmod(0o555)
        done = _cli_without_root_privileges(db, "verify")
        assert done.returncode == 0, done.stderr
        assert "PASS" in done.stderr
        assert sorted(p.name for p in read_only_dir.iterdir()) == ["ledger.db"]
        assert file_digest(db) == before

    def test_a_read_only_directory_with_a_wal_cannot_be_verified(
        self, read_only_dir: Path, tmp_path: Path
    ) -> None:
        source = tmp_path / "live.db"
        live = MessageCassette(source)  # kept open: its -wal holds the last commits
        try:
            live.post_message({"n": 1}, "r", "USER")
            for suffix in ("", "-wal"):
                shutil.copyfile(f"{source}{suffix}", read_only_dir / f"ledger.db{suffix}")
        finally:
            live.close()
        db = read_only_dir / "ledger.db"
        before = file_digest(db)
        read_only_dir.chmod(0o555)
        done = _cli_without_root_privileges(db, "verify")
        assert done.returncode == 3, (done.stdout, done.stderr)
        assert "CANNOT_OPEN" in done.stderr and "corrupt" not in done.stdout
        assert "Traceback" not in done.stderr
        assert file_digest(db) == before

    def test_a_ledger_nobody_may_read_cannot_be_verified(self, tmp_path: Path) -> None:
        db = tmp_path / "ledger.db"
        with MessageCassette(db) as cassette:
            cassette.post_message({"n": 1}, "r", "USER")
        db.chmod(0o000)
        try:
            done = _cli_without_root_privileges(db, "verify")
        finally:
            db.chmod(0o644)
        assert done.returncode == 3, (done.stdout, done.stderr)
        assert "CANNOT_OPEN" in done.stderr and "corrupt" not in done.stdout


# ------------------------------------------------------------ the module itself


class TestWrites:
    def test_write_new_never_replaces_and_leaves_no_temporary(self, tmp_path: Path) -> None:
        target = victim(tmp_path)
        assert (
            code_of(lambda: safe_files.write_new(target, b"other", what="file"))
            is ErrorCode.INVALID_ARGUMENT
        )
        assert unchanged(target)
        assert sorted(p.name for p in tmp_path.iterdir()) == ["victim.txt"]

    def test_replace_replaces_a_link_instead_of_following_it(self, tmp_path: Path) -> None:
        target = victim(tmp_path)
        link = tmp_path / "name"
        link.symlink_to(target)
        safe_files.write_new(link, b"new", what="file", replace=True)
        assert unchanged(target) and not link.is_symlink() and link.read_bytes() == b"new"

    def test_a_device_is_never_opened(self) -> None:
        for device in ("/dev/zero", "/dev/null"):
            with pytest.raises(CassetteError) as caught:
                safe_files.read_file(device, what="file", max_bytes=1)
            assert caught.value.code is ErrorCode.UNSAFE_PATH
            assert "a device" in caught.value.message
