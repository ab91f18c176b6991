"""C2SP signed-note, tlog-checkpoint and tlog-proof: published vectors, round trips, and every
refusal raised as a NoteError of the right kind (never another exception, never acceptance)."""

from __future__ import annotations

import base64
import hashlib
from collections.abc import Callable
from typing import Any

import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey
from hypothesis import given, settings
from hypothesis import strategies as st

from catalytic_cassette.errors import CassetteError, ErrorCode
from catalytic_cassette.note import (
    Checkpoint,
    NoteError,
    NoteSignature,
    SignedNote,
    TlogProof,
    ed25519_key_id,
    open_note,
    parse_note,
    parse_vkey,
    sign_note,
    vkey,
)

# -- published vectors ------------------------------------------------------------------

# From golang.org/x/mod/sumdb/note: the package documentation's "Example" section (note.go)
# and its tests (note_test.go: TestNewVerifier, TestSign, TestOpen, TestVerifierList).
# The signer key is "PRIVATE+KEY+<name>+<key id>+base64(0x01 || 32-byte Ed25519 seed)".
PETER_SKEY = "PRIVATE+KEY+PeterNeumann+c74f20a3+AYEKFALVFGyNhPJEMzD1QIDr+Y7hfZx09iUvxdXHKDFz"
PETER_VKEY = "PeterNeumann+c74f20a3+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW"
ENOCH_VKEY = "EnochRoot+af0cfe78+ATtqJ7zOtqQtYqOo0CpvDXNlMhV3HeJDpjrASKGLWdop"
QUOTE = (
    b"If you think cryptography is the answer to your problem,\n"
    b"then you don't know what your problem is.\n"
)
PETER_LINE = (
    "\u2014 PeterNeumann x08go/ZJkuBS9UG/SffcvIAQxVBtiFupLLr8pAcElZInNIuGUgYN1FFYC2pZSNXgKv"
    "qfqdngotpRZb6KE6RyyBwJnAM=\n"
).encode()
ENOCH_LINE = (
    "\u2014 EnochRoot rwz+eBzmZa0SO3NbfRGzPCpDckykFXSdeX+MNtCOXm2/5n2tiOHp+vAF1aGrQ5ovTG01oO"
    "TGwnWLox33WWd1RvMc+QQ=\n"
).encode()
PETER_NOTE = QUOTE + b"\n" + PETER_LINE
# The same two key-id and key-name mangled variants note_test.go's TestNewVerifier refuses:
# a key of the wrong length and an unknown algorithm byte, each with a re-computed key id.
GO_BAD_VKEYS = [
    "PeterNeumann+cc469956+ARpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TWBADKEY==",
    "PeterNeumann+173116ae+ZRpc2QcUPDhMQegwxbzhKqiBfsVkmqq/LDE4izWy10TW",
]

# The Go checksum database's published verifier key (the GOSUMDB default in the Go source,
# cmd/go/internal/modfetch/key.go). The example in c2sp.org/tlog-checkpoint shows the origin
# "example.com/behind-the-sofa", but its signature line's key id is 033de0ae, this key's: the
# signature verifies over the same checkpoint with sum.golang.org's real origin.
SUMDB_VKEY = "sum.golang.org+033de0ae+Ac4zctda0e5eza+HJyk9SxEdh+s3Ux18htTTAD8OuAn8"
SOFA_SIG = (
    "Az3grlgtzPICa5OS8npVmf1Myq/5IZniMp+ZJurmRDeOoRDe4URYN7u5/Zhcyv2q1gGzGku9nTo+zyWE+xeMcTOAYQ8="
)
SOFA_ROOT = "CsUYapGGPo4dkMgIAUqom/Xajj7h2fB2MPA3j2jxq2I="


def sofa_note(origin: str, key_name: str) -> bytes:
    return f"{origin}\n20852163\n{SOFA_ROOT}\n\n\u2014 {key_name} {SOFA_SIG}\n".encode()


