"""Retention: the content an owner keeps (a BundleDeployment's revisions) stay in the node
cache while nothing mounts them, until the retention TTL passes.

Grouped by layer: the volume attributes (``retainFor``, ``retain``: images, git and http
sources), the cache's records (``CacheState.retain``), eviction, and the publish that
records them, against a real registry and a real http server; then the FUSE store's
own retention, on a real store.
"""

from __future__ import annotations

import json
import logging
import os
import time
from collections.abc import Iterator
from hashlib import sha256
from pathlib import Path
from typing import Any

import pytest

from csi.fuse.images import FuseImages
from csi.fuse.publisher import FusePublisher
from csi.node.publish import Publisher
from csi.plugin import main as plugin_main
from csi.volume.request import PublishRequest
from rukpak.common import errors
from rukpak.image import retention
from rukpak.image.cache import ImageCache
from rukpak.image.cachestate import CacheState, Holder
from rukpak.image.seams import Puller, PullPolicy
from rukpak.image.settings import CacheSettings
from rukpak.oci.auth import Credentials
from rukpak.oci.client import RegistryClient
from rukpak.oci.manifest import Platform
from rukpak.oci.reference import Reference
from rukpak.sources.cache import SourceCache
from rukpak.sources.volume import RETAIN_MAX, FetchSource, VolumeSource, retain_entry
from tests.csi_helpers import PushedImage, push_image, simple_image
from tests.publish_fakes import FakeMounter
from tests.registry import RegistryServer
from tests.source_servers import SourceServer, serving, tarball
from tests.test_csi_image_formats import push_multi_platform

AMD64 = Platform.parse("linux/amd64")
OWNER = "bundledeployment/hello/0d9c7e2a-5b1f-4c3e-9a51-3f1d2b7c8e90"
HEX = {c: c * 64 for c in "abcdef"}


def pinned(digest_hex: str, name: str = "quay.io/org/app") -> str:
    return f"{name}@sha256:{digest_hex}"


def pinned_image(image: PushedImage) -> str:
    """``image`` named by its manifest digest (``host/repo@sha256:...``)."""
    ref = Reference.parse(image.ref)
    return str(Reference(ref.registry, ref.repository).with_digest(image.manifest_digest))


# --- volume attributes --------------------------------------------------------------


def test_retain_for_and_retain_parse_together_and_round_trip() -> None:
    kept = f"{pinned(HEX['a'])} {pinned(HEX['b'])}"
    attributes = {"image": pinned(HEX["c"]), "retainFor": OWNER, "retain": f"  {kept} "}
    source = VolumeSource.from_attributes(attributes)
    assert source.retain_for == OWNER
    assert source.retain == (pinned(HEX["a"]), pinned(HEX["b"]))
    assert source.attributes()["retainFor"] == OWNER
    assert source.attributes()["retain"] == kept
    assert VolumeSource.from_attributes(source.attributes()) == source


def test_a_volume_without_retention_attributes_is_unchanged() -> None:
    source = VolumeSource.from_attributes({"image": "quay.io/a/b:v1"})
    assert (source.retain_for, source.retain) == ("", ())
    assert "retainFor" not in source.attributes() and "retain" not in source.attributes()


@pytest.mark.parametrize(
    ("attributes", "message"),
    [
        ({"retainFor": OWNER}, "'retainFor' needs 'retain'"),
        ({"retain": pinned(HEX["a"])}, "'retain' needs 'retainFor'"),
        ({"retainFor": OWNER, "retain": "  "}, "'retainFor' needs 'retain'"),
    ],
)
def test_one_retention_attribute_without_the_other_is_invalid_argument(
    attributes: dict[str, str], message: str
) -> None:
    with pytest.raises(errors.InvalidArgument, match=message):
        VolumeSource.from_attributes({"image": "quay.io/a/b:v1", **attributes})


