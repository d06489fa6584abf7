"""Rekor inclusion proofs: a log entry is in the Merkle tree whose root a checkpoint signed
by the log's key names.

Where it sits: under ``rukpak.signing.verify`` beside ``keyless`` (which checks an entry's
signed entry timestamp and what its body records). A Sigstore bundle's tlog entry may hold
an ``inclusionProof`` (``rukpak.signing.sigstore`` keeps it on the signature); when the
policy names a Rekor key, a proof that is there must verify: the entry's leaf hash, the
proof's hashes and the tree size give the proof's root (RFC 6962 / RFC 9162 section
2.1.3.2), and the checkpoint (a signed note, ``transparency-dev/formats``) states that
root and size and is signed by the Rekor key.

Protocol facts (Sigstore bundle v0.3, ``dev.sigstore.rekor.v1.InclusionProof``):
``logIndex``, ``rootHash`` (base64), ``treeSize``, ``hashes`` (base64, leaf to root) and
``checkpoint.envelope``: the note text ``<origin>\\n<size>\\n<base64 root>\\n[...]\\n\\n``
followed by signature lines ``— <name> <base64(4-byte key hint || signature)>``. A leaf
hash is SHA-256(0x00 || entry body), an inner node SHA-256(0x01 || left || right).

Hand-written (about 100 lines) rather than taken from the ``sigstore`` package, whose
Merkle and checkpoint code is private API (``sigstore._internal``) and comes with a
verifier that insists on its own trust roots and online TUF.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Final

from cryptography.exceptions import InvalidSignature
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.hazmat.primitives.asymmetric import padding as rsa_padding
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes

from rukpak.common import errors

MAX_HASHES: Final[int] = 64
"""Proof hashes at most (a tree of 2**64 entries needs 64)."""
MAX_NOTE: Final[int] = 8 << 10


class ProofError(errors.InvalidArgument):
    """An inclusion proof or its checkpoint does not verify (the message says why)."""


@dataclass(frozen=True)
class Proof:
    """A tlog entry's inclusion proof, with the entry body it proves."""

    body: bytes
    log_index: int
    tree_size: int
    root_hash: bytes
    hashes: tuple[bytes, ...]
    checkpoint: str

    @classmethod
    def from_entry(cls, entry: dict[str, Any], *, where: str) -> Proof | None:
        """The proof of a bundle's tlog entry; None when it has none. ProofError when it
        is there but malformed."""
        raw = entry.get("inclusionProof")
        if raw is None:
            return None
        try:
            checkpoint = raw["checkpoint"]["envelope"]
            hashes_b64 = raw["hashes"]
            if not isinstance(checkpoint, str) or not isinstance(hashes_b64, list):
                raise TypeError
            if len(hashes_b64) > MAX_HASHES or len(checkpoint) > MAX_NOTE:
                raise ValueError("too large")
            return cls(
                body=base64.b64decode(entry["canonicalizedBody"], validate=True),
                log_index=int(raw["logIndex"]),
                tree_size=int(raw["treeSize"]),
                root_hash=base64.b64decode(raw["rootHash"], validate=True),
                hashes=tuple(base64.b64decode(h, validate=True) for h in hashes_b64),
                checkpoint=checkpoint,
            )
        except (KeyError, TypeError, ValueError, binascii.Error) as exc:
            raise ProofError(f"{where}: a malformed tlog inclusionProof ({exc!s:.80})") from None


def _node(left: bytes, right: bytes) -> bytes:
    return hashlib.sha256(b"\x01" + left + right).digest()


def root_from_proof(leaf: bytes, index: int, size: int, proof: Sequence[bytes]) -> bytes:
    """The tree root that ``proof`` (leaf to root) gives for the leaf hash ``leaf`` at
    ``index`` in a tree of ``size`` leaves (RFC 9162 2.1.3.2); ProofError if it cannot."""
    if not 0 <= index < size:
        raise ProofError(f"inclusion proof index {index} is outside a tree of {size}")
    inner = (index ^ (size - 1)).bit_length()
    border = bin(index >> inner).count("1")
    if len(proof) != inner + border:
        raise ProofError(
            f"inclusion proof has {len(proof)} hashes; index {index} in a tree of {size} "
            f"needs {inner + border}"
        )
    node = leaf
    for i, sibling in enumerate(proof[:inner]):
        node = _node(node, sibling) if (index >> i) & 1 == 0 else _node(sibling, node)
    for sibling in proof[inner:]:
        node = _node(sibling, node)
    return node


def _verifies(key: PublicKeyTypes, signature: bytes, data: bytes) -> bool:
    try:
        if isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(signature, data, ec.ECDSA(hashes.SHA256()))
        elif isinstance(key, ed25519.Ed25519PublicKey):
            key.verify(signature, data)
        elif isinstance(key, rsa.RSAPublicKey):
            key.verify(signature, data, rsa_padding.PKCS1v15(), hashes.SHA256())
        else:
            return False
    except InvalidSignature:
        return False
    return True


def key_hint(key: PublicKeyTypes) -> bytes:
    """The 4-byte hint Rekor's checkpoints put before a signature: the first bytes of the
    SHA-256 of the key's DER SubjectPublicKeyInfo."""
    der = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(der).digest()[:4]


def verify_checkpoint(note: str, keys: Sequence[PublicKeyTypes]) -> tuple[int, bytes]:
    """(tree size, root hash) a checkpoint states, once one of its signatures verifies
    with one of ``keys``; ProofError otherwise."""
    text, sep, signatures = note.partition("\n\n")
    if not sep or not text:
        raise ProofError("the checkpoint is not a signed note (no blank line)")
    lines = text.split("\n")
    if len(lines) < 3 or not lines[1].isdigit():
        raise ProofError("the checkpoint does not state an origin, a size and a root hash")
    try:
        root = base64.b64decode(lines[2], validate=True)
    except (binascii.Error, ValueError):
        raise ProofError("the checkpoint's root hash is not base64") from None
    signed = (text + "\n").encode()
    for line in signatures.split("\n"):
        if not line.startswith("\u2014 "):
            continue
        try:
            blob = base64.b64decode(line.rsplit(" ", 1)[-1], validate=True)
        except (binascii.Error, ValueError):
            continue
        for key in keys:
            if blob[:4] == key_hint(key) and _verifies(key, blob[4:], signed):
                return int(lines[1]), root
    raise ProofError("no signature of the checkpoint verifies with the trusted Rekor keys")


def verify(proof: Proof, keys: Sequence[PublicKeyTypes]) -> None:
    """``proof`` puts its entry in the tree its checkpoint, signed by one of ``keys``,
    names; ProofError saying which step fails."""
    leaf = hashlib.sha256(b"\x00" + proof.body).digest()
    root = root_from_proof(leaf, proof.log_index, proof.tree_size, proof.hashes)
    if root != proof.root_hash:
        raise ProofError("the inclusion proof does not lead to its root hash")
    size, signed_root = verify_checkpoint(proof.checkpoint, keys)
    if (size, signed_root) != (proof.tree_size, proof.root_hash):
        raise ProofError("the checkpoint states another tree than the inclusion proof")
