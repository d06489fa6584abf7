"""A bundle's content beside ``manifests/``: what ``rukpak bundle build`` packs with it.

Registry+v1 bundles keep ``metadata/`` (annotations, dependencies) next to
``manifests/``; others carry ``tests/``, docs or a Dockerfile. Everything at the
top of the bundle directory other than ``manifests/`` (checked by
``provisioner.bundle.validate``) goes into the image as it is, found here and
packed by ``provisioner.bundle.build``. Nothing is dropped silently:

- hidden entries (names starting with ".", such as ``.git``) are left out of
  the image, as they are in ``manifests/``, and reported (``Extras.left_out``);
- what a tar layer cannot carry faithfully is refused with an error naming the
  path and what to do: sockets, FIFOs, devices, symlinks that are absolute or
  point outside the bundle, files or directories that cannot be read, names
  that are not UTF-8.

Directories, regular files and symlinks that stay inside the bundle are
kept. Only local files are read.
"""

from __future__ import annotations

import os
import stat
from dataclasses import dataclass
from pathlib import Path, PurePosixPath
from typing import Literal

from provisioner.bundle.validate import MANIFESTS_DIR
from rukpak.common import errors

EntryType = Literal["dir", "file", "symlink"]


@dataclass(frozen=True)
class Entry:
    """One member of the layer beside ``manifests/``."""

    member: str
    """Its path in the image, e.g. ``metadata/annotations.yaml`` (directories end in /)."""
    path: Path
    type: EntryType
    size: int = 0
    executable: bool = False
    """A regular file with an execute bit: packed 0755 (else 0644)."""
    target: str = ""
    """A symlink's target, as written in the link (relative, inside the bundle)."""


@dataclass(frozen=True)
class Extras:
    entries: tuple[Entry, ...]
    """In the order they are packed: sorted by path, each directory before its content."""
    left_out: tuple[str, ...]
    """Hidden entries not packed (paths relative to the bundle), for the build report."""

    @property
    def files(self) -> tuple[Entry, ...]:
        return tuple(e for e in self.entries if e.type == "file")


NONE = Extras(entries=(), left_out=())
"""A bundle with nothing beside ``manifests/``."""


def collect(root: Path) -> Extras:
    """Every packable entry of ``root`` outside ``manifests/``; refuses what cannot be packed."""
    entries: list[Entry] = []
    left_out: list[str] = []
    for name in _names(root):
        if name == MANIFESTS_DIR:
            continue
        _walk(root, PurePosixPath(name), entries, left_out)
    return Extras(entries=tuple(entries), left_out=tuple(left_out))


def _names(directory: Path) -> list[str]:
    try:
        names = os.listdir(directory)
    except OSError as exc:
        raise errors.InvalidArgument(
            f"{directory}: cannot list it ({exc.strerror}); make it readable or remove it"
        ) from None
    for name in names:
        try:
            name.encode("utf-8")
        except UnicodeEncodeError:
            raise errors.InvalidArgument(
                f"{directory / name!s}: file name is not valid UTF-8; rename it"
            ) from None
    return sorted(names)


def _walk(root: Path, rel: PurePosixPath, entries: list[Entry], left_out: list[str]) -> None:
    if rel.name.startswith("."):
        left_out.append(str(rel))
        return
    path = root / rel
    st = os.lstat(path)
    mode = st.st_mode
    if stat.S_ISLNK(mode):
        entries.append(Entry(str(rel), path, "symlink", target=_inside_target(root, rel)))
    elif stat.S_ISDIR(mode):
        entries.append(Entry(f"{rel}/", path, "dir"))
        for name in _names(path):
            _walk(root, rel / name, entries, left_out)
    elif stat.S_ISREG(mode):
        if not os.access(path, os.R_OK):
            raise errors.InvalidArgument(
                f"{path} cannot be read; make it readable (chmod +r) or remove it from the bundle"
            )
        executable = bool(mode & 0o111)
        entries.append(Entry(str(rel), path, "file", size=st.st_size, executable=executable))
    else:
        raise errors.InvalidArgument(
            f"{path} is a {_kind(mode)}; bundle images carry directories, regular files and "
            "symlinks inside the bundle only: remove it"
        )


def _inside_target(root: Path, rel: PurePosixPath) -> str:
    """The link text of symlink ``rel`` when it stays inside the bundle; refuses it otherwise."""
    path = root / rel
    target = os.readlink(path)
    if os.path.isabs(target):
        raise errors.InvalidArgument(
            f"{path} is a symlink to the absolute path {target}; bundle images can only keep "
            "relative links inside the bundle: replace it with a copy or a relative link"
        )
    resolved = os.path.normpath(os.path.join(str(rel.parent), target))
    if resolved == ".." or resolved.startswith("../"):
        raise errors.InvalidArgument(
            f"{path} is a symlink to {target}, outside the bundle; replace it with a copy"
        )
    return target


def _kind(mode: int) -> str:
    if stat.S_ISSOCK(mode):
        return "socket"
    if stat.S_ISFIFO(mode):
        return "FIFO (named pipe)"
    if stat.S_ISCHR(mode):
        return "character device"
    if stat.S_ISBLK(mode):
        return "block device"
    return "special file"
