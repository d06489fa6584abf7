"""One conformance suite for every store on a node (``rukpak.store.commit``, ``collect``).

containerd runs one content-store suite against every implementation; this is ours.
The same tests run against the image cache (bind mode: ``rukpak.image.cache``), the git
and http source cache (``rukpak.sources.cache``, trees beside the image trees) and the
FUSE file store (``csi.fuse.images``), each filled from a real server (the test
registry, an http server on loopback) through its own ``ensure``:

* commit atomicity: a commit that fails half way (the unpack budget runs out after some
  files were written) leaves nothing served and nothing staged, and what was committed
  before is untouched; a committed unit is whole;
* crash leftovers (what a ``kill -9`` mid-commit leaves on disk) are removed when the store
  opens again (for the FUSE store: at its first collection), and never served;
* the one collector: over budget, every unit goes but those a holder holds (the node's
  holder registry) and those an owner retains.
"""

from __future__ import annotations

import hashlib
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from csi.fuse.images import FuseImages
from rukpak.common import errors
from rukpak.image.cache import ImageCache
from rukpak.image.cachestate import Holder
from rukpak.image.members import Limits
from rukpak.image.seams import Puller, PullPolicy
from rukpak.image.settings import CacheSettings
from rukpak.oci.auth import Credentials
from rukpak.oci.client import RegistryClient
from rukpak.oci.manifest import Platform
from rukpak.sources.cache import SourceCache
from rukpak.sources.volume import FetchSource
from rukpak.store import holders as holding
from tests.csi_helpers import push_image
from tests.registry import RegistryServer
from tests.source_servers import SourceServer, serving, tarball
from tests.spine_helpers import fuse_listing

pytestmark = pytest.mark.registry

AMD64 = Platform.parse("linux/amd64")
LIMITS = Limits(max_entries=8)
"""The unpack budget of every store here: a unit of ``BIG`` files fails half way."""
BIG = 20


def client(credentials: Credentials | None) -> Puller:
    return RegistryClient(credentials=credentials, retries=0, timeout=10)


def refuse(credentials: Credentials | None) -> Puller:
    raise AssertionError("the source cache never asks a registry")


def files_of(n: int, count: int) -> dict[str, str]:
    return {f"manifests/f{i}.yaml": f"unit {n} file {i}\n" for i in range(count)}


@dataclass
class Unit:
    """A unit committed by a store: its digest and what asks for it again."""

    digest: str
    ask: str | FetchSource

    @property
    def hex(self) -> str:
        return self.digest.removeprefix("sha256:")


@dataclass
class Driver:
    """One store under test, as the suite drives it (opened again to model a restart)."""

    kind: str
    root: Path
    registry: RegistryServer
    http: SourceServer
    tag: str
    store: object = None
    holders: holding.Holders = field(init=False)
    _n: int = 0

    def __post_init__(self) -> None:
        self.open()

    def open(self) -> None:
        """Open (again) on the same directory: what a restarted plugin does."""
        settings = CacheSettings(limits=LIMITS)
        self.holders = holding.Holders(self.root / "holders", durable=False)
        if self.kind == "fuse":
            self.store = FuseImages(self.root / "fuse", puller_factory=client, settings=settings)
            return
        images = ImageCache(
            self.root / "images",
            puller_factory=client if self.kind == "image" else refuse,
            settings=settings,
            holders=self.holders,
        )
        self.store = images if self.kind == "image" else SourceCache(images, read_timeout=5)

    @property
    def images(self) -> ImageCache:
        store = self.store
        if isinstance(store, SourceCache):
            return store.images
        assert isinstance(store, ImageCache)
        return store

    @property
    def fuse(self) -> FuseImages:
        assert isinstance(self.store, FuseImages)
        return self.store

    # --- filling ----------------------------------------------------------------

    def put(self, *, files: int = 3) -> Unit:
        """Commit a new unit of ``files`` files through the store's own ``ensure``."""
        self._n += 1
        n, content = self._n, files_of(self._n, files)
        if self.kind == "source":
            name = f"{self.tag}-{n}.tgz"
            data = tarball(content)
            self.http.files[name] = data
            digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
            source = FetchSource("http", f"{self.http.url}/files/{name}", digest)
            assert isinstance(self.store, SourceCache)
            return Unit(self.store.ensure(source).digest, source)
        entries = [("manifests/", "dir")] + [
            (path, "file", text.encode()) for path, text in content.items()
        ]
        image = push_image(self.registry.host, f"conformance/{self.tag}-{n}", "v1", [entries])
        if self.kind == "image":
            got = self.images.ensure(
                image.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT
            )
            return Unit(got.digest, image.ref)
        ready = self.fuse.ensure(image.ref, platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT)
        return Unit(ready.digest, image.ref)

    # --- what is served ---------------------------------------------------------

    def served(self, unit: Unit) -> set[str]:
        """The file names the store serves for ``unit`` (empty: not served)."""
        if self.kind == "fuse":
            if not self.fuse.has_tree(unit.digest):
                return set()
            listing = fuse_listing(self.fuse, unit.hex)  # reads every file it names
            return {path for path, what in listing.items() if what.startswith("file:")}
        path = self.images.tree_path(unit.digest)
        marker = self.images.trees.marker(unit.digest)
        if not (path.is_dir() and marker.is_file()):
            return set()
        return {str(p.relative_to(path)) for p in path.rglob("*") if p.is_file()}

    def staged(self) -> list[str]:
        """Names of unfinished commits on disk."""
        if self.kind == "fuse":
            return sorted(p.name for p in self.fuse.files.ingest_dir.iterdir())
        return sorted(p.name for p in self.images.unpacked_dir.iterdir() if ".tmp-" in p.name)

    # --- a kill -9 mid-commit -----------------------------------------------------

    def leave_crash_debris(self) -> list[Path]:
        """Write what a ``kill -9`` in the middle of a commit leaves; returns the paths."""
        hex_ = hashlib.sha256(f"{self.tag}-crash".encode()).hexdigest()
        if self.kind == "fuse":
            ingest = self.fuse.files.ingest_dir / "0123456789abcdef"
            ingest.write_bytes(b"half a file")
            data = b"a whole file no index names yet"
            orphan = self.fuse.files.files_dir / hashlib.sha256(data).hexdigest()
            orphan.write_bytes(data)
            return [ingest, orphan]
        unpacked = self.images.unpacked_dir
        staging = unpacked / f"{hex_}.tmp-dead"
        (staging / "manifests").mkdir(parents=True)
        (staging / "manifests" / "half.yaml").write_text("half")
        os.chmod(staging / "manifests", 0o555)  # the seal had begun
        unmarked = unpacked / hex_[::-1]  # renamed into place, marker never written
        (unmarked / "manifests").mkdir(parents=True)
        return [staging, unmarked]

    # --- holding, retaining, collecting ---------------------------------------------

    def hold(self, unit: Unit, target: str) -> None:
        if self.kind == "fuse":
            self.holders.hold(
                holding.Record(target, f"vol-{target}", unit.digest, holding.FUSE, str(unit.ask))
            )
            return
        self.images.hold(unit.digest, Holder(target, f"vol-{target}", str(unit.ask)))

    def retain(self, owner: str, unit: Unit) -> None:
        if self.kind == "fuse":
            assert self.fuse.retain(owner, [str(unit.ask)], AMD64)
        elif isinstance(unit.ask, FetchSource):
            assert self.images.retain(owner, [], AMD64, labels=[unit.ask.label()])
        else:
            assert self.images.retain(owner, [str(unit.ask)], AMD64)

    def collect_over_budget(self) -> set[str]:
        """Set the budget to nothing and collect once; returns the hex names evicted."""
        if self.kind == "fuse":
            for path in self.fuse.trees_dir.glob("*.json"):  # used long ago (not "recent")
                stamp = time.time() - 3600
                os.utime(path, (stamp, stamp))
            self.fuse.collector.budget_bytes = 0
            evicted, _ = self.fuse.collector.collect(self.holders.held(store=holding.FUSE))
            return set(evicted)
        self.images.budget_bytes = 0
        return {d.removeprefix("sha256:") for d in self.images.evict()}


