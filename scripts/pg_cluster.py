"""A throwaway PostgreSQL cluster in one directory, for tests and benchmarks.

    python scripts/pg_cluster.py start DIR [--durable]   # prints the server's URL
    python scripts/pg_cluster.py stop DIR

The cluster listens on a unix socket in DIR only (no TCP), with trust authentication and
the superuser ``postgres``. ``durable=False`` turns off fsync, synchronous commit and full
page writes (a test cluster that is thrown away needs none of them); ``durable=True``
keeps PostgreSQL's defaults, for benchmarks. The server refuses to run as root, so under
root the cluster is created and run as the ``postgres`` OS user.

Standard library only, and no import of the package: CI and the benchmarks use it
before anything is installed.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote

# The socket lives in the cluster's own directory, so two clusters never share a socket
# path and one fixed port serves them all.
PORT = 5432
SUPERUSER = "postgres"
OS_USER_UNDER_ROOT = "postgres"
DATA = "data"
LOG = "server.log"
SETTINGS = "cassette.conf"
# A unix socket path (DIR/.s.PGSQL.5432) longer than this is refused by the kernel.
MAX_SOCKET_PATH = 107

FAST = {"fsync": "off", "synchronous_commit": "off", "full_page_writes": "off"}


class ClusterError(RuntimeError):
    """PostgreSQL is missing, or a cluster could not be created, started or stopped."""


def find_bin_dir() -> Path:
    """The directory holding initdb and pg_ctl: PATH first, then the highest Debian
    version under /usr/lib/postgresql."""
    found = shutil.which("pg_ctl")
    if found is not None:
        # Resolve links (e.g. /usr/local/bin/pg_ctl -> .../15/bin/pg_ctl): initdb and
        # postgres must come from the same installation.
        directory = Path(found).resolve().parent
        if (directory / "initdb").exists():
            return directory
    versions = []
    for candidate in glob.glob("/usr/lib/postgresql/*/bin"):
        name = Path(candidate).parent.name
        if name.isdigit() and (Path(candidate) / "pg_ctl").exists():
            versions.append((int(name), Path(candidate)))
    if not versions:
        raise ClusterError("PostgreSQL not found: no pg_ctl in PATH or /usr/lib/postgresql/*/bin")
    return max(versions)[1]


def _as_server_user(argv: list[str]) -> list[str]:
    """``argv`` run as the user the server may run as: ``postgres`` under root."""
    if os.geteuid() != 0:
        return argv
    return ["runuser", "-u", OS_USER_UNDER_ROOT, "--", *argv]


def _run(argv: list[str], directory: Path) -> None:
    # cwd is the cluster directory: the server user may not be able to enter ours.
    try:
        result = subprocess.run(
            _as_server_user(argv), cwd=directory, capture_output=True, text=True, check=False
        )
    except OSError as error:  # runuser or the binary itself missing
        raise ClusterError(f"{' '.join(argv)}: {error}") from error
    if result.returncode != 0:
        log = directory / LOG
        tail = log.read_text(errors="replace")[-2000:] if log.exists() else ""
        raise ClusterError(
            f"{' '.join(argv)} failed ({result.returncode}):\n"
            f"{result.stdout}{result.stderr}{tail}".rstrip()
        )


def _conf_quote(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def url_for(directory: Path, port: int = PORT) -> str:
    """The libpq URL of the cluster in ``directory``, as its superuser."""
    host = quote(str(directory.resolve()), safe="/")
    return f"postgresql://{SUPERUSER}@/postgres?host={host}&port={port}"


@dataclass(frozen=True)
class Cluster:
    """A running cluster: ``url`` reaches it as the superuser, ``stop()`` shuts it down."""

    directory: Path
    bin_dir: Path
    port: int
    url: str

    def stop(self) -> None:
        stop(self.directory, bin_dir=self.bin_dir)


def start(directory: Path | str, *, durable: bool, bin_dir: Path | None = None) -> Cluster:
    """Create a cluster in ``directory`` (kept if it is already there) and start it;
    returns once it accepts connections."""
    directory = Path(directory).resolve()
    if len(str(directory / f".s.PGSQL.{PORT}")) > MAX_SOCKET_PATH:
        raise ClusterError(f"directory path too long for a unix socket: {directory}")
    bin_dir = bin_dir or find_bin_dir()
    directory.mkdir(parents=True, exist_ok=True)
    data = directory / DATA
    if os.geteuid() == 0:
        try:
            shutil.chown(directory, user=OS_USER_UNDER_ROOT)
        except LookupError as error:
            raise ClusterError(f"running as root and no {OS_USER_UNDER_ROOT!r} user") from error
    if not (data / "PG_VERSION").exists():
        initdb = [str(bin_dir / "initdb"), "-D", str(data), "-U", SUPERUSER, "-A", "trust"]
        initdb += ["-E", "UTF8", "--locale=C", "--no-instructions"]
        _run(initdb + ([] if durable else ["--no-sync"]), directory)
        with (data / "postgresql.conf").open("a", encoding="utf-8") as conf:
            conf.write(f"\ninclude_if_exists {_conf_quote(SETTINGS)}\n")
    # Rewritten at every start, so one directory can be started durable or not.
    settings = {
        "listen_addresses": "",
        "unix_socket_directories": str(directory),
        "port": str(PORT),
        **({} if durable else FAST),
    }
    conf_file = data / SETTINGS
    conf_file.write_text(
        "".join(f"{key} = {_conf_quote(value)}\n" for key, value in settings.items()),
        encoding="utf-8",
    )
    if os.geteuid() == 0:
        shutil.chown(conf_file, user=OS_USER_UNDER_ROOT)
    pg_ctl = [str(bin_dir / "pg_ctl"), "start", "-w", "-t", "60", "-D", str(data)]
    _run([*pg_ctl, "-l", str(directory / LOG)], directory)
    return Cluster(directory=directory, bin_dir=bin_dir, port=PORT, url=url_for(directory))


def stop(directory: Path | str, *, bin_dir: Path | None = None, mode: str = "fast") -> None:
    """Stop the cluster in ``directory``: ``fast`` disconnects sessions and shuts down
    cleanly; ``immediate`` is a crash (every server process quits at once, nothing in
    shared memory is written: the next start recovers from the WAL), for tests."""
    directory = Path(directory).resolve()
    bin_dir = bin_dir or find_bin_dir()
    argv = [str(bin_dir / "pg_ctl"), "stop", "-w", "-t", "60", "-m", mode]
    _run([*argv, "-D", str(directory / DATA)], directory)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="A throwaway PostgreSQL cluster in one directory.")
    commands = parser.add_subparsers(dest="command", required=True)
    start_parser = commands.add_parser("start", help="create if needed, start, print the URL")
    start_parser.add_argument("directory", type=Path)
    start_parser.add_argument("--durable", action="store_true", help="keep fsync on")
    stop_parser = commands.add_parser("stop", help="stop the cluster in DIR")
    stop_parser.add_argument("directory", type=Path)
    args = parser.parse_args(argv)
    try:
        if args.command == "start":
            print(start(args.directory, durable=args.durable).url)
        else:
            stop(args.directory)
    except ClusterError as error:
        print(f"pg_cluster: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
