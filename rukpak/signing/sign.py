"""Writing a signature as ``cosign sign --key`` does, so ``cosign verify`` accepts it.

Where it sits: under ``rukpak bundle sign`` (``provisioner.cli.signing``), on the registry
client of ``rukpak.oci``. The image is resolved to its digest first (a tag is never
signed, only what it names now). Two formats:

- :func:`sign_bundle` (the default, what cosign 3 writes): a Sigstore bundle of a DSSE
  envelope around cosign's in-toto statement (``rukpak.signing.sigstore``), pushed as a
  referrer of the digest: a manifest with that ``subject``, listed in the referrers tag
  schema's index ``sha256-<hex>`` (registries with the referrers API list it themselves;
  the index is written for the others, as cosign does);
- :func:`sign` (cosign 2's format): the simple-signing payload (``cosign.payload``) signed
  with the key and stored as one more layer of the manifest tagged ``sha256-<hex>.sig``.
  A signature of the same payload by the same key already there is not added again, so
  signing again is idempotent; other signatures in that manifest are kept.
"""

from __future__ import annotations

import base64
import contextlib
import json
from dataclasses import dataclass

from cryptography.hazmat.primitives import serialization

from rukpak.common import errors
from rukpak.oci import digest as digests
from rukpak.oci import mediatypes
from rukpak.oci.client import RegistryClient
from rukpak.oci.manifest import Descriptor, Index, Manifest
from rukpak.oci.reference import Reference
from rukpak.signing import cosign, keys, sigstore, timestamps


@dataclass(frozen=True)
class Signed:
    digest: str
    signature_ref: str
    added: bool
    """False when the same signature was there already."""


def sign(
    client: RegistryClient,
    image: str,
    key: keys.PrivateKey,
    *,
    annotations: dict[str, str] | None = None,
    tsa_url: str = "",
) -> Signed:
    """Sign what ``image`` names now and push the signature; see the module docstring.
    With ``tsa_url`` the signature gets that TSA's RFC 3161 timestamp."""
    ref = Reference.parse(image)
    digest = ref.digest or client.resolve(ref).digest
    body = cosign.payload(ref.name, digest)
    signature = base64.b64encode(keys.sign(key, body)).decode()
    sig_ref = ref.with_tag(cosign.signature_tag(digest))
    try:
        _desc, existing = client.get_parsed(sig_ref)
    except errors.NotFound:
        existing = None
    layers: list[Descriptor] = []
    if isinstance(existing, Manifest):
        layers = [d for d in existing.layers if d.media_type == cosign.SIMPLE_SIGNING]
    public = key.public_key()
    for old in layers:
        if old.digest != digests.of(body):
            continue
        with contextlib.suppress(errors.InvalidArgument):
            there = cosign.Signature.from_layer(body, old.annotations, where=str(sig_ref))
            if keys.verifies(public, there.signature, body):  # ECDSA signs differently each time
                return Signed(digest, str(sig_ref), added=False)
    layer = client.push_blob(ref, body, media_type=cosign.SIMPLE_SIGNING)
    layer.annotations = {cosign.SIGNATURE: signature, **(annotations or {})}
    if tsa_url:
        token = timestamps.request(tsa_url, base64.b64decode(signature))
        layer.annotations[timestamps.ANNOTATION] = timestamps.annotation(token)
    layers.append(layer)
    config = json.dumps(
        {
            "architecture": "",
            "os": "",
            "config": {},
            "rootfs": {"type": "layers", "diff_ids": [d.digest for d in layers]},
        },
        separators=(",", ":"),
    ).encode()
    config_desc = client.push_blob(ref, config, media_type=mediatypes.OCI_CONFIG)
    manifest = Manifest(media_type=mediatypes.OCI_MANIFEST, config=config_desc, layers=layers)
    client.push_manifest(sig_ref, manifest.to_json(), mediatypes.OCI_MANIFEST)
    return Signed(digest, str(sig_ref), added=True)


def sign_bundle(
    client: RegistryClient, image: str, key: keys.PrivateKey, *, tsa_url: str = ""
) -> Signed:
    """Sign what ``image`` names now as cosign 3 does; see the module docstring. Each call
    adds a bundle (a DSSE signature differs every time), as each ``cosign sign`` does.
    With ``tsa_url`` the bundle holds that TSA's RFC 3161 timestamp over the signature."""
    ref = Reference.parse(image)
    subject = client.resolve(ref.with_digest(ref.digest) if ref.digest else ref)
    digest = subject.digest
    payload = sigstore.statement(ref.name, digest)
    raw = keys.sign(key, sigstore.pae(sigstore.IN_TOTO, payload))
    der = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    stamps = (timestamps.request(tsa_url, raw),) if tsa_url else ()
    bundle = sigstore.dsse_bundle(
        payload, raw, key_hint=sigstore.key_hint(der), timestamps_der=stamps
    )
    layer = client.push_blob(ref, bundle, media_type=sigstore.BUNDLE_V03)
    config = client.push_blob(ref, b"{}", media_type=mediatypes.OCI_EMPTY)
    annotations = {
        sigstore.CONTENT_ANNOTATION: "dsse-envelope",
        sigstore.PREDICATE_ANNOTATION: sigstore.COSIGN_PREDICATE,
    }
    manifest = Manifest(
        media_type=mediatypes.OCI_MANIFEST,
        config=config,
        layers=[layer],
        annotations=annotations,
        artifact_type=sigstore.BUNDLE_V03,
        subject=Descriptor(subject.media_type, subject.digest, subject.size),
    )
    body = manifest.to_json()
    at = ref.at_digest(digests.of(body))  # by digest only: never moves ref's tag
    referrer = client.push_manifest(at, body, mediatypes.OCI_MANIFEST)
    if client.referrers(ref, digest, sigstore.BUNDLE_V03) is None:
        _list_in_fallback_index(client, ref, digest, Descriptor(
            mediatypes.OCI_MANIFEST, referrer, len(body),
            annotations=annotations, artifact_type=sigstore.BUNDLE_V03,
        ))  # fmt: skip
    return Signed(digest, str(ref.at_digest(referrer)), added=True)


def _list_in_fallback_index(
    client: RegistryClient, ref: Reference, digest: str, entry: Descriptor
) -> None:
    """Add ``entry`` to the referrers tag schema's index of ``digest`` (kept entries stay)."""
    tag = ref.with_tag(cosign.referrers_tag(digest))
    try:
        _desc, existing = client.get_parsed(tag)
    except errors.NotFound:
        existing = None
    manifests = list(existing.manifests) if isinstance(existing, Index) else []
    if all(m.digest != entry.digest for m in manifests):
        manifests.append(entry)
    index = Index(media_type=mediatypes.OCI_INDEX, manifests=manifests)
    client.push_manifest(tag, index.to_json(), mediatypes.OCI_INDEX)
