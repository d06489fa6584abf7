"""Building plain+v0 bundle images from a directory (``rukpak bundle build``).

A plain+v0 bundle is a directory whose ``manifests/`` holds Kubernetes objects
as YAML or JSON files. Once ``provisioner.bundle.validate`` has accepted
such a directory, this module packs ``manifests/``, and everything beside it
that ``provisioner.bundle.extras`` found (``metadata/`` of registry+v1
bundles, for one), into one deterministic tar+gzip layer and writes an OCI
image (config, manifest, and an index when several platforms are asked for)
into an OCI layout (``provisioner.bundle.layout``). Pushing the layout is
``provisioner.bundle.push``; nothing here touches the network.

Determinism: the same files give the same digests on any machine. Entries are
sorted, mtimes are 0, owners are 0/0 with empty names, modes are 0644 (0755
for directories and files with an execute bit), the tar is plain USTAR (no
PAX headers), the gzip header carries no name or time, and the JSON documents
have a fixed key order and no timestamps.

Files stream from disk through tar and gzip into the layout, so packing a
large bundle never holds it in memory.
"""

from __future__ import annotations

import gzip
import os
import tarfile
import tempfile
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, cast

from provisioner.bundle import estargz
from provisioner.bundle import extras as bundle_extras
from provisioner.bundle.layout import BlobWriter, OciLayout, canonical_json
from provisioner.bundle.validate import MANIFESTS_DIR, BundleFile, validate_bundle
from rukpak.common import errors
from rukpak.oci import mediatypes
from rukpak.oci.manifest import Descriptor, Platform

FORMAT_ANNOTATION = "io.rukpak.bundle.format"
PLAIN_V0 = "plain+v0"
DEFAULT_PLATFORM = "linux/amd64"
GZIP_LEVEL = 6
_CHUNK = 1024 * 1024


@dataclass(frozen=True)
class Layer:
    blob: Descriptor
    diff_id: str  # sha256 of the uncompressed tar, for the config's rootfs
    files: tuple[BundleFile, ...]
    extras: bundle_extras.Extras = bundle_extras.NONE
    """What was packed beside ``manifests/``, and the hidden entries left out."""


@dataclass(frozen=True)
class PlatformImage:
    platform: Platform
    manifest: Descriptor
    layer: Layer


@dataclass(frozen=True)
class BuildResult:
    """What ``build`` wrote: the top-level image (manifest or index) and its parts."""

    image: Descriptor
    images: tuple[PlatformImage, ...]

    @property
    def is_index(self) -> bool:
        return self.image.media_type == mediatypes.OCI_INDEX


# -- the layer -----------------------------------------------------------------


def _tarinfo(
    name: str, *, directory: bool, size: int = 0, executable: bool = False
) -> tarfile.TarInfo:
    info = tarfile.TarInfo(name)
    info.type = tarfile.DIRTYPE if directory else tarfile.REGTYPE
    info.mode = 0o755 if directory or executable else 0o644
    info.size = size
    info.mtime = 0
    info.uid = info.gid = 0
    info.uname = info.gname = ""
    return info


def write_layer(
    layout: OciLayout,
    files: Sequence[BundleFile],
    extras: bundle_extras.Extras = bundle_extras.NONE,
    *,
    estargz: bool = False,
) -> Layer:
    """Stream ``manifests/`` (then ``extras``) into one deterministic tar+gzip blob.

    With ``estargz`` the blob is an eStargz layer (``provisioner.bundle.estargz``):
    still tar+gzip for every reader, plus a table of contents for lazy fetching.
    """
    if estargz:
        return _write_estargz_layer(layout, files, extras)
    with layout.ingest() as compressed:
        hasher = _write_tar_gz(compressed, files, extras.entries)
    blob = Descriptor(
        media_type=mediatypes.OCI_LAYER_GZIP, digest=compressed.digest, size=compressed.size
    )
    return Layer(blob=blob, diff_id=hasher.digest, files=tuple(files), extras=extras)