@pytest.mark.parametrize("ref", ["quay.io/org/app:v1", "quay.io/org/app"])
def test_a_retained_image_not_pinned_by_digest_is_invalid_argument_naming_it(ref: str) -> None:
    attributes = {"image": "quay.io/a/b:v1", "retainFor": OWNER, "retain": ref}
    with pytest.raises(errors.InvalidArgument, match=f"{ref!r} is not pinned by digest"):
        VolumeSource.from_attributes(attributes)


def test_a_malformed_retained_reference_is_invalid_argument() -> None:
    attributes = {"image": "quay.io/a/b:v1", "retainFor": OWNER, "retain": "quay.io/a@sha256:12"}
    with pytest.raises(errors.InvalidArgument, match=r"^volume attribute 'retain': .*sha256"):
        VolumeSource.from_attributes(attributes)


def test_more_retained_images_than_the_limit_are_invalid_argument() -> None:
    refs = [pinned(f"{i:064x}") for i in range(RETAIN_MAX + 1)]
    attributes = {"image": "quay.io/a/b:v1", "retainFor": OWNER, "retain": " ".join(refs)}
    with pytest.raises(errors.InvalidArgument, match=f"at most {RETAIN_MAX}"):
        VolumeSource.from_attributes(attributes)
    attributes["retain"] = " ".join(refs[:RETAIN_MAX])
    assert len(VolumeSource.from_attributes(attributes).retain) == RETAIN_MAX


@pytest.mark.parametrize("owner", ["a b", "x" * 254, "owner\x00"])
def test_an_owner_key_with_whitespace_control_characters_or_too_long_is_invalid_argument(
    owner: str,
) -> None:
    attributes = {"image": "quay.io/a/b:v1", "retainFor": owner, "retain": pinned(HEX["a"])}
    with pytest.raises(errors.InvalidArgument, match="retainFor"):
        VolumeSource.from_attributes(attributes)


GIT_LABEL = f"git+https://example.com/repo.git@{'a' * 40}:manifests"
HTTP_LABEL = f"https://example.com/b.tgz@sha256:{HEX['b']}"


@pytest.mark.parametrize(
    "volume",
    [
        {"git": "https://example.com/repo.git", "commit": "a" * 40},
        {"url": "https://example.com/b.tgz", "digest": "sha256:" + HEX["a"]},
    ],
    ids=["git", "http"],
)
def test_a_git_or_http_volume_takes_retention_of_images_and_sources_alike(
    volume: dict[str, str],
) -> None:
    kept = f"{pinned(HEX['c'])} {GIT_LABEL} {HTTP_LABEL}"
    source = VolumeSource.from_attributes({**volume, "retainFor": OWNER, "retain": kept})
    assert source.fetch is not None
    assert (source.retain_for, source.retain) == (OWNER, tuple(kept.split()))
    assert VolumeSource.from_attributes(source.attributes()) == source


@pytest.mark.parametrize(
    "entry",
    [
        "git+https://example.com/repo.git@abc123",  # not a full commit
        f"git+https://example.com/repo.git@{'A' * 40}",  # not lower-case hex
        "https://example.com/b.tgz",  # not pinned
        f"https://example.com/b.tgz@sha256:{'a' * 12}",
        f"ftp://example.com/b.tgz@sha256:{HEX['a']}",
    ],
)
def test_a_retained_source_that_is_not_pinned_is_invalid_argument_naming_it(entry: str) -> None:
    attributes = {"image": pinned(HEX["a"]), "retainFor": OWNER, "retain": entry}
    with pytest.raises(errors.InvalidArgument, match=r"^volume attribute 'retain': .*pinned"):
        VolumeSource.from_attributes(attributes)