@pytest.fixture(params=["image", "source", "fuse"])
def driver(
    request: pytest.FixtureRequest, tmp_path: Path, registry: RegistryServer
) -> Iterator[Driver]:
    with serving(tmp_path / "git") as http:
        yield Driver(
            request.param,
            tmp_path / "node",
            registry,
            http,
            tag=hashlib.sha256(str(tmp_path).encode()).hexdigest()[:12],
        )


def test_a_committed_unit_is_served_whole(driver: Driver) -> None:
    unit = driver.put(files=5)
    assert len(driver.served(unit)) == 5
    assert driver.staged() == []


def test_a_commit_that_fails_half_way_leaves_nothing_served_or_staged(driver: Driver) -> None:
    before = driver.put()
    kept = driver.served(before)

    with pytest.raises(errors.ResourceExhausted):
        driver.put(files=BIG)  # the budget runs out after LIMITS.max_entries files

    assert driver.staged() == []
    assert driver.served(before) == kept  # what was committed before is untouched
    if driver.kind != "fuse":
        hexes = {p.name for p in driver.images.unpacked_dir.iterdir()}
        assert hexes == {before.hex, f"{before.hex}.sealed"}
    else:
        assert driver.fuse.tree_names() == [before.hex]


def test_what_a_crash_mid_commit_leaves_is_removed_when_the_store_opens_again(
    driver: Driver,
) -> None:
    unit = driver.put()
    debris = driver.leave_crash_debris()

    driver.open()  # the restarted plugin
    if driver.kind == "fuse":
        driver.fuse.collector.collect(set())  # the first collection walks the store

    assert [p for p in debris if p.exists()] == []
    assert driver.staged() == []
    assert len(driver.served(unit)) == 3  # a committed unit survives the restart
    again = driver.put()  # and the store still commits
    assert len(driver.served(again)) == 3


def test_over_budget_every_unit_goes_but_the_held_and_the_retained(driver: Driver) -> None:
    held, retained, free, other = (driver.put() for _ in range(4))
    driver.hold(held, "/targets/a")
    driver.retain("bundledeployment/x", retained)

    evicted = driver.collect_over_budget()

    assert evicted == {free.hex, other.hex}
    assert driver.served(held) and driver.served(retained)
    assert not driver.served(free) and not driver.served(other)


def test_an_evicted_unit_is_committed_again_on_the_next_ensure(driver: Driver) -> None:
    unit = driver.put()
    assert driver.collect_over_budget() == {unit.hex}
    assert not driver.served(unit)

    if driver.kind == "fuse":
        driver.fuse.collector.budget_bytes = 1 << 40
        ready = driver.fuse.ensure(
            str(unit.ask), platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT
        )
        assert not ready.cache_hit
    elif isinstance(unit.ask, FetchSource):
        driver.images.budget_bytes = 1 << 40
        assert isinstance(driver.store, SourceCache)
        assert not driver.store.ensure(unit.ask).cache_hit
    else:
        driver.images.budget_bytes = 1 << 40
        got = driver.images.ensure(
            str(unit.ask), platform=AMD64, pull_policy=PullPolicy.IF_NOT_PRESENT
        )
        assert not got.cache_hit
    assert len(driver.served(unit)) == 3