# The example in c2sp.org/signed-note (no public key is published for it).
QUASIMODO = (
    "Ognuno sta solo sul cuor della terra\ntrafitto da un raggio di sole:\n\ned \u00e8 subito "
    "sera.\n\n\u2014 quasimodo.example/salvatore NnugSzTjtVAewIS+Z/iJhUPeFDkO/5QQ2i5ddnGITLlC+"
    "EhfLW9oJKONrMouFSQU0xMcXxj99ihAQwaqP3ZekRwNtIc=\n"
).encode()

# The head of the example in c2sp.org/tlog-proof, and its checkpoint text. The example's
# signatures are elided ("[...]"), so the tests sign that checkpoint with a key of their own.
PROOF_HEAD = b"""c2sp.org/tlog-proof@v1
extra YWdlLXYxLjIuMS1kYXJ3aW4tYXJtNjQudGFyLmd6kYXJ3aW4tYXJ
index 73894
gSKyXoYZUgZ6jduWYrkDOARinOMGJveXjgMkBTcdPlQ=
B95lDa8R83lS8n0eG+o0buTxRKQTYFi//1U8anccXmA=
EKNzoDWG8LGC0Yp9o+sv3qllpMP9uHQ9B20KNL+Q1zs=
RoopEkOdqkYqMB4MJXrbt/hMjOxsVn0IrWjpz1ZMMes=
AHCioX9nLjsrse6YhjRRmk1WUEirVOLLRoOQ6vfO5vk=

"""
FANCYLOG = b"example.com/fancylog\n109482\nsFodV/vSp5O8n9a8QpW6PRY97tfOSW5bsc2Xl/EQi08=\n"
ELIDED_PROOF = (
    PROOF_HEAD
    + FANCYLOG
    + "\n\u2014 example.com/fancylog hI2DJw[...]1roloI=\n".encode()
    + "\u2014 witness1.example mJirIklj[...]qY9v2B/5bg==\n".encode()
)

# -- helpers ----------------------------------------------------------------------------

KEYS = [Ed25519PrivateKey.from_private_bytes(bytes([i + 1]) * 32) for i in range(3)]
LOG_KEY = KEYS[0]
CONTROL = "".join(chr(c) for c in range(0x20))


def go_signer(skey: str) -> Ed25519PrivateKey:
    """Decode a golang.org/x/mod/sumdb/note signer key (test helper, Ed25519 only)."""
    private, key, _name, _hash, b64 = skey.split("+", 4)
    raw = base64.b64decode(b64)
    assert (private, key, raw[0], len(raw)) == ("PRIVATE", "KEY", 1, 33)
    return Ed25519PrivateKey.from_private_bytes(raw[1:])


def raw_public(key: Ed25519PublicKey) -> bytes:
    return key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def kind_of(call: Callable[..., Any], *args: Any) -> str:
    """The NoteError kind the call raises; fails the test if it returns or raises otherwise."""
    with pytest.raises(NoteError) as caught:
        call(*args)
    return caught.value.kind


def signed_checkpoint(checkpoint: Checkpoint, key: Ed25519PrivateKey = LOG_KEY) -> bytes:
    return sign_note(checkpoint.to_text(), "example.com/log", key)


def noncanonical(b64: bytes) -> bytes:
    """The same bytes, spelled with non-zero pad bits in the last base64 digit."""
    alphabet = b"ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/"
    body = b64.rstrip(b"=")
    digit = alphabet.index(body[-1:]) | 1
    spelled = body[:-1] + alphabet[digit : digit + 1] + b64[len(body) :]
    assert spelled != b64 and base64.b64decode(spelled) == base64.b64decode(b64)
    return spelled


