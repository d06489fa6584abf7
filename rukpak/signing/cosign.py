"""cosign's storage format: where a signature lives, what it signs, how it is annotated.

Where it sits: the protocol facts under ``rukpak.signing.discover`` (reading signatures),
``rukpak.signing.sign`` (writing them) and ``rukpak.signing.verify`` (checking what they
sign). Nothing here talks to a registry.

The facts, as cosign v2 writes them:

- a signature of the manifest ``sha256:<hex>`` is an image manifest tagged
  ``sha256-<hex>.sig`` in the same repository (or, in OCI 1.1 mode, a manifest whose
  ``subject`` is that digest and whose ``artifactType`` is :data:`ARTIFACT_TYPE`);
- each layer is one signature: its blob is the *payload* (:func:`payload`, a "simple
  signing" document naming the digest) with media type :data:`SIMPLE_SIGNING`, and its
  annotations carry the base64 signature (:data:`SIGNATURE`) and, for keyless
  signatures, the certificate, its chain and the Rekor bundle.
"""

from __future__ import annotations

import base64
import binascii
import json
from dataclasses import dataclass, field
from typing import Any, Final

from rukpak.common import errors
from rukpak.oci import digest as digests
from rukpak.signing import inclusion, timestamps

SIMPLE_SIGNING: Final[str] = "application/vnd.dev.cosign.simplesigning.v1+json"
ARTIFACT_TYPE: Final[str] = "application/vnd.dev.cosign.artifact.sig.v1+json"
SIGNATURE: Final[str] = "dev.cosignproject.cosign/signature"
"""The layer annotation with the payload's signature, base64."""
CERTIFICATE: Final[str] = "dev.sigstore.cosign/certificate"
"""A keyless signature's annotation with its signing certificate (PEM)."""
CHAIN: Final[str] = "dev.sigstore.cosign/chain"
"""A keyless signature's annotation with that certificate's chain (PEM)."""
BUNDLE: Final[str] = "dev.sigstore.cosign/bundle"
"""A keyless signature's annotation with its Rekor entry and inclusion proof (JSON)."""
PAYLOAD_TYPE: Final[str] = "cosign container image signature"
"""The payload's ``critical.type``."""
PAYLOAD_MAX: Final[int] = 64 << 10
"""Bytes a payload may have; cosign's are a few hundred."""
SIGNATURES_MAX: Final[int] = 64
"""Signatures looked at per digest; a registry offering more is refused, not read."""


def signature_tag(digest: str) -> str:
    """The tag of the signatures of manifest ``digest``: ``sha256-<hex>.sig``."""
    algorithm, _, hex_part = digests.check(digest, what="signed digest").partition(":")
    return f"{algorithm}-{hex_part}.sig"


def referrers_tag(digest: str) -> str:
    """The OCI 1.1 referrers tag schema's fallback tag for ``digest``: ``sha256-<hex>``."""
    algorithm, _, hex_part = digests.check(digest, what="signed digest").partition(":")
    return f"{algorithm}-{hex_part}"


def payload(docker_reference: str, digest: str) -> bytes:
    """The simple-signing payload cosign signs for ``digest`` (compact JSON, cosign's
    field order)."""
    document = {
        "critical": {
            "identity": {"docker-reference": docker_reference},
            "image": {"docker-manifest-digest": digest},
            "type": PAYLOAD_TYPE,
        },
        "optional": None,
    }
    return json.dumps(document, separators=(",", ":")).encode()


def signed_digest(body: bytes) -> str:
    """The manifest digest a payload vouches for; InvalidArgument when it is not a
    cosign image signature payload."""
    if len(body) > PAYLOAD_MAX:
        raise errors.InvalidArgument(f"signature payload of {len(body)} bytes is too large")
    try:
        document: Any = json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise errors.InvalidArgument(f"signature payload is not JSON: {exc!s:.200}") from None
    critical = document.get("critical") if isinstance(document, dict) else None
    if not isinstance(critical, dict) or critical.get("type") != PAYLOAD_TYPE:
        raise errors.InvalidArgument(f"signature payload is not a {PAYLOAD_TYPE!r}")
    image = critical.get("image")
    digest = image.get("docker-manifest-digest") if isinstance(image, dict) else None
    if not isinstance(digest, str) or not digests.is_valid(digest):
        raise errors.InvalidArgument("signature payload names no valid docker-manifest-digest")
    return digest


@dataclass(frozen=True)
class Signature:
    """One signature found for a digest: its payload and what its layer's annotations say."""

    payload: bytes
    signature: bytes
    where: str
    """Where it was found (the signature manifest's reference), for messages."""
    certificate: bytes | None = None
    chain: bytes | None = None
    bundle: str | None = field(default=None, repr=False)
    """A Rekor bundle (cosign 2's annotation shape), when the log gave one."""
    subject_digest: str | None = None
    """The digest a Sigstore bundle's statement names (``rukpak.signing.sigstore``); None
    for cosign 2's format, whose payload names it (:func:`signed_digest`)."""
    proof: inclusion.Proof | None = field(default=None, repr=False)
    """The inclusion proof of the log entry ``bundle`` comes from (Sigstore bundles), when
    the log gave one (``rukpak.signing.inclusion``)."""
    timestamps: tuple[bytes, ...] = field(default=(), repr=False)
    """RFC 3161 timestamps over the signature (DER TimeStampResp), when a TSA gave them
    (``rukpak.signing.timestamps``)."""

    @classmethod
    def from_layer(cls, payload: bytes, annotations: dict[str, str], *, where: str) -> Signature:
        """The signature a layer describes; InvalidArgument when it carries none."""
        text = annotations.get(SIGNATURE, "")
        try:
            raw = base64.b64decode(text, validate=True)
        except (binascii.Error, ValueError):
            raw = b""
        if not raw:
            raise errors.InvalidArgument(f"{where}: a layer has no valid {SIGNATURE} annotation")
        cert = annotations.get(CERTIFICATE)
        chain = annotations.get(CHAIN)
        return cls(
            payload=payload,
            signature=raw,
            where=where,
            certificate=cert.encode() if cert else None,
            chain=chain.encode() if chain else None,
            bundle=annotations.get(BUNDLE) or None,
            timestamps=timestamps.from_annotation(annotations.get(timestamps.ANNOTATION)),
        )

    @property
    def signed(self) -> str:
        """The digest this signature vouches for; InvalidArgument when it names none."""
        return self.subject_digest or signed_digest(self.payload)

    @property
    def signature_b64(self) -> str:
        return base64.b64encode(self.signature).decode()
