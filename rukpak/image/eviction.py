"""The image cache's eviction: least recently used trees no target holds and no owner
retains, and their blobs.

The policy (budget, holders, retention, least recently used first) is the node's one
collector's (``rukpak.store.collect``); this module is its backend for the image cache.

Where it sits: owned by the image cache (``rukpak.image.cache``), which asks for a
background pass after every pull that may have grown the cache past its budget
(``--cache-budget``). It reads and changes the cache's records
(``rukpak.image.cachestate``) under their lock, reads which trees are held from the
node's holder registry (``rukpak.store.holders``; holds are staged under that same
lock), deletes blobs from the content store (``rukpak.image.store``) only when no pull
leases them (``rukpak.image.leases``), and removes tree directories after the lock is
released. A tree an owner retains
(``CacheState.retained``, a BundleDeployment's kept revisions) is spared like a held
one until its entry is older than the retention TTL (``--retain-ttl``); expired
entries are dropped at each pass.
"""

from __future__ import annotations

import functools
import logging
import os
import secrets
from collections.abc import Callable, Collection, Iterable
from contextlib import AbstractContextManager
from pathlib import Path

from rukpak.image import tree
from rukpak.image.cachestate import CacheState
from rukpak.image.leases import Leases
from rukpak.image.store import ContentStore
from rukpak.oci import digest as digests
from rukpak.store import collect

log = logging.getLogger(__name__)

RETAIN_TTL = 14 * 24 * 3600.0
"""Seconds a retention entry counts after the publish that last set it (``--retain-ttl``)."""


class Evictor:
    """Keeps one cache under its budget through the node's one collector
    (``rukpak.store.collect``), as its backend: a unit is an unpacked tree (named by its
    hex digest; its size as recorded, its last use from the records) with the blobs no
    other tree lists. ``retain_ttl`` and ``clock`` are the cache's
    (``rukpak.image.settings``)."""

    def __init__(
        self,
        *,
        state: CacheState,
        held: Callable[[], set[str]],
        store: ContentStore,
        leases: Leases,
        unpacked_dir: Path,
        marker: Callable[[str], Path],
        budget: Callable[[], int],
        retain_ttl: float,
        clock: Callable[[], float],
    ) -> None:
        self.state = state
        self._held = held  # hex digests of the trees some target holds (rukpak.store.holders)
        self.store = store
        self.leases = leases
        self.unpacked_dir = unpacked_dir
        self._marker = marker  # a tree's sealed marker, removed with it
        self._budget = budget  # read at each pass: the cache's budget may change
        self.retain_ttl = retain_ttl
        self._clock = clock  # unix seconds; retention entries age by it
        self.collector = collect.Collector(self, budget=budget, name="evict")
        # What the pass in progress detached (one pass at a time: the collector's).
        self._doomed: list[Path] = []
        self._blobs: set[str] = set()
        self._expired: list[str] = []

    def usage(self) -> int:
        """Bytes held: blobs plus unpacked trees (as recorded)."""
        return self.store.total_size() + self.state.tree_bytes()

    def request(self) -> None:
        """Evict in the background, outside every publish (one evictor thread at most)."""
        if self.usage() > self._budget():
            self.collector.request()

    def evict(self, *, keep: Collection[str] = ()) -> list[str]:
        """Remove least recently used trees no target holds, no owner retains (within the
        TTL) and no pull leases, until under budget; returns the evicted manifest digests.
        Blobs no remaining tree lists go too.

        Under the state lock a victim tree is only renamed away (atomic, fast), so no
        publish can pick it up afterwards; the slow deletion runs after the lock is
        released. Blobs are deleted only when no pull leases them.
        """
        hexes = self.collector.collect(keep={digests.hex_of(d) for d in keep})
        return [f"sha256:{hex_}" for hex_ in hexes]

    # --- the collector's backend (rukpak.store.collect.Backend) -------------------------

    def locked(self) -> AbstractContextManager[object]:
        return self.state.lock

    def held(self) -> set[str]:
        return self._held()

    def retained(self) -> set[str]:
        now = self._clock()
        self._expired = self.state.expire_retention(now, self.retain_ttl)
        return self.state.retained(now, self.retain_ttl)

    def units(self) -> Iterable[collect.Unit]:
        trees = self.state.data["trees"]
        return [
            collect.Unit(hex_, float(trees[hex_].get("last_used", 0)))
            for hex_ in self.state.lru_trees()
        ]

    def busy(self, unit: collect.Unit) -> bool:
        return self.leases.leased(f"sha256:{unit.name}")

    def detach(self, unit: collect.Unit) -> None:
        grave = self.unpacked_dir / f"{unit.name}.tmp-evict-{secrets.token_hex(4)}"
        try:
            os.replace(self.unpacked_dir / unit.name, grave)
        except FileNotFoundError:
            pass
        else:
            self._doomed.append(grave)
        record = self.state.forget_tree(unit.name)
        self._blobs.update(b for b in record.get("blobs", []) if digests.is_valid(b))

    def remaining(self) -> int:
        pending = self._blobs - self.state.blobs_in_use()
        return self.usage() - sum(self._blob_size(b) for b in pending)

    def settle(self) -> None:
        self._blobs -= self.state.blobs_in_use()
        self.state.save()

    def finish(self, evicted: list[str]) -> None:
        doomed, self._doomed = self._doomed, []
        blobs, self._blobs = self._blobs, set()
        expired, self._expired = self._expired, []
        for owner in expired:
            log.info("msg=%r owner=%s", "retention expired", owner)
        for hex_ in evicted:
            self._marker(f"sha256:{hex_}").unlink(missing_ok=True)
        for blob in sorted(blobs):
            self.leases.unless_leased(blob, functools.partial(self.store.delete, blob))
        for grave in doomed:
            remove_tree(grave)
        for hex_ in evicted:
            log.info("msg=%r digest=sha256:%s", "evicted unused image", hex_)

    def _blob_size(self, digest: str) -> int:
        try:
            return self.store.path(digest).stat().st_size
        except OSError:
            return 0


def remove_tree(path: Path) -> None:
    """Remove a tree (however deep, sealed or not); a failure is logged, never raised."""
    try:
        tree.remove(path)
    except OSError as exc:
        log.error("msg=%r path=%s error=%r", "cannot remove tree", path, str(exc)[:300])
