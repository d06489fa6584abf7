"""Safe layer extraction: image layers (tar, tar+gzip, tar+zstd) → one staging tree.

Sits between the content store (which holds verified layer blobs) and the image
cache (which renames a finished staging tree into place and publishes it). The
plugin runs privileged, and layers are untrusted input, so this module never
writes outside the staging root:

* every entry is created relative to an open directory descriptor, walking its
  parent components one at a time with ``O_NOFOLLOW`` — a symlinked parent
  (placed by this layer or an earlier one) is refused, never followed;
* names with ``..`` are refused; leading ``/`` is stripped (as GNU tar does);
* absolute symlink targets are rewritten relative to the tree root; targets that
  climb above the root are refused, and a final pass re-checks every symlink
  against the finished tree (symlink chains) and removes escaping ones;
* hard links must name a regular file already in the tree, reached without
  symlinks; files are always created fresh (``O_EXCL``), never written through
  an existing inode that a hard link may share;
* device nodes and fifos are skipped; setuid, setgid and sticky bits stripped;
* budgets on uncompressed bytes and entry count stop decompression bombs with
  ResourceExhausted naming the image and the budget.

Refused entries are skipped and reported in ``ExtractStats.warnings``; layer
data that cannot be read at all is InvalidArgument. OCI whiteouts (``.wh.NAME``
and the opaque marker ``.wh..wh..opq``) delete content of lower layers.
"""

from __future__ import annotations

import contextlib
import errno
import io
import os
import posixpath
import queue
import shutil
import stat
import tarfile
import threading
import zlib
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any, BinaryIO

import zstandard

from csi import errors
from csi.node import tree

WHITEOUT_PREFIX = ".wh."
OPAQUE_MARKER = ".wh..wh..opq"
MAX_WARNINGS = 50

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC


@dataclass(frozen=True)
class Limits:
    """Budgets for one image: bytes written (all layers) and entries created."""

    max_bytes: int = 2 * 1024**3
    max_entries: int = 200_000


@dataclass(frozen=True)
class Layer:
    """A verified layer blob on disk and its declared media type (may be empty)."""

    path: Path
    media_type: str = ""
    digest: str = ""


@dataclass
class ExtractStats:
    """What extraction did; ``warnings`` lists refused or altered entries."""

    bytes: int = 0
    entries: int = 0
    warnings: list[str] = field(default_factory=list)
    suppressed_warnings: int = 0

    def warn(self, message: str) -> None:
        if len(self.warnings) < MAX_WARNINGS:
            self.warnings.append(message)
        else:
            self.suppressed_warnings += 1


class _Refused(Exception):
    """An entry that is skipped (and reported), not a failure of the layer."""


def extract_layers(
    root: Path, layers: Sequence[Layer], *, image: str, limits: Limits = Limits()
) -> ExtractStats:
    """Apply ``layers`` in order into the existing empty directory ``root``.

    Leaves the tree writable; call :func:`csi.node.tree.seal` once it is complete. Raises
    ResourceExhausted over budget, InvalidArgument for unreadable layer data.
    Not idempotent on a used ``root``: callers extract into a fresh temp dir.
    """
    stats = ExtractStats()
    root_fd = os.open(root, _DIR_FLAGS)
    try:
        for layer in layers:
            _apply_layer(root_fd, layer, image=image, limits=limits, stats=stats)
        for warning in tree.remove_escaping_symlinks(root):
            stats.warn(warning)
    finally:
        os.close(root_fd)
    return stats


# --- reading layers ---------------------------------------------------------------


def compression_of(media_type: str, head: bytes) -> str:
    """``gzip``, ``zstd`` or ``none``: from the media type, else from magic bytes."""
    mt = media_type.lower()
    if mt.endswith("gzip"):
        return "gzip"
    if mt.endswith("zstd"):
        return "zstd"
    if mt.endswith(".tar") or mt.endswith("tar"):
        return "none"
    if head.startswith(GZIP_MAGIC):
        return "gzip"
    if head.startswith(ZSTD_MAGIC):
        return "zstd"
    return "none"


class _CountingReader(io.RawIOBase):
    """Counts decompressed bytes and stops a stream that outgrows the budget."""

    def __init__(self, inner: IO[bytes], *, limit: int, image: str) -> None:
        self._inner = inner
        self._limit = limit
        self._image = image
        self.count = 0

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        data = self._inner.read(len(buffer))
        n = len(data)
        buffer[:n] = data
        self.count += n
        if self.count > self._limit:
            raise errors.ResourceExhausted(
                f"image {self._image}: decompressed layer data exceeds the unpack budget "
                f"of {self._limit} bytes; use a smaller image or raise --max-unpacked-bytes"
            )
        return n


