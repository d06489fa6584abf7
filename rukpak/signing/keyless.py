"""Cosign "keyless" signatures: a Fulcio certificate, its identity, and a Rekor bundle.

Where it sits: ``rukpak.signing.verify`` calls :func:`verify` for each policy authority
of kind keyless, with a cosign signature layer's annotations (certificate, chain, bundle,
signature) and its blob (the simple-signing payload). Pure: no network; trust roots are
data (:class:`TrustRoot`: Fulcio CA certificates, optionally Rekor public keys).

Verified: the leaf chains, signature by signature, to a trusted certificate, through
chain-annotation intermediates only when those chain there too; every issuer is a CA
(basicConstraints, path length, keyCertSign if keyUsage is present); the leaf has the
codeSigning EKU; its OIDC issuer and subject (email or URI SAN) match a policy identity;
the payload signature verifies with the leaf key. With Rekor keys, also: a bundle is
required, its SignedEntryTimestamp verifies with a trusted Rekor key, its hashedrekord
body names this payload's hash, this signature and this certificate, and every
certificate of the path is valid at the integrated time.

NOT verified: Fulcio's embedded certificate-transparency SCTs, Rekor inclusion proofs or
any online lookup, revocation. Without Rekor keys there is no trusted time and Fulcio
certificates live ten minutes, so :func:`verify` checks no validity period at all.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
import re
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from cryptography import x509
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes

from rukpak.common import errors

ISSUER_OID = x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.8")
LEGACY_ISSUER_OID = x509.ObjectIdentifier("1.3.6.1.4.1.57264.1.1")
MAX_BUNDLE_BYTES = 1 << 20
MAX_CHAIN_CERTS = 10
_Ed25519 = ed25519.Ed25519PublicKey
_PEM_KEY = re.compile(rb"-----BEGIN PUBLIC KEY-----.+?-----END PUBLIC KEY-----", re.DOTALL)


class KeylessError(errors.PermissionDenied):
    """A keyless signature that does not verify; the message says which check failed."""


@dataclass(frozen=True)
class Identity:
    """One identity a policy accepts; every non-empty field must match (cosign's
    ``--certificate-oidc-issuer``, ``--certificate-identity`` and their ``-regexp`` forms)."""

    issuer: str = ""
    subject: str = ""
    issuer_regexp: str = ""
    subject_regexp: str = ""

    def matches(self, issuer: str, subject: str) -> bool:
        """Every given field matches (regexps with re.fullmatch; one that does not compile
        matches nothing); an Identity with no field matches nothing."""
        if not (self.issuer or self.subject or self.issuer_regexp or self.subject_regexp):
            return False
        return (
            (not self.issuer or self.issuer == issuer)
            and (not self.subject or self.subject == subject)
            and (not self.issuer_regexp or _fullmatch(self.issuer_regexp, issuer))
            and (not self.subject_regexp or _fullmatch(self.subject_regexp, subject))
        )


def _fullmatch(pattern: str, value: str) -> bool:
    try:
        return re.fullmatch(pattern, value) is not None
    except re.error:
        return False


@dataclass(frozen=True)
class TrustRoot:
    """Certificates trusted as Fulcio roots or intermediates, and Rekor public keys."""

    certificates: tuple[x509.Certificate, ...]
    rekor_keys: tuple[PublicKeyTypes, ...] = ()

    @classmethod
    def from_pem(cls, fulcio_pem: bytes, rekor_pem: bytes | None = None) -> TrustRoot:
        """Parse a PEM bundle of CA certificates and a PEM of one or more public keys.

        Raises errors.InvalidArgument (a configuration error, not a refused signature).
        """
        try:
            certs = tuple(x509.load_pem_x509_certificates(fulcio_pem))
        except ValueError as e:
            raise errors.InvalidArgument(f"Fulcio trust root is not PEM certificates: {e}") from e
        keys: list[PublicKeyTypes] = []
        for block in _PEM_KEY.findall(rekor_pem or b""):
            try:
                key = serialization.load_pem_public_key(block)
            except (ValueError, UnsupportedAlgorithm) as e:
                raise errors.InvalidArgument(f"Rekor key is not a valid public key: {e}") from e
            if not isinstance(key, ec.EllipticCurvePublicKey | rsa.RSAPublicKey | _Ed25519):
                raise errors.InvalidArgument("Rekor key must be an ECDSA, RSA or Ed25519 key")
            keys.append(key)
        if rekor_pem is not None and not keys:
            raise errors.InvalidArgument("Rekor key holds no PEM PUBLIC KEY block")
        return cls(certificates=certs, rekor_keys=tuple(keys))


def _der_utf8string(raw: bytes) -> str:
    bad = KeylessError("certificate issuer extension is not a DER UTF8String")
    if len(raw) < 2 or raw[0] != 0x0C:
        raise bad
    length, offset = raw[1], 2
    if length & 0x80:
        n = length & 0x7F
        if not 1 <= n <= 4 or len(raw) < 2 + n:
            raise bad
        length, offset = int.from_bytes(raw[2 : 2 + n], "big"), 2 + n
    if len(raw) != offset + length:
        raise bad
    try:
        return raw[offset:].decode("utf-8")
    except UnicodeDecodeError as e:
        raise bad from e


def _extension_bytes(cert: x509.Certificate, oid: x509.ObjectIdentifier) -> bytes | None:
    try:
        value = cert.extensions.get_extension_for_oid(oid).value
    except x509.ExtensionNotFound:
        return None
    return value.value if isinstance(value, x509.UnrecognizedExtension) else None


def certificate_identity(cert: x509.Certificate) -> tuple[str, str]:
    """(issuer, subject): issuer from extension 1.3.6.1.4.1.57264.1.8 (DER UTF8String) or
    else the legacy 1.3.6.1.4.1.57264.1.1 (raw bytes as UTF-8); subject = first SAN
    email, else first URI, else ""."""
    try:
        raw = _extension_bytes(cert, ISSUER_OID)
        issuer = ""
        if raw is not None:
            issuer = _der_utf8string(raw)
        elif (legacy := _extension_bytes(cert, LEGACY_ISSUER_OID)) is not None:
            issuer = legacy.decode("utf-8")
        try:
            san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
        except x509.ExtensionNotFound:
            return issuer, ""
    except ValueError as e:  # UnicodeDecodeError included
        raise KeylessError(f"certificate extensions are malformed: {e}") from e
    names = san.get_values_for_type(x509.RFC822Name) or san.get_values_for_type(
        x509.UniformResourceIdentifier
    )
    return issuer, names[0] if names else ""


def _name(cert: x509.Certificate) -> str:
    return cert.subject.rfc4514_string() or "(empty subject)"


def _issues(issuer: x509.Certificate, cert: x509.Certificate) -> bool:
    try:
        cert.verify_directly_issued_by(issuer)
    except (ValueError, TypeError, InvalidSignature, UnsupportedAlgorithm):
        return False
    return True


def _ca_problem(issuer: x509.Certificate, below: int) -> str | None:
    """Why ``issuer`` may not issue with ``below`` CA certificates under it, if it may not."""
    try:
        bc = issuer.extensions.get_extension_for_class(x509.BasicConstraints).value
    except x509.ExtensionNotFound:
        bc = None
    except ValueError as e:
        return f"issuer {_name(issuer)} has malformed extensions: {e}"
    if bc is None or not bc.ca:
        return f"issuer {_name(issuer)} is not a CA"
    if bc.path_length is not None and below > bc.path_length:
        return f"issuer {_name(issuer)} allows a path length of {bc.path_length} only"
    try:
        ku = issuer.extensions.get_extension_for_class(x509.KeyUsage).value
    except x509.ExtensionNotFound:
        return None
    if not ku.key_cert_sign:
        return f"issuer {_name(issuer)} may not sign certificates (keyUsage)"
    return None


def _build_path(
    leaf: x509.Certificate, chain: list[x509.Certificate], root: TrustRoot
) -> list[x509.Certificate]:
    """leaf, then chain certificates each issued by a CA, ending at a trusted certificate."""
    path, unused = [leaf], list(chain)
    while True:
        current, below, problem = path[-1], len(path) - 1, None
        for cand in root.certificates:
            if _issues(cand, current) and (problem := _ca_problem(cand, below)) is None:
                return [*path, cand]
        found = None
        for cand in unused:
            if _issues(cand, current) and (problem := _ca_problem(cand, below)) is None:
                found = cand
                break
        if found is None:
            break
        unused.remove(found)
        path.append(found)
    detail = problem or f"no trusted or chained issuer for {current.issuer.rfc4514_string()}"
    raise KeylessError(f"certificate is not signed by the trusted Fulcio root: {detail}")


def _check_validity(path: list[x509.Certificate], at: datetime) -> None:
    at = at if at.tzinfo is not None else at.replace(tzinfo=UTC)
    for i, cert in enumerate(path):
        what = "certificate" if i == 0 else f"chain certificate {_name(cert)}"
        start, end = cert.not_valid_before_utc, cert.not_valid_after_utc
        if at > end:
            raise KeylessError(f"{what} expired at {end.isoformat()}")
        if at < start:
            raise KeylessError(f"{what} is not valid before {start.isoformat()}")


def _verify_chain(
    cert_pem: bytes,
    chain_pem: bytes | None,
    root: TrustRoot,
    identities: Sequence[Identity],
    at: datetime | None,
) -> PublicKeyTypes:
    try:
        leaf = x509.load_pem_x509_certificate(cert_pem)
    except ValueError as e:
        raise KeylessError(f"signing certificate is not a PEM certificate: {e}") from e
    chain: list[x509.Certificate] = []
    if chain_pem and chain_pem.strip():
        try:
            chain = x509.load_pem_x509_certificates(chain_pem)
        except ValueError as e:
            raise KeylessError(f"certificate chain is not a PEM bundle: {e}") from e
        if len(chain) > MAX_CHAIN_CERTS:
            raise KeylessError(f"certificate chain has more than {MAX_CHAIN_CERTS} certificates")
    try:
        eku = leaf.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    except (x509.ExtensionNotFound, ValueError):
        eku = None
    if eku is None or x509.oid.ExtendedKeyUsageOID.CODE_SIGNING not in eku:
        raise KeylessError("certificate lacks the codeSigning extended key usage")
    path = _build_path(leaf, chain, root)
    if at is not None:
        _check_validity(path, at)
    issuer, subject = certificate_identity(leaf)
    if not any(identity.matches(issuer, subject) for identity in identities):
        raise KeylessError(
            f"certificate identity issuer={issuer!r} subject={subject!r} "
            "matches none of the policy identities"
        )
    return leaf.public_key()


def verify_certificate(
    cert_pem: bytes,
    chain_pem: bytes | None,
    root: TrustRoot,
    identities: Sequence[Identity],
    *,
    at: datetime | None = None,
) -> PublicKeyTypes:
    """Check the leaf's path to the trust root, validity at ``at`` (default now; naive
    means UTC), and identity; return the leaf public key. KeylessError on failure."""
    return _verify_chain(cert_pem, chain_pem, root, identities, at or datetime.now(UTC))


def _verifies(key: PublicKeyTypes, signature: bytes, data: bytes, *, by_curve: bool) -> bool:
    """ECDSA (SHA-256; SHA-384 on P-384 if ``by_curve``), RSA PKCS#1 v1.5 SHA-256, Ed25519."""
    try:
        if isinstance(key, ec.EllipticCurvePublicKey):
            if by_curve and not isinstance(key.curve, ec.SECP256R1 | ec.SECP384R1):
                raise KeylessError(f"unsupported certificate key curve {key.curve.name}")
            p384 = by_curve and isinstance(key.curve, ec.SECP384R1)
            key.verify(signature, data, ec.ECDSA(hashes.SHA384() if p384 else hashes.SHA256()))
        elif isinstance(key, rsa.RSAPublicKey):
            key.verify(signature, data, padding.PKCS1v15(), hashes.SHA256())
        elif isinstance(key, _Ed25519):
            key.verify(signature, data)
        else:
            raise KeylessError(f"unsupported public key type {type(key).__name__}")
    except InvalidSignature:
        return False
    return True


