"""The image cache against the real registry: pull once, share, survive restarts, evict."""

from __future__ import annotations

import json
import os
import stat
import threading
from pathlib import Path
from typing import Any

import pytest

from rukpak.common import errors
from rukpak.image import tree
from rukpak.image.cache import ImageCache
from rukpak.image.cachestate import Holder
from rukpak.image.seams import Puller, PullPolicy
from rukpak.image.settings import CacheSettings
from rukpak.oci.auth import Credentials
from rukpak.oci.client import RegistryClient
from rukpak.oci.manifest import Platform
from tests.csi_helpers import PushedImage, push_image, simple_image
from tests.polling import eventually
from tests.registry import RegistryServer

pytestmark = pytest.mark.registry

AMD64 = Platform.parse("linux/amd64")


def client(credentials: Credentials | None) -> Puller:
    return RegistryClient(credentials=credentials, retries=0, timeout=5)


def no_network(credentials: Credentials | None) -> Puller:
    raise AssertionError("the cache must not contact the registry here")


def cache(root: Path, **kwargs: object) -> ImageCache:
    kwargs.setdefault("puller_factory", client)
    return ImageCache(root, **kwargs)  # type: ignore[arg-type]


def blob_gets(registry: RegistryServer, repo: str) -> int:
    return registry.count_requests("GET", rf"^/v2/{repo}/blobs/")


def pulled_once(
    tmp_path: Path, registry: RegistryServer, repo: str
) -> tuple[PushedImage, ImageCache]:
    """A fresh ``simple_image`` in ``repo`` and a cache that has pulled it once."""
    image = simple_image(registry.host, repo)
    c = cache(tmp_path)
    c.ensure(image.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)
    return image, c


def test_ensure_unpacks_a_read_only_tree_named_by_manifest_digest(
    tmp_path: Path, registry: RegistryServer
) -> None:
    image = simple_image(registry.host, "images/basic", text="one")
    got = cache(tmp_path).ensure(image.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)
    assert got.digest == image.manifest_digest
    assert got.path.name == image.manifest_digest.split(":")[1]
    assert (got.path / "manifests/cm.yaml").read_text() == "one"
    assert stat.S_IMODE(got.path.stat().st_mode) == 0o555
    assert not got.cache_hit


def test_a_second_ensure_is_a_cache_hit_without_any_request(
    tmp_path: Path, registry: RegistryServer
) -> None:
    image, c = pulled_once(tmp_path, registry, "images/hit")
    before = registry.count_requests("GET", "^/v2/images/hit/")
    again = c.ensure(image.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)
    assert again.cache_hit
    assert registry.count_requests("GET", "^/v2/images/hit/") == before


def ensure_concurrently(c: ImageCache, refs: list[str]) -> list[str]:
    """``ensure`` each of ``refs`` in its own thread; the digests, in order. Fails on errors."""
    results: list[str] = [""] * len(refs)
    failures: list[BaseException] = []

    def pull(n: int) -> None:
        try:
            got = c.ensure(refs[n], platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)
            results[n] = got.digest
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=pull, args=(n,)) for n in range(len(refs))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    return results


def test_images_sharing_a_layer_pulled_concurrently_fetch_it_once(
    tmp_path: Path, registry: RegistryServer
) -> None:
    shared = [("big", "file", os.urandom(4 << 20))]
    images = [
        push_image(registry.host, f"images/share{n}", "v1", [shared, [("own", "file", str(n))]])
        for n in range(4)
    ]
    layer = images[0].blob_digests[1]
    assert all(i.blob_digests[1] == layer for i in images)
    results = ensure_concurrently(cache(tmp_path), [i.ref for i in images])
    assert results == [i.manifest_digest for i in images]
    assert registry.count_requests("GET", rf"/blobs/{layer}$") == 1


class GatedPuller:
    """The real client, except that opening the blob ``gate`` waits until ``go`` is set."""

    def __init__(self, gate: str) -> None:
        self.client = RegistryClient(retries=0, timeout=5)
        self.gate = gate
        self.reached = threading.Event()
        self.go = threading.Event()

    def resolve_image(self, ref: Any, platform: Any = None) -> Any:
        return self.client.resolve_image(ref, platform)

    def fetch_blob(self, ref: Any, desc: Any, dest: Path) -> None:
        self.client.fetch_blob(ref, desc, dest)

    def open_blob(self, ref: Any, desc: Any) -> Any:
        if desc.digest == self.gate:
            self.reached.set()
            assert self.go.wait(30)
        return self.client.open_blob(ref, desc)


