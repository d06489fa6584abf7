"""Streamed pulls: layers unpack while they download, and bad or broken streams leave nothing.

The image cache tees each missing layer's stream into the content store and
the extractor at once; these tests drive it with an in-memory puller whose
streams can be corrupted, broken or cut short by a crash.
"""

from __future__ import annotations

import contextlib
import io
import os
import random
import stat
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import BinaryIO

import pytest

from rukpak.common import errors
from rukpak.image.cache import ImageCache
from rukpak.image.seams import PullPolicy
from rukpak.image.store import ContentStore
from rukpak.oci import digest as digests
from rukpak.oci import mediatypes
from rukpak.oci.manifest import Descriptor, Manifest, Platform
from rukpak.oci.reference import Reference
from tests.csi_helpers import Entry, compress, tar_bytes, tree

AMD64 = Platform.parse("linux/amd64")
IMAGE = "registry.example/bundles/streamed:v1"
FILES = 300  # enough data that extraction is well under way before the stream ends


def layer_bytes() -> bytes:
    rng = random.Random(7)  # the same bytes in a child process
    entries: list[Entry] = [("manifests/", "dir")]
    entries += [(f"manifests/f{i:03d}.yaml", "file", rng.randbytes(4096)) for i in range(FILES)]
    return compress(tar_bytes(entries), "gzip")


class FakePuller:
    """Serves one image from memory; ``stream`` decides what ``open_blob`` sends."""

    def __init__(self, layer: bytes, *, served: bytes | None = None, stream: bool = True) -> None:
        self.layer = layer
        self.served = layer if served is None else served
        config = b'{"architecture":"amd64","os":"linux"}'
        self.blobs = {digests.of(config): config, digests.of(layer): layer}
        self.config = Descriptor(mediatypes.OCI_CONFIG, digests.of(config), len(config))
        self.layer_desc = Descriptor(mediatypes.OCI_LAYER_GZIP, digests.of(layer), len(layer))
        self.manifest = Manifest(mediatypes.OCI_MANIFEST, self.config, [self.layer_desc])
        self.opened = 0
        self.fetched: list[str] = []
        self.break_after: int | None = None
        self.exit_after: int | None = None
        if not stream:
            self.open_blob = None  # type: ignore[assignment]

    def resolve_image(
        self, ref: Reference, platform: Platform | None = None
    ) -> tuple[Descriptor, Manifest]:
        body = self.manifest.to_json()
        return Descriptor(mediatypes.OCI_MANIFEST, digests.of(body), len(body)), self.manifest

    def fetch_blob(self, ref: Reference, desc: Descriptor, dest: Path) -> None:
        self.fetched.append(desc.digest)
        dest.write_bytes(self.blobs[desc.digest])

    @contextlib.contextmanager
    def open_blob(self, ref: Reference, desc: Descriptor) -> Iterator[BinaryIO]:
        self.opened += 1
        data = self.served if desc.digest == self.layer_desc.digest else self.blobs[desc.digest]
        yield _Stream(data, break_after=self.break_after, exit_after=self.exit_after)


class _Stream(io.BytesIO):
    """Unverified bytes (so the store's own check is what catches corruption)."""

    def __init__(self, data: bytes, *, break_after: int | None, exit_after: int | None) -> None:
        super().__init__(data)
        self._break_after = break_after
        self._exit_after = exit_after

    def read(self, size: int | None = -1, /) -> bytes:
        pos = self.tell()
        if self._exit_after is not None and pos >= self._exit_after:
            os._exit(17)  # a crash: no cleanup, no finally blocks
        if self._break_after is not None and pos >= self._break_after:
            raise errors.Unavailable("the connection broke during the download")
        return super().read(4096 if size is None or size < 0 else min(size, 4096))


def ensure(root: Path, puller: FakePuller) -> Path:
    cache = ImageCache(root, puller_factory=lambda _creds: puller)  # type: ignore[arg-type,return-value]
    return cache.ensure(IMAGE, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT).path


def visible(root: Path) -> dict[str, list[str]]:
    """What a pull left: trees, staging dirs, blobs, ingests (not the trees' sealed markers)."""
    blobs = root / "content" / "blobs" / "sha256"
    return {
        "unpacked": sorted(
            p.name for p in (root / "unpacked").iterdir() if not p.name.endswith(".sealed")
        ),
        "blobs": sorted(p.name for p in blobs.iterdir()) if blobs.exists() else [],
        "ingest": sorted(p.name for p in (root / "content" / "ingest").iterdir()),
    }


def hex_(digest: str) -> str:
    return digests.hex_of(digest)


def test_a_streamed_pull_unpacks_the_tree_and_commits_the_read_only_blob(tmp_path: Path) -> None:
    puller = FakePuller(layer_bytes())
    path = ensure(tmp_path, puller)
    assert puller.opened == 1 and puller.fetched == [puller.config.digest]
    assert len(tree(path)) == FILES + 1
    assert stat.S_IMODE(path.stat().st_mode) == 0o555
    assert stat.S_IMODE((path / "manifests").stat().st_mode) == 0o555
    assert stat.S_IMODE((path / "manifests/f000.yaml").stat().st_mode) == 0o444
    blob = ContentStore(tmp_path / "content").path(puller.layer_desc.digest)
    assert blob.read_bytes() == puller.layer
    assert stat.S_IMODE(blob.stat().st_mode) == 0o444
    assert visible(tmp_path)["ingest"] == []


