"""The mount seam: read-only bind mounts and the mount table, nothing else.

Where it sits: the only module of the node plugin that changes mounts. The
publish core (``csi.node.publish``) calls :class:`Mounter`; tests may pass a
fake with the same methods. Mounts go through ``mount(8)``/``umount(8)`` (two
steps: ``--bind``, then ``remount,bind,ro``, because a bind mount ignores
``ro`` on its first call on older kernels); the table is read from
``/proc/self/mountinfo``, whose paths are octal-escaped.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

from csi import errors

MOUNTINFO = Path("/proc/self/mountinfo")
TIMEOUT = 60.0


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
    out = []
    i = 0
    while i < len(field):
        if field[i] == "\\" and i + 4 <= len(field) and field[i + 1 : i + 4].isdigit():
            out.append(chr(int(field[i + 1 : i + 4], 8)))
            i += 4
        else:
            out.append(field[i])
            i += 1
    return "".join(out)


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
    """Real mounts via ``mount(8)``; needs CAP_SYS_ADMIN."""

    def mounts(self) -> list[MountInfo]:
        return parse_mountinfo(MOUNTINFO.read_text(encoding="utf-8", errors="surrogateescape"))

    def bind_read_only(self, source: Path, target: Path) -> None:
        _run(["mount", "--bind", "--", str(source), str(target)], what=f"bind mount on {target}")
        try:
            _run(
                ["mount", "-o", "remount,bind,ro", "--", str(target)],
                what=f"read-only remount of {target}",
            )
        except errors.RukpakError:
            self.unmount(target)
            raise

    def unmount(self, target: Path) -> None:
        _run(["umount", "--", str(target)], what=f"unmount of {target}")


def _run(argv: list[str], *, what: str) -> None:
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=TIMEOUT, stdin=subprocess.DEVNULL
        )
    except (OSError, subprocess.TimeoutExpired) as exc:
        raise errors.Internal(f"{what} failed: {exc}") from exc
    if done.returncode != 0:
        raise errors.Internal(
            f"{what} failed (exit {done.returncode}): {done.stderr.strip()[:500]}; "
            "the plugin needs CAP_SYS_ADMIN and Bidirectional mount propagation"
        )