def _b64(value: Any, what: str) -> bytes:
    if not isinstance(value, str):
        raise KeylessError(f"{what} is not a base64 string")
    try:
        return base64.b64decode(value, validate=True)
    except (binascii.Error, ValueError) as e:
        raise KeylessError(f"{what} is not valid base64") from e


def _field(obj: Any, *path: str) -> Any:
    for key in path:
        if not isinstance(obj, dict) or key not in obj:
            raise KeylessError(f"rekor bundle lacks {'.'.join(path)}")
        obj = obj[key]
    return obj


def _json(text: str | bytes, what: str) -> Any:
    try:
        return json.loads(text)
    except (ValueError, RecursionError) as e:
        raise KeylessError(f"{what} is not valid JSON") from e


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def verify_rekor_bundle(
    bundle_json: str, root: TrustRoot, *, signature_b64: str, payload: bytes, cert_pem: bytes
) -> datetime:
    """Verify the bundle's SET with a trusted Rekor key and its body against this payload,
    signature and certificate: a ``hashedrekord`` entry (cosign 2) or a ``dsse`` entry
    (cosign 3's bundles, whose ``payload`` is DSSE's pre-authentication encoding); return
    integratedTime (aware, UTC)."""
    if len(bundle_json) > MAX_BUNDLE_BYTES or len(bundle_json.encode()) > MAX_BUNDLE_BYTES:
        raise KeylessError(f"rekor bundle is larger than {MAX_BUNDLE_BYTES} bytes")
    bundle = _json(bundle_json, "rekor bundle")
    set_sig = _b64(_field(bundle, "SignedEntryTimestamp"), "rekor bundle SignedEntryTimestamp")
    body_b64, log_id = _field(bundle, "Payload", "body"), _field(bundle, "Payload", "logID")
    integrated = _field(bundle, "Payload", "integratedTime")
    log_index = _field(bundle, "Payload", "logIndex")
    for name, value in (("integratedTime", integrated), ("logIndex", log_index)):
        if not isinstance(value, int) or isinstance(value, bool) or value < 0:
            raise KeylessError(f"rekor bundle Payload.{name} is not a non-negative integer")
    if not isinstance(log_id, str) or not isinstance(body_b64, str):
        raise KeylessError("rekor bundle Payload.logID and Payload.body must be strings")
    spki = serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    keys = [k for k in root.rekor_keys if _sha256(k.public_bytes(*spki)) == log_id.lower()]
    if not keys:
        raise KeylessError(f"rekor bundle logID {log_id!r} matches none of the trusted Rekor keys")
    # What Rekor signs: the canonical JSON (sorted keys, no whitespace) of these 4 fields.
    signed = dict(body=body_b64, integratedTime=integrated, logIndex=log_index, logID=log_id)
    canonical = json.dumps(signed, sort_keys=True, separators=(",", ":")).encode()
    if not any(_verifies(key, set_sig, canonical, by_curve=False) for key in keys):
        raise KeylessError("rekor bundle SignedEntryTimestamp does not verify with the Rekor key")

    body = _json(_b64(body_b64, "rekor bundle body"), "rekor bundle body")
    if _field(body, "kind") == "dsse" and _field(body, "apiVersion") == "0.0.1":
        _check_dsse_entry(body, signature_b64=signature_b64, pae=payload, cert_pem=cert_pem)
        return _integrated(integrated)
    if _field(body, "kind") != "hashedrekord" or _field(body, "apiVersion") != "0.0.1":
        raise KeylessError("rekor entry is not a hashedrekord or dsse 0.0.1 entry")
    algorithm = _field(body, "spec", "data", "hash", "algorithm")
    digest = _field(body, "spec", "data", "hash", "value")
    if algorithm != "sha256" or not isinstance(digest, str):
        raise KeylessError("rekor entry hash is not a sha256 hash")
    if digest.lower() != _sha256(payload):
        raise KeylessError("rekor entry hash does not match the signed payload")
    logged_sig = _b64(_field(body, "spec", "signature", "content"), "rekor entry signature")
    if logged_sig != _b64(signature_b64, "signature"):
        raise KeylessError("rekor entry signature does not match the image signature")
    logged = _b64(_field(body, "spec", "signature", "publicKey", "content"), "rekor entry key")
    if not _same_certificate(logged, cert_pem):
        raise KeylessError("rekor entry certificate does not match the signing certificate")
    return _integrated(integrated)


