"""Whole-tree operations on an unpacked image: the symlink escape check, sealing.

Where it sits: the extractor (``rukpak.image.extract``) runs the escape check once
all layers are applied, since a chain of individually harmless symlinks can
still climb out of the tree; the image cache (``rukpak.image.cache``) seals a
finished tree read-only before renaming it into place (its directories only,
when the extractor already created the files read-only), and unseals one before
deleting it (:func:`remove`). Every walk is iterative (:func:`walk`) and never
follows symlinks, so no tree depth can exhaust the stack or the descriptors.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Iterator
from pathlib import Path
from typing import NamedTuple

from rukpak.image import members

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_UP_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC


class Entry(NamedTuple):
    """One directory entry as :func:`walk` lists it (``lstat`` mode: links not followed).

    A NamedTuple, not a frozen dataclass: one is made per entry of every tree walked,
    and a tuple is a third quicker to build and a quarter smaller."""

    name: str
    mode: int

    @property
    def is_dir(self) -> bool:
        return stat.S_ISDIR(self.mode)


def _entries(fd: int) -> list[Entry]:
    out = []
    with os.scandir(fd) as it:
        for e in it:
            out.append(Entry(e.name, e.stat(follow_symlinks=False).st_mode))
    return out


def walk(root: Path) -> Iterator[tuple[int, tuple[str, ...], list[Entry]]]:
    """Every directory under ``root`` (itself first): ``(dir_fd, components, entries)``.

    Depth first and iterative, whatever the depth: no recursion, and at most two
    descriptors open at a time (the walk climbs back with ``..``; nobody else
    writes in these trees while it runs). Symlinks are listed, never followed.
    ``dir_fd`` is borrowed: valid until the next item.
    """
    fd = os.open(root, _DIR_FLAGS)
    path: list[str] = []
    pending: list[list[str]] = []
    try:
        while True:
            entries = _entries(fd)
            yield fd, tuple(path), entries
            pending.append([e.name for e in entries if e.is_dir])
            while True:
                if pending[-1]:
                    name = pending[-1].pop()
                    child = os.open(name, _DIR_FLAGS, dir_fd=fd)
                    os.close(fd)
                    fd = child
                    path.append(name)
                    break
                pending.pop()
                if not path:
                    return
                parent = os.open("..", _UP_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = parent
                path.pop()
    finally:
        os.close(fd)


def seal(root: Path) -> None:
    """Make the finished tree read-only for everyone: dirs 0555, files 0444/0555."""
    for dir_fd, _parts, entries in walk(root):
        for e in entries:
            # Modes from lstat: chmod by name must never act through a symlink.
            if e.is_dir:
                os.chmod(e.name, 0o555, dir_fd=dir_fd)
            elif stat.S_ISREG(e.mode):
                os.chmod(e.name, 0o555 if e.mode & 0o111 else 0o444, dir_fd=dir_fd)
    os.chmod(root, 0o555)


def seal_dirs(root: Path) -> None:
    """Make the directories of a tree whose files are already read-only 0555.

    For trees from ``rukpak.image.extract``, which creates files with their final
    modes: one walk that touches directories only.
    """
    for dir_fd, _parts, _entries in walk(root):
        os.fchmod(dir_fd, 0o555)


def unseal(root: Path) -> None:
    """Make a sealed tree's directories writable again so it can be deleted."""
    if not root.is_dir() or root.is_symlink():
        return
    os.chmod(root, 0o755)
    for dir_fd, _parts, _entries in walk(root):
        os.fchmod(dir_fd, 0o755)


def remove(root: Path) -> None:
    """Delete the tree at ``root`` (sealed or not, however deep); missing is fine.

    Iterative, like :func:`walk`: a staging tree left by a hostile layer with
    thousands of nested directories is removed as surely as a small one.
    """
    try:
        st = os.lstat(root)
    except FileNotFoundError:
        return
    if not stat.S_ISDIR(st.st_mode):
        os.unlink(root)
        return
    fd = os.open(root, _DIR_FLAGS)
    names: list[str] = []
    try:
        while True:
            os.fchmod(fd, 0o700)  # a sealed dir: let its entries go (root needs no bits)
            subdir = None
            for e in _entries(fd):
                if e.is_dir:
                    subdir = e.name
                    break
                os.unlink(e.name, dir_fd=fd)
            if subdir is not None:
                child = os.open(subdir, _DIR_FLAGS, dir_fd=fd)
                os.close(fd)
                fd = child
                names.append(subdir)
                continue
            if not names:
                break
            parent = os.open("..", _UP_FLAGS, dir_fd=fd)
            os.close(fd)
            fd = parent
            os.rmdir(names.pop(), dir_fd=fd)
    finally:
        os.close(fd)
    os.rmdir(root)


def escapes(root: Path, link: tuple[str, ...]) -> bool:
    """Whether the symlink at ``link`` (components under ``root``) resolves above ``root``
    (:func:`rukpak.image.members.resolves_above`, probing the disk with lstat)."""

    def probe(parts: list[str]) -> str | bool | None:
        path = root.joinpath(*parts)
        try:
            st = os.lstat(path)
        except OSError:
            return None
        return os.readlink(path) if stat.S_ISLNK(st.st_mode) else True

    return members.resolves_above(link, os.readlink(root.joinpath(*link)), probe)


def remove_escaping_symlinks(root: Path) -> list[str]:
    """Delete every symlink under ``root`` that resolves above it; returns warnings."""
    warnings = []
    for dir_fd, rel, entries in walk(root):
        for e in entries:
            if stat.S_ISLNK(e.mode) and escapes(root, (*rel, e.name)):
                os.unlink(e.name, dir_fd=dir_fd)
                shown = "/".join((*rel, e.name))[-256:]
                warnings.append(f"{shown!r}: symlink resolves outside the image")
    return warnings
