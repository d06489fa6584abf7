"""The one commit recipe of the node's stores: stage, make durable, rename, marker last.

Where it sits: below every store that keeps content on a node — the image cache's trees
(``rukpak.image.cache``), the git and http trees beside them (``rukpak.sources.cache``)
and the FUSE file store (``csi.fuse.filestore``, whose tree indexes are its markers,
``csi.fuse.images``). Nothing here knows what a tree holds: callers fill a staging
directory or an ingest file, this module puts it in place.

The recipe, for a file or a tree:

1. **stage**: content is written under a name readers never look up (``<hex>.tmp-<rand>``
   beside the tree's final place; a file store's ``ingest/``), so an unfinished commit is
   invisible, and a crash leaves only names that start-up removes (:meth:`Trees.recover`).
2. **durable**: a file is fsynced before its rename (:func:`place`); a tree, many files at
   once, is made durable by one ``syncfs`` of its filesystem — either in the background
   after the commit (:class:`Syncer`: the tree's marker names the boot it was written in,
   and says ``synced`` once flushed; a tree not synced before a reboot is distrusted at the
   next start), or by the writer before it commits what names its files (a FUSE index).
3. **rename** into place (``os.replace``, atomic), then fsync the directory (durable mode).
   Content already present is success: the new copy is dropped.
4. **marker** last: a tree is committed once ``<hex>.sealed`` exists; a tree renamed into
   place whose marker was never written was never committed and goes at start.

``durable=False`` (``--no-durable-commit``) keeps every step but the fsyncs: still atomic
for readers and across a crash of the process; a power loss may take recent commits.
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import secrets
import threading
from collections.abc import Callable, Collection, Iterator
from pathlib import Path
from typing import Any

from rukpak.common.background import Chore
from rukpak.common.fsio import fsync_dir, syncfs, write_json_atomic

log = logging.getLogger(__name__)

SEALED = ".sealed"
"""Suffix of a committed tree's marker, ``<hex>.sealed``, written last."""
STAGING = ".tmp-"
"""Infix of a name being written (or being removed): never served, removed at start."""
BOOT_ID = Path("/proc/sys/kernel/random/boot_id")


def boot_id() -> str:
    """The kernel's id of this boot ('' when unknown): a reboot changes it."""
    try:
        return BOOT_ID.read_text().strip()
    except OSError:
        return ""


def lost_in_reboot(marker: dict[str, Any]) -> bool:
    """Whether a marker's tree was never synced and was written before this boot."""
    written = marker.get("boot_id")
    return bool(written) and not marker.get("synced") and written != boot_id()


def sync_filesystem(path: Path) -> None:
    """Make every file written so far on ``path``'s filesystem durable (one ``syncfs``)."""
    syncfs(path)


def place(tmp: Path, final: Path, *, fd: int | None = None, durable: bool = True) -> bool:
    """Rename the staged ``tmp`` (a file, open on ``fd`` when given, or a tree) to ``final``.

    A file is fsynced first (``fd``, durable mode); the directory after the rename. Content
    already at ``final`` is success: ``tmp`` is dropped (a file) and False returned.
    """
    if final.exists():
        if fd is not None:
            tmp.unlink(missing_ok=True)
        return False
    if fd is not None and durable:
        os.fsync(fd)
    os.replace(tmp, final)
    if durable:
        fsync_dir(final.parent)
    return True


class Syncer:
    """Flushes committed trees in the background and marks them ``synced``."""

    def __init__(self, directory: Path, marker_path: Callable[[str], Path]) -> None:
        self.directory = directory
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
            syncfs(self.directory)
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