def _integrated(integrated: int) -> datetime:
    try:
        return datetime.fromtimestamp(integrated, tz=UTC)
    except (OverflowError, OSError, ValueError) as e:
        raise KeylessError("rekor bundle integratedTime is out of range") from e


def _same_certificate(logged: bytes, cert_pem: bytes) -> bool:
    try:
        return x509.load_pem_x509_certificate(logged) == x509.load_pem_x509_certificate(cert_pem)
    except ValueError:
        return False


def dsse_payload(pae: bytes) -> bytes:
    """The payload inside DSSE's pre-authentication encoding ``DSSEv1 <len> <type> <len>
    <payload>`` (what a Sigstore bundle's signature covers); KeylessError when malformed."""
    bad = KeylessError("the signed bytes are not a DSSE pre-authentication encoding")
    prefix = b"DSSEv1 "
    if not pae.startswith(prefix):
        raise bad
    rest = pae[len(prefix) :]
    type_len, _, rest = rest.partition(b" ")
    if not type_len.isdigit() or len(rest) < int(type_len) + 1 or rest[int(type_len)] != 0x20:
        raise bad
    rest = rest[int(type_len) + 1 :]
    body_len, _, body = rest.partition(b" ")
    if not body_len.isdigit() or int(body_len) != len(body):
        raise bad
    return body


