"""Print the test vectors quoted in LAW.md ("Test vectors"): a tiny ledger's journal
bodies, leaf and chain hashes, tree roots of every size, one inclusion proof, one
consistency proof and a seal signed with a fixed key.

    python scripts/law_vectors.py        # the JSON block LAW.md quotes; a test compares them
"""

from __future__ import annotations

import base64
import json
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from catalytic_cassette import ManualClock, MessageCassette
from catalytic_cassette.note import Checkpoint, ed25519_key_id, sign_note
from catalytic_cassette.tree import StoredTree

ORIGIN = "catalytic-cassette/ledger/test-vectors"
SEED = bytes(range(32))  # the Ed25519 private key seed of the vectors: 00 01 02 ... 1f


def build(path: Path) -> None:
    """Post one message (message, job, step), claim it, complete it: six entries."""
    clock = ManualClock()
    with MessageCassette(path, clock=clock) as cassette:
        cassette.post_message({"a": 1}, "r", "USER")
        step = cassette.claim_step("r", "w", 60)
        clock.advance(1_000)
        cassette.complete_step(
            "r", step["step_id"], "w", step["fencing_token"], {"ok": 1}, "SUCCESS"
        )


def vectors() -> dict[str, object]:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    key = Ed25519PrivateKey.from_private_bytes(SEED)
    with tempfile.TemporaryDirectory() as scratch:
        path = Path(scratch) / "vectors.db"
        build(path)
        with MessageCassette(path) as cassette:
            conn = cassette.conn
            rows = conn.execute(
                "SELECT seq, body, leaf_hash, chain_hash FROM cassette_journal ORDER BY seq"
            ).fetchall()
            tree = StoredTree(conn)
            size = len(rows)
            roots = {n: tree.root(n).hex() for n in range(1, size + 1)}
            inclusion = [h.hex() for h in tree.inclusion_proof(2, size)]
            consistency = [h.hex() for h in tree.consistency_proof(3, size)]
            note = sign_note(Checkpoint(ORIGIN, size, tree.root(size)).to_text(), ORIGIN, key)
    return {
        "entries": [
            {"seq": seq, "body": body, "leaf_hash": leaf.hex(), "chain_hash": chain.hex()}
            for seq, body, leaf, chain in rows
        ],
        "roots": roots,
        "inclusion_proof": {"index": 2, "size": size, "path": inclusion},
        "consistency_proof": {"old_size": 3, "new_size": size, "proof": consistency},
        "seal": {
            "private_key_seed": SEED.hex(),
            "key_id": ed25519_key_id(ORIGIN, key.public_key()).hex(),
            "note_base64": base64.b64encode(note).decode("ascii"),
        },
    }


def main() -> None:
    print(json.dumps(vectors(), indent=1))


if __name__ == "__main__":
    main()
