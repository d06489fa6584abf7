"""The image cache against the real registry: pull once, share, survive restarts, evict."""

from __future__ import annotations

import stat
import threading
from pathlib import Path

import pytest

from csi.common import errors
from csi.image import tree
from csi.image.cache import Holder, ImageCache, Puller, PullPolicy
from csi.oci.auth import Credentials
from csi.oci.client import RegistryClient
from csi.oci.manifest import Platform
from tests.csi_helpers import push_image, simple_image
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
    image = simple_image(registry.host, "images/hit")
    c = cache(tmp_path)
    c.ensure(image.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)
    before = registry.count_requests("GET", "^/v2/images/hit/")
    again = c.ensure(image.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)
    assert again.cache_hit
    assert registry.count_requests("GET", "^/v2/images/hit/") == before


def test_concurrent_requests_for_one_image_fetch_each_blob_once(
    tmp_path: Path, registry: RegistryServer
) -> None:
    image = push_image(
        registry.host,
        "images/concurrent",
        "v1",
        [[("a", "file", b"x" * 200_000)], [("b", "file", b"y" * 100_000)]],
    )
    c = cache(tmp_path)
    results: list[str] = []
    failures: list[BaseException] = []

    def pull() -> None:
        try:
            got = c.ensure(image.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)
            results.append(got.digest)
        except BaseException as exc:
            failures.append(exc)

    threads = [threading.Thread(target=pull) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert failures == []
    assert results == [image.manifest_digest] * 8
    for digest in image.blob_digests:
        assert registry.count_requests("GET", rf"^/v2/images/concurrent/blobs/{digest}$") == 1


def test_pull_policy_always_re_resolves_but_reuses_the_tree(
    tmp_path: Path, registry: RegistryServer
) -> None:
    image = simple_image(registry.host, "images/always")
    c = cache(tmp_path)
    c.ensure(image.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)
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
    from csi.oci.manifest import Manifest
    from csi.oci.reference import Reference

    ref = Reference.parse(f"{registry.host}/images/helmchart:v1")
    with RegistryClient() as rc:
        config = rc.push_blob(ref, b"{}", media_type="application/vnd.cncf.helm.config.v1+json")
        layer = rc.push_blob(
            ref, b"chart", media_type="application/vnd.cncf.helm.chart.content.v1.tar+gzip"
        )
        body = Manifest("application/vnd.oci.image.manifest.v1+json", config, [layer]).to_json()
        rc.push_manifest(ref, body, "application/vnd.oci.image.manifest.v1+json")
    with pytest.raises(errors.InvalidArgument, match="not a filesystem layer"):
        cache(tmp_path).ensure(str(ref), platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)


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


def test_eviction_removes_least_recently_used_unheld_trees_and_their_blobs(
    tmp_path: Path, registry: RegistryServer
) -> None:
    a = push_image(registry.host, "images/evict-a", "v1", [[("a", "file", b"a" * 50_000)]])
    b = push_image(registry.host, "images/evict-b", "v1", [[("b", "file", b"b" * 50_000)]])
    d = push_image(registry.host, "images/evict-d", "v1", [[("d", "file", b"d" * 50_000)]])
    c = cache(tmp_path, budget_bytes=120_000)
    held = c.ensure(
        a.ref,
        platform=AMD64,
        pull_policy=PullPolicy.IF_NOT_PRESENT,
        holder=Holder("/pods/x/target", "vol-a", a.ref),
    )
    unheld = c.ensure(b.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)
    assert held.path.exists() and unheld.path.exists()
    newest = c.ensure(d.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)
    assert held.path.exists() and newest.path.exists()
    assert not unheld.path.exists()
    assert not any(c.store.has(digest) for digest in b.blob_digests[1:])
    assert c.usage() <= 120_000
    c.release("/pods/x/target")
    assert c.holders() == {}