@pytest.mark.parametrize(
    ("attributes", "entry"),
    [
        ({"image": pinned(HEX["a"])}, pinned(HEX["a"])),
        ({"image": "quay.io/org/app:v1"}, None),  # a tag names no fixed content
        (
            {"git": "https://example.com/repo.git", "commit": "a" * 40, "directory": "manifests"},
            GIT_LABEL,
        ),
        ({"url": "https://example.com/b.tgz", "digest": f"sha256:{HEX['b']}"}, HTTP_LABEL),
        ({"url": f"https://example.com/b.tgz#sha256={HEX['b']}"}, HTTP_LABEL),
        ({"git": "https://example.com/repo.git", "commit": "short"}, None),
        (
            {"image": pinned(HEX["a"]), "retainFor": OWNER, "retain": pinned(HEX["b"])},
            pinned(HEX["a"]),
        ),
    ],
)
def test_retain_entry_names_pinned_content_as_the_node_labels_it(
    attributes: dict[str, str], entry: str | None
) -> None:
    assert retain_entry(attributes) == entry
    if entry is not None and "image" not in attributes:
        assert VolumeSource.from_attributes(attributes).image == entry  # the tree's label


def test_the_plugin_takes_the_retention_ttl_in_seconds_fourteen_days_by_default() -> None:
    parser = plugin_main.build_parser()
    assert parser.parse_args([]).retain_ttl == 14 * 24 * 3600
    assert parser.parse_args(["--retain-ttl", "3600"]).retain_ttl == 3600
    with pytest.raises(SystemExit):
        parser.parse_args(["--retain-ttl", "0"])


# --- the cache's records --------------------------------------------------------------


def test_retain_replaces_an_owners_set_and_an_empty_one_ends_it(tmp_path: Path) -> None:
    state = CacheState(tmp_path / "state.json")
    a, b, c = (f"sha256:{HEX[x]}" for x in "abc")
    state.retain(OWNER, [a, b], now=100.0)
    state.retain("other", [c], now=100.0)
    assert state.retained(now=100.0, ttl=10) == {HEX["a"], HEX["b"], HEX["c"]}
    state.retain(OWNER, [b], now=101.0)
    assert state.retention() == {OWNER: [b], "other": [c]}
    state.retain(OWNER, [], now=102.0)
    assert state.retention() == {"other": [c]}


def test_retention_is_persisted_and_survives_a_restart(tmp_path: Path) -> None:
    state = CacheState(tmp_path / "state.json")
    state.retain(OWNER, [f"sha256:{HEX['a']}"], now=100.0)
    on_disk = json.loads((tmp_path / "state.json").read_text())
    assert on_disk["retained"] == {OWNER: {"digests": [f"sha256:{HEX['a']}"], "at": 100.0}}
    assert CacheState(tmp_path / "state.json").retained(now=100.0, ttl=1) == {HEX["a"]}


def test_a_retention_older_than_the_ttl_no_longer_counts_and_expires(tmp_path: Path) -> None:
    state = CacheState(tmp_path / "state.json")
    state.retain(OWNER, [f"sha256:{HEX['a']}"], now=100.0)
    state.retain("later", [f"sha256:{HEX['b']}"], now=150.0)
    assert state.retained(now=160.0, ttl=60) == {HEX["a"], HEX["b"]}
    assert state.retained(now=161.0, ttl=60) == {HEX["b"]}
    assert state.expire_retention(now=161.0, ttl=60) == [OWNER]
    assert list(state.retention()) == ["later"]


def test_a_state_file_written_before_retention_existed_loads(tmp_path: Path) -> None:
    digest = f"sha256:{HEX['a']}"
    old = {
        "tags": {"r.io/a:v1|linux/amd64": digest},
        "trees": {HEX["a"]: {"digest": digest, "size": 1, "blobs": []}},
        "holders": {"/t": {"digest": digest, "volume_id": "v", "image": "r.io/a:v1"}},
    }
    (tmp_path / "state.json").write_text(json.dumps(old))
    state = CacheState(tmp_path / "state.json")
    assert state.tag("r.io/a:v1|linux/amd64") == digest
    assert state.take_legacy_holders() == old["holders"]  # for the holder registry
    assert state.retained(now=0.0, ttl=1) == set() and state.retention() == {}


# --- eviction (real registry) ---------------------------------------------------------