def _check_dsse_entry(body: Any, *, signature_b64: str, pae: bytes, cert_pem: bytes) -> None:
    """A ``dsse`` 0.0.1 entry (what Rekor logs for cosign 3's bundles) records this
    signature: its ``payloadHash`` is the DSSE payload's sha256 and one of its
    ``signatures`` is this signature with this certificate as ``verifier``. (Its
    ``envelopeHash`` covers Rekor's own serialisation of the envelope, which is not
    reproduced here; the payload hash and the signature bind the entry to it.)"""
    algorithm = _field(body, "spec", "payloadHash", "algorithm")
    digest = _field(body, "spec", "payloadHash", "value")
    if algorithm != "sha256" or not isinstance(digest, str):
        raise KeylessError("rekor dsse entry payloadHash is not a sha256 hash")
    if digest.lower() != _sha256(dsse_payload(pae)):
        raise KeylessError("rekor dsse entry payloadHash does not match the signed payload")
    signatures = _field(body, "spec", "signatures")
    if not isinstance(signatures, list) or not signatures:
        raise KeylessError("rekor dsse entry lists no signatures")
    wanted = _b64(signature_b64, "signature")
    for i, entry in enumerate(signatures[:16]):
        if not isinstance(entry, dict):
            continue
        if _b64(entry.get("signature"), f"rekor dsse entry signatures[{i}].signature") != wanted:
            continue
        verifier = _b64(entry.get("verifier"), f"rekor dsse entry signatures[{i}].verifier")
        if _same_certificate(verifier, cert_pem):
            return
        raise KeylessError("rekor entry certificate does not match the signing certificate")
    raise KeylessError("rekor entry signature does not match the image signature")