def test_eviction_keeps_blobs_an_in_flight_pull_found_present(
    tmp_path: Path, registry: RegistryServer
) -> None:
    shared = [("shared", "file", os.urandom(100_000))]
    old = push_image(registry.host, "images/lease-old", "v1", [shared])
    new = push_image(
        registry.host, "images/lease-new", "v1", [[("own", "file", os.urandom(100_000))], shared]
    )
    gated = GatedPuller(gate=new.blob_digests[1])  # its own layer, before the shared one
    c = cache(tmp_path, puller_factory=lambda creds: gated)
    gated.go.set()
    c.ensure(old.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)
    shared_digest = old.blob_digests[1]
    assert c.store.has(shared_digest)
    gated.go.clear()
    done: list[str] = []
    worker = threading.Thread(
        target=lambda: done.append(
            c.ensure(new.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT).digest
        )
    )
    worker.start()
    assert gated.reached.wait(30)  # the new pull has found the shared blob present
    c.budget_bytes = 1
    c.evict()
    assert not c.has_tree(old.manifest_digest)  # evicted: nothing holds it
    assert c.store.has(shared_digest)  # leased by the pull in flight: kept
    gated.go.set()
    worker.join(30)
    assert done == [new.manifest_digest]
    assert registry.count_requests("GET", rf"^/v2/images/lease-new/blobs/{shared_digest}$") == 0


def test_concurrent_requests_for_one_image_fetch_each_blob_once(
    tmp_path: Path, registry: RegistryServer
) -> None:
    image = push_image(
        registry.host,
        "images/concurrent",
        "v1",
        [[("a", "file", b"x" * 200_000)], [("b", "file", b"y" * 100_000)]],
    )
    results = ensure_concurrently(cache(tmp_path), [image.ref] * 8)
    assert results == [image.manifest_digest] * 8
    for digest in image.blob_digests:
        assert registry.count_requests("GET", rf"^/v2/images/concurrent/blobs/{digest}$") == 1


def test_pull_policy_always_re_resolves_but_reuses_the_tree(
    tmp_path: Path, registry: RegistryServer
) -> None:
    image, c = pulled_once(tmp_path, registry, "images/always")
    manifests = registry.count_requests("GET", "^/v2/images/always/manifests/")
    blobs = blob_gets(registry, "images/always")
    again = c.ensure(image.ref, platform=AMD64, pull_policy=PullPolicy.ALWAYS)
    assert again.cache_hit
    assert registry.count_requests("GET", "^/v2/images/always/manifests/") == manifests + 1
    assert blob_gets(registry, "images/always") == blobs


def test_pull_policy_always_follows_a_moved_tag(tmp_path: Path, registry: RegistryServer) -> None:
    first = simple_image(registry.host, "images/moved", text="first")
    c = cache(tmp_path)
    c.ensure(first.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)
    second = simple_image(registry.host, "images/moved", text="second")
    kept = c.ensure(first.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)
    assert kept.digest == first.manifest_digest
    moved = c.ensure(first.ref, platform=AMD64, pull_policy=PullPolicy.ALWAYS)
    assert moved.digest == second.manifest_digest
    assert (moved.path / "manifests/cm.yaml").read_text() == "second"


def test_pull_policy_never_needs_the_image_on_the_node(
    tmp_path: Path, registry: RegistryServer
) -> None:
    image = simple_image(registry.host, "images/never")
    c = cache(tmp_path, puller_factory=no_network)
    with pytest.raises(errors.FailedPrecondition, match="Never"):
        c.ensure(image.ref, platform=AMD64, pull_policy=PullPolicy.NEVER)
    cache(tmp_path).ensure(image.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)
    got = cache(tmp_path, puller_factory=no_network).ensure(
        image.ref, platform=AMD64, pull_policy=PullPolicy.NEVER
    )
    assert got.cache_hit


def test_an_unknown_image_is_not_found(tmp_path: Path, registry: RegistryServer) -> None:
    with pytest.raises(errors.NotFound):
        cache(tmp_path).ensure(
            f"{registry.host}/images/nothing:here",
            platform=AMD64,
            pull_policy=PullPolicy.IF_NOT_PRESENT,
        )


