"""Atomic, durable file writes: the one temp-file → fsync → rename → fsync-dir recipe.

Shared by the content store, the registry client's blob downloads, the volume
records of the node and controller services, and OCI layouts written by the CLI.
A reader sees the old file or the new one, never a torn one; after a crash the
rename is either on disk or not at all.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any


def fsync_dir(path: Path) -> None:
    """Make a create, rename or unlink inside ``path`` durable."""
    fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


@contextlib.contextmanager
def atomic_writer(dest: Path, *, mode: int | None = None) -> Iterator[IO[bytes]]:
    """A binary file that replaces ``dest`` only when the ``with`` block succeeds.

    The temp file lives beside ``dest`` (same filesystem, so ``os.replace`` is
    atomic) and is invisible by name (``.<name>.*.partial``); it is fsynced
    before the rename and the directory after it. On any failure it is removed
    and ``dest`` is left as it was. ``mode`` sets the permission bits.
    """
    fd, tmp_name = tempfile.mkstemp(prefix=f".{dest.name}.", suffix=".partial", dir=dest.parent)
    tmp = Path(tmp_name)
    try:
        with os.fdopen(fd, "wb") as out:
            yield out
            out.flush()
            os.fsync(out.fileno())
        if mode is not None:
            os.chmod(tmp, mode)
        os.replace(tmp, dest)
        fsync_dir(dest.parent)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            tmp.unlink()
        raise


def write_bytes_atomic(dest: Path, data: bytes, *, mode: int | None = None) -> None:
    """Replace ``dest`` with ``data`` atomically and durably."""
    with atomic_writer(dest, mode=mode) as out:
        out.write(data)


def write_json_atomic(dest: Path, data: Any) -> None:
    """Replace ``dest`` with ``data`` as compact, key-sorted JSON, atomically and durably."""
    # json.dumps without indent takes the C encoder: rewritten on every publish, it matters.
    write_bytes_atomic(dest, json.dumps(data, sort_keys=True).encode())
