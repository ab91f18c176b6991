"""Three C2SP text formats, pure (no database): signed notes, tlog checkpoints, tlog proofs.

- c2sp.org/signed-note (Ed25519 only, signature type 0x01): `sign_note`, `parse_note`,
  `open_note`, `ed25519_key_id`, and verifier keys `vkey` / `parse_vkey` in the
  ``<name>+<hex key id>+<base64(0x01 || public key)>`` form of golang.org/x/mod/sumdb/note.
- c2sp.org/tlog-checkpoint: `Checkpoint`, the text a log signs as a note.
- c2sp.org/tlog-proof@v1: `TlogProof`, an index, an inclusion path and a signed checkpoint.

Parsing is strict: base64 must be canonical (standard alphabet, padded, zero pad bits) and
decimals must have no sign and no leading zeros, so every accepted input has exactly one
encoding. Every refusal is a `NoteError` whose ``kind`` is ``"malformed"``, ``"unknown_key"``
or ``"bad_signature"``. The ``cryptography`` package is imported lazily.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from .errors import CassetteError, ErrorCode

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

NoteErrorKind = Literal["malformed", "unknown_key", "bad_signature"]

ED25519_TYPE = 0x01  # signed-note signature type identifier for Ed25519
MAX_SIGNATURES = 100  # the spec says verifiers must accept at least 16
MAX_INT = 2**63 - 1  # largest tree size or index
PROOF_HEADER = b"c2sp.org/tlog-proof@v1"

_EM_DASH_SPACE = "\u2014 ".encode()
_CONTROL = re.compile("[\x00-\x09\x0b-\x1f]")  # ASCII controls other than newline
_DECIMAL = re.compile(rb"0|[1-9][0-9]{0,18}")
_HEX_ID = re.compile("[0-9a-f]{8}")


class NoteError(CassetteError):
    """A refused note, checkpoint, proof or key; ``kind`` says why (also in ``detail``)."""

    def __init__(self, kind: NoteErrorKind, message: str) -> None:
        super().__init__(ErrorCode.INVALID_ARGUMENT, message, kind=kind)
        self.kind: NoteErrorKind = kind


def _malformed(message: str) -> NoteError:
    return NoteError("malformed", message)


def _b64decode(data: bytes, what: str) -> bytes:
    """Standard padded base64 (RFC 4648 section 4), refusing any non-canonical spelling."""
    try:
        raw = base64.b64decode(data, validate=True)
    except (binascii.Error, ValueError) as exc:
        raise _malformed(f"{what} is not valid base64") from exc
    if base64.b64encode(raw) != data:
        raise _malformed(f"{what} is not canonical base64")
    return raw


def _decimal(data: bytes, what: str) -> int:
    """An ASCII decimal in 0..2**63-1 with no sign and no leading zeros."""
    if _DECIMAL.fullmatch(data) is None:
        raise _malformed(f"{what} is not a canonical decimal")
    value = int(data)
    if value > MAX_INT:
        raise _malformed(f"{what} is larger than 2**63-1")
    return value


def _check_int(value: object, what: str) -> None:
    if not isinstance(value, int) or isinstance(value, bool) or not 0 <= value <= MAX_INT:
        raise _malformed(f"{what} must be an int in 0..2**63-1")


def _note_text(data: object, what: str) -> str:
    """Valid UTF-8, no ASCII control character but newline (signed-note, Format)."""
    if not isinstance(data, bytes):
        raise _malformed(f"{what} must be bytes")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise _malformed(f"{what} is not valid UTF-8") from exc
    if _CONTROL.search(text):
        raise _malformed(f"{what} contains an ASCII control character")
    return text


def _check_line(value: object, what: str) -> str:
    """One non-empty line of note text: a str with no newline or control character."""
    if not isinstance(value, str) or not value:
        raise _malformed(f"{what} must be a non-empty str")
    try:
        _note_text(value.encode("utf-8"), what)
    except UnicodeEncodeError as exc:
        raise _malformed(f"{what} is not encodable as UTF-8") from exc
    if "\n" in value:
        raise _malformed(f"{what} contains a newline")
    return value


def _check_name(name: object) -> str:
    """Key names are non-empty, without Unicode spaces or '+' (signed-note, Format)."""
    checked = _check_line(name, "key name")
    if "+" in checked or any(ch.isspace() for ch in checked):
        raise _malformed(f"key name {checked!r} contains a space or '+'")
    return checked


# -- c2sp.org/signed-note ---------------------------------------------------------------


@dataclass(frozen=True)
class NoteSignature:
    """One signature line: ``— <key_name> base64(key_id || signature)``."""

    key_name: str
    key_id: bytes  # 4 bytes, the big-endian uint32 key ID
    signature: bytes  # the algorithm's signature over the note text (64 bytes for Ed25519)

    def __post_init__(self) -> None:
        _check_name(self.key_name)
        if not isinstance(self.key_id, bytes) or len(self.key_id) != 4:
            raise _malformed("key id must be 4 bytes")
        if not isinstance(self.signature, bytes) or not self.signature:
            raise _malformed("signature must be non-empty bytes")

    def to_line(self) -> bytes:
        b64 = base64.b64encode(self.key_id + self.signature)
        return _EM_DASH_SPACE + self.key_name.encode() + b" " + b64 + b"\n"


@dataclass(frozen=True)
class SignedNote:
    """A note text (ending in newline) and its signatures, none of them verified."""

    text: bytes
    signatures: tuple[NoteSignature, ...]

    def __post_init__(self) -> None:
        _note_text(self.text, "note text")
        if not self.text.endswith(b"\n"):
            raise _malformed("note text must end with a newline")
        if not isinstance(self.signatures, tuple) or not self.signatures:
            raise _malformed("a note needs at least one signature")
        if len(self.signatures) > MAX_SIGNATURES:
            raise _malformed(f"a note may carry at most {MAX_SIGNATURES} signatures")
        if not all(isinstance(sig, NoteSignature) for sig in self.signatures):
            raise _malformed("signatures must be NoteSignature values")

    def to_bytes(self) -> bytes:
        """The encoded note: text, a blank line, one line per signature."""
        return self.text + b"\n" + b"".join(sig.to_line() for sig in self.signatures)


def _raw_public(public_key: Ed25519PublicKey) -> bytes:
    from cryptography.hazmat.primitives import serialization

    return public_key.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)


def ed25519_key_id(name: str, public_key: Ed25519PublicKey) -> bytes:
    """SHA-256(name || 0x0A || 0x01 || 32-byte public key)[:4] (signed-note, Ed25519)."""
    preimage = _check_name(name).encode() + bytes([0x0A, ED25519_TYPE]) + _raw_public(public_key)
    return hashlib.sha256(preimage).digest()[:4]


def sign_note(text: bytes, name: str, private_key: Ed25519PrivateKey) -> bytes:
    """Sign ``text`` (UTF-8 ending in newline) as ``name``; the note with one signature line."""
    _note_text(text, "note text")  # refuse before signing anything
    key_id = ed25519_key_id(name, private_key.public_key())
    return SignedNote(text, (NoteSignature(name, key_id, private_key.sign(text)),)).to_bytes()


def _parse_signature_line(line: bytes) -> NoteSignature:
    if not line.startswith(_EM_DASH_SPACE):
        raise _malformed("a signature line must start with an em dash and a space")
    name, space, b64 = line[len(_EM_DASH_SPACE) :].partition(b" ")
    if not space:
        raise _malformed("a signature line needs a key name and a signature")
    raw = _b64decode(b64, "signature")
    if len(raw) < 5:
        raise _malformed("a signature must be a key id and at least one byte")
    return NoteSignature(name.decode(), raw[:4], raw[4:])


def parse_note(data: bytes) -> SignedNote:
    """Split a signed note into its text and signature lines; verifies nothing.

    The text is separated from the signatures by the last empty line (c2sp.org/signed-note).
    """
    _note_text(data, "note")
    split = data.rfind(b"\n\n")
    if split < 0:
        raise _malformed("no empty line separates the text from the signatures")
    text, block = data[: split + 1], data[split + 2 :]
    if not block.endswith(b"\n"):
        raise _malformed("the signature block must end with a newline")
    lines = block[:-1].split(b"\n")
    if len(lines) > MAX_SIGNATURES:
        raise _malformed(f"a note may carry at most {MAX_SIGNATURES} signatures")
    return SignedNote(text, tuple(_parse_signature_line(line) for line in lines))


def open_note(data: bytes, name: str, public_key: Ed25519PublicKey) -> bytes:
    """The text of ``data`` once the signature by key (``name``, ``public_key``) verifies.

    Lines whose (key name, key id) differ from this key's are ignored. If none match the
    kind is ``unknown_key``; if any matching line fails to verify, ``bad_signature``.
    """
    from cryptography.exceptions import InvalidSignature

    note = parse_note(data)
    key_id = ed25519_key_id(name, public_key)
    mine = [s for s in note.signatures if s.key_name == name and s.key_id == key_id]
    if not mine:
        raise NoteError("unknown_key", f"the note carries no signature by {name}+{key_id.hex()}")
    for sig in mine:
        try:
            if len(sig.signature) != 64:
                raise InvalidSignature("an Ed25519 signature is 64 bytes")
            public_key.verify(sig.signature, note.text)
        except InvalidSignature as exc:
            message = f"the signature by {name}+{key_id.hex()} does not verify"
            raise NoteError("bad_signature", message) from exc
    return note.text


def vkey(name: str, public_key: Ed25519PublicKey) -> str:
    """The verifier key string ``<name>+<8 hex key id>+<base64(0x01 || public key)>``."""
    key_id = ed25519_key_id(name, public_key)
    encoded = base64.b64encode(bytes([ED25519_TYPE]) + _raw_public(public_key)).decode()
    return f"{name}+{key_id.hex()}+{encoded}"


def parse_vkey(text: str) -> tuple[str, Ed25519PublicKey]:
    """Parse a verifier key string; the key id must match the name and key it names."""
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    if not isinstance(text, str):
        raise _malformed("a verifier key must be a str")
    name, plus1, rest = text.partition("+")
    hex_id, plus2, b64 = rest.partition("+")
    if not (plus1 and plus2) or _HEX_ID.fullmatch(hex_id) is None:
        raise _malformed("a verifier key is <name>+<8 lowercase hex digits>+<base64 key>")
    _check_name(name)
    try:
        raw = _b64decode(b64.encode("ascii"), "verifier key")
    except UnicodeEncodeError as exc:
        raise _malformed("verifier key is not base64") from exc
    if len(raw) != 33 or raw[0] != ED25519_TYPE:
        raise _malformed("verifier key is not 0x01 and a 32-byte Ed25519 public key")
    try:
        public_key = Ed25519PublicKey.from_public_bytes(raw[1:])
    except ValueError as exc:
        raise _malformed("verifier key is not a valid Ed25519 public key") from exc
    if ed25519_key_id(name, public_key) != bytes.fromhex(hex_id):
        raise _malformed("verifier key id does not match its name and public key")
    return name, public_key


# -- c2sp.org/tlog-checkpoint -----------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    """A checkpoint's note text: origin, tree size, root hash, then optional extension lines."""

    origin: str
    size: int
    root: bytes
    extensions: tuple[str, ...] = ()

    def __post_init__(self) -> None:
        _check_line(self.origin, "origin")
        _check_int(self.size, "tree size")
        if not isinstance(self.root, bytes) or len(self.root) != 32:
            raise _malformed("root hash must be 32 bytes")
        if not isinstance(self.extensions, tuple):
            raise _malformed("extensions must be a tuple of lines")
        for line in self.extensions:
            _check_line(line, "extension line")

    def to_text(self) -> bytes:
        """The note text: one line each for origin, size, base64 root, extensions."""
        root = base64.b64encode(self.root).decode()
        lines = [self.origin, str(self.size), root, *self.extensions]
        return "".join(f"{line}\n" for line in lines).encode()

    @classmethod
    def from_text(cls, text: bytes) -> Checkpoint:
        """Parse a checkpoint's note text (not the signed note: see `open_note`)."""
        decoded = _note_text(text, "checkpoint")
        if not decoded.endswith("\n"):
            raise _malformed("checkpoint text must end with a newline")
        lines = decoded[:-1].split("\n")
        if len(lines) < 3:
            raise _malformed("a checkpoint has at least three lines")
        origin, size, root, *extensions = lines
        return cls(
            origin,
            _decimal(size.encode(), "tree size"),
            _b64decode(root.encode(), "root hash"),
            tuple(extensions),
        )