line_chars = st.characters(codec="utf-8", exclude_characters=CONTROL)
lines = st.text(line_chars, min_size=1, max_size=30)
names = st.text(
    st.characters(codec="utf-8", exclude_characters=CONTROL + "+"),
    min_size=1,
    max_size=20,
).filter(lambda name: not any(ch.isspace() for ch in name))
note_texts = st.lists(st.text(line_chars, max_size=30), min_size=1, max_size=6).map(
    lambda parts: "".join(f"{part}\n" for part in parts).encode()
)
keys = st.sampled_from(KEYS)
checkpoints = st.builds(
    Checkpoint,
    origin=lines,
    size=st.integers(0, 2**63 - 1),
    root=st.binary(min_size=32, max_size=32),
    extensions=st.lists(lines, max_size=3).map(tuple),
)
signatures = st.builds(
    NoteSignature,
    key_name=names,
    key_id=st.binary(min_size=4, max_size=4),
    signature=st.binary(min_size=1, max_size=80),
)

# -- known answers ----------------------------------------------------------------------


def test_go_verifier_key_parses_and_reencodes() -> None:
    name, public = parse_vkey(PETER_VKEY)
    assert name == "PeterNeumann"
    assert raw_public(public) == raw_public(go_signer(PETER_SKEY).public_key())
    assert vkey(name, public) == PETER_VKEY


def test_go_documented_note_opens() -> None:
    assert open_note(PETER_NOTE, *parse_vkey(PETER_VKEY)) == QUOTE


def test_signing_reproduces_the_documented_note_and_key_id() -> None:
    signer = go_signer(PETER_SKEY)
    assert ed25519_key_id("PeterNeumann", signer.public_key()) == bytes.fromhex(
        PETER_SKEY.split("+")[3]
    )
    # Ed25519 is deterministic, so the whole note must come out byte for byte.
    assert sign_note(QUOTE, "PeterNeumann", signer) == PETER_NOTE


def test_go_doubly_signed_note_opens_with_either_key() -> None:
    both = QUOTE + b"\n" + PETER_LINE + ENOCH_LINE
    assert open_note(both, *parse_vkey(PETER_VKEY)) == QUOTE
    assert open_note(both, *parse_vkey(ENOCH_VKEY)) == QUOTE
    parsed = parse_note(both)
    assert [(s.key_name, s.key_id.hex()) for s in parsed.signatures] == [
        ("PeterNeumann", "c74f20a3"),
        ("EnochRoot", "af0cfe78"),
    ]
    assert parsed.to_bytes() == both
    assert kind_of(open_note, PETER_NOTE, *parse_vkey(ENOCH_VKEY)) == "unknown_key"


def test_go_corrupted_signature_vector_is_a_bad_signature() -> None:
    # note_test.go TestOpen: four base64 digits spliced into the signature line.
    spliced = QUOTE + b"\n" + PETER_LINE[:60] + b"ABCD" + PETER_LINE[60:]
    assert kind_of(open_note, spliced, *parse_vkey(PETER_VKEY)) == "bad_signature"


def test_tlog_checkpoint_spec_example_is_a_real_sumdb_checkpoint() -> None:
    name, public = parse_vkey(SUMDB_VKEY)
    text = open_note(sofa_note("go.sum database tree", name), name, public)
    checkpoint = Checkpoint.from_text(text)
    assert checkpoint == Checkpoint(
        "go.sum database tree", 20852163, base64.b64decode(SOFA_ROOT), ()
    )
    assert checkpoint.to_text() == text
    # As printed in the spec the key name differs, so the sumdb key does not match it...
    printed = sofa_note("example.com/behind-the-sofa", "example.com/behind-the-sofa")
    assert Checkpoint.from_text(parse_note(printed).text).origin == "example.com/behind-the-sofa"
    assert kind_of(open_note, printed, name, public) == "unknown_key"
    # ...and with the right key name, the edited origin no longer verifies.
    relabelled = sofa_note("example.com/behind-the-sofa", name)
    assert kind_of(open_note, relabelled, name, public) == "bad_signature"


def test_signed_note_spec_example_parses() -> None:
    parsed = parse_note(QUASIMODO)
    assert parsed.text.endswith(b"\n\ned \xc3\xa8 subito sera.\n")  # an empty line inside
    (signature,) = parsed.signatures
    assert signature.key_name == "quasimodo.example/salvatore"
    assert len(signature.signature) == 64
    assert parsed.to_bytes() == QUASIMODO