class _Gunzip(io.RawIOBase):
    """gzip (multi-member, zero-padded, CRC-checked by zlib) inflated in a helper thread.

    zlib releases the GIL while it inflates, so decompression overlaps with
    writing files, as ``tar -xz`` overlaps its gzip child with itself. Output
    goes through a bounded queue in chunks of at most ``CHUNK`` bytes (so a
    bomb never inflates more than ``DEPTH`` chunks ahead of the byte budget);
    errors are raised to the reader; :meth:`close` stops and joins the thread.
    """

    CHUNK = 1 << 20
    DEPTH = 8

    def __init__(self, raw: BinaryIO) -> None:
        self._queue: queue.Queue[bytes | BaseException | None] = queue.Queue(self.DEPTH)
        self._stop = threading.Event()
        self._pending = memoryview(b"")
        self._done = False
        self._thread = threading.Thread(target=self._inflate, args=(raw,), name="gunzip")
        self._thread.daemon = True
        self._thread.start()

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        while not self._pending and not self._done:
            item = self._queue.get()
            if item is None:
                self._done = True
            elif isinstance(item, BaseException):
                self._done = True
                raise item
            else:
                self._pending = memoryview(item)
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n

    def close(self) -> None:
        self._stop.set()
        while self._thread.is_alive():
            with contextlib.suppress(queue.Empty):
                self._queue.get(timeout=0.05)
        super().close()

    def _put(self, item: bytes | BaseException | None) -> bool:
        while not self._stop.is_set():
            with contextlib.suppress(queue.Full):
                self._queue.put(item, timeout=0.05)
                return True
        return False

    def _inflate(self, raw: BinaryIO) -> None:
        try:
            member: Any = zlib.decompressobj(16 + zlib.MAX_WBITS)
            while chunk := raw.read(self.CHUNK):
                data = chunk
                while data:
                    if member is None:  # between members: skip zero padding
                        data = data.lstrip(b"\0")
                        if not data:
                            break
                        member = zlib.decompressobj(16 + zlib.MAX_WBITS)
                    out = member.decompress(data, self.CHUNK)
                    if out and not self._put(out):
                        return
                    if member.eof:
                        data = member.unused_data
                        member = None
                    else:
                        data = member.unconsumed_tail
            if member is not None:
                raise EOFError("compressed data ends before the end-of-stream marker")
            self._put(None)
        except BaseException as exc:  # handed to the reader, which raises it
            self._put(exc)


@contextmanager
def _open_tar_stream(layer: Layer, *, limit: int, image: str) -> Iterator[tarfile.TarFile]:
    raw: BinaryIO = open(layer.path, "rb")  # noqa: SIM115 - closed below
    inner: IO[bytes] = raw
    try:
        head = raw.read(4)
        raw.seek(0)
        kind = compression_of(layer.media_type, head)
        if kind == "gzip":
            inner = _Gunzip(raw)  # type: ignore[assignment]
        elif kind == "zstd":
            inner = zstandard.ZstdDecompressor().stream_reader(raw)
        counted = io.BufferedReader(_CountingReader(inner, limit=limit, image=image), 1 << 16)
        with tarfile.open(fileobj=counted, mode="r|") as tar:
            yield tar
    finally:
        if isinstance(inner, _Gunzip):
            inner.close()
        raw.close()


def _apply_layer(
    root_fd: int, layer: Layer, *, image: str, limits: Limits, stats: ExtractStats
) -> None:
    # Tar headers and padding ride on top of member data; allow for them.
    stream_limit = limits.max_bytes + limits.max_entries * 1024 + (1 << 20)
    touched: set[tuple[str, ...]] = set()
    name = layer.digest or layer.path.name
    try:
        with _open_tar_stream(layer, limit=stream_limit, image=image) as tar:
            for member in tar:
                try:
                    _apply_member(
                        root_fd,
                        tar,
                        member,
                        image=image,
                        limits=limits,
                        stats=stats,
                        touched=touched,
                    )
                except _Refused as refused:
                    stats.warn(f"layer {name}: {member.name!r}: {refused}")
    except errors.RukpakError:
        raise
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise errors.ResourceExhausted(
                f"image {image}: no space left on the node while unpacking layer {name}"
            ) from exc
        if exc.errno:
            raise errors.Internal(f"image {image}: unpacking layer {name} failed: {exc}") from exc
        raise _unreadable(image, name, exc) from exc  # BadGzipFile and friends: no errno
    except (tarfile.TarError, EOFError, zlib.error, zstandard.ZstdError) as exc:
        raise _unreadable(image, name, exc) from exc


