"""RFC 3161 timestamps on signatures: a time-stamping authority (TSA) vouches that a
signature existed at a time.

Where it sits: under ``rukpak.signing.verify``, beside ``keyless``. ``cosign.Signature``
carries the timestamps found with a signature (``timestamps``, DER ``TimeStampResp``
bytes); an authority with a TSA chain (a ClusterBundlePolicy authority's
``rfc3161timestamp.certificateChain``, ``rukpak.signing.policy``) requires one of them to
verify under that chain over the signature, and a keyless authority then checks its
certificate at the time the TSA vouched for (when no Rekor key gives one).

The ASN.1 and the CMS signature are ``rfc3161-client``'s (the library the ``sigstore``
package uses for the same check); what is ours: where cosign puts timestamps, which
chain they must verify under, and the messages. Protocol facts (cosign 2.6 and 3.1):

- cosign 2's simple-signing layers: the annotation :data:`ANNOTATION`, JSON
  ``{"SignedRFC3161Timestamp": "<base64 of the DER TimeStampResp>"}``;
- Sigstore bundles: ``verificationMaterial.timestampVerificationData.rfc3161Timestamps[]``
  ``.signedTimestamp`` (base64 of the DER TimeStampResp);
- in both the timestamped message is the signature's raw bytes.

:func:`request` asks a TSA for a timestamp over a signature (``rukpak bundle sign
--timestamp-server-url``, as ``cosign sign`` does): an HTTP POST of a TimeStampReq
(``application/timestamp-query``) with a nonce, asking for the TSA's certificate.
"""

from __future__ import annotations

import base64
import binascii
import json
from collections.abc import Sequence
from datetime import UTC, datetime
from typing import Any, Final

from cryptography import x509

from rukpak.common import errors

ANNOTATION: Final[str] = "dev.sigstore.cosign/rfc3161timestamp"
ANNOTATION_KEY: Final[str] = "SignedRFC3161Timestamp"
MAX_TIMESTAMPS: Final[int] = 8
"""Timestamps read per signature at most (cosign writes one)."""
MAX_TOKEN: Final[int] = 64 << 10
REQUEST_TIMEOUT: Final[float] = 30.0


class TimestampError(errors.InvalidArgument):
    """No timestamp verifies (the message says why)."""


def from_annotation(text: str | None) -> tuple[bytes, ...]:
    """The timestamp of a cosign 2 layer's :data:`ANNOTATION`; () when there is none or
    it is unreadable (the signature stays usable where no timestamp is required; where
    one is, :func:`verify` says none was found)."""
    if not text or len(text) > 2 * MAX_TOKEN:
        return ()
    try:
        doc = json.loads(text)
        token = base64.b64decode(doc[ANNOTATION_KEY], validate=True)
    except (ValueError, TypeError, KeyError, binascii.Error):
        return ()
    return (token,) if 0 < len(token) <= MAX_TOKEN else ()


def from_bundle(material: dict[str, Any]) -> tuple[bytes, ...]:
    """The timestamps of a Sigstore bundle's ``verificationMaterial`` (unreadable entries
    left out, as in :func:`from_annotation`); () when none."""
    data = material.get("timestampVerificationData")
    if not isinstance(data, dict):
        return ()
    entries = data.get("rfc3161Timestamps")
    if not isinstance(entries, list):
        return ()
    out: list[bytes] = []
    for entry in entries[:MAX_TIMESTAMPS]:
        text = entry.get("signedTimestamp") if isinstance(entry, dict) else None
        try:
            token = base64.b64decode(str(text), validate=True)
        except (binascii.Error, ValueError):
            continue
        if 0 < len(token) <= MAX_TOKEN:
            out.append(token)
    return tuple(out)


