"""OCI artifacts as volumes: which layers of a manifest are filesystem layers and which
are files, named by their title.

Where it sits: the image cache (``rukpak.image.cache``) asks :func:`placements` before it
pulls, instead of requiring every layer to be a tar. A tar layer (the table of
``rukpak.oci.mediatypes``, which includes a Helm chart's content, a gzip tar) is
extracted at the volume's root as an image layer is; any other layer is one file, placed
at the path its ``org.opencontainers.image.title`` annotation names (as ``oras push``
writes it: ``model.safetensors``, ``weights/part-1.bin``) by the extractor
(``rukpak.image.extract``), which checks that path as it checks a tar entry's. A layer
that is neither a tar nor titled is refused by name: there is no file name to give it.
The same digest, credential, budget and signature rules hold as for any image: the
layers go through the one pull path.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from rukpak.common import errors
from rukpak.oci import mediatypes
from rukpak.oci.manifest import Descriptor
from rukpak.oci.reference import Reference

TITLE = "org.opencontainers.image.title"
"""The annotation naming a file layer (OCI image spec, pre-defined annotation keys)."""


@dataclass(frozen=True)
class Placement:
    """One layer and where it goes: ``name`` empty for a tar layer (extracted at the
    root), else the file's path in the volume."""

    layer: Descriptor
    name: str = ""

    @property
    def is_file(self) -> bool:
        return bool(self.name)


def placements(image: Reference | str, layers: Sequence[Descriptor]) -> list[Placement]:
    """Where each layer of ``image`` goes, in order; InvalidArgument naming a layer that is
    neither a tar nor titled, or two layers titled alike."""
    out: list[Placement] = []
    seen: dict[str, str] = {}
    for layer in layers:
        if layer.media_type in mediatypes.LAYER_TYPES:
            out.append(Placement(layer))
            continue
        title = (layer.annotations or {}).get(TITLE, "").strip()
        if not title:
            raise errors.InvalidArgument(
                f"image {image}: layer {layer.digest} has media type {layer.media_type!r}, "
                f"which is not a filesystem layer, and no {TITLE} annotation naming its file: "
                "push tar layers, or files with a title (as oras push does)"
            )
        key = title.strip("/")
        if key in seen:
            raise errors.InvalidArgument(
                f"image {image}: layers {seen[key]} and {layer.digest} are both titled "
                f"{title[:200]!r}; give each file its own name"
            )
        seen[key] = layer.digest
        out.append(Placement(layer, title))
    return out


def has_files(image: Reference | str, layers: Sequence[Descriptor]) -> bool:
    """Whether ``image`` holds file layers (served by bind mounts only)."""
    return any(p.is_file for p in placements(image, layers))
