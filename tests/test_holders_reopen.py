"""What one cache or holder registry writes, the next one opened on the same directory reads:
at once (no flush, no waiting for a writer thread), in this process or another, and while
the first one keeps publishing; a late write of one never drops another's records
(``rukpak.image.cachestate``'s merge under ``flock``, ``rukpak.store.holders``' per-target
files). Real registry, real trees on disk."""

from __future__ import annotations

import json
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from rukpak.image.cache import ImageCache
from rukpak.image.cachestate import CacheState, Holder
from rukpak.image.seams import Puller, PullPolicy
from rukpak.oci.auth import Credentials
from rukpak.oci.client import RegistryClient
from rukpak.oci.manifest import Platform
from rukpak.store.holders import TREE, Holders, Record
from tests.csi_helpers import PushedImage, simple_image
from tests.registry import RegistryServer

AMD64 = Platform.parse("linux/amd64")
HEX = {c: c * 64 for c in "abcd"}


def client(credentials: Credentials | None) -> Puller:
    return RegistryClient(credentials=credentials, retries=0, timeout=5)


def no_network(credentials: Credentials | None) -> Puller:
    raise AssertionError("the cache must not contact the registry here")


def cache(root: Path, *, network: bool = True) -> ImageCache:
    return ImageCache(root, puller_factory=client if network else no_network)


def pull(images: ImageCache, image: PushedImage) -> str:
    return images.ensure(image.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT).digest


def assert_offline_hits(root: Path, pulled: dict[str, str]) -> None:
    """A cache opened now, without network, has every image's tag and tree record."""
    fresh = cache(root, network=False)
    for ref, digest in pulled.items():
        assert fresh.state.tag(f"{ref}|{AMD64}") == digest, f"the tag of {ref} is on disk"
        assert fresh.state.tree(digest) is not None, f"the tree record of {ref} is on disk"
        got = fresh.ensure(ref, platform=AMD64, pull_policy=PullPolicy.NEVER)
        assert got.cache_hit and got.digest == digest


# --- the cache's records (state.json) ---------------------------------------------------


def test_records_written_by_one_state_are_read_by_the_next_in_this_and_another_process(
    tmp_path: Path,
) -> None:
    path = tmp_path / "state.json"
    first = CacheState(path)
    first.record_tree(f"sha256:{HEX['a']}", {"size": 10})
    first.retain("bd/one", [f"sha256:{HEX['a']}"], now=100.0)
    first.retain("bd/one", [f"sha256:{HEX['a']}"], now=1000.0)  # time only: written soon
    first.set_tag("r.io/a:v1|linux/amd64", f"sha256:{HEX['a']}")  # the last change
    second = CacheState(path)  # no flush in between
    assert second.tag("r.io/a:v1|linux/amd64") == f"sha256:{HEX['a']}"
    assert second.tree(f"sha256:{HEX['a']}") is not None
    assert second.retained(now=200.0, ttl=1000) == {HEX["a"]}
    probe = (
        "import sys; from pathlib import Path; from rukpak.image.cachestate import CacheState;"
        "s = CacheState(Path(sys.argv[1])); print(s.tag('r.io/a:v1|linux/amd64'))"
    )
    out = subprocess.run(
        [sys.executable, "-c", probe, str(path)], check=True, capture_output=True, text=True
    )
    assert out.stdout.strip() == f"sha256:{HEX['a']}"


