"""``export`` and ``prove`` given a pinned key take the newest recorded seal whose signature
verifies under it, not simply the newest row (another key's seal, or a row anyone whose
functions satisfy the seal guard could insert)."""

from __future__ import annotations

import orjson
import pytest
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

from catalytic_cassette import CassetteError, ErrorCode
from catalytic_cassette.bundle import bundle_lines
from catalytic_cassette.chain import CausalChain
from catalytic_cassette.note import NoteError, open_note
from catalytic_cassette.proofs import inclusion_proof

from .backends import Ledger, proof_source

pytestmark = pytest.mark.both_backends

ORIGIN = "example.org/ledger"


def _opens(note: bytes, key: Ed25519PrivateKey) -> bool:
    try:
        open_note(note, ORIGIN, key.public_key())
    except NoteError:
        return False
    return True


def test_the_newest_seal_under_the_pinned_key_is_chosen(backend: Ledger) -> None:
    ours, theirs = Ed25519PrivateKey.generate(), Ed25519PrivateKey.generate()
    with backend.open() as cassette:
        cassette.post_message({"n": 1}, "r", "USER")
    options = {} if backend.postgresql else {"clock": backend.clock}
    with CausalChain(backend.target, **options) as chain:
        chain.append_action(
            {"plan_id": "p", "intent_id": "i", "action_type": "InternalStep", "function_name": "f"}
        )
    with backend.open() as cassette:
        mine = cassette.seal(ours, origin=ORIGIN)
        cassette.post_message({"n": 2}, "r", "USER")
        cassette.seal(theirs, origin=ORIGIN)  # the newest row: another key's
    with proof_source(backend.target) as source:
        newest = inclusion_proof(source, 0, None)
        assert _opens(newest.checkpoint, theirs)
        pinned = inclusion_proof(source, 0, None, (ours.public_key(), ORIGIN))
        assert _opens(pinned.checkpoint, ours) and mine.note == pinned.checkpoint
        header = next(bundle_lines(source, "plan_id", "p", None, (ours.public_key(), ORIGIN)))
        assert orjson.loads(header)["seal"] == mine.note.decode()
        stranger = (Ed25519PrivateKey.generate().public_key(), ORIGIN)
        with pytest.raises(CassetteError) as none:
            inclusion_proof(source, 0, None, stranger)
        assert none.value.code is ErrorCode.NOT_FOUND
