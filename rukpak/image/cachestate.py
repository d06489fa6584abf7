"""The image cache's metadata: tag → digest, tree records and which trees an owner
retains. Which targets hold which tree is not here: the node's holder registry
(``rukpak.store.holders``) keeps it, one file per holder.

Where it sits: inside the image cache (``rukpak.image.cache``), which owns one
:class:`CacheState` and asks it under one lock. Persisted in ``state.json``,
rewritten atomically (``rukpak.common.fsio``): durably, at once, when tree records or
retained digests change; soon, by a writer thread, when only a tag or a retention's
time changed. Neither happens on a hot publish: a cache hit changes only a tree's last
use, kept in memory (:meth:`CacheState.touch`) and written with the next write, or by
the writer thread at most every ``TOUCH_FLUSH`` seconds, and at interpreter exit. A
last-use time lost in a crash costs nothing but the order of eviction. The file is
advisory for trees (a sealed tree on disk without a record is still used), so a file
that cannot be read is kept aside, never overwritten.

Files written before the holder registry carry a ``holders`` table (target →
digest, volume and image): it is loaded, handed over once
(:meth:`CacheState.take_legacy_holders`) and dropped from the file by the next write.

Retention (``retained``: owner → tree digests and when a publish last set them)
keeps an owner's kept revisions (a BundleDeployment's ``status.revisions``) from
eviction while nothing mounts them; an entry older than the cache's TTL no longer
counts, so an owner that is gone lets go by itself. A change of the digests is
written at once, a mere refresh of the time soon. Files written before retention
existed load with none.
"""

from __future__ import annotations

import atexit
import json
import logging
import threading
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rukpak.common.background import Chore
from rukpak.common.fsio import read_json_or_set_aside, write_bytes_atomic, write_json_atomic
from rukpak.image import retention
from rukpak.oci import digest as digests

log = logging.getLogger(__name__)

TOUCH_FLUSH = 60.0
"""Seconds a tree's last use may stay in memory only (see the module docstring)."""


@dataclass(frozen=True)
class Holder:
    """Who uses a tree: one published target path and its volume."""

    target: str
    volume_id: str
    image: str


