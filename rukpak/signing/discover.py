"""Finding the signatures of a manifest digest in its repository.

Where it sits: called by ``rukpak.signing.gate`` (and ``rukpak bundle verify``) with a
registry client holding the publish's or the Bundle's credentials. Both places cosign
writes are read, and their signatures pooled:

1. the tag ``sha256-<hex>.sig`` (cosign 2's default);
2. the OCI 1.1 referrers of the digest: the referrers API where the registry has one, else
   the referrers tag schema's index ``sha256-<hex>``. Those of cosign 2's artifact type
   hold simple-signing layers; those whose artifact type is a Sigstore bundle's (cosign 3,
   ``rukpak.signing.sigstore``) hold one bundle each.

Bounded: at most ``cosign.SIGNATURES_MAX`` signatures, payloads of at most
``cosign.PAYLOAD_MAX`` bytes, each read verified against its digest. A malformed
signature manifest or layer is skipped with the reason kept (the check then says why
nothing verified); a registry that does not answer raises, as the publish must not
pass for want of an answer.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

from rukpak.common import errors
from rukpak.oci.client import RegistryClient
from rukpak.oci.manifest import Descriptor, Index, Manifest
from rukpak.oci.reference import Reference
from rukpak.signing import cosign, sigstore

log = logging.getLogger(__name__)


@dataclass
class Found:
    """The signatures of one digest, and why any candidate was skipped."""

    signatures: list[cosign.Signature] = field(default_factory=list)
    skipped: list[str] = field(default_factory=list)


def signatures(client: RegistryClient, image: Reference, digest: str) -> Found:
    """Every cosign signature of ``digest`` in ``image``'s repository (see the module
    docstring). An empty ``Found`` when there is none."""
    found = Found()
    sig_ref = image.with_tag(cosign.signature_tag(digest))
    manifest = _manifest(client, sig_ref, found)
    if manifest is not None:
        _read_layers(client, sig_ref, manifest, found)
    for desc in _referrers(client, image, digest, found):
        ref = image.with_digest(desc.digest)
        manifest = _manifest(client, ref, found)
        if manifest is None:
            continue
        if desc.artifact_type in sigstore.BUNDLE_TYPES:
            _read_bundle(client, ref, manifest, found)
        else:
            _read_layers(client, ref, manifest, found)
    return found


def _manifest(client: RegistryClient, ref: Reference, found: Found) -> Manifest | None:
    try:
        _desc, parsed = client.get_parsed(ref)
    except errors.NotFound:
        return None
    except errors.InvalidArgument as exc:
        found.skipped.append(f"{ref}: {exc.message}")
        return None
    if not isinstance(parsed, Manifest):
        found.skipped.append(f"{ref}: not an image manifest")
        return None
    return parsed


READ_TYPES = frozenset({cosign.ARTIFACT_TYPE, *sigstore.BUNDLE_TYPES})
"""The referrers' artifact types read: cosign 2's signatures and Sigstore bundles."""


def _referrers(
    client: RegistryClient, image: Reference, digest: str, found: Found
) -> list[Descriptor]:
    index = client.referrers(image, digest, READ_TYPES)
    if index is None:  # no referrers API: the tag schema's fallback index
        try:
            _desc, parsed = client.get_parsed(image.with_tag(cosign.referrers_tag(digest)))
        except errors.NotFound:
            return []
        except errors.InvalidArgument as exc:
            found.skipped.append(f"referrers index of {digest}: {exc.message}")
            return []
        if not isinstance(parsed, Index):
            return []
        index = parsed
    entries = [m for m in index.manifests if m.artifact_type in READ_TYPES]
    return entries[: cosign.SIGNATURES_MAX]


def _read_bundle(client: RegistryClient, ref: Reference, manifest: Manifest, found: Found) -> None:
    """The one Sigstore bundle a referrer manifest holds (its only layer)."""
    if len(found.signatures) >= cosign.SIGNATURES_MAX:
        found.skipped.append(f"{ref}: more than {cosign.SIGNATURES_MAX} signatures")
        return
    layers = [d for d in manifest.layers if d.media_type in sigstore.BUNDLE_TYPES]
    if len(layers) != 1:
        found.skipped.append(f"{ref}: a bundle manifest with {len(layers)} bundle layers")
        return
    if layers[0].size > sigstore.BUNDLE_MAX:
        found.skipped.append(f"{ref}: a bundle of {layers[0].size} bytes")
        return
    try:
        with client.open_blob(ref, layers[0]) as stream:
            body = stream.read(sigstore.BUNDLE_MAX + 1)
        found.signatures.append(sigstore.signature(body, where=str(ref)))
    except (errors.InvalidArgument, errors.DataLoss, errors.NotFound) as exc:
        found.skipped.append(exc.message)


def _read_layers(client: RegistryClient, ref: Reference, manifest: Manifest, found: Found) -> None:
    for layer in manifest.layers:
        if len(found.signatures) >= cosign.SIGNATURES_MAX:
            found.skipped.append(f"{ref}: more than {cosign.SIGNATURES_MAX} signatures")
            return
        if layer.media_type != cosign.SIMPLE_SIGNING:
            found.skipped.append(f"{ref}: a layer of media type {layer.media_type!r}")
            continue
        if layer.size > cosign.PAYLOAD_MAX:
            found.skipped.append(f"{ref}: a payload of {layer.size} bytes")
            continue
        try:
            with client.open_blob(ref, layer) as stream:
                body = stream.read(cosign.PAYLOAD_MAX + 1)
            found.signatures.append(
                cosign.Signature.from_layer(body, layer.annotations, where=str(ref))
            )
        except (errors.InvalidArgument, errors.DataLoss, errors.NotFound) as exc:
            found.skipped.append(f"{ref}: {exc.message}")