def test_a_layer_already_in_the_store_unpacks_from_it_without_a_download(tmp_path: Path) -> None:
    layer = layer_bytes()
    puller = FakePuller(layer)
    cache = ImageCache(tmp_path, puller_factory=lambda _creds: puller)  # type: ignore[arg-type,return-value]
    cache.store.put_bytes(digests.of(layer), layer)  # as another image's pull left it
    cache.ensure(IMAGE, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)
    assert puller.opened == 0 and puller.layer_desc.digest not in puller.fetched


def test_at_start_blobs_no_tree_lists_go_and_listed_ones_stay(tmp_path: Path) -> None:
    puller = FakePuller(layer_bytes())
    ensure(tmp_path, puller)
    stray = b"a blob a failed pull committed before a power loss"
    ContentStore(tmp_path / "content").put_bytes(digests.of(stray), stray)
    assert len(visible(tmp_path)["blobs"]) == 3  # config, layer, stray
    ensure(tmp_path, puller)  # a new cache over the same root: the plugin restarted
    assert visible(tmp_path)["blobs"] == sorted(
        hex_(d) for d in (puller.config.digest, puller.layer_desc.digest)
    )
    assert puller.opened == 1  # the kept tree was served, nothing pulled again


@pytest.mark.parametrize(
    "corrupt",
    [
        pytest.param(lambda b: b[:100] + bytes([b[100] ^ 1]) + b[101:], id="flipped-byte"),
        pytest.param(lambda b: b + b"\0" * 512, id="extra-bytes"),
        pytest.param(lambda b: b[:-10], id="truncated"),
    ],
)
def test_a_stream_that_does_not_match_its_digest_leaves_no_tree_no_blob_no_ingest(
    tmp_path: Path, corrupt: object
) -> None:
    layer = layer_bytes()
    puller = FakePuller(layer, served=corrupt(layer))  # type: ignore[operator]
    with pytest.raises(errors.RukpakError) as caught:
        ensure(tmp_path, puller)
    # DataLoss from the store's count and hash; a flipped byte may upset gzip first.
    assert isinstance(caught.value, errors.DataLoss | errors.InvalidArgument)
    left = visible(tmp_path)
    assert left["unpacked"] == [] and left["ingest"] == []
    assert hex_(puller.layer_desc.digest) not in left["blobs"]


def test_a_broken_stream_falls_back_to_downloading_the_blob_first(tmp_path: Path) -> None:
    puller = FakePuller(layer_bytes())
    puller.break_after = len(puller.layer) // 2
    path = ensure(tmp_path, puller)
    assert puller.opened == 1 and puller.layer_desc.digest in puller.fetched
    assert len(tree(path)) == FILES + 1
    assert visible(tmp_path)["unpacked"] == [path.name]


CRASHING_PULL = """
import sys
from pathlib import Path
from tests import test_csi_streaming as t
puller = t.FakePuller(t.layer_bytes())
puller.exit_after = len(puller.layer) // 2
t.ensure(Path(sys.argv[1]), puller)
"""


def test_a_crash_mid_extraction_leaves_nothing_visible_after_restart(tmp_path: Path) -> None:
    crashed = subprocess.run(
        [sys.executable, "-c", CRASHING_PULL, str(tmp_path)],
        cwd=Path(__file__).parent.parent,
        check=False,
    )
    assert crashed.returncode == 17
    left = visible(tmp_path)
    assert not [n for n in left["unpacked"] if ".tmp-" not in n]  # no finished tree
    assert [n for n in left["unpacked"] if ".tmp-" in n]  # it was mid-extraction
    assert left["ingest"]  # and mid-download
    layer = layer_bytes()
    assert hex_(digests.of(layer)) not in left["blobs"]
    ImageCache(tmp_path, puller_factory=lambda _creds: FakePuller(layer))  # type: ignore[arg-type,return-value]
    assert visible(tmp_path)["unpacked"] == [] and visible(tmp_path)["ingest"] == []


def test_an_ingest_commits_only_matching_content(tmp_path: Path) -> None:
    store = ContentStore(tmp_path)
    data = b"streamed content"
    with store.ingest(digests.of(data), len(data)) as sink:
        sink.write(data[:5])
        sink.write(data[5:])
    assert store.path(digests.of(data)).read_bytes() == data
    wrong = digests.of(b"something else")
    with pytest.raises(errors.DataLoss, match="hashes to"), store.ingest(wrong, len(data)) as sink:
        sink.write(data)
    with pytest.raises(errors.DataLoss, match="more than"), store.ingest(wrong, 3) as sink:
        sink.write(data)
    assert not store.has(wrong)
    assert list(store.ingest_dir.iterdir()) == []
