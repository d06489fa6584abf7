"""Content digests: validation of ``algorithm:hex`` strings and hashing.

Everything that names content by digest goes through here: references
(``rukpak.oci.reference``), descriptors (``rukpak.oci.manifest``), the verifying
downloads of ``rukpak.oci.client`` and the node's content store. Two algorithms
are supported, sha256 (what every registry uses) and sha512 (allowed by the
OCI spec and cheap to support with hashlib).
"""

from __future__ import annotations

import hashlib
import re
from typing import Final

from rukpak.common import errors

# Hex lengths of the supported algorithms.
ALGORITHMS: Final[dict[str, int]] = {"sha256": 64, "sha512": 128}

# The OCI grammar: algorithm-component ([+._-] algorithm-component)* ":" encoded.
_GRAMMAR = re.compile(r"^[a-z0-9]+(?:[+._-][a-z0-9]+)*:[a-zA-Z0-9=_-]+$")
_SHA256 = re.compile(r"sha256:[0-9a-f]{64}")  # nearly every digest: one match, no more checks


def check(digest: str, *, what: str = "digest") -> str:
    """Return ``digest`` if it is a well-formed sha256 or sha512 digest.

    Raises InvalidArgument saying what is wrong (``what`` names the thing that
    carried the digest, e.g. a reference) otherwise.
    """
    if isinstance(digest, str) and _SHA256.fullmatch(digest):
        return digest
    if not isinstance(digest, str) or not _GRAMMAR.match(digest):
        raise errors.InvalidArgument(
            f"{what}: {digest!r} is not a digest: expected 'sha256:' followed by 64 lowercase "
            "hex characters"
        )
    algorithm, _, encoded = digest.partition(":")
    length = ALGORITHMS.get(algorithm)
    if length is None:
        raise errors.InvalidArgument(
            f"{what}: digest algorithm {algorithm!r} in {digest!r} is not supported: "
            f"use one of {', '.join(sorted(ALGORITHMS))}"
        )
    if len(encoded) != length or not re.fullmatch(r"[0-9a-f]+", encoded):
        raise errors.InvalidArgument(
            f"{what}: {digest!r} is not a valid {algorithm} digest: expected {length} "
            "lowercase hex characters after the colon"
        )
    return digest


def is_valid(digest: str) -> bool:
    """True when :func:`check` would accept ``digest``."""
    try:
        check(digest)
    except errors.InvalidArgument:
        return False
    return True


class Digester:
    """Incremental hash of content that must end up equal to ``expected``."""

    def __init__(self, algorithm: str = "sha256") -> None:
        if algorithm not in ALGORITHMS:
            raise errors.InvalidArgument(f"digest algorithm {algorithm!r} is not supported")
        self.algorithm = algorithm
        self._hash = hashlib.new(algorithm)
        self.size = 0

    @classmethod
    def for_digest(cls, digest: str) -> Digester:
        """A digester using the algorithm of ``digest`` (which is validated)."""
        return cls(check(digest).partition(":")[0])

    def update(self, data: bytes | bytearray | memoryview) -> None:
        self._hash.update(data)
        self.size += len(data)

    def digest(self) -> str:
        return f"{self.algorithm}:{self._hash.hexdigest()}"


def of(data: bytes, algorithm: str = "sha256") -> str:
    """The digest of ``data``."""
    d = Digester(algorithm)
    d.update(data)
    return d.digest()


def hex_of(digest: str) -> str:
    """The encoded part of a (valid) digest, e.g. for ``blobs/sha256/<hex>`` paths."""
    return check(digest).partition(":")[2]
