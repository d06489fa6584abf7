"""The node's content-addressed blob store, modelled on containerd's.

Where it sits: under the image cache (``rukpak.image.cache``), which asks it for
manifests, configs and layers by digest; the registry client writes into it
through a ``fetch`` callback. Layout under ``root``::

    ingest/                 unfinished downloads (invisible; wiped at start)
    blobs/<alg>/<hex>       verified content, mode 0444

A blob becomes visible only after its size and digest were checked, by one
``os.replace`` from ``ingest/`` followed by an fsync of the directory, so a
crash at any moment leaves either nothing or a complete blob. Putting content
that already exists is success (idempotent). Besides ``put`` (a fetch callback
writes a file), :meth:`ContentStore.ingest` takes the bytes as they stream by,
hashing them on the way, so a caller can unpack a layer while it downloads.
Digests come from untrusted manifests, so each one is validated before it
names a path.
"""

from __future__ import annotations

import contextlib
import os
import secrets
import shutil
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import NamedTuple

from rukpak.common import errors
from rukpak.common.fsio import fsync_dir, preallocate, unlink_size
from rukpak.oci import digest as digests
from rukpak.oci import handoff

WRITE_PIECE = 64 << 10
"""The most one ``write(2)`` of an ingest passes to the kernel (see :class:`Ingest`)."""

Fetch = Callable[[Path], None]
"""Writes the blob's bytes to the given (not yet existing) path."""


class BlobInfo(NamedTuple):
    """One stored blob, as :meth:`ContentStore.blobs` yields them (each size check walks all)."""

    digest: str
    size: int
    touched: float
    """The file's mtime: the mirror touches a blob each time it serves it (atime is not
    kept on relatime or noatime mounts)."""


def verify_file(path: Path, *, digest: str, size: int) -> None:
    """Raise DataLoss unless ``path`` holds exactly ``size`` bytes hashing to ``digest``."""
    hasher = digests.Digester.for_digest(digest)
    with open(path, "rb") as f:
        while chunk := f.read(1 << 20):
            hasher.update(chunk)
    _check_hashed(hasher, digest=digest, size=size)


def _check_hashed(hasher: digests.Digester, *, digest: str, size: int) -> None:
    """Raise DataLoss unless ``hasher`` saw exactly ``size`` bytes hashing to ``digest``:
    the last step of :func:`verify_file` and of :meth:`Ingest.check`."""
    if hasher.size != size:
        raise errors.DataLoss(
            f"blob {digest}: got {hasher.size} bytes, the manifest says {size}; "
            "the registry served different content, try again or re-push the image"
        )
    if hasher.digest() != digest:
        raise errors.DataLoss(
            f"blob {digest}: content hashes to {hasher.digest()}; "
            "the registry served different content, try again or re-push the image"
        )


class Ingest:
    """An open ingest file: bytes written are hashed and counted (see ContentStore.ingest).

    A blob to hash of ``handoff.WORTH`` bytes or more is hashed and written by a second
    thread (:class:`rukpak.oci.handoff.Handoff`) while the caller reads on: :meth:`write`
    copies and returns, :meth:`check` waits for every byte to be on file and raises a write
    error (ENOSPC, EIO) the thread met, as :meth:`write` itself does for the next chunk.
    :meth:`close` stops the thread. One only counted (its source verifies it, hashing in
    a thread of its own) is written by the caller's thread: a thread just to write buys
    nothing measurable and costs one more copy. Either way ``write(2)`` is given at most
    ``WRITE_PIECE`` bytes at a time: the kernel then fills small page-cache folios, while
    1 MiB writes made it take large ones, likely from memory the benchmark's VM had
    handed back to its host (a loop reading a socket and writing 1 GiB took 0.6-2.7 s at
    1 MiB a write, 0.25-0.4 s at 64 KiB; see docs/benchmarks.md, artifacts).
    """

    def __init__(self, fd: int, *, digest: str, size: int, hashed: bool = True) -> None:
        self._fd = fd
        self._hasher = digests.Digester.for_digest(digest)
        self._hashed = hashed
        self._count = 0
        self.digest = digest
        self.size = size
        self._handoff = (
            handoff.Handoff(self._store, name=f"ingest {digest[:19]}")
            if hashed and size >= handoff.WORTH
            else None
        )

    @property
    def written(self) -> int:
        return self._count

    def write(self, data: bytes | memoryview) -> None:
        """Append ``data``; DataLoss as soon as more than ``size`` bytes arrive."""
        self._count += len(data)
        if self._count > self.size:
            raise errors.DataLoss(
                f"blob {self.digest}: more than the {self.size} bytes the manifest says "
                "arrived; the registry served different content, try again or re-push the image"
            )
        if self._handoff is not None:
            self._handoff.put(data)
        else:
            self._store(memoryview(data).cast("B"))

    def _store(self, view: memoryview) -> None:
        if self._hashed:
            self._hasher.update(view)
        while view:
            view = view[os.write(self._fd, view[:WRITE_PIECE]) :]

    def check(self) -> None:
        """Raise DataLoss unless exactly ``size`` bytes hashing to ``digest`` were written
        (the count only when the source verified the digest itself)."""
        if self._handoff is not None:
            self._handoff.flush()
        if self._hashed:
            _check_hashed(self._hasher, digest=self.digest, size=self.size)
        elif self._count != self.size:
            raise errors.DataLoss(
                f"blob {self.digest}: got {self._count} bytes, the manifest says {self.size}; "
                "the registry served different content, try again or re-push the image"
            )

    def close(self) -> None:
        """Stop the writing thread, if any (what it had not written is dropped); idempotent."""
        if self._handoff is not None:
            self._handoff.close()


