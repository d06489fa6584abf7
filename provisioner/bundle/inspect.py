"""Looking inside a bundle image in a registry (``rukpak bundle inspect``).

Resolves a reference with the registry client (``rukpak.oci.client``), picks a
platform's manifest when the reference names an index, and lists the files of
each layer by streaming the blob through the client's digest-verifying reader,
a decompressor and ``tarfile`` in stream mode: nothing is written to disk and
no layer is held in memory. The result is a plain dataclass; ``to_json`` is
its machine-readable form and ``provisioner.cli.bundle`` prints it as text.
"""

from __future__ import annotations

import tarfile
from dataclasses import dataclass, field
from typing import IO, Any, NamedTuple, cast

import zstandard

from rukpak.common import errors
from rukpak.image import layerio
from rukpak.oci import client as oci_client
from rukpak.oci import manifest as oci_manifest
from rukpak.oci import mediatypes
from rukpak.oci.reference import Reference

_CHUNK = 1 << 20
_TYPES = {
    tarfile.REGTYPE: "file",
    tarfile.AREGTYPE: "file",
    tarfile.DIRTYPE: "dir",
    tarfile.SYMTYPE: "symlink",
    tarfile.LNKTYPE: "hardlink",
}


class LayerFile(NamedTuple):
    """One member of a layer's tar, as ``list_layer`` streams it: a NamedTuple, since a
    bundle may hold 10,000 files and a tuple is cheaper to build than a frozen dataclass."""

    path: str
    size: int
    type: str


@dataclass(frozen=True)
class Layer:
    descriptor: oci_manifest.Descriptor
    files: tuple[LayerFile, ...]


@dataclass(frozen=True)
class Inspection:
    reference: Reference  # what was asked for
    digest: str  # of what the reference names (index or manifest)
    media_type: str
    platforms: tuple[oci_manifest.Platform, ...]  # offered by an index; empty for a manifest
    platform: oci_manifest.Platform | None  # the one chosen from an index
    manifest: oci_manifest.Descriptor  # the image manifest whose layers are listed
    annotations: dict[str, str] = field(default_factory=dict)
    layers: tuple[Layer, ...] = ()

    @property
    def files(self) -> list[LayerFile]:
        return [f for layer in self.layers for f in layer.files]


def inspect(
    client: oci_client.RegistryClient,
    ref: Reference,
    *,
    platform: oci_manifest.Platform | None = None,
) -> Inspection:
    """Describe the image ``ref`` names and list its files.

    For an index the manifest for ``platform`` is chosen (this machine's when
    None; NotFound lists what the index offers).
    """
    top, body = client.get_manifest(ref)
    document = oci_manifest.parse_manifest(top.media_type, body, what=str(ref))
    pinned = ref.with_digest(top.digest)
    platforms: tuple[oci_manifest.Platform, ...] = ()
    chosen: oci_manifest.Platform | None = None
    if isinstance(document, oci_manifest.Index):
        platforms = tuple(m.platform for m in document.manifests if m.platform is not None)
        wanted = platform or oci_manifest.Platform.current()
        try:
            entry = oci_manifest.select_platform(document, wanted, what=str(ref))
        except errors.NotFound:
            offered = ", ".join(str(p) for p in platforms) or "no platforms"
            raise errors.NotFound(
                f"{ref} has no manifest for platform {wanted}; it offers {offered}: "
                "choose one with --platform"
            ) from None
        chosen = entry.platform
        manifest_desc, manifest_body = client.get_manifest(pinned.with_digest(entry.digest))
        image = oci_manifest.parse_manifest(
            manifest_desc.media_type, manifest_body, what=entry.digest
        )
        if not isinstance(image, oci_manifest.Manifest):
            raise errors.InvalidArgument(
                f"{ref}: index entry {entry.digest} for {chosen} is not an image manifest"
            )
        annotations = {**document.annotations, **image.annotations}
    else:
        manifest_desc, image, annotations = top, document, dict(document.annotations)
    layers = tuple(
        Layer(descriptor=layer, files=tuple(list_layer(client, pinned, layer)))
        for layer in image.layers
    )
    return Inspection(
        reference=ref,
        digest=top.digest,
        media_type=top.media_type,
        platforms=platforms,
        platform=chosen,
        manifest=manifest_desc,
        annotations=annotations,
        layers=layers,
    )


def list_layer(
    client: oci_client.RegistryClient, ref: Reference, layer: oci_manifest.Descriptor
) -> list[LayerFile]:
    """The members of one layer, read as a stream and verified against its digest
    (the client reads what tar leaves unread and checks it when the block ends)."""
    if layer.media_type not in mediatypes.LAYER_TYPES:
        raise errors.InvalidArgument(
            f"{ref}: layer {layer.digest} has media type {layer.media_type!r}, which is not "
            "a tar layer; this is not a bundle image"
        )
    files: list[LayerFile] = []
    with client.open_blob(ref, layer) as raw:
        stream = _decompressed(cast(IO[bytes], raw), layer.media_type)
        try:
            with tarfile.open(fileobj=stream, mode="r|") as tar:
                for member in tar:
                    files.append(
                        LayerFile(
                            path=member.name,
                            size=member.size,
                            type=_TYPES.get(member.type, "other"),
                        )
                    )
        except (tarfile.TarError, OSError, EOFError, zstandard.ZstdError) as exc:
            # Corruption in transit or storage is DataLoss, not a bad image: read
            # the rest so the verifying stream gets to compare the digest.
            while raw.read(_CHUNK):
                pass
            raise errors.InvalidArgument(
                f"{ref}: layer {layer.digest} is not a readable {layer.media_type} ({exc})"
            ) from None
    return files


def _decompressed(raw: IO[bytes], media_type: str) -> IO[bytes]:
    return layerio.decompressed(raw, media_type)  # the one media-type table


def to_json(result: Inspection) -> dict[str, Any]:
    return {
        "reference": str(result.reference),
        "digest": result.digest,
        "mediaType": result.media_type,
        "platforms": [str(p) for p in result.platforms],
        "platform": str(result.platform) if result.platform else None,
        "manifest": result.manifest.to_json(),
        "annotations": result.annotations,
        "layers": [
            {
                **layer.descriptor.to_json(),
                "files": [{"path": f.path, "size": f.size, "type": f.type} for f in layer.files],
            }
            for layer in result.layers
        ],
    }
