"""Durability of committed trees, off the publish path: flush later, distrust after a reboot.

Where it sits: inside the image cache (``rukpak.image.cache``). Making a freshly
extracted tree durable before publishing it (one ``syncfs`` of the whole
filesystem) cost a large share of a cold publish, and more the busier the disk
(it waits for every other writer's dirty pages too). Durability only matters
across a power loss or a kernel crash — a crashed plugin loses nothing the page
cache holds — and either of those is a reboot, which changes the kernel's
``boot_id``. So a tree is committed (renamed into place) at once, with a marker
naming the boot it was written in; a background thread runs ``syncfs`` and then
rewrites the marker durably as ``synced``. At start, a tree whose marker is not
``synced`` and names another boot may have lost data and is removed (it is
pulled again when next needed); one from this boot is still in the page cache
and is simply synced again. Trees of ``--no-durable-commit`` carry no boot id.
"""

from __future__ import annotations

import json
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

from rukpak.common.background import Chore
from rukpak.common.fsio import syncfs, write_json_atomic

log = logging.getLogger(__name__)

BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str:
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


def lost_in_reboot(marker: dict[str, Any]) -> bool:
    """Whether a marker's tree was never synced and was written before this boot."""
    written = marker.get("boot_id")
    return bool(written) and not marker.get("synced") and written != boot_id()


class TreeSyncer:
    """Flushes committed trees in the background and marks them ``synced``."""

    def __init__(self, unpacked_dir: Path, marker_path: Callable[[str], Path]) -> None:
        self.unpacked_dir = unpacked_dir
        self._marker_path = marker_path
        self._boot = boot_id()
        self._pending: set[str] = set()
        self._lock = threading.Lock()
        self._chore = Chore("sync-trees", self.sync_now, failure="cannot sync committed trees")

    def commit_marker(self, digest: str, **fields: Any) -> dict[str, Any]:
        """The marker of a tree committed now, before it is synced."""
        return {"digest": digest, **fields, "boot_id": self._boot}

    def request(self, digest: str) -> None:
        with self._lock:
            self._pending.add(digest)
        self._chore.wake()  # a failed sync leaves trees unsynced: distrusted after a reboot

    def sync_now(self) -> list[str]:
        """Sync every pending tree now; returns the digests marked ``synced``."""
        with self._lock:
            pending, self._pending = self._pending, set()
        if not pending:
            return []
        try:
            syncfs(self.unpacked_dir)
        except OSError:
            with self._lock:
                self._pending |= pending
            raise
        done = []
        for digest in sorted(pending):
            path = self._marker_path(digest)
            try:
                marker = json.loads(path.read_bytes())
            except (OSError, ValueError):
                continue  # evicted meanwhile
            marker["synced"] = True
            write_json_atomic(path, marker)
            done.append(digest)
        return done
