"""Ed25519 signatures over an action's canonical bytes (cryptography, imported lazily)."""

from __future__ import annotations

import base64
import hashlib
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any

import orjson

from . import safe_files
from .errors import CassetteError, ErrorCode
from .payloads import loads_object

if TYPE_CHECKING:
    from cryptography.hazmat.primitives.asymmetric.ed25519 import (
        Ed25519PrivateKey,
        Ed25519PublicKey,
    )

SIGNATURE_FIELDS = ("signature", "key_id")


def key_id(public: Ed25519PublicKey) -> str:
    """First 16 hex digits of SHA-256 over the raw 32-byte public key."""
    from cryptography.hazmat.primitives import serialization

    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return hashlib.sha256(raw).hexdigest()[:16]


def generate(prefix: str) -> tuple[Path, Path]:
    """Write PREFIX.key (private, PKCS#8 PEM, mode 0600) and PREFIX.pub (public PEM),
    each created exclusively: an existing file, or a link, at either name is refused."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    private = Ed25519PrivateKey.generate()
    key_path, pub_path = Path(f"{prefix}.key"), Path(f"{prefix}.pub")
    for path in (key_path, pub_path):
        if safe_files.lexists(path):
            raise CassetteError(ErrorCode.KEY_ERROR, f"{path} exists; refusing to overwrite a key")
    pem = private.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    public_pem = private.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    for path, data, private_file in ((key_path, pem, True), (pub_path, public_pem, False)):
        try:
            safe_files.write_new(path, data, what="key file", private=private_file)
        except CassetteError as error:
            if error.detail.get("exists"):
                raise CassetteError(
                    ErrorCode.KEY_ERROR, f"{path} exists; refusing to overwrite a key"
                ) from error
            raise
    return key_path, pub_path


def _read_key(path: str | os.PathLike[str], what: str, private: bool) -> bytes:
    """A key file's bytes: a regular file, not a link, and for a private key one that
    only its owner may access (like ssh's UNPROTECTED PRIVATE KEY FILE refusal)."""
    try:
        return safe_files.read_file(
            path, what=what, max_bytes=safe_files.KEY_MAX_BYTES, private=private
        )
    except CassetteError as error:
        if private and error.code is ErrorCode.KEY_PERMISSIONS and _is_public_key(path):
            # a readable .pub given where the .key belongs: say that, not "chmod 600"
            raise CassetteError(
                ErrorCode.KEY_ERROR,
                f"{os.fspath(path)} is a public key; a private key is needed here"
                " (keygen writes PREFIX.key beside PREFIX.pub)",
            ) from error
        if error.code in (ErrorCode.NOT_FOUND, ErrorCode.CANNOT_OPEN):
            raise CassetteError(
                ErrorCode.KEY_ERROR, f"cannot load {what} {os.fspath(path)}: {error.message}"
            ) from error
        raise


def _is_public_key(path: str | os.PathLike[str]) -> bool:
    try:
        data = safe_files.read_file(path, what="key", max_bytes=safe_files.KEY_MAX_BYTES)
    except CassetteError:
        return False
    return data.lstrip().startswith(b"-----BEGIN PUBLIC KEY-----")


def load_private(path: str | os.PathLike[str]) -> Ed25519PrivateKey:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

    data = _read_key(path, "private key", private=True)
    try:
        key = serialization.load_pem_private_key(data, password=None)
    except (ValueError, TypeError) as exc:
        if data.lstrip().startswith(b"-----BEGIN PUBLIC KEY-----"):
            raise CassetteError(
                ErrorCode.KEY_ERROR, f"{path} is a public key; a private key is needed here"
            ) from exc
        raise CassetteError(ErrorCode.KEY_ERROR, f"cannot load private key {path}: {exc}") from exc
    if not isinstance(key, Ed25519PrivateKey):
        raise CassetteError(ErrorCode.KEY_ERROR, f"{path} is not an Ed25519 private key")
    return key


def load_public(path: str | os.PathLike[str]) -> Ed25519PublicKey:
    return public_from_pem(_read_key(path, "public key", private=False), str(path))


def public_from_pem(data: bytes, name: str) -> Ed25519PublicKey:
    """An Ed25519 public key from SubjectPublicKeyInfo PEM bytes; ``name`` is for errors."""
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PublicKey

    try:
        key = serialization.load_pem_public_key(data)
    except (ValueError, TypeError) as exc:
        raise CassetteError(ErrorCode.KEY_ERROR, f"cannot load public key {name}: {exc}") from exc
    if not isinstance(key, Ed25519PublicKey):
        raise CassetteError(ErrorCode.KEY_ERROR, f"{name} is not an Ed25519 public key")
    return key


def canonical_bytes(row: dict[str, Any]) -> bytes:
    """The signed bytes: the stored row's non-NULL columns (minus action_seq), with the
    metadata JSON parsed and its signature fields removed, as sorted-key compact JSON.

    NULL columns are left out, so a column added by a later migration (NULL in older
    rows) does not change what an older signature covered.
    """
    body = {k: v for k, v in row.items() if k != "action_seq" and v is not None}
    metadata = loads_object(body.pop("metadata_json"), "the metadata of an action")
    for name in SIGNATURE_FIELDS:
        metadata.pop(name, None)
    body["metadata"] = metadata
    return orjson.dumps(body, option=orjson.OPT_SORT_KEYS)


def sign(private: Ed25519PrivateKey, row: dict[str, Any]) -> tuple[str, str]:
    signature = private.sign(canonical_bytes(row))
    return base64.b64encode(signature).decode("ascii"), key_id(private.public_key())


def check(public: Ed25519PublicKey, row: dict[str, Any]) -> str | None:
    """None when the row carries a valid signature by this key, else the problem's kind."""
    from cryptography.exceptions import InvalidSignature

    try:
        metadata = loads_object(row["metadata_json"], "the metadata of an action")
    except CassetteError:  # edited by hand: no signature can hold over it
        return "bad_signature"
    signature, signer = metadata.get("signature"), metadata.get("key_id")
    if signature is None:
        return "unsigned_action"
    if signer != key_id(public):
        return "unknown_key"
    try:
        public.verify(base64.b64decode(signature, validate=True), canonical_bytes(row))
    except (InvalidSignature, ValueError):
        return "bad_signature"
    return None
