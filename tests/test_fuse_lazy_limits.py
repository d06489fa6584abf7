"""Lazily fetched eStargz layers stay within bounds: the TOC's size, and what the layer
holds beyond its TOC (issue 18, items 4 and 5).

A TOC of ~58 MiB of JSON drove the plugin from 63 to 618 MiB: TOCs above
``lazy.MAX_TOC_BYTES`` compressed or ``lazy.MAX_TOC_JSON_BYTES`` inflated are refused
(FailedPrecondition) before ``json`` parses them. Tar members the TOC does not list
were stored by the background completion outside every budget (1 GiB with
``--max-unpacked-bytes 64 MiB``): now they are never stored, and every member counts
against the unpack budgets. Layers are written by hand and pushed to the registry.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import os
import tarfile
import tracemalloc
from pathlib import Path

import pytest

from csi.fuse import lazy
from csi.fuse.images import FuseImages
from provisioner.bundle import estargz
from rukpak.common import errors
from rukpak.image.members import Limits
from rukpak.image.seams import PullPolicy
from rukpak.image.settings import CacheSettings
from tests.csi_helpers import tar_bytes
from tests.registry import RegistryServer
from tests.spine_helpers import PLATFORM, fuse_listing, push_layer, registry_client, toc_member

pytestmark = [pytest.mark.registry]


def _images(root: Path, limits: Limits | None = None) -> FuseImages:
    settings = CacheSettings(limits=limits or Limits())
    return FuseImages(root, puller_factory=registry_client, settings=settings)


def _ensure(images: FuseImages, ref: str) -> str:
    ready = images.ensure(ref, platform=PLATFORM, pull_policy=PullPolicy.IF_NOT_PRESENT)
    return ready.name


def _toc_only_layer(registry: RegistryServer, repo: str, toc: bytes) -> str:
    """An image whose one layer is just a TOC member and the footer."""
    layer = toc_member(toc) + estargz.footer(0)
    digest = f"sha256:{hashlib.sha256(toc).hexdigest()}"
    return push_layer(registry.host, repo, layer, {lazy.TOC_DIGEST_ANNOTATION: digest}).ref


def test_a_toc_that_inflates_past_the_cap_is_refused_before_it_is_parsed(
    tmp_path: Path, registry: RegistryServer
) -> None:
    count = lazy.MAX_TOC_JSON_BYTES // 30 + 1  # ~30 bytes an entry: just past the cap
    body = ",".join(f'{{"name":"d{n}","type":"dir"}}' for n in range(count))
    toc = f'{{"version":1,"entries":[{body}]}}'.encode()
    assert len(toc) > lazy.MAX_TOC_JSON_BYTES
    ref = _toc_only_layer(registry, "lazy/huge-toc", toc)
    del body, toc
    images = _images(tmp_path)
    tracemalloc.start()
    try:
        with pytest.raises(errors.FailedPrecondition, match=r"16 MiB .* without\s+--estargz"):
            _ensure(images, ref)
        _now, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    # Parsing it would have built ~560,000 dicts (hundreds of MiB); refusing costs the
    # compressed member and at most the capped inflated bytes.
    assert peak < 3 * lazy.MAX_TOC_JSON_BYTES
    assert images.tree_names() == []


def test_a_toc_member_larger_than_the_cap_is_refused_before_it_is_fetched(
    tmp_path: Path, registry: RegistryServer
) -> None:
    member = os.urandom(lazy.MAX_TOC_BYTES + 1)  # what the footer claims is the TOC
    layer = member + estargz.footer(0)
    digest = "sha256:" + "0" * 64
    image = push_layer(
        registry.host, "lazy/huge-member", layer, {lazy.TOC_DIGEST_ANNOTATION: digest}
    )
    ranges = registry.count_requests("GET", r"^/v2/lazy/huge-member/blobs/")
    with pytest.raises(errors.FailedPrecondition, match="compressed"):
        _ensure(_images(tmp_path), image.ref)
    # Only the footer was asked for.
    assert registry.count_requests("GET", r"^/v2/lazy/huge-member/blobs/") == ranges + 1


def test_a_toc_that_is_not_json_is_invalid_argument(
    tmp_path: Path, registry: RegistryServer
) -> None:
    ref = _toc_only_layer(registry, "lazy/not-json", b"[" * 100_000)  # deeper than json recurses
    with pytest.raises(errors.InvalidArgument, match="not a JSON document"):
        _ensure(_images(tmp_path), ref)


def _with_unlisted_member(name: str, data: bytes) -> tuple[bytes, dict[str, str]]:
    """An eStargz layer of two listed files plus member ``name`` its TOC does not list
    (its own gzip member, placed before the TOC), and the layer's annotations."""
    listed = [("manifests/", "dir"), ("manifests/a.yaml", "file", b"a" * 300)]
    out = io.BytesIO()
    written = estargz.convert(io.BytesIO(tar_bytes(listed)), out)
    layer = out.getvalue()
    toc_offset = lazy.parse_footer(layer[-lazy.FOOTER_SIZE :])
    info = tarfile.TarInfo(name)
    info.size = len(data)
    padding = b"\0" * (-len(data) % tarfile.BLOCKSIZE)
    extra = gzip.compress(info.tobuf(tarfile.PAX_FORMAT) + data + padding, mtime=0)
    rebuilt = (
        layer[:toc_offset]
        + extra
        + layer[toc_offset : -lazy.FOOTER_SIZE]
        + estargz.footer(toc_offset + len(extra))
    )
    return rebuilt, written.annotations()


def test_members_the_toc_does_not_list_count_against_the_budget(
    tmp_path: Path, registry: RegistryServer
) -> None:
    limits = Limits(max_bytes=1 << 20, max_entries=100)
    big = b"\0" * (8 << 20)  # 8 MiB the TOC does not mention, 8 KiB compressed
    layer, annotations = _with_unlisted_member("hidden.bin", big)
    image = push_layer(registry.host, "lazy/unlisted-big", layer, annotations)
    images = _images(tmp_path, limits)
    name = _ensure(images, image.ref)  # the TOC is within the budget: indexed
    images.lazy.complete(name)
    assert name in images.lazy.broken  # the layer is not: the completion stops
    hidden = f"sha256:{hashlib.sha256(big).hexdigest()}"
    assert not images.files.has(hidden)
    assert all(
        images.files.path(d).stat().st_size <= limits.max_bytes for d in images.files.digests()
    )
    # What the TOC lists is still served, fetched by range.
    assert fuse_listing(images, name) == {
        "manifests": "dir",
        "manifests/a.yaml": "file:" + "a" * 300,
    }


def test_members_the_toc_does_not_list_are_never_stored(
    tmp_path: Path, registry: RegistryServer
) -> None:
    secret = b"b" * 300  # the size of a listed file: only its digest tells them apart
    layer, annotations = _with_unlisted_member("hidden.txt", secret)
    image = push_layer(registry.host, "lazy/unlisted-small", layer, annotations)
    images = _images(tmp_path)
    name = _ensure(images, image.ref)
    images.lazy.complete(name)
    assert name not in images.lazy.broken
    assert not images.files.has(f"sha256:{hashlib.sha256(secret).hexdigest()}")
    assert fuse_listing(images, name) == {
        "manifests": "dir",
        "manifests/a.yaml": "file:" + "a" * 300,
    }
