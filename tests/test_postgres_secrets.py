"""A password never reaches any output or error (LAW.md 14): every form a libpq secret
can take in a ledger's URL or connection string, against a server that refuses the
password and against a server that is down, through the CLI's stdout and stderr, the
Python API's error (its text, repr and traceback) and a real process's streams."""

from __future__ import annotations

import json
import os
import subprocess
import time
import traceback
from pathlib import Path
from urllib.parse import parse_qsl, urlsplit

import pytest
from click.testing import CliRunner

from catalytic_cassette import CassetteError, ErrorCode
from catalytic_cassette.cli import cli
from catalytic_cassette.redaction import SECRET_KEYWORDS, redact
from catalytic_cassette.verify import verify_path

from . import postgres
from .test_cli import cassette_script

psycopg = pytest.importorskip("psycopg")

ROLE = "cassette_test_password"
# A password no message holds by chance; its halves are checked too (libpq echoes
# fragments of a string it cannot parse).
SECRET = "Hunter2xQ7-Zebra"
PIECES = (SECRET, "Hunter2xQ7", "Zebra", "Q7-Z")


def _socket(server_url: str) -> tuple[str, str]:
    query = dict(parse_qsl(urlsplit(server_url).query))
    return query.get("host", ""), query.get("port", "5432")


def forms(server_url: str, down: bool) -> dict[str, str]:
    """Each way a secret rides in a target, aimed at the test server (as ROLE, whom it
    asks for a password) or at a socket folder with no server."""
    host, port = _socket(server_url)
    if down:
        host = "/nonexistent-cassette-socket"
    where = f"host={host}&port={port}"
    return {
        "user info": f"postgresql://{ROLE}:{SECRET}@/postgres?{where}",
        "query": f"postgresql://{ROLE}@/postgres?{where}&password={SECRET}",
        "query, name percent-encoded": f"postgresql://{ROLE}@/postgres?{where}&pass%77ord={SECRET}",
        "query, sslpassword": f"postgresql://{ROLE}:{SECRET}@/postgres?{where}&sslpassword={SECRET}",
        "user info, a bad percent-escape": f"postgresql://{ROLE}:Hunter2xQ7%zzZebra@/postgres?{where}",
        "user info with an @": f"postgresql://{ROLE}:Hunter2xQ7@Q7-Zebra@/postgres?{where}",
        "keyword form": f"host={host} port={port} user={ROLE} password={SECRET} dbname=postgres",
        "keyword form, quoted with a space": (
            f"host={host} port={port} password='Hunter2xQ7 Q7-Zebra' dbname=postgres"
        ),
        "keyword form, a space": f"host={host} password=Hunter2xQ7 Zebra dbname=postgres",
    }


@pytest.fixture(scope="module")
def refusing(pg_server: str) -> str:
    """The test server, made to ask ROLE for a password (scram-sha-256) that no form
    gives right: a line of its own at the top of pg_hba.conf, for that role only."""
    if os.environ.get(postgres.SERVER_VARIABLE):
        pytest.skip("a server given by the variable keeps its own pg_hba.conf")
    with psycopg.connect(pg_server, autocommit=True) as conn:
        hba = Path(conn.execute("SHOW hba_file").fetchone()[0])
        line = f"local all {ROLE} scram-sha-256\n"
        text = hba.read_text()
        if line not in text:
            hba.write_text(line + text)
            conn.execute("SELECT pg_reload_conf()")
        if not conn.execute("SELECT 1 FROM pg_roles WHERE rolname = %s", (ROLE,)).fetchone():
            conn.execute(f"CREATE ROLE {ROLE} LOGIN PASSWORD 'the-right-one'")
    host, port = _socket(pg_server)
    probe = f"postgresql://{ROLE}:wrong@/postgres?host={host}&port={port}"
    for _ in range(100):  # (the reload is asynchronous)
        try:
            psycopg.connect(probe).close()
        except psycopg.OperationalError as error:
            if "password authentication failed" in str(error):
                return pg_server
        time.sleep(0.05)
    pytest.fail("the server did not start asking for a password")


COMMANDS = (
    ("init",),
    ("status", "--run-id", "r"),
    ("verify",),
    ("migrate", "--check"),
    ("migrate",),
)


def assert_hidden(*texts: str) -> None:
    for text in texts:
        for piece in PIECES:
            assert piece not in text, text


