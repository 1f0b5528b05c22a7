"""Ed25519 signatures on a published ledger head, with a key the user holds.

An unsigned head file is only as trustworthy as the place it is kept; a signed one can be
kept anywhere: `verify --expect-head H --public-key P` refuses a head whose signature does not
verify under P, so a writer who rewrites the chain cannot publish a matching head without the
private key. Keys are PEM files as `openssl genpkey -algorithm ed25519` writes them.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from pathlib import Path

from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey, Ed25519PublicKey

from tica.errors import InputError, input_bytes
from tica.ledger import Head


def message(head: Head) -> bytes:
    """What is signed: the head's three fields, nothing a reader would not check."""
    return f"tica-ledger-head\n{head.seq}\n{head.row_hash}\n{head.recorded_at}".encode()


def key_id(public: Ed25519PublicKey) -> str:
    raw = public.public_bytes(serialization.Encoding.Raw, serialization.PublicFormat.Raw)
    return "ed25519:" + hashlib.sha256(raw).hexdigest()[:16]


KEY_MAX_BYTES = 64 * 1024  # a PEM key is a few hundred bytes


def _read(path: str | Path) -> bytes:
    """A key file: a regular file only (a FIFO would hang the command), and small."""
    return input_bytes(path, max_bytes=KEY_MAX_BYTES)


def load_private_key(path: str | Path) -> Ed25519PrivateKey:
    try:
        key = serialization.load_pem_private_key(_read(path), password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm) as err:
        raise InputError(path, "<pem>", f"not an unencrypted PEM private key: {err}") from None
    if not isinstance(key, Ed25519PrivateKey):
        raise InputError(path, "<pem>", f"a {type(key).__name__}, not an Ed25519 key")
    return key


def load_public_key(path: str | Path) -> Ed25519PublicKey:
    try:
        key = serialization.load_pem_public_key(_read(path))
    except (ValueError, TypeError, UnsupportedAlgorithm) as err:
        raise InputError(path, "<pem>", f"not a PEM public key: {err}") from None
    if not isinstance(key, Ed25519PublicKey):
        raise InputError(path, "<pem>", f"a {type(key).__name__}, not an Ed25519 key")
    return key


def sign(head: Head, key: Ed25519PrivateKey) -> Head:
    signature = base64.b64encode(key.sign(message(head))).decode()
    return Head(seq=head.seq, row_hash=head.row_hash, recorded_at=head.recorded_at,
                signature=signature, signed_by=key_id(key.public_key()))


def signature_problem(head: Head, public: Ed25519PublicKey) -> str | None:
    """None when `head` carries a valid signature by `public`; else what is wrong."""
    if head.signature is None:
        return "the published head is not signed, and a public key was given: an unsigned head proves nothing"
    if head.signed_by is not None and head.signed_by != key_id(public):
        # the label is not under the signature: a head naming another signer than the key that checks it
        # would have `verify` print a signer it did not check
        return (f"the published head names its signer {head.signed_by}, but the key given is {key_id(public)}: "
                "the head file was altered or the wrong key was given")
    try:
        raw = base64.b64decode(head.signature, validate=True)
        public.verify(raw, message(head))
    except (binascii.Error, ValueError, InvalidSignature):
        return (f"the published head's signature does not verify under {key_id(public)} "
                f"(signed by {head.signed_by or 'unknown'}): the head file was altered or signed by another key")
    return None
