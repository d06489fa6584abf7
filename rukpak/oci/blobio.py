"""Verified content streams: every byte counted and hashed against its descriptor.

Used by ``rukpak.oci.client`` for blob downloads (and usable by the node's
content store for its own ingests): :func:`write_atomically` streams chunks
into a temp file beside the destination and renames it into place only after
size and digest match, so a failure never leaves a partial file behind;
:class:`VerifyingReader` wraps a raw stream and raises DataLoss at end of
stream when the content is not what the descriptor promised; :func:`pieces` reads one
through to its end for a caller that only passes the bytes on (a content store's ingest).
"""

from __future__ import annotations

import errno
import io
import os
from collections.abc import Callable, Generator, Iterable, Iterator
from pathlib import Path
from typing import BinaryIO, Protocol, cast

from rukpak.common import errors
from rukpak.common.fsio import atomic_writer
from rukpak.oci import digest as digests
from rukpak.oci import handoff

Progress = Callable[[int, int], None]  # (bytes done, bytes total)
PIECE = handoff.SLOT
"""What :func:`pieces` reads from the network at a time by default: a whole hashing slot
(reading a 1 GiB blob into an ingest in 64 or 256 KiB pieces cost the reading thread
more CPU, not less; see docs/benchmarks.md, artifacts)."""


class Readable(Protocol):
    """A source of bytes: a file, ``urllib3`` response, or an adapter around one; one with
    a ``readinto`` too is read with that (into the caller's buffer, no ``bytes`` per chunk)."""

    def read(self, size: int = -1, /) -> bytes: ...


CORRUPT_HINT = "the registry's copy is corrupt or was tampered with"


def mismatch(
    subject: str, expected: str, size: int, got_digest: str, got_size: int
) -> errors.DataLoss:
    """The DataLoss error for content that does not match its descriptor."""
    if got_size != size:
        what = f"{got_size} bytes arrived where the descriptor says {size}"
    else:
        what = f"its content hashes to {got_digest}"
    return errors.DataLoss(
        f"{subject}: digest {expected} does not match: {what}; {CORRUPT_HINT} (nothing was stored)"
    )


def write_atomically(
    chunks: Iterable[bytes],
    dest: Path,
    *,
    digest: str,
    size: int,
    subject: str,
    progress: Progress | None = None,
) -> None:
    """Write ``chunks`` to ``dest`` only if they are exactly ``size`` bytes hashing to ``digest``.

    The temp file, fsync and rename are ``rukpak.common.fsio.atomic_writer``'s: on
    any failure the temp file is removed and ``dest`` is left as it was.
    """
    digester = digests.Digester.for_digest(digest)
    try:
        with atomic_writer(dest) as out:
            for chunk in chunks:
                if not chunk:
                    continue
                digester.update(chunk)
                if digester.size > size:
                    raise mismatch(subject, digest, size, "", digester.size)
                out.write(chunk)
                if progress is not None:
                    progress(digester.size, size)
            if digester.size != size or digester.digest() != digest:
                raise mismatch(subject, digest, size, digester.digest(), digester.size)
    except OSError as exc:
        raise disk_error(exc, dest, subject) from exc


def disk_error(exc: OSError, dest: Path, subject: str) -> errors.RukpakError:
    """A coded error for a local filesystem failure while storing ``subject``."""
    reason = os.strerror(exc.errno) if exc.errno else str(exc)
    message = f"cannot store {subject} at {dest}: {reason}"
    if exc.errno in (errno.ENOSPC, errno.EDQUOT):
        return errors.ResourceExhausted(f"{message}; free space or raise the cache budget")
    if exc.errno in (errno.ENOENT, errno.ENOTDIR, errno.EACCES, errno.EPERM, errno.EROFS):
        return errors.FailedPrecondition(f"{message}; check the directory exists and is writable")
    return errors.Internal(message)


class VerifyingReader(io.RawIOBase):
    """A read-only raw stream that checks size and digest of what passes through.

    Raises DataLoss as soon as more than ``size`` bytes arrive, and at end of
    stream when the size or digest is wrong. :meth:`verify_rest` drains what is
    left unread and checks it (used when a consumer stops early, e.g. a tar
    reader at the end-of-archive marker). A blob of ``handoff.WORTH`` bytes or more
    is hashed in a second thread (:class:`rukpak.oci.handoff.Handoff`) while the next
    chunk is read; the end of stream waits for it, so nothing is declared verified
    before every byte was hashed. :meth:`close` stops that thread.
    """

    def __init__(self, raw: Readable, *, digest: str, size: int, subject: str) -> None:
        super().__init__()
        self._handoff: handoff.Handoff | None = None
        self._raw = raw
        into = getattr(raw, "readinto", None)
        self._into: Callable[[memoryview], int] | None = into if callable(into) else None
        self._digester = digests.Digester.for_digest(digest)
        self._digest = digest
        self._size = size
        self._count = 0
        self._subject = subject
        if size >= handoff.WORTH:
            self._handoff = handoff.Handoff(self._digester.update, name=f"hash {digest[:19]}")
        self.verified = False

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        view = memoryview(buffer).cast("B")
        if self._into is not None:
            n = self._into(view)
        else:
            data = self._raw.read(len(view))
            n = len(data)
            view[:n] = data
        if not n:
            self._finish()
            return 0
        self._count += n
        if self._count > self._size:
            raise mismatch(self._subject, self._digest, self._size, "", self._count)
        if self._handoff is not None:
            self._handoff.put(view[:n])
        else:
            self._digester.update(view[:n])
        return n

    def pieces(self, size: int) -> Generator[memoryview, None, None]:
        """The rest of the stream in views of at most ``size`` bytes, then verified (DataLoss).

        A large blob from a source with ``readinto`` is read straight into the hashing
        thread's slots (:meth:`rukpak.oci.handoff.Handoff.borrow`), so the bytes the
        caller writes out are the very bytes hashed, with no copy between. Each view is
        valid until the next one is asked for; the caller only reads it.
        """
        work, into = self._handoff, self._into
        if work is None or into is None:
            buffer = memoryview(bytearray(size))
            while n := self.readinto(buffer):
                yield buffer[:n]
            return
        while True:
            slot = work.borrow()
            view = memoryview(slot)
            fill = 0
            try:
                while fill < len(view):
                    n = into(view[fill : fill + size])
                    if not n:
                        break
                    self._count += n
                    if self._count > self._size:
                        raise mismatch(self._subject, self._digest, self._size, "", self._count)
                    yield view[fill : fill + n]
                    fill += n
            except BaseException:
                work.give(slot, 0)  # nothing more is hashed: the stream failed or was left
                raise
            work.give(slot, fill)
            if fill < len(slot):
                self._finish()
                return

    @property
    def fresh(self) -> bool:
        """Whether nothing was read yet (a buffer above it holds nothing of the blob)."""
        return self._count == 0 and not self.verified

    def _finish(self) -> None:
        if self.verified:
            return
        if self._handoff is not None:
            self._handoff.flush()
        got = self._digester.digest()
        if self._count != self._size or got != self._digest:
            raise mismatch(self._subject, self._digest, self._size, got, self._count)
        self.verified = True

    def verify_rest(self) -> None:
        """Read to the end (discarding) and verify."""
        while self.read(1 << 20):
            pass
        self._finish()

    def close(self) -> None:
        if self._handoff is not None:
            self._handoff.close()
        super().close()


def pieces(stream: BinaryIO, size: int = PIECE) -> Iterator[memoryview]:
    """What is left of ``stream`` in views of at most ``size`` bytes, each valid until the
    next is asked for. A blob stream of ``RegistryClient.open_blob`` not read from yet is
    read through :meth:`VerifyingReader.pieces` (no copy for the hash); any other binary
    stream through ``readinto`` into one buffer. Either way the stream's own checks apply.
    """
    raw = getattr(stream, "raw", None)
    if isinstance(raw, VerifyingReader) and raw.fresh:
        yield from raw.pieces(size)
        return
    readinto = cast(io.BufferedIOBase, stream).readinto
    buffer = memoryview(bytearray(size))
    while n := readinto(buffer):
        yield buffer[:n]
