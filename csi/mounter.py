"""The mount seam: read-only bind mounts and the mount table, nothing else.

Where it sits: the only module of the node plugin that changes mounts. The
publish core (``csi.node.publish``) calls :class:`Mounter`; tests may pass a
fake with the same methods. Mounts are direct system calls (forking
``mount(8)`` twice cost ~5 ms of every publish).

A read-only bind mount is made read-only *before* it is attached, with the
new mount API (Linux 5.12+): ``open_tree(OPEN_TREE_CLONE)`` makes a detached
copy of the tree, ``mount_setattr`` sets ``ro,nosuid,nodev`` on it, and
``move_mount`` attaches it at the target. The order matters in a container
with Bidirectional propagation: the kernel copies a mount to the host's peer
mounts as it is attached, and per-mount flags changed afterwards (the classic
bind, then ``MS_REMOUNT|MS_BIND|MS_RDONLY``) stay behind, leaving the host's
copy writable. Kernels without the new API (ENOSYS) get the classic pair,
which keeps the target's nosuid/nodev/noexec/atime flags (the kernel refuses
to clear flags locked by a user namespace). The table is read from
``/proc/self/mountinfo``, whose paths are octal-escaped.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from rukpak.common import errors

MOUNTINFO = Path("/proc/self/mountinfo")

# <sys/mount.h>
MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MS_NOEXEC = 8
MS_REMOUNT = 32
MS_NOATIME = 1024
MS_NODIRATIME = 2048
MS_BIND = 4096
MS_RELATIME = 1 << 21
MS_SHARED = 1 << 20
# statvfs f_flag bit → the mount flag a remount must repeat to keep it.
_KEPT_FLAGS = {
    os.ST_NOSUID: MS_NOSUID,
    os.ST_NODEV: MS_NODEV,
    os.ST_NOEXEC: MS_NOEXEC,
    os.ST_NOATIME: MS_NOATIME,
    os.ST_NODIRATIME: MS_NODIRATIME,
    os.ST_RELATIME: MS_RELATIME,
}
_ESCAPE = re.compile(r"\\([0-7]{3})")
_libc = ctypes.CDLL(None, use_errno=True)
_libc.syscall.restype = ctypes.c_long

# The new mount API (<linux/mount.h>); the syscall numbers are the same on x86_64
# and on the architectures that use the generic table (arm64).
SYS_OPEN_TREE = 428
SYS_MOVE_MOUNT = 429
SYS_MOUNT_SETATTR = 442
AT_FDCWD = -100
AT_EMPTY_PATH = 0x1000
OPEN_TREE_CLONE = 1
OPEN_TREE_CLOEXEC = os.O_CLOEXEC
MOVE_MOUNT_F_EMPTY_PATH = 0x4
MOUNT_ATTR_RDONLY = 0x1
MOUNT_ATTR_NOSUID = 0x2
MOUNT_ATTR_NODEV = 0x4


class _MountAttr(ctypes.Structure):
    _fields_ = [
        ("attr_set", ctypes.c_uint64),
        ("attr_clr", ctypes.c_uint64),
        ("propagation", ctypes.c_uint64),
        ("userns_fd", ctypes.c_uint64),
    ]


@dataclass(frozen=True)
class MountInfo:
    """One line of mountinfo: ``root`` is the path inside the source filesystem."""

    mount_point: str
    root: str
    options: tuple[str, ...]
    fstype: str = ""
    super_options: tuple[str, ...] = ()

    @property
    def read_only(self) -> bool:
        return "ro" in self.options


class MounterProtocol(Protocol):
    def mounts(self) -> list[MountInfo]: ...

    def bind_read_only(self, source: Path, target: Path) -> None: ...

    def unmount(self, target: Path) -> None: ...


def unescape(field: str) -> str:
    """Undo mountinfo's octal escapes (``\\040`` for a space, ...)."""
    if "\\" not in field:
        return field
    return _ESCAPE.sub(lambda m: chr(int(m.group(1), 8)), field)


