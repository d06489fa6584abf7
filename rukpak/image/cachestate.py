"""The image cache's metadata: tag → digest, tree records and which trees an owner
retains. Which targets hold which tree is not here: the node's holder registry
(``rukpak.store.holders``) keeps it, one file per holder.

Where it sits: inside the image cache (``rukpak.image.cache``), which owns one
:class:`CacheState` and asks it under one lock. Persisted in ``state.json``,
rewritten atomically (``rukpak.common.fsio``): durably, before the call returns, when
a tag, a tree record or retained digests change (a pull, an eviction, a new revision:
never a hot publish), so a cache opened afterwards, in this process or the next, reads
them; soon, by a writer thread, when only a retention's time changed. A cache hit
changes only a tree's last use, kept in memory (:meth:`CacheState.touch`) and written
with the next write, or by the writer thread at most every ``TOUCH_FLUSH`` seconds, and
at interpreter exit. A last-use time lost in a crash costs nothing but the order of
eviction. The file is advisory for trees (a sealed tree on disk without a record is
still used), so a file that cannot be read is kept aside, never overwritten.

Several objects may write one file (two caches opened on one directory, or the next
process while this one exits): each write takes ``flock`` on ``state.json.lock``, reads
the file back when someone else replaced it since, and puts only the keys this object
changed over it (:meth:`CacheState._commit`), so a late write of one object never drops
the records another wrote.

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
import contextlib
import fcntl
import json
import logging
import os
import threading
import time
from collections.abc import Collection, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from rukpak.common.background import Chore
from rukpak.common.fsio import read_json_or_set_aside, write_bytes_atomic
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
        self._touched_since = 0.0  # monotonic: the first last-use change not written yet
        self.data: dict[str, Any] = {"tags": {}, "trees": {}, "retained": {}}
        # Keys this object changed since its last write, per section (see _merge).
        self._changed: dict[str, set[str]] = {section: set() for section in self.data}
        self._touched: set[str] = set()  # trees whose last use alone changed
        self._forgotten: set[str] = set()  # trees dropped: their tags go on disk too
        self._seen: tuple[int, int, int] | None = None  # the file as last read or written
        self._legacy_holders: dict[str, Any] = {}
        with self._file_lock():
            loaded = read_json_or_set_aside(path)
            self._seen = _identity(path)
        if isinstance(loaded, dict):
            for key in self.data:
                if isinstance(loaded.get(key), dict):
                    self.data[key] = loaded[key]
            if isinstance(loaded.get("holders"), dict):
                self._legacy_holders = loaded["holders"]

    def save(self) -> None:
        """Write the records atomically and durably, now."""
        self._commit(durable=True)

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
        """Write pending changes now (not durably); nothing when there are none, or when
        the cache's directory is gone (a cache removed whole, e.g. a temp one at exit)."""
        with self.lock:
            if self._dirty and self.path.parent.is_dir():
                self._commit(durable=False)

    def _commit(self, *, durable: bool) -> None:
        """Merge this object's changes into the file on disk and write it.

        Another :class:`CacheState` on the same file (a second cache in this process, or
        another process) may have written since this one last read it: its records are
        read back and kept, and only the keys this object changed are written over them
        (``_merge``), so no writer drops another's tags, trees or retention. The writers
        of one file take turns under ``flock`` on ``<file>.lock``; the file is still
        replaced by a rename, so a reader, or a ``kill -9`` at any point, sees a whole
        file. Runs under the state lock (callers may hold it already; nothing that takes
        ``flock`` waits for that lock).
        """
        with self.lock, self._file_lock():
            base = None
            if self._seen is None or _identity(self.path) != self._seen:
                base = read_json_or_set_aside(self.path)  # written by another object
            merged = self._merge(base if isinstance(base, dict) else None)
            payload = json.dumps(merged, sort_keys=True).encode()
            write_bytes_atomic(self.path, payload, durable=durable)
            self.data = merged
            self._seen = _identity(self.path)
            self._dirty = False
            self._touched_since = 0.0
            for keys in self._changed.values():
                keys.clear()
            self._touched.clear()
            self._forgotten.clear()

    def _merge(self, disk: dict[str, Any] | None) -> dict[str, Any]:
        """The records to write: ``disk`` (None: this object's own last write) with this
        object's changes on top. A tree whose last use alone changed keeps the newer
        time; tags naming a tree this object dropped go with it."""
        if disk is None:
            return self.data
        merged: dict[str, Any] = {}
        for section, mine in self.data.items():
            theirs = disk.get(section)
            result = dict(theirs) if isinstance(theirs, dict) else {}
            for key in self._changed[section]:
                if key in mine:
                    result[key] = mine[key]
                else:
                    result.pop(key, None)
            merged[section] = result
        trees = merged["trees"]
        for hex_ in self._touched - self._changed["trees"]:
            mine, theirs = self.data["trees"].get(hex_), trees.get(hex_)
            if not isinstance(mine, dict):
                continue
            if isinstance(theirs, dict):
                used = max(float(mine.get("last_used", 0)), float(theirs.get("last_used", 0)))
                trees[hex_] = {**theirs, "last_used": used}
            else:
                trees[hex_] = mine
        if self._forgotten:
            merged["tags"] = {
                k: v
                for k, v in merged["tags"].items()
                if k in self._changed["tags"] or str(v).rpartition(":")[2] not in self._forgotten
            }
        return merged

    @contextlib.contextmanager
    def _file_lock(self) -> Iterator[None]:
        """Exclusive use of ``state.json`` among every object and process writing it."""
        fd = os.open(self.path.with_name(self.path.name + ".lock"), os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
            yield
        finally:
            os.close(fd)  # releases the lock

    # --- tags -------------------------------------------------------------------

    def tag(self, key: str) -> str | None:
        with self.lock:
            digest = self.data["tags"].get(key)
        return digest if isinstance(digest, str) and digests.is_valid(digest) else None

    def set_tag(self, key: str, digest: str) -> None:
        """Remember what ``key`` resolved to; written durably before it returns, and only
        when it changed (a resolution that moved, not a hot publish)."""
        with self.lock:
            if self.data["tags"].get(key) == digest:
                return
            self.data["tags"][key] = digest
            self._changed["tags"].add(key)
            self.save()

    # --- trees ------------------------------------------------------------------

    def tree(self, digest: str) -> dict[str, Any] | None:
        with self.lock:
            record = self.data["trees"].get(digests.hex_of(digest))
            return dict(record) if isinstance(record, dict) else None

    def record_tree(self, digest: str, record: dict[str, Any]) -> None:
        with self.lock:
            hex_ = digests.hex_of(digest)
            self.data["trees"][hex_] = {**record, "last_used": time.time()}
            self._changed["trees"].add(hex_)
            self._forgotten.discard(hex_)
            self.save()

    def touch(self, digest: str) -> None:
        """Mark a tree used now: in memory; written with the next write, or by the writer
        thread once ``TOUCH_FLUSH`` seconds passed since the first change not written."""
        with self.lock:
            hex_ = digests.hex_of(digest)
            tree = self.data["trees"].setdefault(hex_, {})
            tree["last_used"] = time.time()
            self._touched.add(hex_)
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
            tags = self.data["tags"]
            gone = [k for k, v in tags.items() if str(v).endswith(hex_)]
            for key in gone:
                del tags[key]
            self._changed["tags"].update(gone)
            self._changed["trees"].add(hex_)
            self._forgotten.add(hex_)
            self._touched.discard(hex_)
            self._pending()  # written by the caller's save, the next write, or at exit
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
            if change is not retention.Change.NONE:
                self._changed["retained"].add(owner)
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
            self._changed["retained"].update(gone)
            if gone:
                self.save_soon()
            return gone


def _identity(path: Path) -> tuple[int, int, int] | None:
    """What tells one version of ``path`` from the next (each write renames a new inode
    into place); None when there is no file."""
    try:
        st = path.stat()
    except FileNotFoundError:
        return None
    return (st.st_ino, st.st_mtime_ns, st.st_size)
