"""The FUSE filesystem: every tree index, read-only, one directory per image manifest.

Where it sits: the operations the FUSE daemon (``csi.fuse.session``) serves.
The mount's root lists one directory per image tree (named by the manifest's
hex digest); the FUSE publisher bind-mounts such a directory, read-only, on a
pod's target. Content never changes, so entries and attributes carry long
timeouts and files keep the kernel's page cache across opens.

Inode numbers are stable across daemons: ``slot << 32 | row``, where a tree's
slot is recorded in ``slots.json`` the first time it is served and ``row`` is
the entry's position in its saved index. File handles are inode numbers. A
restarted daemon can therefore answer requests about inodes and handles the
kernel got from its predecessor, with no state but those files.

Warm reads stay in the kernel ("no-open" mode, Linux 4.19+): the first
``open`` and ``opendir`` answer ENOSYS, which the kernel takes as "this
filesystem needs no open calls" (``FUSE_NO_OPEN_SUPPORT``,
``FUSE_NO_OPENDIR_SUPPORT``) for the rest of the connection: opens and
releases stop reaching the daemon, files keep their page cache and directory
listings are cached. Reads then carry no handle of ours, so this needs a
pyfuse3 that passes the inode instead (``hack/pyfuse3``: 3.5.0 plus a
two-line patch, version ``3.5.0+rukpak.inodehandles``); with a stock pyfuse3
every open is a round trip as before. The mount is read-only
(``MS_RDONLY``), so the kernel refuses writes without asking us.

Every write is EROFS. A file is checked against its digest the first time a
daemon opens or reads it (a hash of the stored file); one that does not match is EIO
for the reader and an error in the log, never wrong content. Files a lazy
layer has not delivered yet are fetched through the optional ``fetcher``.
"""

from __future__ import annotations

import collections
import contextlib
import errno
import importlib.metadata
import logging
import os
import stat
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Protocol

import pyfuse3
import trio

from csi.fuse import filestore, index
from csi.fuse.filestore import FileStore
from rukpak.common.fsio import read_json_or_set_aside, write_json_atomic

log = logging.getLogger(__name__)

ROOT = pyfuse3.ROOT_INODE
SLOT_SHIFT = 32
ROW_MASK = (1 << SLOT_SHIFT) - 1
FOREVER = 365 * 24 * 3600.0  # content is immutable: cache entries and attributes "forever"
ROOT_TIMEOUT = 1.0  # the root's listing grows as trees are added
MAX_OPEN_FILES = 1024
INLINE_VERIFY = 256 * 1024
BLOCK = 4096
PATCHED_PYFUSE3 = "+rukpak.inodehandles"  # read/readdir get the inode when the handle is 0


def _pyfuse3_passes_inodes() -> bool:
    try:
        return importlib.metadata.version("pyfuse3").endswith(PATCHED_PYFUSE3)
    except importlib.metadata.PackageNotFoundError:
        return False


NO_OPEN = _pyfuse3_passes_inodes()


class Fetcher(Protocol):
    """Delivers a file a lazy layer has not fetched yet (``csi.fuse.lazy``)."""

    def fetch(self, tree: str, row: index.Row) -> None: ...