def test_tlog_proof_spec_example() -> None:
    assert kind_of(TlogProof.from_bytes, ELIDED_PROOF) == "malformed"  # "[...]" is not base64
    data = PROOF_HEAD + sign_note(FANCYLOG, "example.com/fancylog", LOG_KEY)
    proof = TlogProof.from_bytes(data)
    assert proof.index == 73894
    assert proof.path[0] == base64.b64decode("gSKyXoYZUgZ6jduWYrkDOARinOMGJveXjgMkBTcdPlQ=")
    assert len(proof.path) == 5
    assert proof.extra is not None and proof.extra.startswith(b"age-v1.2.1-darwin-arm64.tar.gz")
    assert proof.to_bytes() == data
    text = open_note(proof.checkpoint, "example.com/fancylog", LOG_KEY.public_key())
    assert Checkpoint.from_text(text).size == 109482


# -- round trips ------------------------------------------------------------------------


@settings(deadline=None)
@given(text=note_texts, name=names, key=keys)
def test_sign_open_round_trip(text: bytes, name: str, key: Ed25519PrivateKey) -> None:
    note = sign_note(text, name, key)
    assert open_note(note, name, key.public_key()) == text
    parsed = parse_note(note)
    assert parsed.text == text
    assert [(s.key_name, s.key_id) for s in parsed.signatures] == [
        (name, ed25519_key_id(name, key.public_key()))
    ]
    assert parsed.to_bytes() == note
    name2, public = parse_vkey(vkey(name, key.public_key()))
    assert (name2, raw_public(public)) == (name, raw_public(key.public_key()))


@given(text=note_texts, sigs=st.lists(signatures, min_size=1, max_size=5).map(tuple))
def test_parse_note_round_trip(text: bytes, sigs: tuple[NoteSignature, ...]) -> None:
    note = SignedNote(text, sigs)
    assert parse_note(note.to_bytes()) == note


def test_text_is_split_at_the_last_empty_line() -> None:
    # The text itself may end in empty lines and hold something shaped like a signature.
    for text in [b"\n", b"\n\n", b"a\n\n", "a\n\n\u2014 PeterNeumann AAAAAAA=\n".encode()]:
        note = sign_note(text, "PeterNeumann", go_signer(PETER_SKEY))
        assert open_note(note, *parse_vkey(PETER_VKEY)) == text


@given(checkpoint=checkpoints)
def test_checkpoint_round_trip(checkpoint: Checkpoint) -> None:
    text = checkpoint.to_text()
    assert Checkpoint.from_text(text) == checkpoint
    assert Checkpoint.from_text(text).to_text() == text


@settings(deadline=None)
@given(
    index=st.integers(0, 2**63 - 1),
    path=st.lists(st.binary(min_size=32, max_size=32), max_size=64).map(tuple),
    extra=st.none() | st.binary(max_size=100),
    checkpoint=checkpoints,
)
def test_proof_round_trip(
    index: int, path: tuple[bytes, ...], extra: bytes | None, checkpoint: Checkpoint
) -> None:
    proof = TlogProof(index, path, signed_checkpoint(checkpoint), extra)
    data = proof.to_bytes()
    assert TlogProof.from_bytes(data) == proof
    assert TlogProof.from_bytes(data).to_bytes() == data
    text = open_note(proof.checkpoint, "example.com/log", LOG_KEY.public_key())
    assert Checkpoint.from_text(text) == checkpoint


def test_empty_extra_is_kept_apart_from_no_extra() -> None:
    note = signed_checkpoint(Checkpoint("o", 1, bytes(32)))
    with_empty = TlogProof(0, (), note, b"").to_bytes()
    assert with_empty.split(b"\n")[1] == b"extra "
    assert TlogProof.from_bytes(with_empty).extra == b""
    assert TlogProof.from_bytes(TlogProof(0, (), note).to_bytes()).extra is None