def parse_mountinfo(text: str) -> list[MountInfo]:
    mounts = []
    for line in text.splitlines():
        fields = line.split(" ")
        if len(fields) < 6:
            continue
        tail = fields[fields.index("-", 6) + 1 :] if "-" in fields[6:] else []
        mounts.append(
            MountInfo(
                mount_point=unescape(fields[4]),
                root=unescape(fields[3]),
                options=tuple(fields[5].split(",")),
                fstype=tail[0] if tail else "",
                super_options=tuple(unescape(tail[2]).split(",")) if len(tail) > 2 else (),
            )
        )
    return mounts


def find(mounts: list[MountInfo], target: Path) -> MountInfo | None:
    """The topmost mount on ``target`` (the last one listed wins)."""
    wanted = str(target)
    found = None
    for m in mounts:
        if m.mount_point == wanted:
            found = m
    return found


def find_on(mounter: MounterProtocol, target: Path) -> MountInfo | None:
    """The topmost mount on ``target``, skipping the table when the mounter can tell
    cheaply that ``target`` is no mount point (``Mounter.may_be_mount_point``)."""
    may_be = getattr(mounter, "may_be_mount_point", None)
    if may_be is not None and not may_be(target):
        return None
    return find(mounter.mounts(), target)


class Mounter:
    """Real mounts via ``mount(2)``; needs CAP_SYS_ADMIN."""

    def mounts(self) -> list[MountInfo]:
        return parse_mountinfo(MOUNTINFO.read_text(encoding="utf-8", errors="surrogateescape"))

    def may_be_mount_point(self, path: Path) -> bool:
        """False only when ``path`` is surely no mount point: one statx instead of reading
        the whole mount table (whose size grows with every published volume)."""
        return _may_be_mount_root(path)

    def bind_read_only(self, source: Path, target: Path) -> None:
        if not _bind_read_only_detached(source, target):
            self._bind_then_remount(source, target)

    def _bind_then_remount(self, source: Path, target: Path) -> None:
        _mount(source, target, MS_BIND, what=f"bind mount on {target}")
        try:
            kept = os.statvfs(target).f_flag
            flags = MS_REMOUNT | MS_BIND | MS_RDONLY
            flags |= sum(ms for st, ms in _KEPT_FLAGS.items() if kept & st)
            _mount(None, target, flags, what=f"read-only remount of {target}")
        except (errors.RukpakError, OSError) as exc:
            self.unmount(target)
            if isinstance(exc, OSError):
                raise _failed(f"read-only remount of {target}", exc.errno or 0) from exc
            raise

    def share_in_place(self, path: Path) -> None:
        """Make ``path`` a mount point of its own (a bind on itself, unless it is one) in a
        shared peer group: mounts made below it later then propagate to every bind of it
        (the store volume, ``csi.node.storevolume``). Idempotent."""
        if find_on(self, path) is None:
            _mount(path, path, MS_BIND, what=f"bind mount of {path} on itself")
        _mount(None, path, MS_SHARED, what=f"shared propagation on {path}")

    def mount_overlay(self, options: str, target: Path) -> None:
        """A read-only, nosuid, nodev overlayfs on ``target`` (``csi.fuse.overlay`` builds
        ``options``); read-only from the start, so propagated copies are too."""
        flags = MS_RDONLY | MS_NOSUID | MS_NODEV
        if _libc.mount(b"rukpak", os.fsencode(target), b"overlay", ctypes.c_ulong(flags),
                       os.fsencode(options)) != 0:  # fmt: skip
            raise _failed(f"overlay mount on {target}", ctypes.get_errno())

    def mount_tmpfs(self, target: Path, options: str) -> None:
        """A private tmpfs (nosuid, nodev, noexec) on ``target`` for plugin metadata."""
        flags = MS_NOSUID | MS_NODEV | MS_NOEXEC
        if _libc.mount(b"rukpak-meta", os.fsencode(target), b"tmpfs", ctypes.c_ulong(flags),
                       os.fsencode(options)) != 0:  # fmt: skip
            raise _failed(f"tmpfs mount on {target}", ctypes.get_errno())

    def detach(self, target: Path) -> None:
        """A lazy unmount (``MNT_DETACH``): gone from the table now, freed when unused."""
        if _libc.umount2(os.fsencode(target), 2) != 0:
            raise _failed(f"detaching {target}", ctypes.get_errno())

    def unmount(self, target: Path) -> None:
        if _libc.umount2(os.fsencode(target), 0) != 0:
            raise _failed(f"unmount of {target}", ctypes.get_errno())