class Trees:
    """Commits trees into ``directory`` as ``<hex>`` with their marker ``<hex>.sealed``.

    ``seal`` makes a finished staging tree read-only; ``remove`` deletes a tree however it
    is sealed (both from the caller: what a tree is, is theirs). Thread-safe: every commit
    stages under its own random name.
    """

    def __init__(
        self,
        directory: Path,
        *,
        durable: bool,
        seal: Callable[[Path], None],
        remove: Callable[[Path], None],
    ) -> None:
        self.directory = directory
        self.durable = durable
        self._seal = seal
        self.remove = remove
        self.syncer = Syncer(directory, self.marker)

    def path(self, digest: str) -> Path:
        return self.directory / digest.removeprefix("sha256:")

    def marker(self, digest: str) -> Path:
        return self.directory / f"{digest.removeprefix('sha256:')}{SEALED}"

    def scratch(self, digest: str, what: str = "") -> Path:
        """A fresh name beside the trees that start-up removes (``<hex>.tmp-<what><rand>``)."""
        return self.directory / f"{digest.removeprefix('sha256:')}{STAGING}{what}{_rand()}"

    @contextlib.contextmanager
    def stage(self, digest: str) -> Iterator[Path]:
        """An empty staging directory for the tree of ``digest``, removed when the block
        fails (commit it with :meth:`commit` inside the block)."""
        staging = self.scratch(digest)
        staging.mkdir(mode=0o755)
        try:
            yield staging
        except BaseException:
            self.remove(staging)
            raise

    def commit(self, staging: Path, digest: str, **fields: Any) -> None:
        """Seal ``staging`` and make it the tree of ``digest``, marker last (``fields`` go
        into the marker). Durable mode: synced in the background, distrusted after a reboot
        until then. A tree already committed under ``digest`` is kept (``staging`` goes)."""
        self._seal(staging)
        if not place(staging, self.path(digest), durable=False):
            self.remove(staging)
            return
        if self.durable:
            marker = self.syncer.commit_marker(digest, **fields)
            write_json_atomic(self.marker(digest), marker, durable=False)
            self.syncer.request(digest)
        else:
            write_json_atomic(self.marker(digest), {"digest": digest, **fields})

    def adopt(self, digest: str) -> None:
        """Write the marker of a tree on disk that a target holds but was never marked."""
        write_json_atomic(self.marker(digest), {"digest": digest})

    def recover(
        self,
        *,
        held: Collection[str],
        forget: Callable[[str], object],
        is_tree: Callable[[str], bool],
    ) -> None:
        """Remove what a crash left, whatever it holds; never fails start.

        Staging names (``.tmp-``) go, markers without their tree go, trees without their
        marker go (renamed into place, never committed) unless a target in ``held`` (hex
        digests) holds one (written by an older plugin: adopted), and trees whose marker
        says they were not synced before a reboot go. ``forget`` is called with the hex of
        every tree removed; ``is_tree`` tells a tree's name from other files.
        """
        names = {e.name for e in self.directory.iterdir()}
        for name in sorted(names):
            entry = self.directory / name
            if STAGING in name:
                log.info("msg=%r path=%s", "removing unfinished tree", entry)
                self.remove(entry)
            elif name.endswith(SEALED):
                tree_name = name[: -len(SEALED)]
                if tree_name not in names:
                    entry.unlink(missing_ok=True)
                    continue
                marker = _read_marker(entry)
                if lost_in_reboot(marker):
                    log.warning(
                        "msg=%r path=%s",
                        "removing a tree that was not yet on disk when the node went down",
                        self.directory / tree_name,
                    )
                    entry.unlink(missing_ok=True)
                    self.remove(self.directory / tree_name)
                    forget(tree_name)
                elif marker.get("boot_id") and not marker.get("synced"):
                    self.syncer.request(f"sha256:{tree_name}")
            elif name + SEALED not in names and is_tree(name):
                if name in held:
                    log.info("msg=%r path=%s", "adopting a held tree without marker", entry)
                    self.adopt(f"sha256:{name}")
                    continue
                log.warning("msg=%r path=%s", "removing a tree that was never sealed", entry)
                self.remove(entry)
                forget(name)


def _rand() -> str:
    return secrets.token_hex(4)


def _read_marker(path: Path) -> dict[str, object]:
    try:
        doc = json.loads(path.read_bytes())
    except (OSError, ValueError):
        return {}
    return doc if isinstance(doc, dict) else {}
