"""The journal's SHA-256: CPython's builtin module when present, ``hashlib`` otherwise;
both give the standard digests, so the choice never changes a hash."""

from __future__ import annotations

import hashlib
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from catalytic_cassette import hashing


def _reference(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def test_the_builtin_module_is_used_when_present() -> None:
    builtin = sys.modules.get("_sha2") or sys.modules.get("_sha256")
    if builtin is None:
        pytest.skip("this interpreter has no builtin SHA-256 module")
    assert hashing.sha256 is builtin.sha256


@settings(max_examples=60, deadline=None)
@given(st.binary(max_size=5000))
def test_the_chosen_sha256_gives_hashlib_s_digests(data: bytes) -> None:
    assert hashing.sha256(data).hexdigest() == _reference(data)
    assert hashing.sha256(data).digest() == hashlib.sha256(data).digest()


def test_the_journal_hashes_are_the_standard_ones() -> None:
    leaf = hashing.leaf_hash(b'{"a":1}')
    assert leaf == hashlib.sha256(b'\x00{"a":1}').digest()
    node = hashing.node_hash(leaf, bytes(32))
    assert node == hashlib.sha256(b"\x01" + leaf + bytes(32)).digest()
    chain = hashing.chain_hash(7, bytes(32), leaf)
    assert chain == hashlib.sha256(b"\x02" + (7).to_bytes(8, "big") + bytes(32) + leaf).digest()
    assert hashing.sha256_hex("é") == _reference("é".encode())


def test_without_a_builtin_module_hashlib_is_used(monkeypatch: pytest.MonkeyPatch) -> None:
    # None in sys.modules makes the import fail, as in a build without the module.
    monkeypatch.setitem(sys.modules, "_sha2", None)
    monkeypatch.setitem(sys.modules, "_sha256", None)
    fallback = hashing._builtin_sha256()
    assert fallback is hashlib.sha256
    assert fallback(b"abc").hexdigest() == _reference(b"abc")