def client(credentials: Credentials | None) -> Puller:
    return RegistryClient(credentials=credentials, retries=0, timeout=5)


class Clock:
    """Unix seconds that move only when a test says so."""

    def __init__(self) -> None:
        self.now = 1_700_000_000.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


BUDGET = 120_000
"""Room in a store for the trees of two big images, not three."""


def big_image(registry: RegistryServer, repo: str) -> PushedImage:
    """An image whose tree counts 50 kB against the budget."""
    payload = (repo.encode() * 5_000)[:50_000]
    return push_image(registry.host, repo, "v1", [[("f", "file", payload)]])


def big_images(
    registry: RegistryServer, prefix: str
) -> tuple[PushedImage, PushedImage, PushedImage]:
    """Three big images, ``prefix-a``, ``-b`` and ``-c``: one more than ``BUDGET`` holds."""
    a, b, c = (big_image(registry, f"{prefix}-{x}") for x in "abc")
    return a, b, c


def pull(c: ImageCache, image: PushedImage) -> Path:
    return c.ensure(image.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT).path


@pytest.mark.registry
def test_eviction_spares_a_retained_tree_and_takes_an_unretained_unused_one(
    tmp_path: Path, registry: RegistryServer
) -> None:
    kept, unkept, newest = big_images(registry, "retention/ev")
    c = ImageCache(tmp_path, puller_factory=client, settings=CacheSettings(budget_bytes=BUDGET))
    kept_path = pull(c, kept)
    assert c.retain(OWNER, [pinned_image(kept)], AMD64) == [pinned_image(kept)]
    unkept_path = pull(c, unkept)
    newest_path = pull(c, newest)
    c.evict()
    assert kept_path.exists() and newest_path.exists()
    assert not unkept_path.exists()
    assert c.usage() <= BUDGET


@pytest.mark.registry
def test_a_retained_tree_can_go_once_its_retention_is_older_than_the_ttl(
    tmp_path: Path, registry: RegistryServer, clock: Clock
) -> None:
    kept, other, later = big_images(registry, "retention/ttl")
    settings = CacheSettings(budget_bytes=BUDGET, retain_ttl=3600, clock=clock)
    c = ImageCache(tmp_path, puller_factory=client, settings=settings)
    assert c.retain_ttl == 3600
    kept_path = pull(c, kept)
    c.retain(OWNER, [kept.ref], AMD64)
    other_path = pull(c, other)
    clock.now += 3600  # the TTL has just passed: it still counts
    later_path = pull(c, later)
    c.evict()
    assert kept_path.exists() and not other_path.exists()
    clock.now += 1
    assert c.retained() == set()
    again = pull(c, other)
    c.evict()
    assert not kept_path.exists(), "least recently used and no longer retained"
    assert again.exists() and later_path.exists()
    assert c.state.retention() == {}


@pytest.mark.registry
def test_retain_maps_an_index_digest_to_the_platforms_tree_it_pulled(
    tmp_path: Path, registry: RegistryServer
) -> None:
    tagged = push_multi_platform(registry, "retention/multi", docker=False)
    with RegistryClient() as rc:
        index_digest = rc.resolve(Reference.parse(tagged)).digest
    ref = Reference.parse(tagged)
    by_index = str(Reference(ref.registry, ref.repository).with_digest(index_digest))
    c = ImageCache(tmp_path, puller_factory=client)
    assert c.retain(OWNER, [by_index], AMD64) == [], "nothing cached yet"
    tree = c.ensure(by_index, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)
    assert c.retain(OWNER, [by_index], AMD64) == [by_index]
    assert c.state.retention() == {OWNER: [tree.digest]} and tree.digest != index_digest


# --- the publish that records it (real registry) --------------------------------------


@pytest.fixture
def publisher(tmp_path: Path) -> Publisher:
    (tmp_path / "kubelet").mkdir()
    images = ImageCache(tmp_path / "state", puller_factory=client)
    return Publisher(images=images, mounter=FakeMounter(), kubelet_dir=tmp_path / "kubelet")


def publish(publisher: Publisher, pod: str, image: str, *kept: str) -> Path:
    """Publish ``image`` for ``pod`` with ``OWNER`` retaining ``kept``; the target."""
    target = publisher.kubelet_dir / "pods" / pod / "volumes" / "bundle"
    attributes = {"image": image, "retainFor": OWNER, "retain": " ".join(kept)}
    source = VolumeSource.from_attributes(attributes)
    publisher.publish(PublishRequest(f"vol-{pod}", str(target), source))
    return target


@pytest.mark.registry
def test_publishing_with_retention_retains_the_current_image_and_the_cached_kept_ones(
    publisher: Publisher, registry: RegistryServer
) -> None:
    v1 = simple_image(registry.host, "retention/app", "v1", text="one")
    v2 = simple_image(registry.host, "retention/app", "v2", text="two")
    first = publish(publisher, "install", pinned_image(v1), pinned_image(v1))
    assert publisher.images.state.retention() == {OWNER: [v1.manifest_digest]}
    publisher.unpublish("vol-install", str(first))  # the instance pod ran to completion
    publish(publisher, "upgrade", pinned_image(v2), pinned_image(v1), pinned_image(v2))
    assert publisher.images.state.retention() == {
        OWNER: sorted([v1.manifest_digest, v2.manifest_digest])
    }
    assert publisher.images.retained() == {
        v.manifest_digest.removeprefix("sha256:") for v in (v1, v2)
    }


@pytest.mark.registry
def test_a_kept_image_the_node_never_cached_is_skipped_and_the_publish_succeeds(
    publisher: Publisher, registry: RegistryServer, caplog: pytest.LogCaptureFixture
) -> None:
    current = simple_image(registry.host, "retention/skip", "v2", text="now")
    elsewhere = simple_image(registry.host, "retention/skip", "v1", text="other node")
    caplog.set_level(logging.INFO, logger="csi.node.publish")
    target = publish(publisher, "p", pinned_image(current), pinned_image(elsewhere))
    assert target.is_dir()
    assert publisher.images.state.retention() == {OWNER: [current.manifest_digest]}
    assert not publisher.images.has_tree(elsewhere.manifest_digest), "retention pulls nothing"
    assert f"owner={OWNER} retained=1 asked=2" in caplog.text


@pytest.mark.registry
def test_republishing_the_same_volume_refreshes_its_retention(
    publisher: Publisher, registry: RegistryServer
) -> None:
    image = simple_image(registry.host, "retention/again", "v1")
    publish(publisher, "p", pinned_image(image), pinned_image(image))
    publisher.images.state.retain(OWNER, [], now=0.0)  # as if it had expired
    publish(publisher, "p", pinned_image(image), pinned_image(image))
    assert publisher.images.state.retention() == {OWNER: [image.manifest_digest]}


class RetentionFails(ImageCache):
    def retain(self, owner: str, refs: Any, platform: Platform, **_: Any) -> list[str]:
        raise OSError(28, "No space left on device")


@pytest.mark.registry
def test_a_retention_that_cannot_be_recorded_never_fails_the_publish(
    tmp_path: Path, registry: RegistryServer, caplog: pytest.LogCaptureFixture
) -> None:
    (tmp_path / "kubelet").mkdir()
    images = RetentionFails(tmp_path / "state", puller_factory=client)
    mounts = FakeMounter()
    failing = Publisher(images=images, mounter=mounts, kubelet_dir=tmp_path / "kubelet")
    image = simple_image(registry.host, "retention/fails", "v1")
    target = publish(failing, "p", pinned_image(image), pinned_image(image))
    assert [m.mount_point for m in mounts.table] == [str(target)]
    assert "cannot record retained images" in caplog.text
    assert images.holders()[str(target)] == Holder(str(target), "vol-p", pinned_image(image))


class FuseRecorder:
    """A FUSE publisher that only records what it was asked to publish and retain (the
    FUSE store's own retention is tested on a real store below)."""

    def __init__(self) -> None:
        self.sources: list[VolumeSource] = []
        self.images = self
        self.retained: list[tuple[str, list[str]]] = []

    def publish(self, req: PublishRequest, target: Path, **_: Any) -> Path:
        self.sources.append(req.source)
        return target

    def retain(self, owner: str, refs: Any, platform: Platform) -> list[str]:
        self.retained.append((owner, list(refs)))
        return []

    def release(self, target: str) -> None:
        pass

    def published(self) -> int:
        return len(self.sources)


def test_a_fuse_mode_publish_records_retention_in_the_fuse_store(tmp_path: Path) -> None:
    (tmp_path / "kubelet").mkdir()
    images = ImageCache(tmp_path / "state", puller_factory=client)
    fuse = FuseRecorder()
    publisher = Publisher(
        images=images,
        mounter=FakeMounter(),
        kubelet_dir=tmp_path / "kubelet",
        fuse=fuse,  # type: ignore[arg-type]
    )
    attributes = {
        "image": pinned(HEX["a"]),
        "publishMode": "fuse",
        "retainFor": OWNER,
        "retain": f"{pinned(HEX['b'])} {GIT_LABEL}",
    }
    target = tmp_path / "kubelet" / "pods" / "p" / "volumes" / "bundle"
    source = VolumeSource.from_attributes(attributes)
    assert publisher.publish(PublishRequest("vol", str(target), source)) == target
    assert fuse.sources == [source]
    assert fuse.retained == [(OWNER, [pinned(HEX["a"]), pinned(HEX["b"])])], "images only"
    assert images.state.retention() == {}, "the bind cache holds none of them"


# --- git and http trees (a real http server) -------------------------------------------


def big_tarball(tag: str) -> bytes:
    """A tarball whose tree counts 50 kB against the budget."""
    return tarball({"manifests/f": (tag * 50_000)[:50_000]})


@pytest.fixture
def files_server(tmp_path: Path) -> Iterator[SourceServer]:
    with serving(tmp_path / "repos") as server:
        yield server


def http_volume(server: SourceServer, name: str, data: bytes) -> dict[str, str]:
    server.files[name] = data
    return {"url": f"{server.url}/files/{name}", "digest": "sha256:" + sha256(data).hexdigest()}


def test_eviction_spares_a_retained_http_tree_and_a_publish_of_it_retains_it(
    tmp_path: Path, files_server: SourceServer
) -> None:
    (tmp_path / "kubelet").mkdir()
    images = ImageCache(
        tmp_path / "state", puller_factory=client, settings=CacheSettings(budget_bytes=BUDGET)
    )
    publisher = Publisher(images=images, mounter=FakeMounter(), kubelet_dir=tmp_path / "kubelet")
    kept, other, newest = (
        http_volume(files_server, f"{x}.tgz", big_tarball(x)) for x in ("kept", "other", "new")
    )
    label = retain_entry(kept)
    assert label is not None and label.startswith(f"{files_server.url}/files/kept.tgz@sha256:")
    target = publisher.kubelet_dir / "pods" / "p" / "volumes" / "bundle"
    request = PublishRequest(
        "vol-p",
        str(target),
        VolumeSource.from_attributes({**kept, "retainFor": OWNER, "retain": label}),
    )
    kept_path = publisher.publish(request)
    kept_digest = images.holder_digest(str(target))
    assert images.state.retention() == {OWNER: [kept_digest]}
    publisher.unpublish("vol-p", str(target))  # the instance pod ended

    sources = SourceCache(images)
    other_path = sources.ensure(FetchSource.from_attributes(other)).path
    newest_path = sources.ensure(FetchSource.from_attributes(newest)).path
    images.evict()
    assert kept_path.is_dir() and newest_path.is_dir()
    assert not other_path.exists(), "unretained and least recently used"

    files_server.files.clear()  # the server has nothing now: the tree is all there is
    again = publisher.publish(request)
    assert again == kept_path and (again / "manifests" / "f").read_text().startswith("kept")


