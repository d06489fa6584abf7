"""An OCI image layout on disk: where ``rukpak bundle build`` puts what it makes.

The layout follows the OCI image-layout specification: an ``oci-layout`` marker
file, an ``index.json`` naming the images it holds, and content-addressed blobs
under ``blobs/sha256/<hex>``. ``provisioner.bundle.build`` writes into one,
``provisioner.bundle.push`` reads one and sends it to a registry.

Blobs are hashed while they stream into an unnamed spool file; once the digest
is known the blob lands under it through ``rukpak.common.fsio`` (the project's one
temp-file, fsync, rename, fsync-dir recipe), read-only; a blob that is already
present is success. ``index.json`` and ``oci-layout`` are replaced the same way.
Nothing here touches the network.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from rukpak.common import errors, fsio
from rukpak.oci import digest as digests
from rukpak.oci import mediatypes
from rukpak.oci.manifest import Descriptor, Index, Manifest, parse_manifest

LAYOUT_VERSION = "1.0.0"
REF_NAME = "org.opencontainers.image.ref.name"
IMAGE_NAME = "io.containerd.image.name"

# JSON documents in a layout (index, manifests, configs) are small; a bigger
# one means the layout is not what we think it is.
MAX_JSON_BYTES = 4 * 1024 * 1024
_COPY_CHUNK = 1024 * 1024


def canonical_json(document: dict[str, Any]) -> bytes:
    """The bytes we hash for manifests and configs: compact, key order as built."""
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


class BlobWriter:
    """A tee that sha256-hashes and counts what it passes on to ``handle``.

    ``OciLayout.ingest`` hands one out for a blob (the digest names the blob);
    ``provisioner.bundle.build`` also puts one between tar and gzip (the digest of
    the uncompressed tar is the layer's diff_id).
    """

    def __init__(self, handle: IO[bytes]) -> None:
        self._handle = handle
        self._hash = hashlib.sha256()
        self.size = 0

    def write(self, data: bytes) -> int:  # the file-like protocol gzip and tarfile use
        self._handle.write(data)
        self._hash.update(data)
        self.size += len(data)
        return len(data)

    def flush(self) -> None:
        self._handle.flush()

    def tell(self) -> int:  # tarfile asks where it is
        return self.size

    @property
    def digest(self) -> str:
        return "sha256:" + self._hash.hexdigest()


class OciLayout:
    """One OCI image-layout directory."""

    def __init__(self, root: Path) -> None:
        self.root = root

    @classmethod
    def create(cls, root: Path) -> OciLayout:
        """Open ``root`` for writing, creating the layout if needed.

        An existing layout is reused (its blobs stay, so a rebuild only adds
        what changed). An existing directory that is not empty and is not a
        layout is refused rather than written into.
        """
        if root.exists() and not root.is_dir():
            raise errors.InvalidArgument(
                f"output {root} exists and is not a directory; choose another --output path"
            )
        if root.is_dir() and any(root.iterdir()) and not (root / "oci-layout").is_file():
            raise errors.InvalidArgument(
                f"output {root} is a non-empty directory without an oci-layout file; "
                "give an empty or new directory, or an existing OCI layout"
            )
        (root / "blobs" / "sha256").mkdir(parents=True, exist_ok=True)
        layout = cls(root)
        if not (root / "oci-layout").is_file():
            marker = canonical_json({"imageLayoutVersion": LAYOUT_VERSION})
            fsio.write_bytes_atomic(root / "oci-layout", marker, mode=0o644)
        if not (root / "index.json").is_file():
            layout.write_index([])
        return layout

    @classmethod
    def open(cls, root: Path) -> OciLayout:
        """Open an existing layout for reading; a clear error if it is not one."""
        marker = root / "oci-layout"
        if not root.is_dir():
            raise errors.NotFound(f"OCI layout {root} does not exist or is not a directory")
        if not marker.is_file():
            raise errors.InvalidArgument(
                f"{root} is not an OCI image layout (no oci-layout file); "
                "make one with `rukpak bundle build DIR --tag REF --output LAYOUT`"
            )
        try:
            version = json.loads(marker.read_bytes()).get("imageLayoutVersion")
        except (ValueError, AttributeError) as exc:
            raise errors.InvalidArgument(f"{marker} is not valid JSON: {exc}") from exc
        if version != LAYOUT_VERSION:
            raise errors.InvalidArgument(
                f"{marker} has imageLayoutVersion {version!r}; only {LAYOUT_VERSION} is supported"
            )
        return cls(root)

    def blob_path(self, digest: str) -> Path:
        algorithm, _, encoded = digests.check(digest).partition(":")
        return self.root / "blobs" / algorithm / encoded

    @contextmanager
    def ingest(self) -> Iterator[BlobWriter]:
        """Stream one blob in; on success it lands under its digest.

        Use ``writer.digest`` and ``writer.size`` after the ``with`` block. A
        failure inside the block leaves nothing behind.
        """
        # The name is only known at the end: spool (unnamed, gone with the handle), then
        # commit under the digest.
        with tempfile.TemporaryFile(dir=self.root) as spool:
            writer = BlobWriter(spool)
            yield writer
            final = self.blob_path(writer.digest)
            if not final.exists():
                spool.seek(0)
                with fsio.atomic_writer(final, mode=0o444) as out:
                    shutil.copyfileobj(spool, out, _COPY_CHUNK)

    def put_bytes(self, data: bytes, media_type: str) -> Descriptor:
        digest = digests.of(data, "sha256")
        final = self.blob_path(digest)
        if not final.exists():
            fsio.write_bytes_atomic(final, data, mode=0o444)
        return Descriptor(media_type=media_type, digest=digest, size=len(data))

    def read_bytes(self, blob: Descriptor) -> bytes:
        """A small (JSON) blob from the layout, checked against its descriptor."""
        if blob.size > MAX_JSON_BYTES:
            raise errors.InvalidArgument(
                f"{blob.digest} claims {blob.size} bytes; a JSON document over "
                f"{MAX_JSON_BYTES} bytes is not accepted"
            )
        path = self.blob_path(blob.digest)
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise errors.NotFound(
                f"OCI layout {self.root} is missing blob {blob.digest}; rebuild the layout"
            ) from None
        self._verify(data, blob)
        return data

    def check_blob(self, blob: Descriptor) -> Path:
        """The path of a blob whose size matches its descriptor (the digest is
        verified again by the registry when it is pushed)."""
        path = self.blob_path(blob.digest)
        try:
            size = path.stat().st_size
        except FileNotFoundError:
            raise errors.NotFound(
                f"OCI layout {self.root} is missing blob {blob.digest}; rebuild the layout"
            ) from None
        if size != blob.size:
            raise errors.DataLoss(
                f"blob {blob.digest} in {self.root} has {size} bytes, its descriptor says "
                f"{blob.size}; the layout is corrupt, rebuild it"
            )
        return path

    def index(self) -> list[Descriptor]:
        """The images the layout names (entries of ``index.json``)."""
        path = self.root / "index.json"
        try:
            data = path.read_bytes()
        except FileNotFoundError:
            raise errors.InvalidArgument(f"OCI layout {self.root} has no index.json") from None
        document = parse_manifest(mediatypes.OCI_INDEX, data, what=str(path))
        if not isinstance(document, Index):
            raise errors.InvalidArgument(f"{path} is not an image index")
        return document.manifests

    def read_manifest(self, blob: Descriptor) -> Manifest | Index:
        """A manifest or index stored in the layout, checked against its descriptor."""
        return parse_manifest(blob.media_type, self.read_bytes(blob), what=blob.digest)

    def write_index(self, manifests: list[Descriptor]) -> None:
        document = {
            "schemaVersion": 2,
            "mediaType": mediatypes.OCI_INDEX,
            "manifests": [m.to_json() for m in manifests],
        }
        index = json.dumps(document, indent=2).encode() + b"\n"
        fsio.write_bytes_atomic(self.root / "index.json", index, mode=0o644)

    def tag(self, image: Descriptor, *, name: str, ref_name: str) -> Descriptor:
        """Record ``image`` in index.json under ``ref_name``, replacing an entry
        of the same name; ``name`` is the full reference it was built for."""
        named = Descriptor(
            media_type=image.media_type,
            digest=image.digest,
            size=image.size,
            annotations={REF_NAME: ref_name, IMAGE_NAME: name},
        )
        kept = [m for m in self.index() if m.annotations.get(REF_NAME) != ref_name]
        self.write_index([*kept, named])
        return named

    @staticmethod
    def _verify(data: bytes, blob: Descriptor) -> None:
        if len(data) != blob.size:
            raise errors.DataLoss(
                f"blob {blob.digest} has {len(data)} bytes, its descriptor says {blob.size}"
            )
        actual = digests.of(data, blob.digest.partition(":")[0])
        if actual != blob.digest:
            raise errors.DataLoss(f"blob {blob.digest} hashes to {actual}; the layout is corrupt")
