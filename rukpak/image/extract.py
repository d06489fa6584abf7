"""Safe layer extraction: image layers (tar, tar+gzip, tar+zstd) → one staging tree.

Sits between the content store (which holds verified layer blobs, or streams
one while it downloads, see ``rukpak.image.layerio``) and the image cache (which
renames a finished staging tree into place and publishes it). The plugin runs
privileged, and layers are untrusted input, so this module never writes
outside the staging root:

* every entry is created relative to an open directory descriptor, reached by
  walking its parent components one at a time with ``O_NOFOLLOW`` — a
  symlinked parent (placed by this layer or an earlier one) is refused, never
  followed. Descriptors of directories already walked are reused until this
  extraction removes anything (nobody else writes in a staging dir);
* names with ``..`` are refused; leading ``/`` is stripped (as GNU tar does) and
  reported; a path deeper or longer than ``Limits`` refuses the layer, and so does
  an oversized pax or GNU long-name header (``rukpak.image.layerio``), before it is
  read into memory; attacker strings are cut short in warnings and errors;
* absolute symlink targets are rewritten relative to the tree root; targets that
  climb above the root are refused, and when any symlink was created a final
  pass re-checks every symlink against the finished tree (symlink chains) and
  removes escaping ones;
* hard links must name a regular file already in the tree, reached without
  symlinks; files are always created fresh (``O_EXCL``), never written through
  an existing inode that a hard link may share;
* device nodes and fifos are skipped; setuid, setgid and sticky bits stripped;
* budgets on uncompressed bytes and entry count stop decompression bombs with
  ResourceExhausted naming the image and the budget.

Files are created with their final, read-only mode (0444, or 0555 when any
execute bit is set) — an ``O_WRONLY`` descriptor from ``open`` still writes —
so sealing the finished tree only has to chmod directories
(:func:`rukpak.image.tree.seal_dirs`).

Refused entries are skipped and reported in ``ExtractStats.warnings``; layer
data that cannot be read at all is InvalidArgument. OCI whiteouts (``.wh.NAME``
and the opaque marker ``.wh..wh..opq``) delete content of lower layers.
"""

from __future__ import annotations

import errno
import os
import shutil
import stat
import tarfile
from collections.abc import Sequence
from pathlib import Path

from rukpak.common import errors
from rukpak.image import members, tree
from rukpak.image.layerio import Layer, compression_of, shown
from rukpak.image.members import (
    OPAQUE_MARKER,
    WHITEOUT_PREFIX,
    ExtractStats,
    Limits,
    Refused,
    final_mode,
    safe_symlink_target,
    split_name,
)

__all__ = ["ExtractStats", "Layer", "Limits", "compression_of", "extract_layers"]

MAX_OPEN_DIRS = 256
DEFAULT_LIMITS = Limits()
WRITE_CHUNK = 1 << 20
_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
_FILE_FLAGS = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC


def extract_layers(
    root: Path, layers: Sequence[Layer], *, image: str, limits: Limits = DEFAULT_LIMITS
) -> ExtractStats:
    """Apply ``layers`` in order into the existing empty directory ``root``.

    Files get their final read-only modes; directories stay writable until
    :func:`rukpak.image.tree.seal_dirs` (or :func:`~rukpak.image.tree.seal`) runs on
    the complete tree. Raises ResourceExhausted over budget, InvalidArgument
    for unreadable layer data, and whatever a layer's source raises when its
    content does not verify. Not idempotent on a used ``root``: callers
    extract into a fresh temp dir.
    """
    stats = ExtractStats()
    with _Tree(root, image=image, limits=limits, stats=stats) as t:
        for layer in layers:
            t.apply_layer(layer)
    if stats.symlinks:  # only symlinks this extraction made can exist in the tree
        for warning in tree.remove_escaping_symlinks(root):
            stats.warn(warning)
    return stats


def _current_umask() -> int:
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    return 0o777  # unknown: always chmod explicitly


