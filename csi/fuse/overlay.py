"""Kernel-speed presentation of fully fetched FUSE trees: overlayfs over metadata-only files.

Where it sits: beside the FUSE filesystem (``csi.fuse.fs``), under the FUSE
publisher (``csi.fuse.publisher``), which asks :meth:`MetaTrees.present` to put a
tree on a pod's target when every file of the tree is in the file store
(``csi.fuse.filestore``); lazy eStargz trees with files still to fetch keep the
FUSE view. The idea is composefs's, without its tools (none in this Debian):

- a *metadata tree* per image tree, built from its index (``csi.fuse.index``) in
  a private tmpfs: directories, symlinks, and for each regular file an empty
  file of the right size, mode and mtime carrying ``trusted.overlay.metacopy``
  and ``trusted.overlay.redirect = /<hex digest>``;
- a read-only overlayfs mounted on the target with that tree as its lower layer
  and the store's ``files/sha256`` directory as a *data-only* lower layer
  (``lowerdir=META::DATA``, Linux 6.5+): lookups and metadata come from the
  metadata tree, every open goes straight to the stored file, so reads, opens
  and ioctls never reach a daemon and the page cache of a file is shared by
  every tree that holds it (file-level dedup kept).

The metadata lives in tmpfs because ext4 cannot keep the 65-byte redirect inside
the inode: each metadata file would cost a 4 KiB xattr block on disk (41 MB for
10,000 files), more than a version's changed content. In memory a file costs
about 1.5 KiB of kernel memory (charged to the plugin's cgroup) while a volume
presents its tree; the tmpfs holds at most :data:`TMPFS_INODES` inodes (~96 MiB),
and a tree that does not fit is ResourceExhausted here and gets the FUSE view
(the publisher falls back). A tree's
metadata goes when the last record naming it is released
(:meth:`MetaTrees.drop`); mounted overlays hold references of their own, so a
lost tmpfs (a restarted plugin container) never breaks a published volume, and
the next publish builds the metadata again.

Rules kept: nothing is writable (the overlay has no upper layer and is mounted
``ro,nosuid,nodev``); names come from an index whose entries passed the spine's
checks and are checked again here (no ``/``, ``.`` or ``..``), every path is
built under a fresh staging directory of ours; redirects name only hex digests
inside the data layer; a stored file is hashed against its digest once per
process before a tree naming it is first presented; a missing or damaged file
fails the publish with DataLoss naming it, never wrong content.
"""

from __future__ import annotations

import errno
import logging
import os
import secrets
import shutil
import threading
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import Protocol

from csi import mounter as mounts
from csi.fuse import filestore, index
from csi.fuse.filestore import FileStore
from rukpak.common import errors

log = logging.getLogger(__name__)

METACOPY = "trusted.overlay.metacopy"
REDIRECT = "trusted.overlay.redirect"
STAGING = ".staging-"
TMPFS_INODES = 65_536  # ~1.5 KiB of kernel memory each, in use
TMPFS_OPTIONS = f"mode=0700,nr_inodes={TMPFS_INODES}"
_UNSAFE = (",", ":", "\\", "\n", " ")
_HEX = frozenset("0123456789abcdef")


class OverlayMounter(Protocol):
    """What presenting a tree needs of the mount seam (``csi.mounter.Mounter``)."""

    def mounts(self) -> list[mounts.MountInfo]: ...

    def mount_overlay(self, options: str, target: Path) -> None: ...

    def mount_tmpfs(self, target: Path, options: str) -> None: ...


def supported(mounter: object) -> bool:
    """Whether ``mounter`` can make overlay mounts (tests' fakes cannot)."""
    return hasattr(mounter, "mount_overlay") and hasattr(mounter, "mount_tmpfs")