class ContentStore:
    """Verified blobs by digest. Thread-safe: writers never share an ingest file."""

    def __init__(self, root: Path) -> None:
        self.root = root
        self.ingest_dir = root / "ingest"
        self.blobs_dir = root / "blobs"
        for d in (root, self.ingest_dir, self.blobs_dir):
            d.mkdir(mode=0o700, parents=True, exist_ok=True)
        self.clean_ingests()

    def clean_ingests(self) -> None:
        """Drop unfinished downloads (call only when no pull is running: at start)."""
        for entry in self.ingest_dir.iterdir():
            if entry.is_dir() and not entry.is_symlink():
                shutil.rmtree(entry, ignore_errors=True)
            else:
                entry.unlink(missing_ok=True)

    def path(self, digest: str) -> Path:
        """Where ``digest`` lives (whether or not it is present yet)."""
        algorithm, _, _ = digests.check(digest).partition(":")
        return self.blobs_dir / algorithm / digests.hex_of(digest)

    def has(self, digest: str) -> bool:
        return self.path(digest).is_file()

    def put(self, digest: str, size: int, fetch: Fetch) -> Path:
        """Make ``digest`` present, calling ``fetch`` only if it is missing.

        Idempotent: an existing blob is success without a fetch. Raises DataLoss
        (and keeps nothing) when the fetched content does not match.
        """
        final = self.path(digest)
        if final.is_file():
            return final
        work = self.ingest_dir / f"{digests.hex_of(digest)}-{secrets.token_hex(4)}"
        work.mkdir(mode=0o700)
        try:
            tmp = work / "data"
            fetch(tmp)
            verify_file(tmp, digest=digest, size=size)
            self._commit(tmp, final)
        finally:
            shutil.rmtree(work, ignore_errors=True)
        return final

    @contextlib.contextmanager
    def ingest(
        self, digest: str, size: int, *, durable: bool = True, source_verified: bool = False
    ) -> Iterator[Ingest]:
        """Stream a blob in: write its bytes to the yielded :class:`Ingest`.

        Leaving the block normally checks size and digest and commits the blob
        (DataLoss, keeping nothing, when they do not match); leaving it with an
        error discards the ingest. Until the commit nothing is visible under
        ``blobs/``, and an ingest a crash interrupts is wiped at the next start.
        ``durable=False`` commits without fsync: the caller makes it durable later
        (the image cache: with its tree, and drops blobs no tree lists at start).
        ``source_verified=True`` only counts the bytes: the caller's source checks the
        digest itself before the block ends (a verifying registry stream opened inside
        it), so the bytes are hashed once, not twice. A large blob's disk space is
        allocated before the block starts (``rukpak.common.fsio.preallocate``): a disk
        that cannot hold it fails here (OSError ENOSPC), before the download.
        """
        final = self.path(digest)
        work = self.ingest_dir / f"{digests.hex_of(digest)}-{secrets.token_hex(4)}"
        work.mkdir(mode=0o700)
        try:
            tmp = work / "data"
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600)
            try:
                if size >= handoff.WORTH:  # the disk it needs, taken before the download
                    preallocate(fd, size)
                sink = Ingest(fd, digest=digest, size=size, hashed=not source_verified)
                try:
                    yield sink
                    sink.check()
                finally:
                    sink.close()
            finally:
                os.close(fd)
            self._commit(tmp, final, durable=durable)
        finally:
            shutil.rmtree(work, ignore_errors=True)

    def put_bytes(self, digest: str, data: bytes) -> Path:
        """Store small content already in memory (manifests), verified first."""

        def write(dest: Path) -> None:
            dest.write_bytes(data)

        return self.put(digest, len(data), write)

    def _commit(self, tmp: Path, final: Path, *, durable: bool = True) -> None:
        fd = os.open(tmp, os.O_RDONLY | os.O_CLOEXEC)
        try:
            if durable:
                os.fsync(fd)
            os.fchmod(fd, 0o444)
        finally:
            os.close(fd)
        final.parent.mkdir(mode=0o700, exist_ok=True)
        os.replace(tmp, final)
        if durable:
            fsync_dir(final.parent)

    def delete(self, digest: str) -> int:
        """Remove a blob; returns the bytes freed (0 if it was absent)."""
        return unlink_size(self.path(digest))

    def blobs(self) -> Iterator[BlobInfo]:
        for alg_dir in self.blobs_dir.iterdir():
            if alg_dir.name not in digests.ALGORITHMS:
                continue
            for blob in alg_dir.iterdir():
                digest = f"{alg_dir.name}:{blob.name}"
                if not digests.is_valid(digest):
                    continue
                st = blob.stat()
                yield BlobInfo(digest=digest, size=st.st_size, touched=st.st_mtime)

    def total_size(self) -> int:
        return sum(b.size for b in self.blobs())
