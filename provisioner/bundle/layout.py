"""An OCI image layout on disk: where ``rukpak bundle build`` puts what it makes.

The layout follows the OCI image-layout specification: an ``oci-layout`` marker
file, an ``index.json`` naming the images it holds, and content-addressed blobs
under ``blobs/sha256/<hex>``. ``provisioner.bundle.build`` writes into one,
``provisioner.bundle.push`` reads one and sends it to a registry.

Blobs are written like containerd's content store writes them: into a hidden
temp file next to the blobs, hashed while they stream, then renamed into place;
a blob that is already present is success. ``index.json`` is replaced
atomically. Nothing here touches the network.
"""

from __future__ import annotations

import hashlib
import json
import os
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import IO, Any

from csi.common import errors
from csi.oci import digest as digests
from csi.oci import mediatypes
from csi.oci.manifest import Descriptor, Index, Manifest, parse_manifest

LAYOUT_VERSION = "1.0.0"
REF_NAME = "org.opencontainers.image.ref.name"
IMAGE_NAME = "io.containerd.image.name"

# JSON documents in a layout (index, manifests, configs) are small; a bigger
# one means the layout is not what we think it is.
MAX_JSON_BYTES = 4 * 1024 * 1024


def canonical_json(document: dict[str, Any]) -> bytes:
    """The bytes we hash for manifests and configs: compact, key order as built."""
    return json.dumps(document, separators=(",", ":"), ensure_ascii=False).encode()


class BlobWriter:
    """A streaming writer that hashes what it writes; see ``OciLayout.ingest``."""

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
            _atomic_write(
                root / "oci-layout", canonical_json({"imageLayoutVersion": LAYOUT_VERSION})
            )
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
        blobs = self.root / "blobs" / "sha256"
        fd, tmp_name = tempfile.mkstemp(prefix=".ingest-", dir=self.root)
        tmp = Path(tmp_name)
        try:
            with os.fdopen(fd, "wb") as handle:
                writer = BlobWriter(handle)
                yield writer
                handle.flush()
                os.fsync(handle.fileno())
            final = blobs / writer.digest.removeprefix("sha256:")
            if final.exists():
                tmp.unlink()
            else:
                os.chmod(tmp, 0o444)
                os.replace(tmp, final)
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def put_bytes(self, data: bytes, media_type: str) -> Descriptor:
        with self.ingest() as writer:
            writer.write(data)
        return Descriptor(media_type=media_type, digest=writer.digest, size=writer.size)

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
        _atomic_write(self.root / "index.json", json.dumps(document, indent=2).encode() + b"\n")

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


def _atomic_write(path: Path, data: bytes) -> None:
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}-", dir=path.parent)
    try:
        os.fchmod(fd, 0o644)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise
