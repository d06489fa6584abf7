"""The node's one holder registry (``rukpak.store.holders``): one file per holder, torn files
ignored, the older ``state.json`` and ``publishes.json`` taken over, and a hot publish that
writes its own record and nothing else (real registry, real trees on disk)."""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from pathlib import Path

import pytest

from csi.fuse.images import FuseImages
from csi.fuse.publisher import FusePublisher
from rukpak.common import fsio
from rukpak.image import cachestate
from rukpak.image.cache import ImageCache
from rukpak.image.cachestate import Holder
from rukpak.image.seams import Puller, PullPolicy
from rukpak.image.settings import CacheSettings
from rukpak.oci.auth import Credentials
from rukpak.oci.client import RegistryClient
from rukpak.oci.manifest import Platform
from rukpak.store import holders
from rukpak.store.holders import FUSE, TREE, Holders, Record
from tests.csi_helpers import simple_image
from tests.polling import eventually
from tests.registry import RegistryServer

AMD64 = Platform.parse("linux/amd64")
A, B = "sha256:" + "a" * 64, "sha256:" + "b" * 64


def record(target: str, digest: str = A, store: str = TREE, **meta: str) -> Record:
    return Record(target, f"vol-{target}", digest, store, image="r.io/x:v1", meta=meta)


def snapshot(root: Path) -> dict[str, tuple[int, int]]:
    """Each file under ``root``: (inode, mtime in ns); a rewrite changes one of them."""
    return {p.name: (p.stat().st_ino, p.stat().st_mtime_ns) for p in root.iterdir()}


# --- the registry ----------------------------------------------------------------------


def test_a_hold_survives_a_restart_and_a_release_is_idempotent(tmp_path: Path) -> None:
    registry = Holders(tmp_path)
    registry.hold(record("/k/1"))
    registry.hold(record("/k/2", B, FUSE, presentation="overlay"))
    registry.hold(record("/k/3"))
    assert registry.release("/k/3") == record("/k/3")
    assert registry.release("/k/3") is None, "releasing what is not held is OK"
    assert registry.release("/k/2", store=TREE) is None, "another store's holder stays"

    again = Holders(tmp_path)
    assert again.all() == {
        "/k/1": record("/k/1"),
        "/k/2": record("/k/2", B, FUSE, presentation="overlay"),
    }
    assert [r.target for r in again.holders_of(A)] == ["/k/1"]
    assert again.held(store=TREE) == {"a" * 64} and again.held(store=FUSE) == {"b" * 64}
    assert again.count() == 2 and again.count(store=FUSE) == 1
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        holders.file_name(t) for t in ("/k/1", "/k/2")
    )


def test_a_hold_writes_its_own_file_and_leaves_every_other_record_alone(tmp_path: Path) -> None:
    registry = Holders(tmp_path)
    for n in range(50):
        registry.hold(record(f"/k/{n}"))
    before = snapshot(tmp_path)
    registry.hold(record("/k/new"))
    registry.release("/k/7")
    after = snapshot(tmp_path)
    assert set(after) == (set(before) - {holders.file_name("/k/7")}) | {holders.file_name("/k/new")}
    assert all(after[name] == before[name] for name in after if name in before)


@pytest.mark.parametrize(
    "content",
    [b"", b'{"target": "/k/torn", "vol', b"[1, 2]", b'{"target": "/k/other", "store": "tree"}'],
    ids=["empty", "torn", "not-an-object", "another-targets-name"],
)
def test_a_torn_record_is_set_aside_with_a_log_line_and_the_rest_load(
    tmp_path: Path, content: bytes, caplog: pytest.LogCaptureFixture
) -> None:
    Holders(tmp_path).hold(record("/k/good"))
    bad = tmp_path / holders.file_name("/k/torn")
    bad.write_bytes(content)
    leftover = tmp_path / ".leftover.json.1234.partial"
    leftover.write_bytes(b"half")
    stale = time.time() - holders.STALE_TEMP - 1
    os.utime(leftover, (stale, stale))  # what a crash left a while ago
    (tmp_path / ".live.json.5678.partial").write_bytes(b"in flight")  # another's write
    with caplog.at_level(logging.ERROR, logger="rukpak.store.holders"):
        registry = Holders(tmp_path)
    assert list(registry.all()) == ["/k/good"]
    assert "holder record unreadable" in caplog.text
    assert [p.read_bytes() for p in tmp_path.glob("*.bad-*")] == [content], "kept for a human"
    assert [p.name for p in tmp_path.glob(".*.partial")] == [".live.json.5678.partial"], (
        "an interrupted write is removed, a young one left to its writer"
    )
    registry.hold(record("/k/torn"))  # the target can be held again
    assert Holders(tmp_path).get("/k/torn") == record("/k/torn")


def test_a_hold_that_cannot_be_written_raises_and_keeps_what_the_target_held(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    registry = Holders(tmp_path)
    registry.hold(record("/k/1"))

    def full(*_args: object, **_kwargs: object) -> None:
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(holders, "write_bytes_atomic", full)
    with pytest.raises(OSError, match="No space"):
        registry.hold(record("/k/1", B))
    with pytest.raises(OSError, match="No space"):
        registry.hold(record("/k/2"))
    monkeypatch.undo()
    assert registry.all() == {"/k/1": record("/k/1")}
    assert Holders(tmp_path).all() == {"/k/1": record("/k/1")}


def test_holds_are_made_durable_in_the_background(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    synced: list[Path] = []

    def fsync_dir(path: Path) -> None:
        synced.append(path)
        fsio.fsync_dir(path)

    monkeypatch.setattr(holders, "fsync_dir", fsync_dir)
    registry = Holders(tmp_path)
    for n in range(20):
        registry.hold(record(f"/k/{n}"))
    registry.release("/k/3")
    eventually(lambda: registry.pending() == 0, what="the background sync")
    ours = [p for p in synced if p == tmp_path]  # other tests' registries may sync too
    assert 1 <= len(ours) <= 21, "the directory is synced, at most once per change"
    volatile = Holders(tmp_path / "volatile", durable=False)
    volatile.hold(record("/k/v"))
    assert volatile.pending() == 0 and Holders(tmp_path / "volatile").count() == 1


def settled(images: ImageCache) -> None:
    """Wait until the state's writer thread has nothing left to write (a pull asked it to
    write the new tag), so that what follows is the only cause of a write."""
    images.state.save()
    eventually(lambda: images.state._writer._thread is None, what="the state writer idle")


# --- bind mode: the image cache (real registry) -----------------------------------------


def client(credentials: Credentials | None) -> Puller:
    return RegistryClient(credentials=credentials, retries=0, timeout=5)


def cache(root: Path, budget: int = 10**9, registry: Holders | None = None) -> ImageCache:
    return ImageCache(
        root,
        puller_factory=client,
        settings=CacheSettings(budget_bytes=budget),
        holders=registry,
    )


@pytest.mark.registry
def test_a_node_upgraded_in_place_keeps_the_holders_of_its_old_state_file(
    tmp_path: Path, registry: RegistryServer
) -> None:
    held, unheld = (
        simple_image(registry.host, f"holders/upgrade-{x}", text=x) for x in ("held", "unheld")
    )
    old = cache(tmp_path / "images")
    digests = [
        old.ensure(i.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT).digest
        for i in (held, unheld)
    ]
    settled(old)
    # What an older plugin left: the holders in state.json, no registry.
    shutil.rmtree(tmp_path / "images/holders")
    state_path = tmp_path / "images/state.json"
    state = json.loads(state_path.read_text())
    state["holders"] = {
        "/kubelet/pods/p/vol": {"digest": digests[0], "volume_id": "vol-1", "image": held.ref},
        "/kubelet/pods/q/vol": {"volume_id": "vol-2", "image": unheld.ref},  # digest lost
    }
    state_path.write_text(json.dumps(state))

    upgraded = cache(tmp_path / "images", budget=1)
    assert upgraded.holders() == {
        "/kubelet/pods/p/vol": Holder("/kubelet/pods/p/vol", "vol-1", held.ref),
        "/kubelet/pods/q/vol": Holder("/kubelet/pods/q/vol", "vol-2", unheld.ref),
    }
    assert upgraded.holder_digest("/kubelet/pods/p/vol") == digests[0]
    assert upgraded.holder_digest("/kubelet/pods/q/vol") is None
    assert "holders" not in json.loads(state_path.read_text()), "taken over, then dropped"
    assert upgraded.state.tag(f"{held.ref}|{AMD64}") == digests[0], "tags are kept"
    assert upgraded.evict() == [digests[1]], "the held tree is spared, the other goes"
    assert upgraded.has_tree(digests[0])

    restarted = cache(tmp_path / "images", budget=1)  # the registry alone, from now on
    assert set(restarted.holders()) == {"/kubelet/pods/p/vol", "/kubelet/pods/q/vol"}
    restarted.release("/kubelet/pods/p/vol")
    assert restarted.evict() == [digests[0]]


@pytest.mark.registry
def test_a_hot_publish_writes_its_holder_file_and_no_shared_state(
    tmp_path: Path, registry: RegistryServer
) -> None:
    image = simple_image(registry.host, "holders/hot", text="hot")
    images = cache(tmp_path)
    first = images.ensure(image.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)
    assert not first.cache_hit
    settled(images)
    state_before = snapshot(tmp_path)["state.json"]
    for n in range(20):
        hit = images.ensure(
            image.ref,
            platform=AMD64,
            pull_policy=PullPolicy.IF_NOT_PRESENT,
            holder=Holder(f"/k/{n}", f"vol-{n}", image.ref) if n % 2 else None,
        )
        assert hit.cache_hit
    assert snapshot(tmp_path)["state.json"] == state_before, "state.json was not rewritten"
    assert len(list((tmp_path / "holders").glob("*.json"))) == 10
    assert images.registry.held(store=TREE) == {first.digest.removeprefix("sha256:")}


@pytest.mark.registry
def test_a_trees_last_use_is_written_once_the_flush_interval_passed(
    tmp_path: Path, registry: RegistryServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    image = simple_image(registry.host, "holders/touch", text="touch")
    images = cache(tmp_path)
    digest = images.ensure(image.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT).digest
    settled(images)

    def last_used() -> float:
        hex_ = digest.removeprefix("sha256:")
        return float(json.loads((tmp_path / "state.json").read_text())["trees"][hex_]["last_used"])

    written = last_used()
    monkeypatch.setattr(cachestate, "TOUCH_FLUSH", 0.0)
    images.take(digest, None, what="the image")  # the first use since the write: memory only
    assert last_used() == written
    images.take(digest, None, what="the image")  # the interval has passed: written soon
    eventually(lambda: last_used() > written or None, timeout=10)


# --- FUSE mode: publishes.json taken over (real registry, real file store) -------------


@pytest.mark.registry
def test_a_fuse_node_upgraded_in_place_keeps_the_holders_of_its_publishes_file(
    tmp_path: Path, registry: RegistryServer
) -> None:
    image = simple_image(registry.host, "holders/fuse-upgrade", text="fuse")
    fuse = FuseImages(tmp_path / "store", puller_factory=client)
    tree = fuse.ensure(image.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT).name
    records = tmp_path / "publishes.json"
    records.write_text(
        json.dumps(
            {
                "/k/view": {"volume_id": "v1", "image": image.ref, "tree": tree},
                "/k/over": {
                    "volume_id": "v2",
                    "image": image.ref,
                    "tree": tree,
                    "presentation": "overlay",
                },
                "/k/junk": "not a record",
            }
        )
    )
    shared = Holders(tmp_path / "holders")
    shared.hold(record("/k/bind"))  # bind mode's, in the same registry
    publisher = FusePublisher(fuse, _NoMount(), records, holders=shared)
    assert not records.exists(), "taken over, then removed"
    assert publisher.holds("/k/view") and publisher.holds("/k/over")
    assert not publisher.holds("/k/bind") and not publisher.holds("/k/junk")
    assert publisher.held() == {tree} and publisher.presented() == {tree}
    assert publisher.published() == 2
    again = Holders(tmp_path / "holders")
    assert again.get("/k/over") == Record(
        "/k/over", "v2", f"sha256:{tree}", FUSE, image.ref, {"presentation": "overlay"}
    )
    publisher.release("/k/over")
    publisher.release("/k/view")
    assert publisher.held() == set() and Holders(tmp_path / "holders").count() == 1
    assert os.listdir(tmp_path / "holders") == [holders.file_name("/k/bind")]


class _NoMount:
    def tree_dir(self, name: str) -> Path:
        return Path("/nonexistent") / name

    def tree_index(self, name: str) -> None:
        return None