class CacheState:
    """The records in ``state.json``; every method is thread-safe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.RLock()
        self._dirty = False
        self._writer = Chore("state", self.flush, failure="cannot write state")
        self._exit_flush = False
        self._write_lock = threading.Lock()  # held while writing; its holder never waits for lock
        self._version = 0
        self._written = 0
        self._touched_since = 0.0  # monotonic: the first last-use change not written yet
        self.data: dict[str, Any] = {"tags": {}, "trees": {}, "retained": {}}
        self._legacy_holders: dict[str, Any] = {}
        loaded = read_json_or_set_aside(path)
        if isinstance(loaded, dict):
            for key in self.data:
                if isinstance(loaded.get(key), dict):
                    self.data[key] = loaded[key]
            if isinstance(loaded.get("holders"), dict):
                self._legacy_holders = loaded["holders"]

    def save(self) -> None:
        """Write the records atomically and durably, now."""
        with self.lock, self._write_lock:
            self._dirty = False
            self._touched_since = 0.0
            self._version += 1
            write_json_atomic(self.path, self.data)
            self._written = self._version

    def save_soon(self) -> None:
        """Have the writer thread write the records (not durably) shortly; see above."""
        self._pending()
        self._writer.wake()  # a failed write is tried again at the next change

    def _pending(self) -> None:
        """Mark the records changed and not written (written at exit at the latest)."""
        with self.lock:
            self._dirty = True
            if not self._exit_flush:
                self._exit_flush = True
                atexit.register(self.flush)

    def flush(self) -> None:
        """Write pending holder changes now (not durably).

        The records are serialised under the lock but written outside it, so
        publishes never wait for the disk; versions keep an older snapshot from
        replacing a newer one.
        """
        with self.lock:
            if not self._dirty:
                return
            self._dirty = False
            self._touched_since = 0.0
            self._version += 1
            version = self._version
            payload = json.dumps(self.data, sort_keys=True).encode()
        with self._write_lock:
            if version > self._written:
                write_bytes_atomic(self.path, payload, durable=False)
                self._written = version

    # --- tags -------------------------------------------------------------------

    def tag(self, key: str) -> str | None:
        with self.lock:
            digest = self.data["tags"].get(key)
        return digest if isinstance(digest, str) and digests.is_valid(digest) else None

    def set_tag(self, key: str, digest: str) -> None:
        """Remember what ``key`` resolved to; written soon, and only when it changed."""
        with self.lock:
            if self.data["tags"].get(key) != digest:
                self.data["tags"][key] = digest
                self.save_soon()

    # --- trees ------------------------------------------------------------------

    def tree(self, digest: str) -> dict[str, Any] | None:
        with self.lock:
            record = self.data["trees"].get(digests.hex_of(digest))
            return dict(record) if isinstance(record, dict) else None

    def record_tree(self, digest: str, record: dict[str, Any]) -> None:
        with self.lock:
            self.data["trees"][digests.hex_of(digest)] = {**record, "last_used": time.time()}
            self.save()

    def touch(self, digest: str) -> None:
        """Mark a tree used now: in memory; written with the next write, or by the writer
        thread once ``TOUCH_FLUSH`` seconds passed since the first change not written."""
        with self.lock:
            tree = self.data["trees"].setdefault(digests.hex_of(digest), {})
            tree["last_used"] = time.time()
            now = time.monotonic()
            if not self._touched_since:
                self._touched_since = now
                self._pending()  # written by the next write, or at exit
            elif now - self._touched_since >= TOUCH_FLUSH:
                self.save_soon()

    def tree_bytes(self) -> int:
        with self.lock:
            return sum(int(t.get("size", 0)) for t in self.data["trees"].values())

    def trees_labelled(self, label: str) -> list[str]:
        """Digests of the recorded trees whose record names ``label`` (a git or http
        source's ``FetchSource.label()``: one tree per credential that fetched it)."""
        with self.lock:
            return sorted(
                f"sha256:{hex_}"
                for hex_, record in self.data["trees"].items()
                if isinstance(record, dict) and record.get("image") == label
            )

    def forget_tree(self, hex_: str) -> dict[str, Any]:
        """Drop a tree's record and the tags naming it; returns the record."""
        with self.lock:
            record: dict[str, Any] = self.data["trees"].pop(hex_, {})
            self.data["tags"] = {
                k: v for k, v in self.data["tags"].items() if not str(v).endswith(hex_)
            }
            return record

    def blobs_in_use(self) -> set[str]:
        with self.lock:
            return {b for t in self.data["trees"].values() for b in t.get("blobs", [])}

    def lru_trees(self) -> list[str]:
        """Hex digests of recorded trees, least recently used first."""
        with self.lock:
            trees = self.data["trees"]
            return sorted(trees, key=lambda h: float(trees[h].get("last_used", 0)))

    # --- holders of an older format ----------------------------------------------

    def take_legacy_holders(self) -> dict[str, Any]:
        """The ``holders`` table a file written before the holder registry carried
        (target → {digest, volume_id, image}); handed over once, then dropped from memory
        (and from the file at the next write)."""
        with self.lock:
            legacy, self._legacy_holders = self._legacy_holders, {}
            return legacy

    # --- retention ----------------------------------------------------------------

    def retain(self, owner: str, tree_digests: Collection[str], now: float) -> None:
        """Make ``tree_digests`` the trees ``owner`` retains, as of ``now`` (unix seconds),
        replacing what it retained; an empty collection ends the owner's retention."""
        with self.lock:
            change = retention.set_owner(self.data["retained"], owner, tree_digests, now)
            if change is retention.Change.DIGESTS:
                self.save()
            elif change is retention.Change.TIME:
                self.save_soon()

    def retained(self, now: float, ttl: float) -> set[str]:
        """Hex digests of the trees retained by entries at most ``ttl`` seconds older than
        ``now``."""
        with self.lock:
            return retention.fresh(self.data["retained"], now, ttl)

    def retention(self) -> dict[str, list[str]]:
        """Every owner's retained tree digests, expired entries included."""
        with self.lock:
            return {o: retention.digests_of(e) for o, e in self.data["retained"].items()}

    def expire_retention(self, now: float, ttl: float) -> list[str]:
        """Drop the entries more than ``ttl`` seconds older than ``now``; returns their
        owners."""
        with self.lock:
            gone = retention.expire(self.data["retained"], now, ttl)
            if gone:
                self.save_soon()
            return gone
