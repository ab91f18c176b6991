"""Everything a verify run is asked to do, in one object."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from enum import Enum
from pathlib import Path
from typing import TYPE_CHECKING

from ..lease_limits import MAX_TTL_SECONDS

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    from ..anchor import Anchor
    from ..worker_keys import PinnedKey

Progress = Callable[[int], None]

DAY_MS = 86_400_000
LEASE_CAP_MS = MAX_TTL_SECONDS * 1000  # the cap the package's clock guard enforces


class Level(str, Enum):
    """QUICK: header, schema and the chain (leaf and link hashes, contiguity). FULL: also
    pages and indexes, the tree, state against history, consistency, time and seals."""

    QUICK = "quick"
    FULL = "full"


@dataclass(frozen=True)
class VerifyOptions:
    level: Level = Level.FULL
    run_id: str | None = None
    # The verifier's clock: a date later than now + clock_skew_ms is reported.
    now_ms: int | None = None
    clock_skew_ms: int = 5 * 60_000
    # Two consecutive dated entries further apart than this are reported (a warning).
    max_time_jump_ms: int = DAY_MS
    public_key: Ed25519PublicKey | None = None  # action signatures
    anchors: list[Anchor] | None = None
    seal_key: Ed25519PublicKey | None = None
    origin: str | None = None
    progress: Progress | None = None
    artifact_root: Path | None = None  # the artifacts folder; None skips artifacts
    worker_keys: dict[str, PinnedKey] | None = None  # worker id -> pinned key