def test_size_bounds_are_accepted() -> None:
    for size in (0, 2**63 - 1):
        text = Checkpoint("o", size, bytes(32)).to_text()
        assert Checkpoint.from_text(text).size == size


# -- signed-note refusals ---------------------------------------------------------------


def test_every_flipped_bit_is_refused() -> None:
    name, public = parse_vkey(PETER_VKEY)
    name_at = len(QUOTE) + 1 + len("\u2014 ".encode())
    seen = set()
    for bit in range(len(PETER_NOTE) * 8):
        flipped = bytearray(PETER_NOTE)
        flipped[bit // 8] ^= 1 << (bit % 8)
        kind = kind_of(open_note, bytes(flipped), name, public)
        seen.add(kind)
        if bit // 8 < len(QUOTE):  # the signed text
            assert kind in {"bad_signature", "malformed"}, bit
        elif name_at <= bit // 8 < name_at + len(name):  # the key name
            assert kind in {"unknown_key", "malformed"}, bit
    assert seen == {"bad_signature", "malformed", "unknown_key"}


@settings(deadline=None)
@given(text=note_texts, name=names, key=keys, data=st.data())
def test_random_flipped_bit_is_refused(
    text: bytes, name: str, key: Ed25519PrivateKey, data: st.DataObject
) -> None:
    note = bytearray(sign_note(text, name, key))
    bit = data.draw(st.integers(0, len(note) * 8 - 1))
    note[bit // 8] ^= 1 << (bit % 8)
    kind_of(open_note, bytes(note), name, key.public_key())


def test_other_keys_are_unknown() -> None:
    note = sign_note(b"hello\n", "alice", KEYS[0])
    assert kind_of(open_note, note, "alice", KEYS[1].public_key()) == "unknown_key"
    assert kind_of(open_note, note, "bob", KEYS[0].public_key()) == "unknown_key"
    assert open_note(note, "alice", KEYS[0].public_key()) == b"hello\n"


def test_signatures_by_other_keys_are_ignored() -> None:
    text = b"hello\n"
    mine = parse_note(sign_note(text, "alice", KEYS[0])).signatures
    others = (
        parse_note(sign_note(text, "bob", KEYS[1])).signatures
        + parse_note(sign_note(text, "alice", KEYS[2])).signatures  # same name, other key
        + (NoteSignature("carol", b"\0\0\0\0", b"x"),)  # not even Ed25519-sized
    )
    for order in (others + mine, mine + others):
        assert open_note(SignedNote(text, order).to_bytes(), "alice", KEYS[0].public_key()) == text


def test_any_failing_signature_by_the_key_rejects_the_note() -> None:
    text = b"hello\n"
    key_id = ed25519_key_id("alice", KEYS[0].public_key())
    good = parse_note(sign_note(text, "alice", KEYS[0])).signatures[0]
    forged = NoteSignature("alice", key_id, bytes(64))
    short = NoteSignature("alice", key_id, good.signature[:63])
    for sigs in [(forged,), (good, forged), (forged, good), (short,)]:
        note = SignedNote(text, sigs).to_bytes()
        assert kind_of(open_note, note, "alice", KEYS[0].public_key()) == "bad_signature"


def test_every_truncation_is_malformed() -> None:
    name, public = parse_vkey(PETER_VKEY)
    for end in range(len(PETER_NOTE)):
        assert kind_of(open_note, PETER_NOTE[:end], name, public) == "malformed"


BAD_NOTES = [
    QUOTE,  # no signatures
    QUOTE + b"\n",  # an empty signature block
    QUOTE + b"\n" + PETER_LINE[:-1],  # no final newline
    b"\x01" + QUOTE + b"\n" + PETER_LINE,  # a control character
    b"\xff" + QUOTE + b"\n" + PETER_LINE,  # not UTF-8
    QUOTE.replace(b"\n", b"\r\n") + b"\r\n" + PETER_LINE,  # CRLF
    QUOTE + b"\n" + PETER_LINE.replace(b"PeterNeumann", b"Peter Neumann"),
    QUOTE + b"\n" + PETER_LINE.replace(b"PeterNeumann", b"Peter+Neumann"),
    QUOTE + b"\n" + PETER_LINE.replace(b"PeterNeumann", "Peter\u00a0Neumann".encode()),
    QUOTE + b"\n" + PETER_LINE.replace(b"PeterNeumann", "Peter\u2003Neumann".encode()),
    QUOTE + b"\n" + PETER_LINE.replace("\u2014".encode(), b"-"),  # a hyphen, not an em dash
    QUOTE + b"\n" + PETER_LINE.replace(b"PeterNeumann ", b"PeterNeumann"),  # no space
    QUOTE + b"\n" + PETER_LINE.replace(b"PeterNeumann ", b"PeterNeumann  "),  # two spaces
    QUOTE + b"\n" + PETER_LINE.replace(b"AM=", b"AN="),  # non-canonical base64
    QUOTE + b"\n" + PETER_LINE.replace(b"AM=", b"AM"),  # unpadded base64
    QUOTE + b"\n" + "\u2014 PeterNeumann x08gow==\n".encode(),  # key id and nothing more
    QUOTE + b"\n" + "\u2014  x08go/ZJ\n".encode(),  # empty key name
    QUOTE + b"\n" + PETER_LINE + b"Unexpected line.\n",
    QUOTE + b"\n" + PETER_LINE * 101,  # too many signatures
]


@pytest.mark.parametrize("data", BAD_NOTES)
def test_malformed_notes(data: bytes) -> None:
    assert kind_of(parse_note, data) == "malformed"
    assert kind_of(open_note, data, *parse_vkey(PETER_VKEY)) == "malformed"


def test_a_note_may_carry_many_signatures() -> None:
    assert open_note(QUOTE + b"\n" + PETER_LINE * 100, *parse_vkey(PETER_VKEY)) == QUOTE


@pytest.mark.parametrize(
    "text", [b"", b"no final newline", b"tab\there\n", b"\xff\n", b"cr\r\n", "x\n"]
)
def test_sign_note_refuses_bad_text(text: Any) -> None:
    assert kind_of(sign_note, text, "alice", KEYS[0]) == "malformed"


@pytest.mark.parametrize(
    "name", ["", "a b", "a+b", "a\nb", "a\x01b", "a\u00a0b", "a\u2003b", "a\u3000b", "\ud800"]
)
def test_bad_key_names_are_refused(name: str) -> None:
    assert kind_of(sign_note, b"hello\n", name, KEYS[0]) == "malformed"
    assert kind_of(ed25519_key_id, name, KEYS[0].public_key()) == "malformed"
    assert kind_of(vkey, name, KEYS[0].public_key()) == "malformed"


# -- verifier key refusals --------------------------------------------------------------


def test_mangled_verifier_keys_are_refused() -> None:
    # Every proper substring and every single-byte change of a good key (as note_test.go does).
    good = PETER_VKEY.encode()
    mangled = {good[i:j] for i in range(len(good) + 1) for j in range(i, len(good) + 1)}
    for i in range(len(good)):
        mangled.add(good[:i] + bytes([(good[i] + 1) % 128]) + good[i + 1 :])
    mangled.discard(good)
    for key in sorted(mangled):
        assert kind_of(parse_vkey, key.decode()) == "malformed", key
    for key_text in [*GO_BAD_VKEYS, PETER_VKEY.upper(), PETER_VKEY.replace("c74f", "C74F")]:
        assert kind_of(parse_vkey, key_text) == "malformed", key_text


# -- checkpoint refusals ----------------------------------------------------------------

ROOT = base64.b64encode(hashlib.sha256(b"").digest())  # has both "+" and "/" in it


def checkpoint_text(
    origin: bytes = b"example.com/log", size: bytes = b"42", root: bytes = ROOT
) -> bytes:
    return origin + b"\n" + size + b"\n" + root + b"\n"


BAD_CHECKPOINTS = [
    checkpoint_text(origin=b""),
    *(
        checkpoint_text(size=size)
        for size in [
            b"042",
            b"00",
            b"+42",
            b"-42",
            b"-0",
            b" 42",
            b"42 ",
            b"4_2",
            b"",
            b"0x2a",
            b"4e1",
            "\u0664\u0662".encode(),  # Arabic-Indic digits, which int() would take
            str(2**63).encode(),
            b"1" * 5000,
        ]
    ),
    *(
        checkpoint_text(root=root)
        for root in [
            base64.b64encode(bytes(31)),
            base64.b64encode(bytes(33)),
            noncanonical(ROOT),
            ROOT.rstrip(b"="),
            ROOT.replace(b"/", b"_").replace(b"+", b"-"),  # base64url is not the standard alphabet
            b" " + ROOT,
            b"",
        ]
    ),
    checkpoint_text()[:-1],  # no final newline
    b"example.com/log\n42\n",  # two lines
    checkpoint_text() + b"\n",  # an empty extension line
    checkpoint_text() + b"ext\x07\n",  # a control character
    checkpoint_text(origin=b"\xc3\x28"),  # not UTF-8
    checkpoint_text() + b"\n\n" + PETER_LINE,  # a signed note, not its text
]


@pytest.mark.parametrize("text", BAD_CHECKPOINTS)
def test_malformed_checkpoints(text: bytes) -> None:
    assert kind_of(Checkpoint.from_text, text) == "malformed"


@pytest.mark.parametrize(
    "fields",
    [
        ("", 1, bytes(32), ()),
        ("a\nb", 1, bytes(32), ()),
        ("o", -1, bytes(32), ()),
        ("o", 2**63, bytes(32), ()),
        ("o", True, bytes(32), ()),
        ("o", 1, bytes(31), ()),
        ("o", 1, bytes(32), ("",)),
        ("o", 1, bytes(32), ("a\nb",)),
        ("o", 1, bytes(32), ["ext"]),
    ],
)
def test_invalid_checkpoints_cannot_be_built(fields: tuple[Any, ...]) -> None:
    assert kind_of(Checkpoint, *fields) == "malformed"


# -- proof refusals ---------------------------------------------------------------------

NOTE = signed_checkpoint(Checkpoint("example.com/log", 5, bytes(32)))
HASH = base64.b64encode(bytes(range(32)))


def proof_bytes(
    header: bytes = b"c2sp.org/tlog-proof@v1\n",
    extra: bytes = b"extra AQID\n",
    index: bytes = b"index 3\n",
    path: bytes = HASH + b"\n" + HASH + b"\n",
    gap: bytes = b"\n",
    checkpoint: bytes = NOTE,
) -> bytes:
    return header + extra + index + path + gap + checkpoint


def test_proof_parts_parse() -> None:
    proof = TlogProof.from_bytes(proof_bytes())
    assert (proof.index, proof.path, proof.extra) == (3, (bytes(range(32)),) * 2, b"\1\2\3")


BAD_PROOFS = [
    proof_bytes(header=b""),
    proof_bytes(header=b"c2sp.org/tlog-proof@v2\n"),
    proof_bytes(header=b"c2sp.org/spicy-signature@v1\n"),
    proof_bytes(header=b"c2sp.org/tlog-proof@v1 \n"),
    proof_bytes(header=b"c2sp.org/tlog-proof@v1\r\n"),
    proof_bytes(extra=b"extra !!!!\n"),
    proof_bytes(extra=b"extra AQI\n"),
    proof_bytes(extra=b"extra " + noncanonical(b"AQI=") + b"\n"),
    proof_bytes(extra=b"extra\n"),
    proof_bytes(extra=b"", index=b"index 3\nextra AQID\n"),  # extra after index
    proof_bytes(extra=b"extra AQID\nextra AQID\n"),
    *(
        proof_bytes(index=b"index " + index + b"\n")
        for index in [b"03", b"+3", b"-3", b"", b" 3", b"3 ", str(2**63).encode(), b"\xd9\xa3"]
    ),
    proof_bytes(index=b"index3\n"),
    proof_bytes(index=b""),
    proof_bytes(path=base64.b64encode(bytes(31)) + b"\n"),
    proof_bytes(path=base64.b64encode(bytes(33)) + b"\n"),
    proof_bytes(path=b"not base64!\n"),
    proof_bytes(path=noncanonical(HASH) + b"\n"),
    proof_bytes(path=HASH + b" \n"),
    proof_bytes(gap=b"", checkpoint=b""),  # no empty line
    proof_bytes(gap=b""),  # the checkpoint runs into the path
    proof_bytes(checkpoint=b""),
    proof_bytes(checkpoint=Checkpoint("o", 1, bytes(32)).to_text()),  # unsigned
    proof_bytes(checkpoint=sign_note(b"not a checkpoint\n", "example.com/log", LOG_KEY)),
    proof_bytes(checkpoint=NOTE + b"trailing\n"),
]


@pytest.mark.parametrize("data", BAD_PROOFS)
def test_malformed_proofs(data: bytes) -> None:
    assert kind_of(TlogProof.from_bytes, data) == "malformed"


def test_every_proof_truncation_is_malformed() -> None:
    data = proof_bytes()
    for end in range(len(data)):
        assert kind_of(TlogProof.from_bytes, data[:end]) == "malformed"


@pytest.mark.parametrize(
    "fields",
    [
        (-1, (), NOTE, None),
        (2**63, (), NOTE, None),
        (0, [bytes(32)], NOTE, None),
        (0, (bytes(31),), NOTE, None),
        (0, (), NOTE, "extra"),
        (0, (), b"not a note", None),
    ],
)
def test_invalid_proofs_cannot_be_built(fields: tuple[Any, ...]) -> None:
    assert kind_of(TlogProof, *fields) == "malformed"


# -- nothing but NoteError, whatever the input ------------------------------------------


def parses_or_refuses(call: Callable[..., Any], *args: Any) -> None:
    try:
        call(*args)
    except NoteError as exc:
        assert exc.kind in {"malformed", "unknown_key", "bad_signature"}


def all_parsers(data: bytes) -> None:
    name, public = parse_vkey(PETER_VKEY)
    parses_or_refuses(parse_note, data)
    parses_or_refuses(open_note, data, name, public)
    parses_or_refuses(Checkpoint.from_text, data)
    parses_or_refuses(TlogProof.from_bytes, data)
    parses_or_refuses(parse_vkey, data.decode("utf-8", "surrogateescape"))


@given(st.binary(max_size=300))
def test_random_bytes_parse_or_raise_note_error(data: bytes) -> None:
    all_parsers(data)


@settings(deadline=None)
@given(
    base=st.sampled_from(
        [PETER_NOTE, QUASIMODO, proof_bytes(), checkpoint_text(), PETER_VKEY.encode()]
    ),
    data=st.data(),
)
def test_spliced_inputs_parse_or_raise_note_error(base: bytes, data: st.DataObject) -> None:
    start = data.draw(st.integers(0, len(base)))
    end = data.draw(st.integers(start, len(base)))
    insert = data.draw(st.binary(max_size=8) | st.sampled_from([b"\n", b"\n\n", b"+", b"="]))
    all_parsers(base[:start] + insert + base[end:])


def test_note_error_is_a_cassette_error_with_its_kind() -> None:
    name, public = parse_vkey(PETER_VKEY)
    cases = {
        "malformed": PETER_NOTE[:-1],
        "unknown_key": sign_note(QUOTE, name, KEYS[0]),
        "bad_signature": PETER_NOTE.replace(b"problem,", b"problem;"),
    }
    for kind, data in cases.items():
        with pytest.raises(CassetteError) as caught:
            open_note(data, name, public)
        error = caught.value
        assert isinstance(error, NoteError)
        assert error.kind == kind
        assert error.code is ErrorCode.INVALID_ARGUMENT
        assert error.detail == {"kind": kind}
        assert error.to_dict()["kind"] == kind