class Trees:
    """Tree name ↔ slot (persisted) and the loaded indexes."""

    def __init__(self, trees_dir: Path, slots_path: Path, files: FileStore) -> None:
        self.trees_dir = trees_dir
        self.files = files  # where the trees' directory listings are
        self.slots_path = slots_path
        loaded = read_json_or_set_aside(slots_path)
        self._slots: dict[str, int] = dict(loaded) if isinstance(loaded, dict) else {}
        self._names = {slot: name for name, slot in self._slots.items()}
        self._loaded: dict[int, index.Index] = {}
        self._lock = threading.Lock()

    def exists(self, name: str) -> bool:
        return (self.trees_dir / f"{name}.json").is_file()

    def slot(self, name: str) -> int:
        """The slot of tree ``name``, assigned (and recorded) on first use."""
        slot = self._slots.get(name)
        if slot is not None:
            return slot
        with self._lock:
            slot = self._slots.get(name)
            if slot is None:
                slot = max(self._names, default=0) + 1
                self._slots[name] = slot
                self._names[slot] = name
                # Not fsynced: slots must outlive a plugin restart (the page cache does),
                # and a power loss ends the mount they number.
                write_json_atomic(self.slots_path, self._slots, durable=False)
            return slot

    def name(self, slot: int) -> str | None:
        return self._names.get(slot)

    def offer(self, name: str, tree: index.Index) -> None:
        """A tree just indexed: serve it from memory, not by reading back what was written."""
        self._loaded[self.slot(name)] = tree

    def get(self, slot: int) -> index.Index | None:
        tree = self._loaded.get(slot)
        if tree is None:
            name = self._names.get(slot)
            if name is None or not self.exists(name):
                return None
            tree = index.load(self.trees_dir / f"{name}.json", self.files)
            self._loaded[slot] = tree
        return tree

    def names(self) -> list[str]:
        return sorted(p.stem for p in self.trees_dir.glob("*.json"))

    def forget(self, name: str) -> None:
        slot = self._slots.get(name)
        if slot is not None:
            self._loaded.pop(slot, None)


