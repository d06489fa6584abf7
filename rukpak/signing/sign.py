"""Writing a signature as ``cosign sign --key`` does, so ``cosign verify`` accepts it.

Where it sits: under ``rukpak bundle sign`` (``provisioner.cli.bundle``), on the registry
client of ``rukpak.oci``. The image is resolved to its digest first (a tag is never
signed, only what it names now); the payload (``cosign.payload``) is signed with the key
(``keys.sign``) and stored as one more layer of the manifest tagged ``sha256-<hex>.sig``:
cosign's tag scheme, which every cosign release reads. A signature of the same payload by
the same key already there is not added again, so signing again is idempotent; other
signatures in that manifest are kept.
"""

from __future__ import annotations

import base64
import contextlib
import json
from dataclasses import dataclass

from rukpak.common import errors
from rukpak.oci import digest as digests
from rukpak.oci import mediatypes
from rukpak.oci.client import RegistryClient
from rukpak.oci.manifest import Descriptor, Manifest
from rukpak.oci.reference import Reference
from rukpak.signing import cosign, keys


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
) -> Signed:
    """Sign what ``image`` names now and push the signature; see the module docstring."""
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