def _write_estargz_layer(
    layout: OciLayout, files: Sequence[BundleFile], extras: bundle_extras.Extras
) -> Layer:
    with tempfile.TemporaryFile() as plain:  # the tar first; then per-file gzip members
        _write_tar(cast(IO[bytes], plain), files, extras.entries)
        plain.seek(0)
        with layout.ingest() as compressed:
            result = estargz.convert(plain, cast(IO[bytes], compressed), level=GZIP_LEVEL)
    blob = Descriptor(
        media_type=mediatypes.OCI_LAYER_GZIP,
        digest=compressed.digest,
        size=compressed.size,
        annotations=result.annotations(),
    )
    return Layer(blob=blob, diff_id=result.diff_id, files=tuple(files), extras=extras)


def _write_tar_gz(
    sink: BlobWriter, files: Sequence[BundleFile], extras: Sequence[bundle_extras.Entry]
) -> BlobWriter:
    # filename="" and mtime=0 keep the gzip header free of names and times.
    with gzip.GzipFile(
        filename="", mode="wb", fileobj=sink, mtime=0, compresslevel=GZIP_LEVEL
    ) as gz:
        hasher = BlobWriter(cast(IO[bytes], gz))  # the uncompressed tar: its diff_id
        _write_tar(cast(IO[bytes], hasher), files, extras)
    return hasher


def _write_tar(
    sink: IO[bytes], files: Sequence[BundleFile], extras: Sequence[bundle_extras.Entry]
) -> None:
    with tarfile.TarFile(
        fileobj=sink,
        mode="w",
        format=tarfile.USTAR_FORMAT,
        encoding="utf-8",
        copybufsize=_CHUNK,
    ) as tar:
        tar.addfile(_tarinfo(MANIFESTS_DIR + "/", directory=True))
        for f in sorted(files, key=lambda f: f.name):
            _add_file(tar, f"{MANIFESTS_DIR}/{f.name}", f.path)
        for entry in extras:
            _add_extra(tar, entry)


def _add_extra(tar: tarfile.TarFile, entry: bundle_extras.Entry) -> None:
    if entry.type == "file":
        _add_file(tar, entry.member, entry.path, executable=entry.executable)
        return
    info = _tarinfo(entry.member, directory=entry.type == "dir")
    if entry.type == "symlink":
        info.type = tarfile.SYMTYPE
        info.linkname = entry.target
        info.mode = 0o777
    _add(tar, info, entry.path, None)


def _add_file(tar: tarfile.TarFile, member: str, path: Path, *, executable: bool = False) -> None:
    with path.open("rb") as handle:
        size = os.fstat(handle.fileno()).st_size
        info = _tarinfo(member, directory=False, size=size, executable=executable)
        _add(tar, info, path, handle)


def _add(tar: tarfile.TarFile, info: tarfile.TarInfo, path: Path, handle: IO[bytes] | None) -> None:
    try:
        tar.addfile(info, handle)
    except ValueError as exc:  # USTAR limits: name and link length, 8 GiB size
        raise errors.InvalidArgument(
            f"{path}: cannot be stored in a plain tar ({exc}); shorten its name"
        ) from None
    except OSError as exc:
        raise errors.Aborted(
            f"{path} changed while it was being packed ({exc}); build again"
        ) from None


# -- config, manifest, index ---------------------------------------------------


def _config(platform: Platform, diff_id: str) -> dict[str, Any]:
    document: dict[str, Any] = {"architecture": platform.architecture, "os": platform.os}
    if platform.variant:
        document["variant"] = platform.variant
    document["config"] = {"Labels": {FORMAT_ANNOTATION: PLAIN_V0}}
    document["rootfs"] = {"type": "layers", "diff_ids": [diff_id]}
    return document


def _manifest(config: Descriptor, layer: Descriptor) -> dict[str, Any]:
    return {
        "schemaVersion": 2,
        "mediaType": mediatypes.OCI_MANIFEST,
        "config": config.to_json(),
        "layers": [layer.to_json()],
        "annotations": {FORMAT_ANNOTATION: PLAIN_V0},
    }


