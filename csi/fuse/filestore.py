"""The file-level content-addressed store: each regular file of every image, once.

Where it sits: under the FUSE image cache (``csi.fuse.images``), which fills it
while it walks a layer's tar members (``csi.fuse.index``), and under the FUSE
filesystem (``csi.fuse.fs``), which serves reads from it. Layout under ``root``::

    ingest/                 files being written (invisible; wiped at start)
    files/sha256/<hex>      one file per distinct content, mode 0444

It follows the node's one commit recipe (``rukpak.store.commit.place``): bytes are
hashed as they arrive, the finished file is fsynced and renamed into place, so a crash
leaves nothing or a complete file; content that is already present is
success and the new copy is dropped. N versions of a bundle that differ in one
file therefore cost one extra file. Unlike the blob store the digest is often
not known in advance (tar members carry none): :meth:`FileStore.ingest`
computes it, or checks it when the caller names one (lazy fetches, whose TOC
does).
"""

from __future__ import annotations

import contextlib
import hashlib
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path

from rukpak.common import errors
from rukpak.common.fsio import unlink_size
from rukpak.oci import digest as digests
from rukpak.store import commit

ALGORITHM = "sha256"
CHUNK = 1 << 20


def verify_fd(fd: int, digest: str) -> bool:
    """Whether the file open on ``fd`` hashes to ``digest`` (read from offset 0, by ``pread``)."""
    hasher = hashlib.sha256()
    offset = 0
    while chunk := os.pread(fd, CHUNK, offset):
        hasher.update(chunk)
        offset += len(chunk)
    return f"{ALGORITHM}:{hasher.hexdigest()}" == digest


def matches(data: bytes, digest: str) -> bool:
    """Whether ``data`` (a whole file) hashes to ``digest``."""
    return f"{ALGORITHM}:{hashlib.sha256(data).hexdigest()}" == digest


class FileIngest:
    """An open ingest file; :attr:`digest` is set once the ``with`` block commits it."""

    def __init__(self, fd: int) -> None:
        self._fd = fd
        self._hasher = hashlib.sha256()
        self.size = 0
        self.digest = ""

    def write(self, data: bytes | memoryview) -> None:
        self._hasher.update(data)
        self.size += len(data)
        view = memoryview(data)
        while view:
            view = view[os.write(self._fd, view) :]

    def computed(self) -> str:
        return f"{ALGORITHM}:{self._hasher.hexdigest()}"


class FileStore:
    """Files by content digest. Thread-safe: writers never share an ingest file."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ingest_dir = root / "ingest"
        self.files_dir = root / "files" / ALGORITHM
        self._files_prefix = f"{self.files_dir}{os.sep}"
        for d in (root, self.ingest_dir, self.files_dir):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
        for entry in self.ingest_dir.iterdir():  # unfinished ingests from before a crash
            entry.unlink(missing_ok=True)

    def path(self, digest: str) -> Path:
        """Where ``digest`` lives (present or not); InvalidArgument for a malformed digest."""
        algorithm, _, _ = digests.check(digest).partition(":")
        if algorithm != ALGORITHM:
            raise errors.InvalidArgument(f"file digest {digest!r}: only sha256 is supported")
        return self.files_dir / digests.hex_of(digest)

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    @contextlib.contextmanager
    def ingest(
        self,
        *,
        expect: str | None = None,
        size: int | None = None,
        durable: bool = True,
        accept: Callable[[str], bool] | None = None,
    ) -> Iterator[FileIngest]:
        """Stream one file in; leaving the block normally commits it under its digest.

        With ``expect`` (and ``size``) the content must match, else DataLoss and
        nothing is kept. With ``accept``, content whose digest it refuses is dropped
        (``digest`` stays empty): nobody asked for it. Leaving with an error discards
        the ingest. Idempotent: content already present is success (the new copy is
        dropped). With ``durable=False`` nothing is fsynced: bulk writers call
        :meth:`sync` once before they commit what refers to the files (an index).
        """
        tmp = self.ingest_dir / secrets.token_hex(8)
        fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
        try:
            try:
                sink = FileIngest(fd)
                yield sink
                digest = sink.computed()
                if expect is not None and digest != expect:
                    raise errors.DataLoss(
                        f"file content hashes to {digest}, the table of contents says "
                        f"{expect}; the registry served different content"
                    )
                if size is not None and sink.size != size:
                    raise errors.DataLoss(
                        f"file {digest}: got {sink.size} bytes, the table of contents says {size}"
                    )
                if accept is not None and not accept(digest):
                    tmp.unlink()
                    return
                final = self.path(digest)
                if not final.is_file():
                    os.fchmod(fd, 0o444)
                # the node's one recipe: fsync (durable), rename, fsync the directory;
                # content already present is success and this copy goes
                commit.place(tmp, final, fd=fd, durable=durable)
            finally:
                os.close(fd)
            sink.digest = digest
        except BaseException:
            tmp.unlink(missing_ok=True)
            raise

    def sync(self) -> None:
        """Make every file written so far durable: one syncfs of the store's filesystem."""
        commit.sync_filesystem(self.files_dir)

    def put_bytes(self, data: bytes) -> str:
        """Store small content already in memory; returns its digest."""
        with self.ingest() as sink:
            sink.write(data)
        return sink.digest

    def open_fd(self, digest: str) -> int | None:
        """A read-only descriptor of the stored file (the caller closes it); None when missing.

        On the FUSE read path: a plain string path, no ``Path`` objects, one ``open(2)``.
        """
        try:
            return os.open(self._files_prefix + digests.hex_of(digest), os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            return None

    def verify(self, digest: str) -> bool:
        """Whether the stored file still hashes to ``digest`` (False when missing)."""
        fd = self.open_fd(digest)
        if fd is None:
            return False
        try:
            return verify_fd(fd, digest)
        finally:
            os.close(fd)

    def delete(self, digest: str) -> int:
        """Remove a file; returns the bytes freed (0 if absent)."""
        return unlink_size(self.path(digest))

    def digests(self) -> Iterator[str]:
        for entry in self.files_dir.iterdir():
            digest = f"{ALGORITHM}:{entry.name}"
            if digests.is_valid(digest):
                yield digest

    def disk_usage(self) -> int:
        """Bytes allocated on disk by stored files (blocks, as ``du`` counts)."""
        total = 0
        for entry in os.scandir(self.files_dir):
            total += entry.stat(follow_symlinks=False).st_blocks * 512
        return total

    def clear(self) -> None:
        shutil.rmtree(self.files_dir, ignore_errors=True)
        self.files_dir.mkdir(mode=0o700, parents=True, exist_ok=True)
