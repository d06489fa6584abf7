"""Pushing an image from an OCI layout to a registry (``rukpak bundle push``).

Reads what ``provisioner.bundle.build`` wrote (``provisioner.bundle.layout``)
and sends it with the registry client (``rukpak.oci.client``) in the order a
registry needs: every blob a manifest names (skipping the ones the registry
already has), each platform's manifest by digest, and last the top-level
manifest or index under the tag. Nothing is tagged until everything it points
to is in place, so a failed push never leaves a tag naming missing content.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass

from provisioner.bundle.layout import REF_NAME, OciLayout
from rukpak.common import errors
from rukpak.oci import client as oci_client
from rukpak.oci import mediatypes
from rukpak.oci.manifest import Descriptor, Index, Manifest
from rukpak.oci.reference import Reference

log = logging.getLogger(__name__)

# Called as progress(digest, bytes_sent, total) while a blob uploads.
BlobProgress = Callable[[str, int, int], None]


@dataclass
class PushCounts:
    """What a push sent and what the registry had already: the pusher counts into it as
    it goes, and its ``PushResult`` carries it."""

    blobs_uploaded: int = 0
    bytes_uploaded: int = 0
    blobs_present: int = 0  # already in the registry, not sent again
    manifests: int = 0


@dataclass(frozen=True)
class PushResult:
    reference: Reference  # the tag pushed, with the digest of what it now names
    media_type: str
    counts: PushCounts


def select_image(layout: OciLayout, tag: str | None) -> Descriptor:
    """The entry of the layout's index.json to push.

    With a tag, the entry whose ``org.opencontainers.image.ref.name`` is that
    tag, else the only entry; without one, the only entry.
    """
    entries = layout.index()
    if not entries:
        raise errors.NotFound(
            f"OCI layout {layout.root} holds no image; build one with `rukpak bundle build`"
        )
    if tag is not None:
        named = [e for e in entries if e.annotations.get(REF_NAME) == tag]
        if named:
            return named[-1]
    if len(entries) == 1:
        return entries[0]
    names = sorted(e.annotations.get(REF_NAME, e.digest) for e in entries)
    raise errors.InvalidArgument(
        f"OCI layout {layout.root} holds {len(entries)} images ({', '.join(names)}); "
        "give a reference whose tag names one of them"
    )


def default_reference(layout: OciLayout, image: Descriptor) -> Reference:
    """The reference recorded at build time, for ``rukpak bundle push LAYOUT``."""
    name = image.annotations.get("io.containerd.image.name")
    if not name:
        raise errors.InvalidArgument(
            f"OCI layout {layout.root} does not record where its image goes; "
            "give the reference: rukpak bundle push LAYOUT REGISTRY/REPO:TAG"
        )
    return Reference.parse(name)


def push_image(
    client: oci_client.RegistryClient,
    layout: OciLayout,
    image: Descriptor,
    ref: Reference,
    *,
    progress: BlobProgress | None = None,
) -> PushResult:
    """Push ``image`` (a manifest or index in ``layout``) and tag it as ``ref``."""
    if ref.digest is not None and ref.digest != image.digest:
        raise errors.InvalidArgument(
            f"{ref} names digest {ref.digest} but the image to push is {image.digest}; "
            "push to a tag instead"
        )
    pusher = _Pusher(client, layout, ref, progress)
    document = layout.read_manifest(image)
    if isinstance(document, Index):
        for child in document.manifests:
            if child.media_type not in mediatypes.MANIFEST_TYPES:
                raise errors.InvalidArgument(
                    f"index {image.digest} in {layout.root} names {child.media_type} "
                    f"{child.digest}; only image manifests can be pushed from a layout"
                )
            child_manifest = layout.read_manifest(child)
            if not isinstance(child_manifest, Manifest):
                raise errors.InvalidArgument(f"{child.digest} is not an image manifest")
            pusher.manifest(child, child_manifest, tag=None)
        pusher.put(image, tag=ref.tag)
    else:
        pusher.manifest(image, document, tag=ref.tag)
    return PushResult(ref.with_digest(image.digest), image.media_type, pusher.counts)


class _Pusher:
    """Remembers what has been sent so shared blobs go once."""

    def __init__(
        self,
        client: oci_client.RegistryClient,
        layout: OciLayout,
        ref: Reference,
        progress: BlobProgress | None,
    ) -> None:
        self.client, self.layout, self.ref, self.progress = client, layout, ref, progress
        self.done: set[str] = set()
        self.counts = PushCounts()

    def manifest(self, desc: Descriptor, manifest: Manifest, *, tag: str | None) -> None:
        for blob in (manifest.config, *manifest.layers):
            self.blob(blob)
        self.put(desc, tag=tag)

    def blob(self, desc: Descriptor) -> None:
        if desc.digest in self.done:
            return
        path = self.layout.check_blob(desc)
        self.done.add(desc.digest)
        if self.client.blob_exists(self.ref, desc.digest):
            log.debug("blob present digest=%s", desc.digest)
            self.counts.blobs_present += 1
            return
        callback = None
        if self.progress is not None:
            report, digest = self.progress, desc.digest
            report(digest, 0, desc.size)

            def callback(sent: int, total: int) -> None:
                report(digest, sent, total or desc.size)

        pushed = self.client.push_blob(self.ref, path, digest=desc.digest, progress=callback)
        if pushed.digest != desc.digest:
            raise errors.DataLoss(
                f"the registry stored {pushed.digest} for blob {desc.digest} from "
                f"{self.layout.root}; the layout is corrupt, rebuild it"
            )
        self.counts.blobs_uploaded += 1
        self.counts.bytes_uploaded += desc.size
        log.debug("blob pushed digest=%s size=%d", desc.digest, desc.size)

    def put(self, desc: Descriptor, *, tag: str | None) -> None:
        body = self.layout.read_bytes(desc)
        if tag:
            target = self.ref.with_tag(tag)
        else:
            target = Reference(self.ref.registry, self.ref.repository, digest=desc.digest)
        stored = self.client.push_manifest(target, body, desc.media_type)
        if stored and stored != desc.digest:
            raise errors.DataLoss(
                f"the registry stored manifest {desc.digest} as {stored}; push again"
            )
        self.counts.manifests += 1
        log.debug("manifest pushed digest=%s tag=%s", desc.digest, tag)