def test_a_layer_that_is_not_a_tar_is_invalid_argument(
    tmp_path: Path, registry: RegistryServer
) -> None:
    from rukpak.oci.manifest import Manifest
    from rukpak.oci.reference import Reference

    ref = Reference.parse(f"{registry.host}/images/untitled-blob:v1")
    with RegistryClient() as rc:
        config = rc.push_blob(ref, b"{}", media_type="application/vnd.example.config.v1+json")
        layer = rc.push_blob(ref, b"weights", media_type="application/vnd.example.weights")
        body = Manifest("application/vnd.oci.image.manifest.v1+json", config, [layer]).to_json()
        rc.push_manifest(ref, body, "application/vnd.oci.image.manifest.v1+json")
    with pytest.raises(errors.InvalidArgument, match="not a filesystem layer"):
        cache(tmp_path).ensure(str(ref), platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)


def test_a_tampered_layer_that_breaks_decompression_is_data_loss(
    tmp_path: Path, registry: RegistryServer
) -> None:
    image = push_image(
        registry.host, "images/tampered", "v1", [[("f", "file", os.urandom(64_000))]]
    )
    blob = registry.blob_path(image.blob_digests[1])
    data = bytearray(blob.read_bytes())
    data[20:4000] = b"\xff" * 3980  # same size, deflate stream broken near its start
    blob.write_bytes(bytes(data))
    c = cache(tmp_path)
    with pytest.raises(errors.DataLoss, match="does not match"):
        c.ensure(image.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)
    assert not c.store.has(image.blob_digests[1])
    assert [p.name for p in (tmp_path / "unpacked").iterdir()] == []


def test_a_tree_survives_a_restart_and_leftover_temp_trees_are_removed(
    tmp_path: Path, registry: RegistryServer
) -> None:
    image = simple_image(registry.host, "images/restart")
    got = cache(tmp_path).ensure(image.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)
    leftover = tmp_path / "unpacked" / f"{got.path.name}.tmp-dead"
    (leftover / "half").mkdir(parents=True)
    tree.seal(leftover)
    (tmp_path / "content" / "ingest" / "partial").write_bytes(b"half a blob")
    c = cache(tmp_path, puller_factory=no_network)
    assert not leftover.exists()
    assert list((tmp_path / "content" / "ingest").iterdir()) == []
    again = c.ensure(image.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)
    assert again.cache_hit and again.path == got.path


def test_a_committed_tree_has_its_marker_and_an_unsealed_one_is_removed_at_start(
    tmp_path: Path, registry: RegistryServer
) -> None:
    image = simple_image(registry.host, "images/sealed", text="durable")
    got = cache(tmp_path).ensure(image.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)
    marker = got.path.with_name(got.path.name + ".sealed")
    assert json.loads(marker.read_text())["digest"] == image.manifest_digest
    # The first cache's syncer rewrites the marker as synced: let it finish, or it could
    # write the marker again after the unlink below.
    eventually(lambda: json.loads(marker.read_text()).get("synced"), what="the tree synced")
    marker.unlink()  # as after a power loss between the rename and the marker
    again = cache(tmp_path)
    assert not got.path.exists()
    pulled = again.ensure(image.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)
    assert not pulled.cache_hit and (pulled.path / "manifests/cm.yaml").read_text() == "durable"


def test_eviction_removes_least_recently_used_unheld_trees_and_their_blobs(
    tmp_path: Path, registry: RegistryServer
) -> None:
    a = push_image(registry.host, "images/evict-a", "v1", [[("a", "file", b"a" * 50_000)]])
    b = push_image(registry.host, "images/evict-b", "v1", [[("b", "file", b"b" * 50_000)]])
    d = push_image(registry.host, "images/evict-d", "v1", [[("d", "file", b"d" * 50_000)]])
    c = cache(tmp_path, settings=CacheSettings(budget_bytes=120_000))
    held = c.ensure(
        a.ref,
        platform=AMD64,
        pull_policy=PullPolicy.IF_NOT_PRESENT,
        holder=Holder("/pods/x/target", "vol-a", a.ref),
    )
    unheld = c.ensure(b.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)
    assert held.path.exists() and unheld.path.exists()
    newest = c.ensure(d.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)
    c.evict()  # eviction runs in the background after a pull; this waits for a full pass
    assert held.path.exists() and newest.path.exists()
    assert not unheld.path.exists()
    assert not any(c.store.has(digest) for digest in b.blob_digests[1:])
    assert c.usage() <= 120_000
    c.release("/pods/x/target")
    assert c.holders() == {}