class ReadOnlyFS(pyfuse3.Operations):
    """pyfuse3 operations over :class:`Trees` and a :class:`FileStore`."""

    def __init__(
        self,
        trees: Trees,
        files: FileStore,
        *,
        fetcher: Fetcher | None = None,
        on_corrupt: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__()
        self.trees = trees
        self.files = files
        self.fetcher = fetcher
        self.on_corrupt = on_corrupt
        self._verified: set[str] = set()
        self._fds: collections.OrderedDict[str, int] = collections.OrderedDict()
        self.corrupt = 0

    # --- inodes -------------------------------------------------------------------

    def _resolve(self, inode: int) -> tuple[int, index.Index, int]:
        slot, row = inode >> SLOT_SHIFT, inode & ROW_MASK
        tree = self.trees.get(slot) if slot else None
        if tree is None or row >= len(tree.rows):
            raise pyfuse3.FUSEError(errno.ENOENT)
        return slot, tree, row

    def _attrs(self, inode: int) -> pyfuse3.EntryAttributes:
        a = pyfuse3.EntryAttributes()
        a.st_ino = inode
        a.generation = 0
        a.st_uid = 0
        a.st_gid = 0
        a.st_blksize = BLOCK
        if inode == ROOT:
            a.st_mode = stat.S_IFDIR | 0o555
            a.st_nlink = 2
            a.entry_timeout = ROOT_TIMEOUT
            a.attr_timeout = ROOT_TIMEOUT
            return a
        _slot, tree, row_id = self._resolve(inode)
        row = tree.rows[row_id]
        kind = {index.DIR: stat.S_IFDIR, index.FILE: stat.S_IFREG, index.LINK: stat.S_IFLNK}
        a.st_mode = kind[row.kind] | row.mode
        a.st_nlink = 2 if row.kind == index.DIR else 1
        a.st_size = row.size
        a.st_blocks = (row.size + 511) // 512
        ns = row.mtime * 1_000_000_000
        a.st_atime_ns = a.st_mtime_ns = a.st_ctime_ns = ns
        a.entry_timeout = FOREVER
        a.attr_timeout = FOREVER
        return a

    async def lookup(
        self, parent_inode: int, name: bytes, ctx: pyfuse3.RequestContext | None = None
    ) -> pyfuse3.EntryAttributes:
        text = os.fsdecode(name)
        if parent_inode == ROOT:
            if not self.trees.exists(text):
                raise pyfuse3.FUSEError(errno.ENOENT)
            return self._attrs(self.trees.slot(text) << SLOT_SHIFT)
        slot, tree, row = self._resolve(parent_inode)
        child = tree.children.get(row, {}).get(text)
        if child is None:
            negative = pyfuse3.EntryAttributes()
            negative.st_ino = 0  # cached "does not exist": the tree never changes
            negative.entry_timeout = FOREVER
            return negative
        return self._attrs(slot << SLOT_SHIFT | child)

    async def getattr(
        self, inode: int, ctx: pyfuse3.RequestContext | None = None
    ) -> pyfuse3.EntryAttributes:
        return self._attrs(inode)

    async def readlink(self, inode: int, ctx: pyfuse3.RequestContext) -> bytes:
        _slot, tree, row = self._resolve(inode)
        if tree.rows[row].kind != index.LINK:
            raise pyfuse3.FUSEError(errno.EINVAL)
        return os.fsencode(tree.rows[row].target)

    async def opendir(self, inode: int, ctx: pyfuse3.RequestContext) -> int:
        if inode != ROOT:
            _slot, tree, row = self._resolve(inode)
            if tree.rows[row].kind != index.DIR:
                raise pyfuse3.FUSEError(errno.ENOTDIR)
        if NO_OPEN:
            raise pyfuse3.FUSEError(errno.ENOSYS)  # the kernel caches listings from now on
        return inode

    async def readdir(self, fh: int, start_id: int, token: pyfuse3.ReaddirToken) -> None:
        if fh == ROOT:
            entries = [(n, self.trees.slot(n) << SLOT_SHIFT) for n in self.trees.names()]
        else:
            slot, tree, row = self._resolve(fh)
            base = slot << SLOT_SHIFT
            entries = [(n, base | r) for n, r in tree.children.get(row, {}).items()]
        for position in range(start_id, len(entries)):
            name, inode = entries[position]
            if not pyfuse3.readdir_reply(
                token, os.fsencode(name), self._attrs(inode), position + 1
            ):
                return

    async def releasedir(self, fh: int) -> None:
        return None

    async def open(self, inode: int, flags: int, ctx: pyfuse3.RequestContext) -> pyfuse3.FileInfo:
        if flags & (os.O_WRONLY | os.O_RDWR | os.O_TRUNC | os.O_APPEND | os.O_CREAT):
            raise pyfuse3.FUSEError(errno.EROFS)
        slot, tree, row_id = self._resolve(inode)
        row = tree.rows[row_id]
        if row.kind != index.FILE:
            raise pyfuse3.FUSEError(errno.EISDIR if row.kind == index.DIR else errno.ELOOP)
        await self._ready(slot, row)
        if NO_OPEN:
            raise pyfuse3.FUSEError(errno.ENOSYS)  # "no open needed, ever" (see the docstring)
        return pyfuse3.FileInfo(fh=inode, keep_cache=True, direct_io=False)

    async def _ready(self, slot: int, row: index.Row) -> bytes | None:
        """Make sure the row's content is present and verified; EIO otherwise.

        The check reads the stored file once, through the descriptor later reads use.
        A small file's content comes back (its first read is served from it, so a cold
        read costs one disk read, not two); None when already verified or large.
        Nothing is remembered of a failure: a later read checks again.
        """
        digest = row.digest
        if digest in self._verified:
            return None
        fd = self._fd(digest)
        if fd is None and self.fetcher is not None:
            name = self.trees.name(slot) or ""
            try:
                await trio.to_thread.run_sync(self.fetcher.fetch, name, row)
            except Exception as exc:
                log.error(
                    "msg=%r tree=%s file=%s error=%r", "fetching a file failed", name, digest, exc
                )
                raise pyfuse3.FUSEError(errno.EIO) from None
            fd = self._fd(digest)
        content: bytes | None = None
        if fd is None:
            ok = False
        elif row.size <= INLINE_VERIFY:  # a thread hop costs more than hashing a small file
            with contextlib.suppress(OSError):
                content = os.pread(fd, row.size + 1, 0)  # one more byte: a grown file fails
            ok = content is not None and filestore.matches(content, digest)
        else:
            # Its own descriptor: the cache may close ours while the thread reads.
            ok = await trio.to_thread.run_sync(self.files.verify, digest)
        if not ok:
            self._forget_fd(digest)  # a repaired or re-fetched file is opened anew
            self.corrupt += 1
            log.error(
                "msg=%r digest=%s path=%s",
                "stored file is missing or does not match its digest; the reader gets EIO",
                digest,
                self.files.path(digest),
            )
            if self.on_corrupt is not None:
                self.on_corrupt(digest)
            raise pyfuse3.FUSEError(errno.EIO)
        self._verified.add(digest)
        return content

    def _fd(self, digest: str) -> int | None:
        """The stored file's descriptor, from a small LRU of open files; None when missing."""
        fd = self._fds.get(digest)
        if fd is not None:
            self._fds.move_to_end(digest)
            return fd
        fd = self.files.open_fd(digest)
        if fd is None:
            return None
        self._fds[digest] = fd
        while len(self._fds) > MAX_OPEN_FILES:
            _old, old_fd = self._fds.popitem(last=False)
            os.close(old_fd)
        return fd

    def _forget_fd(self, digest: str) -> None:
        fd = self._fds.pop(digest, None)
        if fd is not None:
            os.close(fd)

    async def read(self, fh: int, off: int, size: int) -> bytes:
        if not fh:  # no-open mode under a pyfuse3 that drops the inode: nothing to go on
            log.error("msg=%r", "a read came without a handle; install hack/pyfuse3's pyfuse3")
            raise pyfuse3.FUSEError(errno.EIO)
        slot, tree, row_id = self._resolve(fh)
        row = tree.rows[row_id]
        if row.digest not in self._verified:  # the first read (no-open mode), or a new daemon
            content = await self._ready(slot, row)
            if content is not None:
                return content[off : off + size]
        fd = self._fd(row.digest)
        try:
            if fd is None:
                raise FileNotFoundError(errno.ENOENT, "removed from the store")
            return os.pread(fd, size, off)
        except OSError as exc:
            log.error("msg=%r digest=%s error=%r", "reading a stored file failed", row.digest, exc)
            raise pyfuse3.FUSEError(errno.EIO) from None

    async def release(self, fh: int) -> None:
        return None

    async def statfs(self, ctx: pyfuse3.RequestContext) -> pyfuse3.StatvfsData:
        s = pyfuse3.StatvfsData()
        s.f_bsize = s.f_frsize = BLOCK
        s.f_namemax = 255
        return s

    async def access(self, inode: int, mode: int, ctx: pyfuse3.RequestContext) -> bool:
        return not mode & os.W_OK

    # --- every write is EROFS -----------------------------------------------------

    async def setattr(self, *args: object, **kwargs: object) -> pyfuse3.EntryAttributes:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def mknod(self, *args: object, **kwargs: object) -> pyfuse3.EntryAttributes:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def mkdir(self, *args: object, **kwargs: object) -> pyfuse3.EntryAttributes:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def unlink(self, *args: object, **kwargs: object) -> None:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def rmdir(self, *args: object, **kwargs: object) -> None:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def symlink(self, *args: object, **kwargs: object) -> pyfuse3.EntryAttributes:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def rename(self, *args: object, **kwargs: object) -> None:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def link(self, *args: object, **kwargs: object) -> pyfuse3.EntryAttributes:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def write(self, *args: object, **kwargs: object) -> int:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def create(
        self, *args: object, **kwargs: object
    ) -> tuple[pyfuse3.FileInfo, pyfuse3.EntryAttributes]:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def setxattr(self, *args: object, **kwargs: object) -> None:
        raise pyfuse3.FUSEError(errno.EROFS)

    async def removexattr(self, *args: object, **kwargs: object) -> None:
        raise pyfuse3.FUSEError(errno.EROFS)