def _lstat(name: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


class _Tree:
    """One extraction's staging tree: the root descriptor and the directories walked."""

    def __init__(self, root: Path, *, image: str, limits: Limits, stats: ExtractStats) -> None:
        self.image = image
        self.limits = limits
        self.stats = stats
        self.umask = _current_umask()
        self.root_fd = os.open(root, _DIR_FLAGS)
        self._dirs: dict[tuple[str, ...], int] = {}
        # What the current layer put in the tree, for opaque whiteouts; None in the first
        # layer, where everything in the tree is the current layer's (nothing to clear).
        self.touched: set[tuple[str, ...]] | None = None
        self._layers = 0

    def __enter__(self) -> _Tree:
        return self

    def __exit__(self, *exc: object) -> None:
        self.forget_dirs()
        os.close(self.root_fd)

    # --- directory descriptors ------------------------------------------------------

    def forget_dirs(self) -> None:
        """Close every remembered directory (after anything was removed)."""
        dirs, self._dirs = self._dirs, {}
        for fd in dirs.values():
            os.close(fd)

    def parent(self, parts: tuple[str, ...], *, create: bool) -> int:
        """A descriptor of the directory holding ``parts[-1]`` (borrowed: do not close).

        Reached without following any symlink; missing directories are created
        (0755) when ``create``; a symlink or non-directory on the way is refused.
        """
        key = parts[:-1]
        if not key:
            return self.root_fd
        fd = self._dirs.get(key)
        if fd is not None:
            return fd
        i = len(key) - 1  # longest remembered prefix
        while i > 0 and key[:i] not in self._dirs:
            i -= 1
        fd = self._dirs[key[:i]] if i else self.root_fd
        for j in range(i, len(key)):
            comp = key[j]
            try:
                nfd = os.open(comp, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise Refused(f"parent {comp!r} does not exist") from None
                os.mkdir(comp, 0o755, dir_fd=fd)
                nfd = os.open(comp, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise Refused(f"parent {comp!r} is a symlink or not a directory") from None
                raise
            if len(self._dirs) >= MAX_OPEN_DIRS:
                self.forget_dirs()
            self._dirs[key[: j + 1]] = nfd
            fd = nfd
        return fd

    def remove(self, name: str, dir_fd: int) -> None:
        """Remove an entry (recursively for directories) without following symlinks."""
        st = _lstat(name, dir_fd)
        if st is None:
            return
        if stat.S_ISDIR(st.st_mode):
            shutil.rmtree(name, dir_fd=dir_fd)
            # Remembered descriptors may name what is gone (``dir_fd`` too: walk again).
            self.forget_dirs()
        else:
            os.unlink(name, dir_fd=dir_fd)

    # --- layers and entries ---------------------------------------------------------

    def apply_layer(self, layer: Layer) -> None:
        self.touched = set() if self._layers else None
        self._layers += 1
        self.forget_dirs()
        if layer.file_name:
            self.place_file(layer)
            return
        members.apply_layer(
            layer, self.apply_member, image=self.image, limits=self.limits, stats=self.stats
        )

    def apply_member(self, tar: tarfile.TarFile, member: tarfile.TarInfo) -> None:
        # Every header counts against the entry budget, even refused ones and whiteouts.
        self.stats.charge(member.size if member.isreg() else 0, self.limits, self.image)
        parts = members.check_entry(
            member.name, limits=self.limits, image=self.image, stats=self.stats
        )
        if not parts:
            return  # the root itself ("./"): keep our own root
        if parts[-1].startswith(WHITEOUT_PREFIX):
            self.whiteout(parts)
            return
        if member.ischr() or member.isblk() or member.isfifo():
            raise Refused("device nodes and fifos are not extracted")
        if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
            raise Refused(f"unsupported tar entry type {member.type!r}")
        if member.mode & 0o7000:
            self.stats.warn(f"{member.name!r}: setuid/setgid/sticky bits removed")
        if self.touched is not None:
            for i in range(1, len(parts) + 1):
                self.touched.add(parts[:i])
        try:
            dir_fd = self.parent(parts, create=True)
            if member.isreg():
                self.write_file(tar, member, parts[-1], dir_fd)
            elif member.isdir():
                self.make_dir(parts[-1], dir_fd)
            elif member.issym():
                self.make_symlink(parts, member.linkname, dir_fd)
            else:
                self.make_hardlink(parts, member.linkname, dir_fd)
        except OSError as exc:
            if exc.errno in (errno.ENAMETOOLONG, errno.ENOTDIR, errno.EISDIR, errno.EEXIST):
                raise Refused(os.strerror(exc.errno)) from None
            raise

    def make_dir(self, base: str, dir_fd: int) -> None:
        try:
            os.mkdir(base, 0o755, dir_fd=dir_fd)
        except FileExistsError:
            existing = _lstat(base, dir_fd)
            if existing is not None and stat.S_ISDIR(existing.st_mode):
                return
            os.unlink(base, dir_fd=dir_fd)
            os.mkdir(base, 0o755, dir_fd=dir_fd)

    def make_symlink(self, parts: tuple[str, ...], linkname: str, dir_fd: int) -> None:
        target = safe_symlink_target(parts, linkname)
        try:
            os.symlink(target, parts[-1], dir_fd=dir_fd)
        except FileExistsError:
            self.remove(parts[-1], dir_fd)
            dir_fd = self.parent(parts, create=True)
            os.symlink(target, parts[-1], dir_fd=dir_fd)
        self.stats.symlinks += 1

    def make_hardlink(self, parts: tuple[str, ...], linkname: str, dir_fd: int) -> None:
        link_parts = split_name(linkname)
        if not link_parts:
            raise Refused("hard link to the root directory")
        src_fd = self.parent(link_parts, create=False)
        src = _lstat(link_parts[-1], src_fd)
        if src is None:
            raise Refused(f"hard link target {linkname!r} does not exist")
        if not stat.S_ISREG(src.st_mode):
            raise Refused(f"hard link target {linkname!r} is not a regular file")
        if link_parts == parts:
            return
        if _lstat(parts[-1], dir_fd) is not None:
            self.remove(parts[-1], dir_fd)
            # Removing a directory forgets remembered descriptors: walk again.
            dir_fd = self.parent(parts, create=True)
            src_fd = self.parent(link_parts, create=False)
        os.link(
            link_parts[-1], parts[-1], src_dir_fd=src_fd, dst_dir_fd=dir_fd, follow_symlinks=False
        )

    def write_file(
        self, tar: tarfile.TarFile, member: tarfile.TarInfo, base: str, dir_fd: int
    ) -> None:
        mode = final_mode(member.mode)
        try:
            fd = os.open(base, _FILE_FLAGS, mode, dir_fd=dir_fd)
        except FileExistsError:
            parts = split_name(member.name)
            self.remove(base, dir_fd)
            dir_fd = self.parent(parts, create=True)
            fd = os.open(base, _FILE_FLAGS, mode, dir_fd=dir_fd)
        try:
            if member.sparse is not None:  # rare: let tarfile expand the holes
                src = tar.extractfile(member)
                if src is not None:
                    with os.fdopen(os.dup(fd), "wb") as out:
                        shutil.copyfileobj(src, out, WRITE_CHUNK)
            else:
                _copy_member_data(tar, member.size, fd)
            if mode & self.umask:
                os.fchmod(fd, mode)
            mtime = max(0, int(member.mtime))
            os.utime(fd, (mtime, mtime))
        finally:
            os.close(fd)

    def place_file(self, layer: Layer) -> None:
        """An artifact's file layer: the verified blob at ``layer.path`` placed whole at
        its title, checked as a tar entry's path is (but refused, not skipped: a file
        without its place is a broken artifact). Hard-linked from the content store (one
        copy on disk, read-only), copied when the store is on another filesystem."""
        size = os.stat(layer.path).st_size
        self.stats.charge(size, self.limits, self.image)
        name = layer.file_name
        try:
            parts = members.check_entry(
                name, limits=self.limits, image=self.image, stats=self.stats
            )
            if not parts or parts[-1].startswith(WHITEOUT_PREFIX):
                raise Refused("not a file name")
            if self.touched is not None:
                for i in range(1, len(parts) + 1):
                    self.touched.add(parts[:i])
            dir_fd = self.parent(parts, create=True)
        except Refused as exc:
            raise errors.InvalidArgument(
                f"image {self.image}: file layer {layer.digest} is titled "
                f"{shown(name)!r}, which cannot be placed: {exc}"
            ) from None
        base = parts[-1]
        self.remove(base, dir_fd)
        try:
            os.link(layer.path, base, dst_dir_fd=dir_fd, follow_symlinks=False)
        except OSError as exc:
            if exc.errno not in (errno.EXDEV, errno.EPERM, errno.EMLINK):
                raise
            fd = os.open(base, _FILE_FLAGS, 0o444, dir_fd=dir_fd)
            with open(layer.path, "rb") as src, os.fdopen(fd, "wb") as out:
                shutil.copyfileobj(src, out, WRITE_CHUNK)

    def whiteout(self, parts: tuple[str, ...]) -> None:
        base = parts[-1]
        dir_fd = self.parent(parts, create=True)
        if base == OPAQUE_MARKER:
            if self.touched is not None:
                self.clear_opaque(dir_fd, parts[:-1], self.touched)
                self.forget_dirs()
            return
        target = base[len(WHITEOUT_PREFIX) :]
        if target in ("", ".", ".."):
            raise Refused("whiteout of an invalid name")
        self.remove(target, dir_fd)

    def clear_opaque(
        self, dir_fd: int, prefix: tuple[str, ...], touched: set[tuple[str, ...]]
    ) -> None:
        """Delete everything under a directory except what the current layer put there."""
        for name in os.listdir(dir_fd):
            path = (*prefix, name)
            st = _lstat(name, dir_fd)
            if st is None:
                continue
            if path not in touched:
                if stat.S_ISDIR(st.st_mode):
                    shutil.rmtree(name, dir_fd=dir_fd)
                else:
                    os.unlink(name, dir_fd=dir_fd)
            elif stat.S_ISDIR(st.st_mode):
                child = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
                try:
                    self.clear_opaque(child, path, touched)
                finally:
                    os.close(child)


def _copy_member_data(tar: tarfile.TarFile, size: int, fd: int) -> None:
    """Copy ``size`` bytes of the current member straight from the tar stream to ``fd``.

    In stream mode the archive sits at the member's data once ``next`` returned
    it; ``next`` skips the padding (and whatever was not read) itself.
    """
    stream = tar.fileobj
    assert stream is not None
    left = size
    while left:
        chunk = stream.read(min(left, WRITE_CHUNK))
        if not chunk:
            raise tarfile.ReadError("unexpected end of data")
        left -= len(chunk)
        view = memoryview(chunk)
        while view:
            view = view[os.write(fd, view) :]