def test_a_retained_source_label_keeps_every_tree_fetched_under_it(tmp_path: Path) -> None:
    state = CacheState(tmp_path / "state.json")
    record = {"image": GIT_LABEL, "blobs": [], "size": 1}
    for h in (HEX["a"], HEX["b"]):
        state.record_tree(f"sha256:{h}", {**record, "digest": f"sha256:{h}"})
    state.record_tree(f"sha256:{HEX['c']}", {**record, "image": HTTP_LABEL})
    assert state.trees_labelled(GIT_LABEL) == [f"sha256:{HEX['a']}", f"sha256:{HEX['b']}"]
    assert state.trees_labelled("git+https://example.com/other.git@" + "a" * 40) == []


# --- the FUSE store (a real registry, a real store on disk) ------------------------------


def age(images: FuseImages, *names: str) -> None:
    """Make trees ``names`` look unused for an hour or more, the first the longest (the
    collection spares recently used trees and takes the least recently used first)."""
    for n, name in enumerate(names):
        stamp = time.time() - 3600 - 60 * (len(names) - n)
        os.utime(images.index_path(name), (stamp, stamp))


@pytest.mark.registry
def test_the_fuse_store_spares_a_retained_tree_until_the_ttl_passes(
    tmp_path: Path, registry: RegistryServer, clock: Clock
) -> None:
    kept, other, newest = big_images(registry, "retention/fuse")

    def store(budget_bytes: int) -> FuseImages:
        """The store at ``tmp_path / "fuse"``, opened (again) with a TTL of 600 s."""
        settings = CacheSettings(budget_bytes=budget_bytes, retain_ttl=600, clock=clock)
        return FuseImages(tmp_path / "fuse", puller_factory=client, settings=settings)

    fuse = store(budget_bytes=BUDGET)
    publisher = FusePublisher(fuse, FakeMount(), tmp_path / "publishes.json")
    names = [
        fuse.ensure(i.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT).name
        for i in (kept, other, newest)
    ]
    assert fuse.retain(OWNER, [pinned_image(kept), pinned(HEX["f"])], AMD64) == [
        pinned_image(kept)
    ], "a tree the store lacks is skipped"
    assert fuse.retain(OWNER, [kept.ref], AMD64) == [kept.ref], "a tag: the tree it resolved"
    fuse.retain(OWNER, [pinned_image(kept)], AMD64)
    assert publisher.held() == {names[0]}
    age(fuse, *names)
    evicted, _ = fuse.collector.collect(publisher.held())
    assert names[0] not in evicted and names[1] in evicted
    assert fuse.has_tree(kept.manifest_digest) and not fuse.has_tree(other.manifest_digest)

    restarted = store(budget_bytes=1)
    assert restarted.retained() == {names[0]}, "retention is on disk"
    clock.now += 601
    assert restarted.retained() == set()
    age(restarted, names[0], names[2])
    evicted, _ = restarted.collector.collect(set())
    assert names[0] in evicted, "no longer retained: it may go"


class FakeMount:
    def tree_dir(self, name: str) -> Path:
        return Path("/nonexistent") / name

    def tree_index(self, name: str) -> None:
        return None


def test_the_same_trees_named_again_move_the_time_at_most_once_a_minute() -> None:
    """Every publish names an owner's trees again; only one write a minute follows."""
    table: retention.Table = {}
    trees = [f"sha256:{HEX['a']}"]
    assert retention.set_owner(table, OWNER, trees, 1000.0) is retention.Change.DIGESTS
    assert retention.set_owner(table, OWNER, trees, 1030.0) is retention.Change.NONE
    assert table[OWNER]["at"] == 1000.0
    assert retention.set_owner(table, OWNER, trees, 1061.0) is retention.Change.TIME
    assert table[OWNER]["at"] == 1061.0
    more = [*trees, f"sha256:{HEX['b']}"]
    assert retention.set_owner(table, OWNER, more, 1062.0) is retention.Change.DIGESTS
