"""One policy against the signatures found for a digest: satisfied, or why not.

Where it sits: between ``rukpak.signing.discover`` (the signatures) and
``rukpak.signing.gate`` (every policy selecting an image, remembered). Pure but for
``read_secret``, which the edge gives: it returns the PEM a policy's ``secretRef`` names
(read from the system namespace) or raises NotFound.

A signature counts for an authority when its payload names the digest and

- ``key``: it verifies with one of the authority's public keys;
- ``keyless``: its certificate chains to the authority's Fulcio root, names one of its
  identities and holds the signing key, and (with a Rekor key) its Rekor bundle is signed
  by that log and records this very signature (``rukpak.signing.keyless``), and the
  entry's inclusion proof, when the bundle has one, leads to a checkpoint that log signed
  (``rukpak.signing.inclusion``);
- and, when the authority names a TSA (``rfc3161timestamp``), one of its RFC 3161
  timestamps verifies under that TSA's chain over the signature
  (``rukpak.signing.timestamps``); a keyless certificate must then be valid at that time.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from cryptography import x509

from rukpak.common import errors
from rukpak.signing import cosign, inclusion, keyless, keys, timestamps
from rukpak.signing.discover import Found
from rukpak.signing.policy import Authority, KeyAuthority, Policy

SecretReader = Callable[[str], bytes]


@dataclass(frozen=True)
class Outcome:
    policy: str
    ok: bool
    reason: str
    """What satisfied the policy, or why nothing did (for conditions, events, errors)."""


def check(policy: Policy, found: Found, digest: str, *, read_secret: SecretReader) -> Outcome:
    """Whether ``found`` satisfies ``policy`` for ``digest``. Never raises for bad input."""
    if policy.problem:
        return Outcome(policy.name, False, f"the policy is not valid: {policy.problem}")
    if not found.signatures:
        skipped = f" (skipped: {'; '.join(found.skipped[:3])})" if found.skipped else ""
        return Outcome(
            policy.name,
            False,
            f"no signature found for {digest} (looked for the tag "
            f"{cosign.signature_tag(digest)} and OCI 1.1 referrers: cosign signatures and "
            f"Sigstore bundles){skipped}",
        )
    own: list[cosign.Signature] = []
    reasons: list[str] = []
    for sig in found.signatures:
        try:
            signed = sig.signed
        except errors.InvalidArgument as exc:
            reasons.append(f"{sig.where}: {exc.message}")
            continue
        if signed != digest:
            reasons.append(f"{sig.where}: a signature of {signed}, not of {digest}")
            continue
        own.append(sig)
    for authority in policy.authorities:
        try:
            if (by := _satisfies(authority, own, read_secret, reasons)) is not None:
                return Outcome(policy.name, True, f"signed for authority {authority.name!r} ({by})")
        except errors.RukpakError as exc:
            reasons.append(f"authority {authority.name!r}: {exc.message}")
    detail = "; ".join(dict.fromkeys(reasons)) or "no authority accepted a signature"
    count = len(found.signatures)
    return Outcome(
        policy.name,
        False,
        f"none of the {count} signature{'s' if count != 1 else ''} of {digest} verifies: "
        f"{detail[:900]}",
    )


def _satisfies(
    authority: Authority,
    signatures: list[cosign.Signature],
    read_secret: SecretReader,
    reasons: list[str],
) -> str | None:
    """What verified a signature for ``authority`` (its key, or the certificate's identity);
    None when nothing did (``reasons`` says why)."""
    if isinstance(authority, KeyAuthority):
        pem = authority.pem or read_secret(authority.secret)
        what = f"authority {authority.name!r}"
        public = keys.load_public_keys(pem, what=f"{what} key")
        verified = False
        for sig in signatures:
            key = next((k for k in public if keys.verifies(k, sig.signature, sig.payload)), None)
            if key is None:
                continue
            verified = True
            if authority.tsa:
                try:
                    timestamps.verify(sig.timestamps, sig.signature, authority.tsa)
                except errors.InvalidArgument as exc:
                    reasons.append(f"{what}: {sig.where}: {exc.message}")
                    continue
            return f"key {keys.fingerprint(key)}"
        names = ", ".join(keys.fingerprint(k) for k in public)
        if signatures and not verified:
            reasons.append(f"{what}: no signature verifies with key {names}")
        return None
    for sig in signatures:
        if sig.certificate is None:
            reasons.append(f"authority {authority.name!r}: {sig.where} has no certificate")
            continue
        try:
            stamped = (
                timestamps.verify(sig.timestamps, sig.signature, authority.tsa)
                if authority.tsa
                else None
            )
            keyless.verify(
                timestamp_at=stamped,
                cert_pem=sig.certificate,
                chain_pem=sig.chain,
                bundle_json=sig.bundle,
                signature_b64=sig.signature_b64,
                payload=sig.payload,
                root=authority.root,
                identities=authority.identities,
            )
            if authority.root.rekor_keys and sig.proof is not None:
                inclusion.verify(sig.proof, authority.root.rekor_keys)
        except errors.RukpakError as exc:
            reasons.append(f"authority {authority.name!r}: {exc.message}")
            continue
        try:
            issuer, subject = keyless.certificate_identity(
                x509.load_pem_x509_certificate(sig.certificate)
            )
        except (ValueError, errors.RukpakError):
            return "keyless"
        return f"keyless: identity {subject or '?'} issued by {issuer or '?'}"
    return None