def request(url: str, signature: bytes, *, timeout: float = REQUEST_TIMEOUT) -> bytes:
    """A TSA's timestamp over ``signature`` (the DER TimeStampResp), from the timestamp
    API at ``url`` (e.g. ``https://tsa.example.com/api/v1/timestamp``). Unavailable when
    the TSA cannot be reached, FailedPrecondition when it refuses or answers otherwise."""
    import requests
    from rfc3161_client import (
        HashAlgorithm,
        PKIStatus,
        TimestampRequestBuilder,
        decode_timestamp_response,
    )

    query = (
        TimestampRequestBuilder()
        .data(signature)
        .hash_algorithm(HashAlgorithm.SHA256)
        .nonce(nonce=True)
        .cert_request(cert_request=True)
        .build()
    )
    try:
        answer = requests.post(
            url,
            data=query.as_bytes(),
            headers={"Content-Type": "application/timestamp-query"},
            timeout=timeout,
        )
    except requests.RequestException as exc:
        raise errors.Unavailable(f"timestamp authority {url}: {str(exc)[:300]}") from None
    if answer.status_code != 200:
        raise errors.FailedPrecondition(
            f"timestamp authority {url}: unexpected status {answer.status_code}"
        )
    try:
        response = decode_timestamp_response(answer.content)
    except ValueError as exc:
        raise errors.FailedPrecondition(
            f"timestamp authority {url} answered no TimeStampResp: {str(exc)[:200]}"
        ) from None
    if response.status != PKIStatus.GRANTED or response.tst_info.nonce != query.nonce:
        raise errors.FailedPrecondition(
            f"timestamp authority {url} did not grant the request (status {response.status})"
        )
    return bytes(answer.content)


def annotation(token: bytes) -> str:
    """The :data:`ANNOTATION` value cosign 2 writes for ``token``."""
    return json.dumps({ANNOTATION_KEY: base64.b64encode(token).decode()})


def bundle_material(tokens: Sequence[bytes]) -> dict[str, Any]:
    """A bundle's ``timestampVerificationData`` holding ``tokens``."""
    return {
        "rfc3161Timestamps": [{"signedTimestamp": base64.b64encode(t).decode()} for t in tokens]
    }


def load_chain(pem: bytes, *, what: str) -> tuple[x509.Certificate, ...]:
    """The TSA's certificate chain (PEM: leaf, intermediates, root in any order; at least
    one self-signed root); InvalidArgument naming ``what`` otherwise."""
    try:
        certs = tuple(x509.load_pem_x509_certificates(pem))
    except ValueError as exc:
        raise errors.InvalidArgument(f"{what} is not PEM certificates: {exc}") from None
    if not any(c.subject == c.issuer for c in certs):
        raise errors.InvalidArgument(
            f"{what} has no root (self-signed) certificate: give the TSA's whole chain, as "
            "its /api/v1/timestamp/certchain serves it"
        )
    return certs


def verify(
    tokens: Sequence[bytes], signature: bytes, chain: Sequence[x509.Certificate]
) -> datetime:
    """The time one of ``tokens`` vouches ``signature`` existed at, verified under
    ``chain`` (the TSA's certificates); TimestampError saying why none does."""
    from rfc3161_client import VerifierBuilder, decode_timestamp_response
    from rfc3161_client.errors import VerificationError

    if not tokens:
        raise TimestampError("the signature carries no RFC 3161 timestamp")
    roots = [c for c in chain if c.subject == c.issuer]
    others = [c for c in chain if c.subject != c.issuer]
    # The TSA's own certificate (it issues none of the others): cosign 3 asks for tokens
    # without certificates, so the verifier must be given it.
    leaves = [c for c in others if not any(o.issuer == c.subject for o in chain if o != c)]
    leaf = leaves[0] if len(leaves) == 1 else None
    reasons: list[str] = []
    for i, token in enumerate(tokens[:MAX_TIMESTAMPS]):
        try:
            response = decode_timestamp_response(token)
        except ValueError as exc:
            reasons.append(f"timestamp {i}: not a TimeStampResp ({str(exc)[:120]})")
            continue
        verifier = VerifierBuilder(
            tsa_certificate=leaf,
            roots=list(roots),
            intermediates=[c for c in others if c is not leaf],
        ).build()
        try:
            verifier.verify_message(response, signature)
        except VerificationError as exc:
            reasons.append(f"timestamp {i}: {str(exc)[:200]}")
            continue
        at = response.tst_info.gen_time
        return at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    raise TimestampError(
        "no RFC 3161 timestamp verifies under the authority's TSA chain: " + "; ".join(reasons)
    )
