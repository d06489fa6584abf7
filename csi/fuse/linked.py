"""Fully fetched FUSE trees as real directories of hard links into the file store.

Where it sits: beside the overlay (``csi.fuse.overlay``), under the FUSE publisher
(``csi.fuse.publisher``), which asks :meth:`LinkedTrees.present` first when every file
of a tree is in the file store (``csi.fuse.filestore``) and falls back to the overlay
when hard links are impossible here; lazy eStargz trees with files still to fetch keep
the FUSE view. A *linked tree* is one more presentation of committed content: built
from the tree's index (``csi.fuse.index``) under ``<store>/linked/<tree>``, its
directories and symlinks real, each regular file a hard link to the store's variant
of its (content, mode, mtime) (``FileStore.variant``), and put on a pod's target as
a read-only bind mount. Reads are then ext4's, as in bind mode (no overlay, no
daemon), while identical files of every tree still share one inode, one copy on disk
and one page cache.

Rules kept: nothing is writable (the bind is read-only, ``nosuid,nodev``); names
and digests are checked by the overlay's walk (``overlay._write``: plain names,
parents that are directories of ours, hex digests); stored files are hashed against
their digests once per process before a tree naming them is first presented
(``overlay.Verifier``), DataLoss otherwise. A tree is built in a staging directory
and renamed into place, so a ``kill -9`` mid-build leaves no partial tree that a
publish would serve, and :meth:`LinkedTrees.sweep` (at start) removes staging and
trees no record presents. A tree goes when its last record is released
(:meth:`LinkedTrees.drop`); its variants then have no links left and the store's
collection (``csi.fuse.collect``) removes them. Hard links need the store and the
trees on one filesystem that supports them: :meth:`LinkedTrees.usable` probes that
once, logs a refusal once, and the publisher then presents overlays.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import shutil
import threading
from collections.abc import Iterable
from pathlib import Path

from csi import mounter as mounts
from csi.fuse import index, overlay
from csi.fuse.filestore import CHUNK, FileStore
from rukpak.common import errors

log = logging.getLogger(__name__)

STAGING = ".staging-"
_HEX = frozenset("0123456789abcdef")


class LinkedTrees:
    """Linked trees under ``root`` (on the file store's filesystem), bound read-only."""

    def __init__(self, root: Path, files: FileStore, verifier: overlay.Verifier) -> None:
        self.root = root
        self.files = files
        self.verifier = verifier
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._usable: bool | None = None

    def usable(self) -> bool:
        """Whether hard links from ``root`` into the store work (probed once, logged once)."""
        if self._usable is None:
            self._usable = self._probe()
        return self._usable

    def _probe(self) -> bool:
        if os.stat(self.root).st_dev != os.stat(self.files.files_dir).st_dev:
            log.warning(
                "msg=%r trees=%s store=%s",
                "linked trees and the file store are on different filesystems; "
                "fetched trees are presented as overlays",
                self.root,
                self.files.files_dir,
            )
            return False
        source = self.files.ingest_dir / f"probe-{secrets.token_hex(6)}"
        link = self.root / f"{STAGING}probe-{secrets.token_hex(6)}"
        try:
            source.touch(mode=0o400)
            os.link(source, link)
        except OSError as exc:
            log.warning(
                "msg=%r trees=%s error=%r",
                "no hard links into the file store here; fetched trees are presented as overlays",
                self.root,
                str(exc),
            )
            return False
        finally:
            link.unlink(missing_ok=True)
            source.unlink(missing_ok=True)
        return True

    def path(self, name: str) -> Path:
        if not _is_hex(name):
            raise errors.InvalidArgument(f"tree name {name!r} is not a hex digest")
        return self.root / name

    # --- presenting -------------------------------------------------------------------

    def present(
        self,
        name: str,
        tree: index.Index,
        target: Path,
        mounter: mounts.MounterProtocol,
        *,
        image: str,
    ) -> None:
        """Bind tree ``name``'s linked directory read-only on ``target`` (an existing
        directory). DataLoss naming the file when a stored file is missing or does not
        match its digest: nothing is mounted."""
        mounter.bind_read_only(self.build(name, tree, image=image), target)

    def build(self, name: str, tree: index.Index, *, image: str) -> Path:
        """Tree ``name``'s linked directory, built once (staging, then rename)."""
        final = self.path(name)
        with self._lock, self.files.variants_lock:
            self.verifier.check(name, tree, image=image)
            if final.is_dir():
                return final
            staging = self.root / f"{STAGING}{secrets.token_hex(6)}"
            try:
                overlay._write(tree, staging, self._link)
                os.rename(staging, final)
            except BaseException:
                remove_tree(staging)
                raise
        log.info("msg=%r tree=%s files=%d", "linked tree built", name, len(tree.rows))
        return final

    def _link(self, path: str, row: index.Row, hexdigest: str) -> None:
        """``path`` as a hard link to the variant of ``row``'s content, mode and mtime."""
        mode = row.mode & 0o777
        try:
            source = self.files.variant(f"sha256:{hexdigest}", mode, row.mtime)
        except FileNotFoundError:
            raise errors.DataLoss(
                f"the node's store lost the file {row.digest} of {row.name!r} while its tree "
                "was linked; publish again"
            ) from None
        try:
            os.link(source, path)
        except OSError as exc:
            if exc.errno != errno.EMLINK:
                raise
            _copy(source, path, mode=mode, mtime=row.mtime)  # the inode's links are full

    def tree_of(self, info: mounts.MountInfo) -> str | None:
        """The linked tree the bind mount ``info`` presents; None for any other mount."""
        if info.fstype == "overlay" or info.fstype.startswith("fuse"):
            return None
        head, _, name = info.root.rstrip("/").rpartition("/")
        if head.rpartition("/")[2] != self.root.name or not _is_hex(name):
            return None
        return name if (self.root / name).is_dir() else None

    def is_presenting(self, info: mounts.MountInfo, name: str) -> bool:
        return self.tree_of(info) == name

    # --- removing -------------------------------------------------------------------

    def drop(self, name: str) -> None:
        """Remove tree ``name`` (its last volume is gone); idempotent."""
        with self._lock:
            remove_tree(self.path(name))

    def sweep(self, keep: Iterable[str]) -> int:
        """Remove trees not in ``keep`` and unfinished staging (call at start)."""
        wanted = set(keep)
        removed = 0
        with self._lock:
            for entry in self.root.iterdir():
                if entry.name not in wanted:
                    remove_tree(entry)
                    removed += 1
        return removed

    def names(self) -> list[str]:
        return [p.name for p in self.root.iterdir() if _is_hex(p.name)]


def remove_tree(path: Path) -> None:
    """Remove a linked tree whose directories are read-only (idempotent)."""
    if path.is_symlink() or path.is_file():
        path.unlink(missing_ok=True)
        return
    if not path.is_dir():
        return
    for directory, _, _ in os.walk(path):  # top-down: a parent is writable before its children
        os.chmod(directory, 0o700)
    shutil.rmtree(path, ignore_errors=True)


def _copy(source: str, path: str, *, mode: int, mtime: int) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    with open(source, "rb") as src, open(os.open(path, flags, 0o600), "wb") as dst:
        shutil.copyfileobj(src, dst, CHUNK)
        dst.flush()
        os.fchmod(dst.fileno(), mode)
        os.utime(dst.fileno(), ns=(mtime * 10**9,) * 2)


def _is_hex(text: str) -> bool:
    return bool(text) and set(text) <= _HEX