class _Statx(ctypes.Structure):
    _fields_ = [  # the head of struct statx (<linux/stat.h>); the buffer is 256 bytes
        ("mask", ctypes.c_uint32),
        ("blksize", ctypes.c_uint32),
        ("attributes", ctypes.c_uint64),
        ("nlink", ctypes.c_uint32),
        ("uid", ctypes.c_uint32),
        ("gid", ctypes.c_uint32),
        ("mode", ctypes.c_uint16),
        ("spare0", ctypes.c_uint16),
        ("ino", ctypes.c_uint64),
        ("size", ctypes.c_uint64),
        ("blocks", ctypes.c_uint64),
        ("attributes_mask", ctypes.c_uint64),
        ("rest", ctypes.c_uint8 * 192),
    ]


AT_SYMLINK_NOFOLLOW = 0x100
STATX_ATTR_MOUNT_ROOT = 0x2000  # Linux 5.8+


def _may_be_mount_root(path: Path) -> bool:
    statx = getattr(_libc, "statx", None)
    if statx is None:
        return True
    buf = _Statx()
    if statx(AT_FDCWD, os.fsencode(path), AT_SYMLINK_NOFOLLOW, 0, ctypes.byref(buf)) != 0:
        return ctypes.get_errno() != errno.ENOENT  # absent: surely not mounted on
    if not buf.attributes_mask & STATX_ATTR_MOUNT_ROOT:
        return True  # this kernel does not say
    return bool(buf.attributes & STATX_ATTR_MOUNT_ROOT)


def _bind_read_only_detached(source: Path, target: Path) -> bool:
    """The new-API read-only bind mount; False when this kernel lacks the API."""
    fd = _libc.syscall(
        SYS_OPEN_TREE, AT_FDCWD, os.fsencode(source), OPEN_TREE_CLONE | OPEN_TREE_CLOEXEC
    )
    if fd < 0:
        code = ctypes.get_errno()
        if code == errno.ENOSYS:
            return False
        raise _failed(f"clone of {source} for {target}", code)
    try:
        attr = _MountAttr(MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID | MOUNT_ATTR_NODEV, 0, 0, 0)
        size = ctypes.sizeof(attr)
        if _libc.syscall(SYS_MOUNT_SETATTR, fd, b"", AT_EMPTY_PATH, ctypes.byref(attr), size):
            code = ctypes.get_errno()
            if code == errno.ENOSYS:
                return False
            raise _failed(f"read-only flag on the clone of {source}", code)
        target_path = os.fsencode(target)
        if _libc.syscall(SYS_MOVE_MOUNT, fd, b"", AT_FDCWD, target_path, MOVE_MOUNT_F_EMPTY_PATH):
            raise _failed(f"bind mount on {target}", ctypes.get_errno())
    finally:
        os.close(fd)
    return True


def _mount(source: Path | None, target: Path, flags: int, *, what: str) -> None:
    src = None if source is None else os.fsencode(source)
    if _libc.mount(src, os.fsencode(target), None, ctypes.c_ulong(flags), None) != 0:
        raise _failed(what, ctypes.get_errno())


def _failed(what: str, code: int) -> errors.RukpakError:
    hint = "the plugin needs CAP_SYS_ADMIN and Bidirectional mount propagation"
    if code in (errno.ENOENT, errno.ENOTDIR):
        hint = "the source or target vanished; retry"
    return errors.Internal(
        f"{what} failed: {os.strerror(code)} ({errno.errorcode.get(code, code)}); {hint}"
    )
