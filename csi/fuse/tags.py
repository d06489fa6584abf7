"""The FUSE store's tags: ``reference|platform`` → manifest digest, one small file each.

Where it sits: inside the FUSE store (``csi.fuse.images.FuseImages``), which looks a
tag up before it asks the registry (``IfNotPresent``), records what a pull resolved
and forgets the tags of an evicted tree. A cache of resolutions: a tag lost is
resolved again on the next publish.

Layout: ``<root>/<h>.json``, ``<h>`` the first 32 hex digits of the sha256 of the tag's
key, holding ``{"key": ..., "digest": ...}``, as the node's holder registry keeps one
file per target (``rukpak.store.holders``). A change writes its one file by rename
(``rukpak.common.fsio``: temp file ``.<name>.*.partial``, ``os.replace``), so a kill -9
mid-write leaves the old record or the new one, never a torn one, and a publish costs
the same with 1 or 1,000 tags; forgetting a tag unlinks its file. Not fsynced: after a
power loss a record may read as torn or garbage; such a file is logged and set aside
as ``<name>.bad-<ns>`` at start (``rukpak.common.fsio.json_records``) and the tag
resolved again.

Migration: the single ``tags.json`` of the format before (rewritten whole on every tag
change) is read once at start; its tags are written as records, made durable, and only
then is the old file removed (a crash in between migrates again: idempotent).
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import logging
import threading
import time
from pathlib import Path

from rukpak.common.fsio import fsync_dir, read_json_or_set_aside, write_bytes_atomic
from rukpak.oci import digest as digests
from rukpak.store.holders import STALE_TEMP

log = logging.getLogger(__name__)


def file_name(key: str) -> str:
    """The name of tag ``key``'s record file."""
    return hashlib.sha256(key.encode("utf-8", "surrogateescape")).hexdigest()[:32] + ".json"


class Tags:
    """Tag → manifest digest, in memory and one file per tag under ``root``; thread-safe."""

    def __init__(self, root: Path, *, legacy: Path | None = None) -> None:
        """``legacy``: the ``tags.json`` of the format before, migrated if present."""
        self.root = root
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._tags: dict[str, str] = {}
        self._load()
        if legacy is not None:
            self._migrate(legacy)

    def _load(self) -> None:
        for path in sorted(self.root.glob(".*.partial")):
            with contextlib.suppress(OSError):
                if path.stat().st_mtime < time.time() - STALE_TEMP:
                    path.unlink()  # a write a kill interrupted
        for path in sorted(self.root.glob("*.json")):
            doc = read_json_or_set_aside(path)  # a torn one is set aside and logged
            if doc is None:
                continue
            key, digest = _fields(doc)
            if key is None or digest is None or file_name(key) != path.name:
                log.error("msg=%r path=%s", "tag record is not one; ignored", path)
                continue
            self._tags[key] = digest

    def _migrate(self, legacy: Path) -> None:
        old = read_json_or_set_aside(legacy)  # a torn one is set aside and logged
        if old is None:
            return
        moved = 0
        for key, digest in old.items() if isinstance(old, dict) else ():
            valid = isinstance(key, str) and isinstance(digest, str) and digests.is_valid(digest)
            if valid and key not in self._tags:
                self._write(key, digest, durable=True)
                moved += 1
        fsync_dir(self.root)
        legacy.unlink(missing_ok=True)
        fsync_dir(legacy.parent)
        log.info("msg=%r path=%s tags=%d", "tags taken over from tags.json", legacy, moved)

    def _write(self, key: str, digest: str, *, durable: bool) -> None:
        payload = json.dumps({"key": key, "digest": digest}, sort_keys=True).encode()
        write_bytes_atomic(self.root / file_name(key), payload, durable=durable)
        self._tags[key] = digest

    def get(self, key: str) -> str | None:
        with self._lock:
            return self._tags.get(key)

    def set(self, key: str, digest: str) -> None:
        """Record that ``key`` resolved to ``digest``: its file only, and only when it
        changed (``pullPolicy: Always`` resolving the same digest writes nothing)."""
        with self._lock:
            if self._tags.get(key) != digest:
                self._write(key, digest, durable=False)  # a cache: see the module docstring

    def forget_tree(self, tree: str) -> list[str]:
        """Drop the tags naming tree ``tree`` (its hex digest); returns their keys."""
        with self._lock:
            stale = [k for k, d in self._tags.items() if digests.hex_of(d) == tree]
            for key in stale:
                del self._tags[key]
                (self.root / file_name(key)).unlink(missing_ok=True)
        return stale

    def all(self) -> dict[str, str]:
        with self._lock:
            return dict(self._tags)


def _fields(doc: object) -> tuple[str | None, str | None]:
    """A record's key and digest; (None, None) when it is not a record."""
    if not isinstance(doc, dict):
        return None, None
    key, digest = doc.get("key"), doc.get("digest")
    if not isinstance(key, str) or not isinstance(digest, str) or not digests.is_valid(digest):
        return None, None
    return key, digest
