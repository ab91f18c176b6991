"""LAW.md's test vectors are what the code computes today, and they check themselves."""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys
from pathlib import Path

from catalytic_cassette import merkle
from catalytic_cassette.hashing import ZERO_HASH, chain_hash
from catalytic_cassette.note import Checkpoint, open_note

ROOT = Path(__file__).resolve().parents[1]


def _quoted() -> dict[str, object]:
    law = (ROOT / "LAW.md").read_text(encoding="utf-8")
    block = re.search(
        r"<!-- vectors:begin -->\n```json\n(.*?)\n```\n<!-- vectors:end -->", law, re.S
    )
    assert block is not None, "LAW.md has no vectors block"
    quoted: dict[str, object] = json.loads(block.group(1))
    return quoted


def test_law_quotes_what_the_script_prints() -> None:
    printed = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "law_vectors.py")],
        capture_output=True,
        check=True,
        text=True,
    ).stdout
    assert json.loads(printed) == _quoted()


def test_the_vectors_follow_the_encodings_law_states() -> None:
    """Recompute every quoted hash from the quoted bodies with the stated formulas."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    vectors = _quoted()
    entries = vectors["entries"]
    assert isinstance(entries, list) and len(entries) == 6
    prev = ZERO_HASH
    leaves = []
    for entry in entries:
        leaf = merkle.leaf_hash(entry["body"].encode("utf-8"))
        assert leaf.hex() == entry["leaf_hash"]
        assert chain_hash(entry["seq"], prev, leaf).hex() == entry["chain_hash"]
        prev = bytes.fromhex(entry["chain_hash"])
        leaves.append(leaf)
    roots = vectors["roots"]
    assert isinstance(roots, dict)
    for size, root in roots.items():
        assert merkle.root_from_leaves(leaves[: int(size)]).hex() == root
    inclusion = vectors["inclusion_proof"]
    assert isinstance(inclusion, dict)
    assert merkle.verify_inclusion(
        2, 6, leaves[2], [bytes.fromhex(h) for h in inclusion["path"]], bytes.fromhex(roots["6"])
    )
    consistency = vectors["consistency_proof"]
    assert isinstance(consistency, dict)
    assert merkle.verify_consistency(
        3,
        6,
        bytes.fromhex(roots["3"]),
        bytes.fromhex(roots["6"]),
        [bytes.fromhex(h) for h in consistency["proof"]],
    )
    seal = vectors["seal"]
    assert isinstance(seal, dict)
    key = Ed25519PrivateKey.from_private_bytes(bytes.fromhex(seal["private_key_seed"]))
    origin = "catalytic-cassette/ledger/test-vectors"
    text = open_note(base64.b64decode(seal["note_base64"]), origin, key.public_key())
    assert Checkpoint.from_text(text) == Checkpoint(origin, 6, bytes.fromhex(roots["6"]))