class Verifier:
    """Checks that a tree's stored files are present and, once per process, intact; shared
    by every kernel-speed presentation (this overlay, ``csi.fuse.linked``)."""

    def __init__(self, files: FileStore) -> None:
        self.files = files
        self._verified: set[str] = set()

    def missing(self, tree: index.Index) -> list[index.Row]:
        """The tree's files the store does not hold (one ``stat`` each)."""
        return list(self._absent(tree))

    def complete(self, tree: index.Index) -> bool:
        """Whether the store holds every file of the tree; stops at the first one it
        lacks (a lazy tree just indexed: one ``stat``, not one a file)."""
        return next(self._absent(tree), None) is None

    def _absent(self, tree: index.Index) -> Iterator[index.Row]:
        prefix = f"{self.files.files_dir}{os.sep}"
        return (
            row
            for row in tree.files()
            if not os.path.isfile(prefix + row.digest.removeprefix("sha256:"))
        )

    def check(self, name: str, tree: index.Index, *, image: str) -> None:
        """Every file present, and hashed once by this process; DataLoss otherwise."""
        lost = self.missing(tree)
        if lost:
            row = lost[0]
            raise errors.DataLoss(
                f"image {image}: the node's store lacks {len(lost)} file(s) of tree {name}, "
                f"e.g. {_path_of(tree, row)!r} ({row.digest}, expected at "
                f"{self.files.path(row.digest)}); the store was damaged outside the plugin: "
                "remove the plugin's state directory on this node so the image is pulled again"
            )
        for row in tree.files():
            if row.digest in self._verified:
                continue
            fd = self.files.open_fd(row.digest)
            ok = False
            if fd is not None:
                try:
                    ok = filestore.verify_fd(fd, row.digest)
                finally:
                    os.close(fd)
            if not ok:
                raise errors.DataLoss(
                    f"image {image}: the stored file for {_path_of(tree, row)!r} does not match "
                    f"its digest {row.digest} ({self.files.path(row.digest)}); the store was "
                    "damaged outside the plugin: remove the plugin's state directory on this "
                    "node so the image is pulled again"
                )
            self._verified.add(row.digest)


class MetaTrees:
    """Metadata trees in a private tmpfs at ``root``, presented as overlays over ``files``."""

    def __init__(self, root: Path, files: FileStore) -> None:
        self.root = root
        self.files = files
        self.data_dir = files.files_dir
        for path in (root, self.data_dir):
            if any(c in str(path) for c in _UNSAFE):
                raise errors.InvalidArgument(
                    f"path {path} holds a character overlayfs options cannot carry "
                    f"({' '.join(repr(c) for c in _UNSAFE)}); choose another --state-dir"
                )
        self._lock = threading.Lock()
        self.verifier = Verifier(files)
        self._mounted = False

    # --- the tmpfs ------------------------------------------------------------------

    def ensure_mounted(self, mounter: OverlayMounter) -> None:
        """Mount the tmpfs on ``root`` unless it is mounted there (idempotent)."""
        if self._mounted:
            return
        self.root.mkdir(mode=0o700, parents=True, exist_ok=True)
        if mounts.find(mounter.mounts(), self.root) is None:
            mounter.mount_tmpfs(self.root, TMPFS_OPTIONS)
        self._mounted = True

    def sweep(self, keep: Iterable[str]) -> int:
        """Remove metadata trees not in ``keep`` and unfinished staging (call at start)."""
        wanted = set(keep)
        removed = 0
        if not self.root.is_dir():
            return 0
        for entry in self.root.iterdir():
            if entry.name not in wanted:
                shutil.rmtree(entry, ignore_errors=True)
                removed += 1
        return removed

    def path(self, name: str) -> Path:
        if not _is_hex(name):
            raise errors.InvalidArgument(f"tree name {name!r} is not a hex digest")
        return self.root / name

    # --- presenting -------------------------------------------------------------------

    def complete(self, tree: index.Index) -> bool:
        """Whether the store holds every file of the tree (``Verifier.complete``)."""
        return self.verifier.complete(tree)

    def present(
        self, name: str, tree: index.Index, target: Path, mounter: OverlayMounter, *, image: str
    ) -> None:
        """Mount tree ``name`` read-only on ``target`` (an existing directory).

        DataLoss naming the file when a stored file is missing or does not match its
        digest: nothing is mounted.
        """
        self.ensure_mounted(mounter)
        meta = self.build(name, tree, image=image)
        mounter.mount_overlay(self.options(meta), target)

    def options(self, meta: Path) -> str:
        return f"lowerdir={meta}::{self.data_dir},metacopy=on,redirect_dir=follow"

    def is_presenting(self, info: mounts.MountInfo, name: str) -> bool:
        """Whether the mount ``info`` is our overlay of tree ``name``."""
        return self.tree_of(info) == name

    def tree_of(self, info: mounts.MountInfo) -> str | None:
        """The tree our overlay ``info`` presents; None for any other mount."""
        if info.fstype != "overlay":
            return None
        prefix = f"lowerdir={self.root}/"
        for option in info.super_options:
            if option.startswith(prefix) and option.endswith(f"::{self.data_dir}"):
                name = option[len(prefix) : -len(f"::{self.data_dir}")]
                return name if _is_hex(name) else None
        return None

    def build(self, name: str, tree: index.Index, *, image: str) -> Path:
        """The metadata tree of ``name``, built once (atomically: staging, then rename)."""
        final = self.path(name)
        with self._lock:
            self.verifier.check(name, tree, image=image)
            if final.is_dir():
                return final
            staging = self.root / f"{STAGING}{secrets.token_hex(6)}"
            try:
                _write(tree, staging)
                os.rename(staging, final)
            except BaseException as exc:
                shutil.rmtree(staging, ignore_errors=True)
                if isinstance(exc, OSError) and exc.errno in (errno.ENOSPC, errno.ENOMEM):
                    raise errors.ResourceExhausted(
                        f"tree {name} ({len(tree.rows)} entries) does not fit in the overlay "
                        f"metadata tmpfs ({TMPFS_INODES} inodes, {self.root})"
                    ) from None
                raise
        log.info("msg=%r tree=%s files=%d", "metadata tree built", name, len(tree.rows))
        return final

    def drop(self, name: str) -> None:
        """Remove tree ``name``'s metadata (its last volume is gone); idempotent."""
        with self._lock:
            shutil.rmtree(self.path(name), ignore_errors=True)


