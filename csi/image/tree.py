"""Whole-tree operations on an unpacked image: the symlink escape check, sealing.

Where it sits: the extractor (``csi.image.extract``) runs the escape check once
all layers are applied, since a chain of individually harmless symlinks can
still climb out of the tree; the image cache (``csi.image.cache``) seals a
finished tree read-only before renaming it into place (its directories only,
when the extractor already created the files read-only), and unseals one before
deleting it. Every walk uses ``os.fwalk`` without following symlinks.
"""

from __future__ import annotations

import os
import stat
from pathlib import Path

MAX_SYMLINK_HOPS = 40


def seal(root: Path) -> None:
    """Make the finished tree read-only for everyone: dirs 0555, files 0444/0555."""
    for _dirpath, dirnames, filenames, dir_fd in os.fwalk(root, follow_symlinks=False):
        for name in (*filenames, *dirnames):
            # lstat first: chmod by name must never act through a symlink.
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                os.chmod(name, 0o555, dir_fd=dir_fd)
            elif stat.S_ISREG(st.st_mode):
                executable = st.st_mode & 0o111
                os.chmod(name, 0o555 if executable else 0o444, dir_fd=dir_fd)
    os.chmod(root, 0o555)


def seal_dirs(root: Path) -> None:
    """Make the directories of a tree whose files are already read-only 0555.

    For trees from ``csi.image.extract``, which creates files with their final
    modes: one walk that touches directories only.
    """
    for _dirpath, dirnames, _filenames, dir_fd in os.fwalk(root, follow_symlinks=False):
        for name in dirnames:
            # fwalk lists symlinks to directories too; chmod by name would follow them.
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                os.chmod(name, 0o555, dir_fd=dir_fd)
    os.chmod(root, 0o555)


def unseal(root: Path) -> None:
    """Make a sealed tree's directories writable again so it can be deleted."""
    if not root.is_dir() or root.is_symlink():
        return
    os.chmod(root, 0o755)
    for _dirpath, dirnames, _filenames, dir_fd in os.fwalk(root, follow_symlinks=False):
        for name in dirnames:
            st = os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
            if stat.S_ISDIR(st.st_mode):
                os.chmod(name, 0o755, dir_fd=dir_fd)


def escapes(root: Path, link: tuple[str, ...]) -> bool:
    """Whether the symlink at ``link`` (components under ``root``) resolves above ``root``.

    Resolves component by component with lstat, following in-tree symlinks as the
    kernel would once the tree is mounted elsewhere. Missing components and loops
    cannot escape (the kernel fails there), so they count as safe.
    """
    stack: list[str] = list(link[:-1])
    pending: list[str] = [c for c in reversed(os.readlink(root.joinpath(*link)).split("/"))]
    hops = 0
    while pending:
        comp = pending.pop()
        if comp in ("", "."):
            continue
        if comp == "..":
            if not stack:
                return True
            stack.pop()
            continue
        path = root.joinpath(*stack, comp)
        try:
            st = os.lstat(path)
        except OSError:
            return False
        if stat.S_ISLNK(st.st_mode):
            hops += 1
            if hops > MAX_SYMLINK_HOPS:
                return False
            target = os.readlink(path)
            if target.startswith("/"):
                return True  # absolute links were rewritten; one here points off-tree
            pending.extend(reversed(target.split("/")))
            continue
        stack.append(comp)
    return False


def remove_escaping_symlinks(root: Path) -> list[str]:
    """Delete every symlink under ``root`` that resolves above it; returns warnings."""
    warnings = []
    for dirpath, dirnames, filenames, _dir_fd in os.fwalk(root, follow_symlinks=False):
        rel = Path(dirpath).relative_to(root).parts
        for name in (*dirnames, *filenames):
            path = Path(dirpath, name)
            if path.is_symlink() and escapes(root, (*rel, name)):
                path.unlink()
                warnings.append(f"{'/'.join((*rel, name))!r}: symlink resolves outside the image")
    return warnings
