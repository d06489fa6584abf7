"""Garbage collection of the FUSE file store: unused trees go, then files no tree names.

The policy (budget, holders, retention, least recently used first) is the node's one
collector's (``rukpak.store.collect``), the one bind mode's eviction runs; this module
is its backend for the FUSE store.

Where it sits: the FUSE publisher (``csi.fuse.publisher``) asks for a collection
after each publish and unpublish (:meth:`Collector.request`, one background
thread at most, as the bind cache's eviction in ``rukpak.image.cache``); below it
the FUSE image cache's layout (``csi.fuse.images``). The policy is bind mode's:
while the store is over its byte budget, remove the least recently used trees
no published volume holds (the node's holder registry, ``rukpak.store.holders``, read
through ``FusePublisher.held``) and none used in the last minute (a tree's index
file's mtime is its last use: every publish touches it before it binds the
tree); then delete every variant no linked tree links (``csi.fuse.linked``: a
linked tree exists while a record presents it, so a variant in use is never
collected) and every stored file that no remaining index names. The store's own
bytes count (file contents and variants, as ``du``), not the indexes. The store is
walked for such files only when some can exist: at start (a crash mid-pull), after a
failed pull, after an eviction and after a linked tree was removed.

Safety against a pull in progress, whose files exist before the index that
names them: pulls run inside :meth:`Collector.pulling`; files are deleted only
while no pull runs, and a pull that starts meanwhile waits for the deletion to
end (a directory walk and some unlinks). A file a lazy tree has not fetched
yet is named by its index, so it is fetched again if it ever went missing.
"""

from __future__ import annotations

import contextlib
import json
import logging
import threading
import time
from collections.abc import Callable, Collection, Iterable, Iterator
from contextlib import AbstractContextManager
from pathlib import Path

from csi.fuse import index
from csi.fuse.filestore import FileStore
from rukpak.common.background import Chore
from rukpak.store import collect as collection

log = logging.getLogger(__name__)

RECENT = 60.0  # seconds: a tree used this recently is kept (a publish may be binding it)


def referenced(trees_dir: Path, files: FileStore) -> set[str]:
    """Every file digest the saved indexes under ``trees_dir`` name: their directory
    listings and the files those list (each listing read once, however many trees
    share it)."""
    names: set[str] = set()
    read: set[str] = set()
    for path in trees_dir.glob("*.json"):
        try:
            doc = json.loads(path.read_bytes())
        except (OSError, ValueError):
            continue  # a damaged index serves nothing; its files go unless others name them
        names.update(index.named_files(doc, files, read))
    return names


class Collector:
    """Evicts unused trees over budget and deletes unreferenced files: the node's one
    collector (``rukpak.store.collect``) with this store as its backend (a unit is a tree
    index; its last use is the index's mtime; removing it unlinks the index, then the
    files no remaining index names go)."""

    def __init__(
        self,
        files: FileStore,
        trees_dir: Path,
        *,
        budget_bytes: int,
        forget: Callable[[str], None],
        retained: Callable[[], set[str]] = set,
    ) -> None:
        """``retained``: the trees an owner retains now (``FuseImages.retained``)."""
        self.files = files
        self.trees_dir = trees_dir
        self.budget_bytes = budget_bytes
        self._forget = forget  # drops what else knows a tree (tags, lazy plan, credentials)
        self._retained = retained
        self._gate = threading.Condition()
        self._pulls = 0
        self._deleting = False
        self._held: Callable[[], Collection[str]] = frozenset
        self._deleted = 0  # files the last pass deleted
        self._now = 0.0
        self._run_lock = threading.Lock()
        self._chore = Chore("fuse-gc", self.collect, failure="FUSE store collection failed")
        self.collector = collection.Collector(
            self, budget=lambda: self.budget_bytes, name="fuse-gc"
        )
        # Files nothing names can exist at start (a crash mid-pull) and after a failed
        # pull or an eviction; otherwise a run need not walk the store at all.
        self._orphans = True

    @contextlib.contextmanager
    def pulling(self) -> Iterator[None]:
        """Wrap a pull: its files are safe from deletion until its index is saved."""
        with self._gate:
            while self._deleting:
                self._gate.wait()
            self._pulls += 1
        try:
            yield
        except BaseException:
            self._orphans = True
            raise
        finally:
            with self._gate:
                self._pulls -= 1
                self._gate.notify_all()

    def touch(self, tree: str) -> None:
        """Mark tree ``tree`` as used now (its LRU position)."""
        with contextlib.suppress(OSError):
            (self.trees_dir / f"{tree}.json").touch(exist_ok=True)

    def loosen(self) -> None:
        """Files may have lost their last user (a linked tree removed): the next run walks
        the store's variants and files."""
        self._orphans = True

    def request(self, held: Callable[[], Collection[str]]) -> None:
        """Collect in the background (one thread at most); ``held`` names the trees in use."""
        self._held = held
        self._chore.wake()

    def collect(self, held: Collection[str] | None = None) -> tuple[list[str], int]:
        """Evict unused trees while over budget, then delete unreferenced files.

        ``held``: trees in use besides what the last :meth:`request` named.
        Returns the evicted tree names and the number of files deleted. Files
        are left for a later run while a pull is in progress.
        """
        with self._run_lock:
            evicted = self.collector.collect(keep=() if held is None else held)
            deleted, self._deleted = self._deleted, 0
        return evicted, deleted

    # --- the collector's backend (rukpak.store.collect.Backend) -------------------------

    def locked(self) -> AbstractContextManager[object]:
        return contextlib.nullcontext()  # holds are recorded before a tree is touched

    def usage(self) -> int:
        return self.files.disk_usage()

    def held(self) -> set[str]:
        return set(self._held())

    def retained(self) -> set[str]:
        return set(self._retained())

    def units(self) -> Iterable[collection.Unit]:
        self._now = time.time()
        units = []
        for path in self.trees_dir.glob("*.json"):
            with contextlib.suppress(OSError):
                units.append(collection.Unit(path.stem, path.stat().st_mtime))
        return units

    def busy(self, unit: collection.Unit) -> bool:
        return self._now - unit.last_used < RECENT

    def detach(self, unit: collection.Unit) -> None:
        (self.trees_dir / f"{unit.name}.json").unlink(missing_ok=True)
        self._forget(unit.name)

    def remaining(self) -> int:
        """What the evicted trees alone held is only known after the walk: recount."""
        return self._usage_without_unreferenced()

    def settle(self) -> None:
        pass

    def finish(self, evicted: list[str]) -> None:
        if not evicted and not self._orphans:
            return
        with self._gate:
            if self._pulls:
                self._orphans = True
                return
            self._deleting = True
            self._orphans = False
        try:
            deleted = self._delete_unreferenced()
        except BaseException:
            self._orphans = True
            raise
        finally:
            with self._gate:
                self._deleting = False
                self._gate.notify_all()
        self._deleted = deleted
        if evicted or deleted:
            log.info(
                "msg=%r trees=%s files=%d bytes_now=%d",
                "FUSE store collected",
                evicted,
                deleted,
                self.files.disk_usage(),
            )

    def _usage_without_unreferenced(self) -> int:
        names = referenced(self.trees_dir, self.files)
        total = 0
        for digest in names:
            with contextlib.suppress(OSError):
                total += self.files.path(digest).stat().st_blocks * 512
        return total

    def _delete_unreferenced(self) -> int:
        deleted = self.files.drop_unused_variants()  # variants no linked tree links
        names = referenced(self.trees_dir, self.files)
        for digest in list(self.files.digests()):
            if digest not in names:
                self.files.delete(digest)
                deleted += 1
        return deleted