# -- c2sp.org/tlog-proof ----------------------------------------------------------------


@dataclass(frozen=True)
class TlogProof:
    """A c2sp.org/tlog-proof@v1: entry index, inclusion path, signed checkpoint, extra data.

    ``checkpoint`` is the signed checkpoint note, kept verbatim; it must parse as a signed
    note whose text is a checkpoint, but no signature is verified here. ``extra`` is
    unauthenticated. Checking the path against the checkpoint's root is the caller's job.
    """

    index: int
    path: tuple[bytes, ...]
    checkpoint: bytes
    extra: bytes | None = None

    def __post_init__(self) -> None:
        _check_int(self.index, "index")
        if not isinstance(self.path, tuple) or not all(
            isinstance(h, bytes) and len(h) == 32 for h in self.path
        ):
            raise _malformed("the inclusion path must be a tuple of 32-byte hashes")
        if self.extra is not None and not isinstance(self.extra, bytes):
            raise _malformed("extra data must be bytes or None")
        Checkpoint.from_text(parse_note(self.checkpoint).text)

    def to_bytes(self) -> bytes:
        out = [PROOF_HEADER + b"\n"]
        if self.extra is not None:
            out.append(b"extra " + base64.b64encode(self.extra) + b"\n")
        out.append(b"index %d\n" % self.index)
        out.extend(base64.b64encode(h) + b"\n" for h in self.path)
        out.append(b"\n")
        out.append(self.checkpoint)
        return b"".join(out)

    @classmethod
    def from_bytes(cls, data: bytes) -> TlogProof:
        if not isinstance(data, bytes):
            raise _malformed("a proof must be bytes")
        header, newline, rest = data.partition(b"\n")
        if not newline or header != PROOF_HEADER:
            raise _malformed("a proof must start with the line c2sp.org/tlog-proof@v1")
        extra = None
        if rest.startswith(b"extra "):
            line, newline, rest = rest.partition(b"\n")
            if not newline:
                raise _malformed("the extra line must end with a newline")
            extra = _b64decode(line[len(b"extra ") :], "extra data")
        line, newline, rest = rest.partition(b"\n")
        if not newline or not line.startswith(b"index "):
            raise _malformed("expected an index line")
        index = _decimal(line[len(b"index ") :], "index")
        path = []
        while True:
            line, newline, rest = rest.partition(b"\n")
            if not newline:
                raise _malformed("the inclusion path must be followed by an empty line")
            if not line:
                break
            path.append(_b64decode(line, "inclusion path hash"))
        return cls(index, tuple(path), rest, extra)
