"""The image cache's eviction: least recently used trees no target holds and no owner
retains, and their blobs.

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
import threading
from collections.abc import Callable, Collection
from pathlib import Path

from rukpak.common.background import Chore
from rukpak.image import tree
from rukpak.image.cachestate import CacheState
from rukpak.image.leases import Leases
from rukpak.image.store import ContentStore
from rukpak.oci import digest as digests

log = logging.getLogger(__name__)

RETAIN_TTL = 14 * 24 * 3600.0
"""Seconds a retention entry counts after the publish that last set it (``--retain-ttl``)."""


class Evictor:
    """Keeps one cache under its budget; at most one pass runs at a time. ``retain_ttl``
    and ``clock`` are the cache's (``rukpak.image.settings``)."""

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
        self._chore = Chore("evict", self.evict, failure="eviction failed")
        self._pass_lock = threading.Lock()

    def usage(self) -> int:
        """Bytes held: blobs plus unpacked trees (as recorded)."""
        return self.store.total_size() + self.state.tree_bytes()

    def request(self) -> None:
        """Evict in the background, outside every publish (one evictor thread at most)."""
        if self.usage() > self._budget():
            self._chore.wake()

    def evict(self, *, keep: Collection[str] = ()) -> list[str]:
        """Remove least recently used trees no target holds, no owner retains (within the
        TTL) and no pull leases, until under budget; returns the evicted manifest digests.
        Blobs no remaining tree lists go too.

        Under the state lock a victim tree is only renamed away (atomic, fast), so no
        publish can pick it up afterwards; the slow deletion runs after the lock is
        released. Blobs are deleted only when no pull leases them.
        """
        with self._pass_lock:  # one eviction at a time; publishes never wait for it
            return self._evict(keep)

    def _blob_size(self, digest: str) -> int:
        try:
            return self.store.path(digest).stat().st_size
        except OSError:
            return 0

    def _evict(self, keep: Collection[str]) -> list[str]:
        evicted: list[str] = []
        doomed: list[Path] = []
        blobs: set[str] = set()
        budget = self._budget()
        with self.state.lock:
            if self.usage() <= budget:
                return evicted
            now = self._clock()
            expired = self.state.expire_retention(now, self.retain_ttl)
            held = (
                self._held()
                | self.state.retained(now, self.retain_ttl)
                | {digests.hex_of(d) for d in keep}
            )
            for hex_ in self.state.lru_trees():
                pending = blobs - self.state.blobs_in_use()
                if self.usage() - sum(self._blob_size(b) for b in pending) <= budget:
                    break
                record = self.state.tree(f"sha256:{hex_}") or {}
                digest = str(record.get("digest", f"sha256:{hex_}"))
                if hex_ in held or self.leases.leased(digest):
                    continue
                grave = self.unpacked_dir / f"{hex_}.tmp-evict-{secrets.token_hex(4)}"
                try:
                    os.replace(self.unpacked_dir / hex_, grave)
                except FileNotFoundError:
                    pass
                else:
                    doomed.append(grave)
                self.state.forget_tree(hex_)
                blobs.update(b for b in record.get("blobs", []) if digests.is_valid(b))
                evicted.append(digest)
            blobs -= self.state.blobs_in_use()
            self.state.save()
        for owner in expired:
            log.info("msg=%r owner=%s", "retention expired", owner)
        for digest in evicted:
            self._marker(digest).unlink(missing_ok=True)
        for blob in sorted(blobs):
            self.leases.unless_leased(blob, functools.partial(self.store.delete, blob))
        for grave in doomed:
            remove_tree(grave)
        for digest in evicted:
            log.info("msg=%r digest=%s", "evicted unused image", digest)
        return evicted


def remove_tree(path: Path) -> None:
    """Remove a tree (however deep, sealed or not); a failure is logged, never raised."""
    try:
        tree.remove(path)
    except OSError as exc:
        log.error("msg=%r path=%s error=%r", "cannot remove tree", path, str(exc)[:300])
