"""Check part of the chain in a child process: ``python -m catalytic_cassette.verify.part
PATH START STOP`` prints one JSON object (the seq after the last entry read, the findings
and the suppressed counts). Run as a program, not through multiprocessing, so that the
caller's ``__main__`` is never imported again."""

from __future__ import annotations

import sys

import orjson

from ..connection import connect_readonly
from .chain import check_chain
from .findings import Collector


def check_part(path: str, start: int, stop: int) -> dict[str, object]:
    conn = connect_readonly(path)
    try:
        part = Collector()
        end = check_chain(conn, part, None, None, start=start, stop=stop)
        return {
            "end": end,
            "findings": [f.to_dict() for f in part.report.findings],
            "suppressed": part.report.suppressed,
        }
    finally:
        conn.close()


def main(argv: list[str]) -> int:
    path, start, stop = argv[0], int(argv[1]), int(argv[2])
    sys.stdout.buffer.write(orjson.dumps(check_part(path, start, stop)))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
