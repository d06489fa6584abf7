"""Atomic, durable file writes: the one temp-file → fsync → rename → fsync-dir recipe.

Shared by the content store, the registry client's blob downloads, the volume
records of the node and controller services, and OCI layouts written by the CLI;
``syncfs`` makes a whole unpacked tree durable before the image cache renames it.
A reader sees the old file or the new one, never a torn one; after a crash the
rename is either on disk or not at all.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import errno
import json
import logging
import os
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

log = logging.getLogger(__name__)


def syncfs(path: Path) -> None:
    """Flush every dirty page of the filesystem holding ``path`` (``syncfs(2)``).

    One call makes a whole freshly written tree durable, far cheaper than an
    fsync per file. Falls back to ``os.sync`` where ``syncfs`` is unavailable.
    """
    fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    try:
        if _libc is not None and _libc.syncfs(fd) == 0:
            return
        os.sync()
    finally:
        os.close(fd)


def _load_libc() -> Any:
    try:
        libc = ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6", use_errno=True)
        libc.syncfs.argtypes = [ctypes.c_int]
        return libc
    except (OSError, AttributeError):
        return None


_libc = _load_libc()


def preallocate(fd: int, size: int) -> bool:
    """Allocate ``size`` bytes of disk to the empty file ``fd`` before it is written
    (``fallocate(2)``, mode 0: its length becomes ``size``), so the writes that follow
    fill extents already there instead of reserving blocks page by page (a 1 GiB blob
    streamed into the content store: about 15 % faster, docs/benchmarks.md, artifacts).

    Raises OSError when the space is not there (ENOSPC, EDQUOT, EFBIG): what cannot fit
    fails before a byte is fetched. Returns False, doing nothing, where the filesystem
    cannot (EOPNOTSUPP): no emulation by writing zeroes, as ``posix_fallocate`` does.
    """
    call = getattr(_libc, "fallocate64", None) if _libc is not None else None
    if call is None:
        return False
    call.argtypes = [ctypes.c_int, ctypes.c_int, ctypes.c_int64, ctypes.c_int64]
    if call(fd, 0, 0, size) == 0:
        return True
    err = ctypes.get_errno()
    if err in (errno.EOPNOTSUPP, errno.ENOSYS, errno.EINVAL):
        return False
    raise OSError(err, os.strerror(err))


def fsync_dir(path: Path) -> None:
    """Make a create, rename or unlink inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_writer(
    dest: Path, *, mode: int | None = None, durable: bool = True
) -> Iterator[IO[bytes]]:
    """A binary file that replaces ``dest`` only when the ``with`` block succeeds.

    The temp file lives beside ``dest`` (same filesystem, so ``os.replace`` is
    atomic) and is invisible by name (``.<name>.*.partial``); it is fsynced
    before the rename and the directory after it. On any failure it is removed
    and ``dest`` is left as it was. ``mode`` sets the permission bits.
    ``durable=False`` skips both fsyncs: still atomic for every reader and
    across a crash of the process, but a power loss may bring the old content
    back (for records that a power loss makes moot anyway, e.g. of mounts).
    """
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            yield out
            out.flush()
            if durable:
                os.fsync(out.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, dest)
        if durable:
            fsync_dir(dest.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def write_bytes_atomic(
    dest: Path, data: bytes, *, mode: int | None = None, durable: bool = True
) -> None:
    """Replace ``dest`` with ``data`` atomically (and durably unless ``durable=False``)."""
    with atomic_writer(dest, mode=mode, durable=durable) as out:
        out.write(data)


def write_json_atomic(dest: Path, data: Any, *, durable: bool = True) -> None:
    """Replace ``dest`` with ``data`` as compact, key-sorted JSON, atomically and durably."""
    # json.dumps without indent takes the C encoder: rewritten on every publish, it matters.
    write_bytes_atomic(dest, json.dumps(data, sort_keys=True).encode(), durable=durable)


def json_records(directory: Path) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Each ``*.json`` record in ``directory`` (in name order) holding a JSON object, with
    its path; unreadable ones set aside (:func:`read_json_or_set_aside`), none when the
    directory does not exist."""
    if not directory.is_dir():
        return
    for record in sorted(directory.glob("*.json")):
        doc = read_json_or_set_aside(record)
        if isinstance(doc, dict):
            yield record, doc


def read_json_or_set_aside(path: Path) -> Any | None:
    """The JSON in ``path``; None when it does not exist.

    A file that cannot be read or parsed is renamed to ``<name>.bad-<time>`` beside
    it (and logged), never silently overwritten by the next write: its records
    can still be recovered by hand. Returns None in that case too.
    """
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        return None
    except (OSError, ValueError) as exc:
        aside = path.with_name(f"{path.name}.bad-{time.time_ns()}")
        try:
            os.replace(path, aside)
            fsync_dir(path.parent)
        except OSError as move_exc:
            raise OSError(
                f"{path} is unreadable ({exc}) and could not be moved aside ({move_exc}); "
                "move or repair it by hand, then restart"
            ) from move_exc
        log.error(
            "msg=%r path=%s kept_as=%s error=%r",
            "state file unreadable; kept aside, starting empty",
            path,
            aside,
            str(exc)[:200],
        )
        return None


def unlink_size(path: Path) -> int:
    """Remove the file at ``path``; the bytes it held (0 when it was not there)."""
    try:
        size = path.stat().st_size
        path.unlink()
    except FileNotFoundError:
        return 0
    return size


def fsync_files(*paths: Path) -> None:
    """Make files already written (and their renames) durable: each file, then each
    distinct parent directory."""
    for path in paths:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    for parent in dict.fromkeys(p.parent for p in paths):
        fsync_dir(parent)