def test_a_late_write_of_one_state_keeps_what_another_wrote_meanwhile(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    first, second = CacheState(path), CacheState(path)  # both read the empty file
    first.record_tree(f"sha256:{HEX['a']}", {"size": 1})
    first.set_tag("r.io/a:v1|linux/amd64", f"sha256:{HEX['a']}")
    second.record_tree(f"sha256:{HEX['b']}", {"size": 2})
    second.set_tag("r.io/b:v1|linux/amd64", f"sha256:{HEX['b']}")
    second.retain("bd/two", [f"sha256:{HEX['b']}"], now=100.0)
    first.touch(f"sha256:{HEX['a']}")
    first.record_tree(f"sha256:{HEX['c']}", {"size": 3})  # first writes again, last
    first.forget_tree(HEX["b"])  # and drops the tree second recorded, with its tag
    first.flush()
    on_disk = json.loads(path.read_text())
    assert sorted(on_disk["trees"]) == [HEX["a"], HEX["c"]]
    assert on_disk["tags"] == {"r.io/a:v1|linux/amd64": f"sha256:{HEX['a']}"}
    assert on_disk["retained"]["bd/two"]["digests"] == [f"sha256:{HEX['b']}"]
    assert first.tree(f"sha256:{HEX['c']}") is not None
    assert first.retention() == {"bd/two": [f"sha256:{HEX['b']}"]}, "read back on write"


def test_a_state_file_torn_by_hand_meanwhile_is_set_aside_not_merged(tmp_path: Path) -> None:
    path = tmp_path / "state.json"
    state = CacheState(path)
    state.record_tree(f"sha256:{HEX['a']}", {"size": 1})
    path.write_text('{"trees": {')  # damaged between two writes
    state.record_tree(f"sha256:{HEX['b']}", {"size": 2})
    assert len(list(tmp_path.glob("state.json.bad-*"))) == 1, "kept for a human"
    assert sorted(json.loads(path.read_text())["trees"]) == [HEX["a"], HEX["b"]]


# --- two image caches on one directory (real registry) ---------------------------------


@pytest.mark.registry
def test_a_cache_opened_after_a_pull_reads_the_pulls_tag_and_tree(
    tmp_path: Path, registry: RegistryServer
) -> None:
    image = simple_image(registry.host, "reopen/after", text="after")
    digest = pull(cache(tmp_path), image)  # no flush, no wait for any thread
    assert_offline_hits(tmp_path, {image.ref: digest})


@pytest.mark.registry
def test_two_caches_in_turn_keep_each_others_tags_and_trees(
    tmp_path: Path, registry: RegistryServer
) -> None:
    x, y, z = (simple_image(registry.host, f"reopen/turn-{n}", text=n) for n in "xyz")
    first = cache(tmp_path)
    pulled = {x.ref: pull(first, x)}
    second = cache(tmp_path)
    pulled[y.ref] = pull(second, y)
    pulled[z.ref] = pull(first, z)  # first writes again, after second did
    first.state.flush()
    second.state.flush()
    assert_offline_hits(tmp_path, pulled)


@pytest.mark.registry
def test_caches_opened_while_another_publishes_see_every_record(
    tmp_path: Path, registry: RegistryServer
) -> None:
    base = simple_image(registry.host, "reopen/busy", text="busy")
    others = [simple_image(registry.host, f"reopen/busy-{n}", text=str(n)) for n in range(4)]
    publisher = cache(tmp_path)
    pulled = {base.ref: pull(publisher, base)}
    held: list[str] = []  # targets whose hold returned
    failures: list[BaseException] = []
    stop = threading.Event()

    def publish() -> None:
        n = 0
        try:
            while not stop.is_set():
                target = f"/kubelet/pods/p{n}/volumes/v"
                got = publisher.ensure(
                    base.ref,
                    platform=AMD64,
                    pull_policy=PullPolicy.IF_NOT_PRESENT,
                    holder=Holder(target, f"vol-{n}", base.ref),
                )
                assert got.cache_hit
                held.append(target)
                if n % 5 == 0:  # a write of the publisher's state.json, racing the others'
                    publisher.retain(f"bd/{n}", [base.ref], AMD64)
                n += 1
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)

    worker = threading.Thread(target=publish, name="publishes")
    worker.start()
    try:
        for other in others:
            before = list(held)
            opened = cache(tmp_path)
            assert opened.state.tag(f"{base.ref}|{AMD64}") == pulled[base.ref]
            assert set(before) <= set(opened.holders()), "every finished hold is on disk"
            pulled[other.ref] = pull(opened, other)
    finally:
        stop.set()
        worker.join(timeout=60)
    assert not failures, f"a publish failed: {failures[0]!r}"
    assert len(held) > len(others), "publishes ran while the caches opened"
    publisher.state.flush()
    assert_offline_hits(tmp_path, pulled)
    assert set(held) == set(cache(tmp_path, network=False).holders())


# --- two holder registries on one directory --------------------------------------------


def test_a_registry_opened_while_another_holds_loses_none_of_its_writes(tmp_path: Path) -> None:
    first = Holders(tmp_path)
    failures: list[BaseException] = []
    done = threading.Event()

    def hold_many() -> None:
        try:
            for n in range(400):
                first.hold(Record(f"/k/{n}", f"vol-{n}", f"sha256:{HEX['a']}", TREE))
        except BaseException as exc:  # reported by the main thread
            failures.append(exc)
        finally:
            done.set()

    worker = threading.Thread(target=hold_many, name="holds")
    worker.start()
    opened = 0
    while not done.is_set():
        Holders(tmp_path)  # removes leftover temp files at its start
        opened += 1
    worker.join()
    assert not failures, f"a hold failed: {failures[0]!r}"
    assert opened > 0
    assert Holders(tmp_path).count() == 400
