"""The mount seam: read-only bind mounts and the mount table, nothing else.

Where it sits: the only module of the node plugin that changes mounts. The
publish core (``csi.node.publish``) calls :class:`Mounter`; tests may pass a
fake with the same methods. Mounts are direct ``mount(2)``/``umount2(2)``
calls (forking ``mount(8)`` twice cost ~5 ms of every publish): a bind
mount, then a ``MS_REMOUNT|MS_BIND|MS_RDONLY`` remount, because a bind mount
ignores ``ro`` on its first call; the remount keeps the nosuid/nodev/noexec/atime
flags the target already has (the kernel refuses to clear flags locked by a
user namespace). The table is read from ``/proc/self/mountinfo``, whose paths
are octal-escaped.
"""

from __future__ import annotations

import ctypes
import errno
import os
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from csi import errors

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


@dataclass(frozen=True)
class MountInfo:
    """One line of mountinfo: ``root`` is the path inside the source filesystem."""

    mount_point: str
    root: str
    options: tuple[str, ...]

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
        mounts.append(
            MountInfo(
                mount_point=unescape(fields[4]),
                root=unescape(fields[3]),
                options=tuple(fields[5].split(",")),
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


class Mounter:
    """Real mounts via ``mount(2)``; needs CAP_SYS_ADMIN."""

    def mounts(self) -> list[MountInfo]:
        return parse_mountinfo(MOUNTINFO.read_text(encoding="utf-8", errors="surrogateescape"))

    def bind_read_only(self, source: Path, target: Path) -> None:
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

    def unmount(self, target: Path) -> None:
        if _libc.umount2(os.fsencode(target), 0) != 0:
            raise _failed(f"unmount of {target}", ctypes.get_errno())


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
