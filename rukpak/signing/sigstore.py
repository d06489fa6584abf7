"""Sigstore bundles: the signature format of cosign 3 (and of cosign 2's new bundle format).

Where it sits: protocol facts beside ``rukpak.signing.cosign`` (cosign 2's own format).
``rukpak.signing.discover`` reads bundles it finds as OCI referrers and turns each into a
``cosign.Signature`` (:func:`signature`), so ``rukpak.signing.verify`` checks both formats
by one rule; ``rukpak.signing.sign`` writes them (:func:`dsse_bundle`). Nothing here talks
to a registry.

The facts, as cosign 3.1 writes them for ``cosign sign --key`` (checked against its output):

- the bundle is JSON (``mediaType`` one of :data:`BUNDLE_TYPES`) stored as the only layer of
  an OCI manifest whose ``artifactType`` is the bundle's media type and whose ``subject`` is
  the signed manifest; a registry without the referrers API finds it through the referrers
  tag schema's index ``sha256-<hex>``;
- what is signed is a DSSE envelope (``dsseEnvelope``) around an in-toto statement whose
  ``subject`` names the digest and whose ``predicateType`` is :data:`COSIGN_PREDICATE`; the
  signature covers DSSE's pre-authentication encoding (:func:`pae`) of the payload type and
  payload, not the payload alone;
- ``verificationMaterial`` holds a key hint (``publicKey``), a leaf certificate
  (``certificate``, v0.3) or a chain (``x509CertificateChain``, v0.1 and v0.2), and the
  transparency log entries (``tlogEntries``), each with its signed entry timestamp
  (``inclusionPromise``) when the log gave one, and RFC 3161 timestamps
  (``timestampVerificationData``, read by ``rukpak.signing.timestamps``) when a TSA did.

A bundle that signs a message by digest (``messageSignature``) names no image: it is
skipped with that reason, as cosign does for image verification.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from typing import Any, Final

from rukpak.common import errors
from rukpak.oci import digest as digests
from rukpak.signing import cosign, inclusion, timestamps

BUNDLE_V03: Final[str] = "application/vnd.dev.sigstore.bundle.v0.3+json"
BUNDLE_TYPES: Final[frozenset[str]] = frozenset(
    {
        "application/vnd.dev.sigstore.bundle+json;version=0.1",
        "application/vnd.dev.sigstore.bundle+json;version=0.2",
        "application/vnd.dev.sigstore.bundle+json;version=0.3",
        BUNDLE_V03,
    }
)
"""Bundle media types read; :data:`BUNDLE_V03` is the one written (and cosign 3's)."""
IN_TOTO: Final[str] = "application/vnd.in-toto+json"
STATEMENT_V1: Final[str] = "https://in-toto.io/Statement/v1"
COSIGN_PREDICATE: Final[str] = "https://sigstore.dev/cosign/sign/v1"
"""The predicate type of cosign's image signature statement (an empty predicate)."""
CONTENT_ANNOTATION: Final[str] = "dev.sigstore.bundle.content"
PREDICATE_ANNOTATION: Final[str] = "dev.sigstore.bundle.predicateType"
BUNDLE_MAX: Final[int] = 256 << 10
"""Bytes a bundle may have; cosign's are a few KiB (a certificate chain at most)."""


class BundleError(errors.InvalidArgument):
    """A bundle that is not one, or not a signature of an image."""


def pae(payload_type: str, payload: bytes) -> bytes:
    """DSSE's pre-authentication encoding: what a DSSE signature covers."""
    kind = payload_type.encode()
    return b"DSSEv1 %d %s %d %s" % (len(kind), kind, len(payload), payload)


def statement(name: str, digest: str) -> bytes:
    """The in-toto statement cosign 3 signs for ``digest`` of repository ``name``."""
    algorithm, _, hex_part = digests.check(digest, what="signed digest").partition(":")
    document = {
        "_type": STATEMENT_V1,
        "subject": [{"name": name, "digest": {algorithm: hex_part}}],
        "predicateType": COSIGN_PREDICATE,
        "predicate": {},
    }
    return json.dumps(document, separators=(",", ":")).encode()


def dsse_bundle(
    payload: bytes, signature: bytes, *, key_hint: str, timestamps_der: tuple[bytes, ...] = ()
) -> bytes:
    """A v0.3 bundle of a DSSE envelope signed by a key (no log entries), as cosign writes
    it with ``--key`` and a signing config that names no log (with ``timestamps_der``, RFC
    3161 timestamps over the signature, one that names a TSA)."""
    material: dict[str, Any] = {"publicKey": {"hint": key_hint}}
    if timestamps_der:
        material["timestampVerificationData"] = timestamps.bundle_material(timestamps_der)
    document = {
        "mediaType": BUNDLE_V03,
        "verificationMaterial": material,
        "dsseEnvelope": {
            "payload": base64.b64encode(payload).decode(),
            "payloadType": IN_TOTO,
            "signatures": [{"sig": base64.b64encode(signature).decode()}],
        },
    }
    return json.dumps(document, separators=(",", ":")).encode()


def key_hint(public_der: bytes) -> str:
    """The ``publicKey.hint`` of a key: the base64 SHA-256 of its DER SubjectPublicKeyInfo."""
    return base64.b64encode(hashlib.sha256(public_der).digest()).decode()


def signature(body: bytes, *, where: str) -> cosign.Signature:
    """The signature a bundle carries, as ``verify`` checks it: the payload is the DSSE
    pre-authentication encoding, the digest it vouches for comes from the statement.
    BundleError when it is not a DSSE bundle signing an image."""
    if len(body) > BUNDLE_MAX:
        raise BundleError(f"{where}: a bundle of {len(body)} bytes is larger than {BUNDLE_MAX}")
    doc = _json(body, f"{where}: the bundle")
    if not isinstance(doc, dict) or doc.get("mediaType") not in BUNDLE_TYPES:
        raise BundleError(f"{where}: not a Sigstore bundle (mediaType {_kind(doc)})")
    if "dsseEnvelope" not in doc:
        what = "a message signature" if "messageSignature" in doc else "no DSSE envelope"
        raise BundleError(f"{where}: the bundle holds {what}, which names no image")
    envelope = _dict(doc["dsseEnvelope"], f"{where}: dsseEnvelope")
    payload_type = envelope.get("payloadType")
    if payload_type != IN_TOTO:
        raise BundleError(f"{where}: a DSSE payload of type {payload_type!r}, not {IN_TOTO!r}")
    payload = _b64(envelope.get("payload"), f"{where}: dsseEnvelope.payload")
    sigs = envelope.get("signatures")
    if not isinstance(sigs, list) or len(sigs) != 1 or not isinstance(sigs[0], dict):
        raise BundleError(f"{where}: a DSSE envelope must hold exactly one signature")
    raw = _b64(sigs[0].get("sig"), f"{where}: dsseEnvelope.signatures[0].sig")
    material = _dict(doc.get("verificationMaterial"), f"{where}: verificationMaterial")
    certificate, chain = _certificates(material, where)
    rekor, proof = _rekor_bundle(material, where)
    return cosign.Signature(
        payload=pae(IN_TOTO, payload),
        signature=raw,
        where=where,
        certificate=certificate,
        chain=chain,
        bundle=rekor,
        proof=proof,
        subject_digest=subject_digest(payload, where=where),
        timestamps=timestamps.from_bundle(material),
    )


def subject_digest(payload: bytes, *, where: str) -> str:
    """The one digest an in-toto statement of cosign's predicate names."""
    doc = _json(payload, f"{where}: the DSSE payload")
    if not isinstance(doc, dict) or doc.get("_type") != STATEMENT_V1:
        raise BundleError(f"{where}: the DSSE payload is not an in-toto v1 statement")
    if doc.get("predicateType") != COSIGN_PREDICATE:
        kind = doc.get("predicateType")
        raise BundleError(f"{where}: an attestation of {kind!r}, not an image signature")
    subjects = doc.get("subject")
    if not isinstance(subjects, list) or len(subjects) != 1 or not isinstance(subjects[0], dict):
        raise BundleError(f"{where}: the statement must name exactly one subject")
    named = subjects[0].get("digest")
    hex_part = named.get("sha256") if isinstance(named, dict) else None
    digest = f"sha256:{hex_part}"
    if not isinstance(hex_part, str) or not digests.is_valid(digest):
        raise BundleError(f"{where}: the statement's subject has no valid sha256 digest")
    return digest


def _certificates(material: dict[str, Any], where: str) -> tuple[bytes | None, bytes | None]:
    """(leaf PEM, rest of the chain PEM) from a v0.3 ``certificate`` or an older chain."""
    if "certificate" in material:
        cert = _dict(material["certificate"], f"{where}: certificate")
        return _pem(_b64(cert.get("rawBytes"), f"{where}: certificate.rawBytes")), None
    if "x509CertificateChain" in material:
        chain = _dict(material["x509CertificateChain"], f"{where}: x509CertificateChain")
        certs = chain.get("certificates")
        if not isinstance(certs, list) or not certs:
            raise BundleError(f"{where}: x509CertificateChain holds no certificate")
        pems = [
            _pem(_b64(_dict(c, f"{where}: a chain entry").get("rawBytes"), f"{where}: rawBytes"))
            for c in certs
        ]
        return pems[0], b"".join(pems[1:]) or None
    return None, None


def _rekor_bundle(
    material: dict[str, Any], where: str
) -> tuple[str | None, inclusion.Proof | None]:
    """The first log entry with a signed entry timestamp, in cosign 2's Rekor bundle
    shape (the annotation ``cosign.BUNDLE``), which ``keyless`` verifies, and that entry's
    inclusion proof (``rukpak.signing.inclusion``) when it has one; (None, None) without."""
    entries = material.get("tlogEntries") or []
    if not isinstance(entries, list):
        raise BundleError(f"{where}: tlogEntries is not a list")
    for entry in entries:
        entry = _dict(entry, f"{where}: a tlog entry")
        promise = entry.get("inclusionPromise")
        if not isinstance(promise, dict):
            continue
        log_id = _dict(entry.get("logId"), f"{where}: tlog logId")
        try:
            integrated, index = int(entry["integratedTime"]), int(entry["logIndex"])
        except (KeyError, TypeError, ValueError):
            raise BundleError(f"{where}: a tlog entry without integer time and index") from None
        payload = {
            "body": entry.get("canonicalizedBody"),
            "integratedTime": integrated,
            "logIndex": index,
            "logID": _b64(log_id.get("keyId"), f"{where}: tlog logId.keyId").hex(),
        }
        rekor = {"SignedEntryTimestamp": promise.get("signedEntryTimestamp"), "Payload": payload}
        return json.dumps(rekor), inclusion.Proof.from_entry(entry, where=where)
    return None, None


def _pem(der: bytes) -> bytes:
    text = base64.encodebytes(der).decode().replace("\n", "")
    lines = [text[i : i + 64] for i in range(0, len(text), 64)]
    return (
        "-----BEGIN CERTIFICATE-----\n" + "\n".join(lines) + "\n-----END CERTIFICATE-----\n"
    ).encode()


def _json(body: bytes, what: str) -> Any:
    try:
        return json.loads(body)
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as exc:
        raise BundleError(f"{what} is not JSON: {exc!s:.200}") from None


def _dict(value: Any, what: str) -> dict[str, Any]:
    if not isinstance(value, dict):
        raise BundleError(f"{what} is not an object")
    return value


def _b64(value: Any, what: str) -> bytes:
    if not isinstance(value, str) or not value:
        raise BundleError(f"{what} is missing")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError):
        raise BundleError(f"{what} is not valid base64") from None


def _kind(doc: Any) -> str:
    kind = doc.get("mediaType") if isinstance(doc, dict) else None
    return repr(kind)[:100]