def _unreadable(image: str, name: str, exc: Exception) -> errors.InvalidArgument:
    return errors.InvalidArgument(
        f"image {image}: layer {name} is not a readable tar archive ({exc}); "
        "check the image was built correctly"
    )


# --- applying one entry -------------------------------------------------------------


def _split(name: str) -> tuple[str, ...]:
    """Normalise a member name into path components, refusing ``..``."""
    parts = tuple(p for p in name.split("/") if p not in ("", "."))
    if ".." in parts:
        raise _Refused("path contains '..'")
    return parts


def _charge(stats: ExtractStats, *, size: int, image: str, limits: Limits) -> None:
    stats.entries += 1
    stats.bytes += size
    if stats.entries > limits.max_entries:
        raise errors.ResourceExhausted(
            f"image {image} has more than {limits.max_entries} files (the unpack budget); "
            "use a smaller image or raise --max-unpacked-files"
        )
    if stats.bytes > limits.max_bytes:
        raise errors.ResourceExhausted(
            f"image {image} unpacks to more than {limits.max_bytes} bytes (the unpack budget); "
            "use a smaller image or raise --max-unpacked-bytes"
        )


def _open_parent(root_fd: int, parts: tuple[str, ...], *, create: bool) -> int:
    """Open the directory holding ``parts[-1]`` without following any symlink.

    Missing directories are created (0755) when ``create``; a symlink or a
    non-directory on the way is refused.
    """
    fd = os.dup(root_fd)
    try:
        for comp in parts[:-1]:
            try:
                nfd = os.open(comp, _DIR_FLAGS, dir_fd=fd)
            except FileNotFoundError:
                if not create:
                    raise _Refused(f"parent {comp!r} does not exist") from None
                os.mkdir(comp, 0o755, dir_fd=fd)
                nfd = os.open(comp, _DIR_FLAGS, dir_fd=fd)
            except OSError as exc:
                if exc.errno in (errno.ELOOP, errno.ENOTDIR):
                    raise _Refused(f"parent {comp!r} is a symlink or not a directory") from None
                raise
            os.close(fd)
            fd = nfd
        return fd
    except BaseException:
        os.close(fd)
        raise


def _lstat(name: str, dir_fd: int) -> os.stat_result | None:
    try:
        return os.stat(name, dir_fd=dir_fd, follow_symlinks=False)
    except FileNotFoundError:
        return None


def _remove(name: str, dir_fd: int) -> None:
    """Remove an entry (recursively for directories) without following symlinks."""
    st = _lstat(name, dir_fd)
    if st is None:
        return
    if stat.S_ISDIR(st.st_mode):
        shutil.rmtree(name, dir_fd=dir_fd)
    else:
        os.unlink(name, dir_fd=dir_fd)


def _clear_opaque(dir_fd: int, prefix: tuple[str, ...], touched: set[tuple[str, ...]]) -> None:
    """Delete everything under a directory except what the current layer put there."""
    for name in os.listdir(dir_fd):
        path = (*prefix, name)
        if path not in touched:
            _remove(name, dir_fd)
            continue
        st = _lstat(name, dir_fd)
        if st is not None and stat.S_ISDIR(st.st_mode):
            child = os.open(name, _DIR_FLAGS, dir_fd=dir_fd)
            try:
                _clear_opaque(child, path, touched)
            finally:
                os.close(child)


def _safe_symlink_target(parts: tuple[str, ...], target: str) -> str:
    """Rewrite an absolute target relative to the tree root; refuse one that climbs out."""
    if not target:
        raise _Refused("symlink has an empty target")
    if target.startswith("/"):
        rel = posixpath.normpath(target.lstrip("/")) if target.strip("/") else "."
        depth = len(parts) - 1
        target = posixpath.join(*([".."] * depth), rel) if depth else rel
    # Lexically, ``..`` past the root would stay at "/"; detect the climb by counting.
    level = len(parts) - 1
    for comp in target.split("/"):
        if comp == "..":
            level -= 1
            if level < 0:
                raise _Refused(f"symlink target {target!r} points outside the image")
        elif comp not in ("", "."):
            level += 1
    return target