FileMaker = Callable[[str, index.Row, str], None]


def _metacopy_file(path: str, row: index.Row, hexdigest: str) -> None:
    """An empty file of ``row``'s size, mode and mtime redirecting to the stored file."""
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(path, flags, row.mode & 0o777)
    try:
        os.ftruncate(fd, row.size)
        os.setxattr(fd, METACOPY, b"")
        os.setxattr(fd, REDIRECT, b"/" + hexdigest.encode())
        os.fchmod(fd, row.mode & 0o777)
        os.utime(fd, ns=(row.mtime * 10**9,) * 2)
    finally:
        os.close(fd)


def _write(tree: index.Index, root: Path, make_file: FileMaker = _metacopy_file) -> None:
    """Create the directories and symlinks of ``tree`` at ``root`` (which must not exist),
    each regular file by ``make_file(path, row, hex digest)`` (default: the overlay's
    metadata file). Names and digests are checked here, whoever makes the files."""
    paths = [str(root)]
    dirs: list[tuple[str, int]] = []
    os.mkdir(root, 0o700)
    for row_id, row in enumerate(tree.rows):
        if row_id == 0:
            paths_row = paths[0]
            dirs.append((paths_row, row.mtime))
            continue
        if not row.name or "/" in row.name or row.name in (".", "..") or "\0" in row.name:
            raise errors.InvalidArgument(f"index entry name {row.name!r} is not a plain name")
        if not 0 <= row.parent < row_id or tree.rows[row.parent].kind != index.DIR:
            raise errors.InvalidArgument(f"index entry {row.name!r}: its parent is no directory")
        path = f"{paths[row.parent]}/{row.name}"
        paths.append(path)
        if row.kind == index.DIR:
            os.mkdir(path, row.mode & 0o777)
            dirs.append((path, row.mtime))
        elif row.kind == index.LINK:
            os.symlink(row.target, path)
            os.utime(path, ns=(row.mtime * 10**9,) * 2, follow_symlinks=False)
        elif row.kind == index.FILE:
            hexdigest = row.digest.removeprefix("sha256:")
            if not _is_hex(hexdigest) or len(hexdigest) != 64:
                raise errors.InvalidArgument(f"index entry {row.name!r}: bad digest {row.digest!r}")
            make_file(path, row, hexdigest)
    os.chmod(root, tree.rows[0].mode & 0o777 if tree.rows else 0o555)
    for path, mtime in reversed(dirs):  # children first: adding them changed the parents
        os.utime(path, ns=(mtime * 10**9,) * 2)


def _path_of(tree: index.Index, row: index.Row) -> str:
    parts = [row.name]
    parent = row.parent
    while parent > 0:
        parts.append(tree.rows[parent].name)
        parent = tree.rows[parent].parent
    return "/".join(reversed(parts))


def _is_hex(text: str) -> bool:
    return bool(text) and set(text) <= _HEX