def _index(manifests: Sequence[Descriptor]) -> dict[str, Any]:
    return {
        "schemaVersion": 2,
        "mediaType": mediatypes.OCI_INDEX,
        "manifests": [m.to_json() for m in manifests],
        "annotations": {FORMAT_ANNOTATION: PLAIN_V0},
    }


def parse_platforms(values: Sequence[str]) -> list[Platform]:
    """``--platform`` values (each may be a comma-separated list), de-duplicated in order."""
    out: list[Platform] = []
    for value in values:
        for text in value.split(","):
            text = text.strip()
            if not text:
                raise errors.InvalidArgument(
                    f"--platform {value!r} has an empty entry; write e.g. linux/amd64,linux/arm64"
                )
            platform = Platform.parse(text)
            if platform not in out:
                out.append(platform)
    return out


def parse_platform_dir(value: str) -> tuple[Platform, Path]:
    """One ``--platform-dir os/arch[/variant]=DIR`` value."""
    text, sep, directory = value.partition("=")
    if not sep or not text or not directory:
        raise errors.InvalidArgument(
            f"--platform-dir {value!r} must look like os/arch=DIR, e.g. linux/arm64=./arm64"
        )
    return Platform.parse(text), Path(directory)


def plan_sources(
    root: Path, platforms: Sequence[Platform], overrides: Sequence[tuple[Platform, Path]]
) -> list[tuple[Platform, Path]]:
    """Which directory each platform's image is built from, in platform order.

    The listed platforms use ``root``; a ``--platform-dir`` override both adds
    its platform (when not listed) and gives it its own directory. With no
    platform at all the image is for ``DEFAULT_PLATFORM``.
    """
    seen: dict[Platform, Path] = {}
    for platform, directory in overrides:
        if platform in seen:
            raise errors.InvalidArgument(
                f"--platform-dir gives {platform!s} twice; give each platform once"
            )
        seen[platform] = directory
    order = list(platforms)
    order += [p for p in seen if p not in order]
    if not order:
        order = [Platform.parse(DEFAULT_PLATFORM)]
    return [(p, seen.get(p, root)) for p in order]


def build(
    layout: OciLayout,
    sources: Sequence[tuple[Platform, Path]],
    *,
    name: str,
    ref_name: str,
    force_index: bool = False,
    estargz: bool = False,
) -> BuildResult:
    """Build the image for ``sources`` into ``layout`` and tag it ``ref_name``.

    One source gives an image manifest; several (or ``force_index``) give an
    OCI index with one manifest per platform. A directory shared by several
    platforms is checked and packed once. ``name`` is the full reference the
    image is meant for, recorded in the layout's index.json.
    """
    if not sources:
        raise errors.InvalidArgument("nothing to build: no platform given")
    layers: dict[Path, Layer] = {}
    images: list[PlatformImage] = []
    for platform, directory in sources:
        key = directory.resolve()
        if key not in layers:
            files = validate_bundle(directory)
            layers[key] = write_layer(
                layout, files, bundle_extras.collect(directory), estargz=estargz
            )
        layer = layers[key]
        config = layout.put_bytes(
            canonical_json(_config(platform, layer.diff_id)), mediatypes.OCI_CONFIG
        )
        manifest = layout.put_bytes(
            canonical_json(_manifest(config, layer.blob)), mediatypes.OCI_MANIFEST
        )
        images.append(PlatformImage(platform=platform, manifest=manifest, layer=layer))
    if len(images) == 1 and not force_index:
        top = images[0].manifest
    else:
        entries = [
            Descriptor(
                media_type=i.manifest.media_type,
                digest=i.manifest.digest,
                size=i.manifest.size,
                platform=i.platform,
            )
            for i in images
        ]
        top = layout.put_bytes(canonical_json(_index(entries)), mediatypes.OCI_INDEX)
    layout.tag(top, name=name, ref_name=ref_name)
    return BuildResult(image=top, images=tuple(images))