@pytest.mark.parametrize("down", [False, True], ids=["password refused", "server down"])
def test_no_form_of_a_secret_reaches_the_clis_output(
    refusing: str, down: bool, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.chdir(tmp_path)  # (the keyword form is no URL: a file path, made here)
    for name, target in forms(refusing, down).items():
        for command in (*COMMANDS, ("copy", target, str(tmp_path / "copy.db"))):
            args = ["--db", target, *command] if command[0] != "copy" else list(command)
            result = CliRunner().invoke(cli, args)
            assert result.exit_code in (1, 2, 3), (name, command, result.output)
            assert isinstance(result.exception, SystemExit), (name, command, result.exception)
            assert_hidden(result.stdout, result.stderr)
            if target.startswith("postgresql://"):
                assert "CANNOT_OPEN" in result.stderr, (name, command, result.stderr)


@pytest.mark.parametrize("down", [False, True], ids=["password refused", "server down"])
def test_the_apis_error_holds_no_secret(refusing: str, down: bool) -> None:
    """Its message, its repr and its traceback: libpq's error is not chained to it."""
    for name, target in forms(refusing, down).items():
        if not target.startswith("postgresql://"):
            continue
        with pytest.raises(CassetteError) as caught:
            verify_path(target)
        error = caught.value
        assert error.code is ErrorCode.CANNOT_OPEN, name
        assert error.__cause__ is None and error.__context__ is None, name
        shown = "".join(traceback.format_exception(error))
        assert_hidden(str(error), repr(error), shown, str(error.to_dict()))
    if not down:  # what libpq said is kept, without the secret
        with pytest.raises(CassetteError) as caught:
            verify_path(forms(refusing, down)["user info"])
        assert "password authentication failed" in caught.value.message
        assert f"{ROLE}:***@" in caught.value.message


def test_a_process_shows_no_secret_in_its_streams(refusing: str) -> None:
    """A real `cassette` process (stdout, stderr, no traceback)."""
    for target in (forms(refusing, down=False)["user info, a bad percent-escape"],):
        run = subprocess.run(
            [cassette_script(), "--db", target, "init"],
            capture_output=True,
            text=True,
            check=False,
            env={**os.environ, "CASSETTE_DB": ""},
        )
        assert run.returncode == 1 and run.stderr.startswith("error: CANNOT_OPEN"), run.stderr
        assert "Traceback" not in run.stderr
        assert_hidden(run.stdout, run.stderr)


def test_redact_hides_every_form() -> None:
    cases = {
        "postgresql://u:Hunter2xQ7-Zebra@h/db": "postgresql://u:***@h/db",
        "see postgres://u:a@b@h:5/db?x=1 now": "see postgres://u:***@h:5/db?x=1 now",
        "postgresql://u@h/db?sslmode=require&password=Hunter2xQ7-Zebra&port=1": (
            "postgresql://u@h/db?sslmode=require&password=***&port=1"
        ),
        "postgresql://u@h/db?pass%77ord=Hunter2xQ7-Zebra": "postgresql://u@h/db?pass%77ord=***",
        "host=h password = 'Hunter2xQ7 \\' Zebra' user=u": "host=h password = *** user=u",
        "host=h sslpassword=Hunter2xQ7-Zebra": "host=h sslpassword=***",
        "host=h oauth_client_secret=Hunter2xQ7-Zebra": "host=h oauth_client_secret=***",
        "a path/without secrets.db": "a path/without secrets.db",
    }
    for given, expected in cases.items():
        assert redact(given) == expected, given
    assert redact("libpq said: Hunter2xQ7%zzZebra", ["Hunter2xQ7%zzZebra"]) == "libpq said: ***"


def test_every_secret_parameter_libpq_hides_is_redacted() -> None:
    """libpq marks a secret parameter with the display character '*': each one the libpq
    psycopg loads knows is in the package's list (a newer libpq adding one fails here)."""
    hidden = {
        option.keyword.decode()
        for option in psycopg.pq.Conninfo.get_defaults()
        if option.dispchar == b"*"
    }
    assert hidden <= SECRET_KEYWORDS


def test_a_target_shown_in_a_result_holds_no_secret(pg_ledger: str, tmp_path: Path) -> None:
    """The server trusts the login, so the commands succeed: `init` and `migrate` show
    the ledger's URL (`db`), `copy` its source and destination, each without the secret
    in the user info or the query."""
    user = urlsplit(pg_ledger).username
    with_info = pg_ledger.replace(f"{user}@", f"{user}:{SECRET}@", 1)
    in_query = f"{pg_ledger}&password={SECRET}"
    for target in (with_info, in_query):
        for command in (("init",), ("migrate",), ("migrate", "--check")):
            result = CliRunner().invoke(cli, ["--db", target, *command])
            assert result.exit_code == 0, result.output
            shown = json.loads(result.stdout)["db"]
            assert "***" in shown and postgres.database_name(pg_ledger) in shown
            assert_hidden(result.stdout, result.stderr)
        copied = CliRunner().invoke(cli, ["copy", target, str(tmp_path / f"{len(target)}.db")])
        assert copied.exit_code == 0, copied.output
        assert "***" in json.loads(copied.stdout)["source"]
        assert_hidden(copied.stdout, copied.stderr)
