"""A failed fetch leaves nothing a later publish trusts: corrupt, fail, repair, succeed.

Issue 18, item 6: after one failed fetch of a corrupt blob, a new FUSE volume of the
same image read EIO until the plugin restarted, although the registry's copy had
been repaired: the failure was remembered as if it were content. Here the test
registry's stored blob is damaged (same size), a publish fails, the blob is put back,
and a publish of the same image must then serve the right content, in both modes;
for eStargz images also after the lazy tree's background completion failed.
"""

from __future__ import annotations

import gzip
import io
import json
import tarfile
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from csi.fuse import lazy
from rukpak.common import errors
from rukpak.image.seams import PullPolicy
from tests.csi_helpers import push_image
from tests.registry import RegistryServer
from tests.spine_helpers import MODES, Node, fuse_listing, push_estargz

pytestmark = [pytest.mark.registry]

FILES = {"manifests/a.yaml": "a" * 5000, "manifests/b.yaml": "b" * 7000}


@contextmanager
def damaged(registry: RegistryServer, digest: str, start: int, end: int) -> Iterator[None]:
    """Blob ``digest`` with bytes ``[start, end)`` inverted in the registry's storage;
    repaired when the block ends."""
    path = registry.blob_path(digest)
    original = path.read_bytes()
    bad = bytearray(original)
    bad[start:end] = bytes(b ^ 0xFF for b in bad[start:end])
    path.write_bytes(bytes(bad))
    try:
        yield
    finally:
        path.write_bytes(original)


def expected() -> dict[str, str]:
    return {"manifests": "dir", **{k: f"file:{v}" for k, v in FILES.items()}}


@pytest.mark.parametrize("mode", MODES)
def test_a_publish_after_the_registry_repaired_a_corrupt_layer_succeeds(
    tmp_path: Path, registry: RegistryServer, mode: str
) -> None:
    entries = [("manifests/", "dir"), *((k, "file", v.encode()) for k, v in FILES.items())]
    image = push_image(registry.host, f"spine/corrupt-{mode}", "v1", [entries])
    layer = image.blob_digests[1]
    size = registry.blob_path(layer).stat().st_size
    node = Node(mode, tmp_path)
    with damaged(registry, layer, size // 2, size // 2 + 16), pytest.raises(errors.RukpakError):
        node.publish_image(image.ref)
    assert node.publish_image(image.ref) == expected()


def _span_of(layer: bytes, name: str) -> tuple[int, int]:
    """Where the gzip member holding ``name``'s bytes lies in eStargz ``layer``."""
    toc_offset = lazy.parse_footer(layer[-lazy.FOOTER_SIZE :])
    plain = gzip.decompress(layer[toc_offset : -lazy.FOOTER_SIZE])
    with tarfile.open(fileobj=io.BytesIO(plain)) as tar:
        handle = tar.extractfile(lazy.TOC_NAME)
        assert handle is not None
        entries = json.loads(handle.read())["entries"]
    starts = sorted({e["offset"] for e in entries if e.get("offset")} | {toc_offset})
    start = next(e["offset"] for e in entries if e["name"] == name)
    return start, starts[starts.index(start) + 1]


def test_a_lazy_tree_whose_fetch_and_completion_failed_is_served_once_repaired(
    tmp_path: Path, registry: RegistryServer
) -> None:
    entries = [("manifests/", "dir"), *((k, "file", v.encode()) for k, v in FILES.items())]
    image = push_estargz(registry.host, "spine/corrupt-lazy", entries)
    layer = image.blob_digests[1]
    start, end = _span_of(registry.blob_path(layer).read_bytes(), "manifests/a.yaml")
    node = Node("fuse", tmp_path)
    with damaged(registry, layer, start + 12, end - 12):
        ready = node.fuse.ensure(
            image.ref, platform=node.publisher.platform, pull_policy=PullPolicy.IF_NOT_PRESENT
        )  # indexed from the TOC, which is intact
        with pytest.raises(Exception):  # noqa: B017 - DataLoss or a gzip error: EIO for a reader
            fuse_listing(node.fuse, ready.name)
        node.fuse.lazy.complete(ready.name)  # the background completion fails too
        assert ready.name in node.fuse.lazy.broken
    # A new volume of the same image, the registry repaired: the right content.
    again = node.fuse.ensure(
        image.ref, platform=node.publisher.platform, pull_policy=PullPolicy.IF_NOT_PRESENT
    )
    assert again.name == ready.name and again.cache_hit
    assert fuse_listing(node.fuse, again.name) == expected()
    # The publish started the failed completion again (the publisher calls this).
    node.fuse.complete_in_background(again.name)
    deadline = time.monotonic() + 20
    while again.name in node.fuse.lazy.broken and time.monotonic() < deadline:
        time.sleep(0.05)
    assert again.name not in node.fuse.lazy.broken