def verify(
    *,
    cert_pem: bytes,
    chain_pem: bytes | None,
    bundle_json: str | None,
    signature_b64: str,
    payload: bytes,
    root: TrustRoot,
    identities: Sequence[Identity],
    timestamp_at: datetime | None = None,
) -> None:
    """The whole keyless check. ``timestamp_at``: when an RFC 3161 timestamp the caller
    verified (``rukpak.signing.timestamps``) says the signature existed; the certificate
    path must be valid then (unless a Rekor key gives the log's time, which wins).

    With Rekor keys in ``root`` a bundle is required and the certificate path must be
    valid at its integrated time. Without them (and without ``timestamp_at``) a bundle is
    ignored and NO validity period is checked (no trusted time; Fulcio certificates live
    ten minutes): only the chain, the identity and the signature. Then the signature
    over ``payload`` must verify with the leaf key (ECDSA with SHA-256, or SHA-384 on
    P-384; RSA PKCS#1 v1.5 SHA-256; Ed25519). KeylessError on failure."""
    at: datetime | None = None
    if root.rekor_keys:
        if not bundle_json:
            raise KeylessError("a Rekor bundle is required by the trust root but none was given")
        at = verify_rekor_bundle(
            bundle_json, root, signature_b64=signature_b64, payload=payload, cert_pem=cert_pem
        )
    if at is None:
        at = timestamp_at
    key = _verify_chain(cert_pem, chain_pem, root, identities, at)
    if not _verifies(key, _b64(signature_b64, "signature"), payload, by_curve=True):
        raise KeylessError("signature does not verify over the payload with the certificate key")