def _apply_member(
    root_fd: int,
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    *,
    image: str,
    limits: Limits,
    stats: ExtractStats,
    touched: set[tuple[str, ...]],
) -> None:
    # Every header counts against the entry budget, even refused ones and whiteouts.
    _charge(stats, size=member.size if member.isreg() else 0, image=image, limits=limits)
    parts = _split(member.name)
    if not parts:
        return  # the root itself ("./"): keep our own root
    base = parts[-1]
    if base.startswith(WHITEOUT_PREFIX):
        _apply_whiteout(root_fd, parts, touched)
        return
    if member.ischr() or member.isblk() or member.isfifo():
        raise _Refused("device nodes and fifos are not extracted")
    if not (member.isreg() or member.isdir() or member.issym() or member.islnk()):
        raise _Refused(f"unsupported tar entry type {member.type!r}")

    try:
        _create(root_fd, tar, member, parts, stats=stats, touched=touched)
    except OSError as exc:
        if exc.errno in (errno.ENAMETOOLONG, errno.ENOTDIR, errno.EISDIR, errno.EEXIST):
            raise _Refused(os.strerror(exc.errno)) from None
        raise


def _create(
    root_fd: int,
    tar: tarfile.TarFile,
    member: tarfile.TarInfo,
    parts: tuple[str, ...],
    *,
    stats: ExtractStats,
    touched: set[tuple[str, ...]],
) -> None:
    base = parts[-1]
    mode = member.mode & 0o777
    if member.mode & 0o7000:
        stats.warn(f"{member.name!r}: setuid/setgid/sticky bits removed")

    for i in range(1, len(parts) + 1):
        touched.add(parts[:i])
    dir_fd = _open_parent(root_fd, parts, create=True)
    try:
        existing = _lstat(base, dir_fd)
        if member.isdir():
            if existing is not None and not stat.S_ISDIR(existing.st_mode):
                os.unlink(base, dir_fd=dir_fd)
                existing = None
            if existing is None:
                os.mkdir(base, 0o755, dir_fd=dir_fd)
            return
        if member.islnk():
            link_parts = _split(member.linkname)
            if not link_parts:
                raise _Refused("hard link to the root directory")
            src_fd = _open_parent(root_fd, link_parts, create=False)
            try:
                src = _lstat(link_parts[-1], src_fd)
                if src is None:
                    raise _Refused(f"hard link target {member.linkname!r} does not exist")
                if not stat.S_ISREG(src.st_mode):
                    raise _Refused(f"hard link target {member.linkname!r} is not a regular file")
                if link_parts == parts:
                    return
                if existing is not None:
                    _remove(base, dir_fd)
                os.link(
                    link_parts[-1],
                    base,
                    src_dir_fd=src_fd,
                    dst_dir_fd=dir_fd,
                    follow_symlinks=False,
                )
            finally:
                os.close(src_fd)
            return
        if existing is not None:
            _remove(base, dir_fd)
        if member.issym():
            os.symlink(_safe_symlink_target(parts, member.linkname), base, dir_fd=dir_fd)
            return
        _write_file(tar, member, base, dir_fd, mode=mode)
    finally:
        os.close(dir_fd)


def _apply_whiteout(root_fd: int, parts: tuple[str, ...], touched: set[tuple[str, ...]]) -> None:
    base = parts[-1]
    dir_fd = _open_parent(root_fd, parts, create=True)
    try:
        if base == OPAQUE_MARKER:
            _clear_opaque(dir_fd, parts[:-1], touched)
            return
        target = base[len(WHITEOUT_PREFIX) :]
        if target in ("", ".", ".."):
            raise _Refused("whiteout of an invalid name")
        _remove(target, dir_fd)
    finally:
        os.close(dir_fd)


def _write_file(
    tar: tarfile.TarFile, member: tarfile.TarInfo, base: str, dir_fd: int, *, mode: int
) -> None:
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC
    fd = os.open(base, flags, 0o600, dir_fd=dir_fd)
    with os.fdopen(fd, "wb") as out:
        src = tar.extractfile(member)
        if src is not None:
            shutil.copyfileobj(src, out, 1 << 20)
        os.fchmod(out.fileno(), mode | 0o400)
        mtime = max(0, int(member.mtime))
        os.utime(out.fileno(), (mtime, mtime))
