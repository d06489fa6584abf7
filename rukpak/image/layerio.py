"""Reading layers: a layer's bytes (from the store or a live download) → a tar stream.

Where it sits: under the extractor (``rukpak.image.extract``), which walks the tar
members this module hands it. A layer's compressed bytes come either from a
verified blob on disk or from a :data:`Source` — the image cache passes one
that tees a verifying registry stream into the content store's ingest file,
so download and extraction overlap. Compression is taken from the media type,
else from magic bytes; gzip inflates in a helper thread (as ``tar -xz``
overlaps its gzip child with itself) and every decompressed byte counts
against the unpack budget before tar sees it.
"""

from __future__ import annotations

import contextlib
import gzip
import io
import queue
import tarfile
import threading
import zlib
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any, Self, cast

import zstandard

from rukpak.common import errors
from rukpak.image import ustar
from rukpak.oci import mediatypes
from rukpak.oci.manifest import Descriptor
from rukpak.oci.reference import Reference

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"

Source = Callable[[], AbstractContextManager[io.BufferedReader]]
"""Opens a layer's compressed bytes as a stream. Leaving the context normally
must check the content (and may commit it somewhere); an error leaving it
fails the layer."""


MAX_HEADER_BYTES = 64 * 1024
"""Largest pax extended header or GNU long-name/long-link record read into memory
(PATH_MAX is 4 KiB; a layer asking for more is refused before the bytes are read)."""
MAX_CHAINED_HEADERS = 8
"""Extended headers in a row before one member (tarfile reads them recursively)."""
_EXTENDED = frozenset(
    {
        tarfile.XHDTYPE,
        tarfile.XGLTYPE,
        tarfile.SOLARIS_XHDTYPE,
        tarfile.GNUTYPE_LONGNAME,
        tarfile.GNUTYPE_LONGLINK,
    }
)


def shown(text: str, limit: int = 256) -> str:
    """Attacker-controlled text cut to ``limit`` characters for logs and error messages."""
    if len(text) <= limit:
        return text
    return f"{text[:limit]}...({len(text)} characters)"


class HeaderRefused(Exception):
    """A tar header the extractor will not read (too large, or too many chained)."""


class _CappedTarInfo(tarfile.TarInfo):
    """``TarInfo`` that refuses oversized or endlessly chained extended headers
    *before* ``tarfile`` reads them into memory, and reads common headers faster
    (``rukpak.image.ustar``)."""

    @classmethod
    def frombuf(cls, buf: bytes | bytearray, encoding: str, errors: str) -> Self:
        fast = ustar.parse(cls, bytes(buf), encoding, errors)
        if fast is not None:
            return fast
        return super().frombuf(buf, encoding, errors)

    def _proc_member(self, tarfile_: tarfile.TarFile) -> tarfile.TarInfo:
        if self.type not in _EXTENDED:
            return super()._proc_member(tarfile_)  # type: ignore[misc,no-any-return]
        kind = "pax extended header" if self.type != tarfile.GNUTYPE_LONGNAME else "GNU long name"
        if self.type == tarfile.GNUTYPE_LONGLINK:
            kind = "GNU long link name"
        if self.size > MAX_HEADER_BYTES:
            raise HeaderRefused(
                f"{kind} {shown(self.name)!r} holds {self.size} bytes, more than the "
                f"{MAX_HEADER_BYTES} allowed"
            )
        chain = int(getattr(tarfile_, "_rukpak_chain", 0))
        if chain >= MAX_CHAINED_HEADERS:
            raise HeaderRefused(f"more than {MAX_CHAINED_HEADERS} extended headers in a row")
        if self.type == tarfile.XGLTYPE:
            total = int(getattr(tarfile_, "_rukpak_global", 0)) + self.size
            if total > MAX_HEADER_BYTES:
                raise HeaderRefused(
                    f"global pax headers hold more than {MAX_HEADER_BYTES} bytes in all"
                )
            tarfile_._rukpak_global = total  # type: ignore[attr-defined]
        tarfile_._rukpak_chain = chain + 1  # type: ignore[attr-defined]
        try:
            return super()._proc_member(tarfile_)  # type: ignore[misc,no-any-return]
        finally:
            tarfile_._rukpak_chain = chain  # type: ignore[attr-defined]


@dataclass(frozen=True)
class Layer:
    """A layer: a verified blob at ``path``, or the stream ``source`` opens instead."""

    path: Path
    media_type: str = ""
    digest: str = ""
    source: Source | None = None
    file_name: str = ""
    """Set for a file layer of an artifact (``rukpak.image.artifact``): the blob at ``path``
    is placed whole at this path in the tree, not read as a tar."""


def require_tar_layers(image: Reference, layers: Iterable[Descriptor]) -> None:
    """Raise InvalidArgument unless every layer of ``image`` is a filesystem (tar)
    layer: what both image caches (bind and FUSE) check before they pull."""
    for layer in layers:
        if layer.media_type not in mediatypes.LAYER_TYPES:
            raise errors.InvalidArgument(
                f"image {image}: layer {layer.digest} has media type {layer.media_type!r}, "
                "which is not a filesystem layer; bundle images must use tar layers (an "
                "artifact of files named by their title is served with publishMode: bind)"
            )


def compression_of(media_type: str, head: bytes) -> str:
    """``gzip``, ``zstd`` or ``none``: from the media-type table, else from magic bytes.

    Unknown types (layers of older tools, blobs read by digest only) fall back
    to the suffix of the type and then to the first bytes of the data.
    """
    known = mediatypes.LAYER_COMPRESSION.get(media_type)
    if known is not None:
        return known
    mt = media_type.lower()
    if mt.endswith("gzip"):
        return mediatypes.GZIP
    if mt.endswith("zstd"):
        return mediatypes.ZSTD
    if mt.endswith("tar"):
        return mediatypes.NO_COMPRESSION
    if head.startswith(GZIP_MAGIC):
        return mediatypes.GZIP
    if head.startswith(ZSTD_MAGIC):
        return mediatypes.ZSTD
    return mediatypes.NO_COMPRESSION


def decompressed(raw: IO[bytes], media_type: str, head: bytes = b"") -> IO[bytes]:
    """``raw`` decompressed as its media type (or magic bytes) says, read in the caller's
    thread. For reading a layer once (``rukpak bundle inspect``); the extractor uses
    :func:`open_tar_stream`, which inflates gzip in a helper thread."""
    kind = compression_of(media_type, head)
    if kind == mediatypes.GZIP:
        return cast(IO[bytes], gzip.GzipFile(fileobj=raw, mode="rb"))
    if kind == mediatypes.ZSTD:
        return cast(IO[bytes], zstandard.ZstdDecompressor().stream_reader(raw, closefd=False))
    return raw


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

    zlib releases the GIL while it inflates, so decompression (and, for a live
    download, receiving, hashing and storing the compressed bytes) overlaps
    with writing files. Output goes through a bounded queue in chunks of at
    most ``CHUNK`` bytes (so a bomb never inflates more than ``DEPTH`` chunks
    ahead of the byte budget); errors are raised to the reader; :meth:`close`
    stops and joins the thread.
    """

    CHUNK = 1 << 20
    WINDOW = 1 << 16
    DEPTH = 8

    def __init__(self, raw: IO[bytes]) -> None:
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

    def _inflate(self, raw: IO[bytes]) -> None:
        try:
            member: Any = zlib.decompressobj(16 + zlib.MAX_WBITS)
            while chunk := raw.read(self.CHUNK):
                view, pos = memoryview(chunk), 0
                while pos < len(view):
                    if member is None:  # between members: skip zero padding
                        if not view[pos]:
                            pos = len(chunk) - len(chunk[pos:].lstrip(b"\0"))
                        if pos == len(view):
                            break
                        member = zlib.decompressobj(16 + zlib.MAX_WBITS)
                    # A window, not the rest of the chunk: many small members (eStargz
                    # writes one per file) would otherwise copy the rest as unused_data
                    # once each.
                    window = view[pos : pos + self.WINDOW]
                    data: bytes | memoryview = window
                    while data:
                        out = member.decompress(data, self.CHUNK)
                        if out and not self._put(out):
                            return
                        if member.eof:
                            break
                        data = member.unconsumed_tail
                    if member.eof:
                        pos += len(window) - len(member.unused_data)
                        member = None
                    else:
                        pos += len(window)
            if member is not None:
                raise EOFError("compressed data ends before the end-of-stream marker")
            self._put(None)
        except BaseException as exc:  # handed to the reader, which raises it
            self._put(exc)


@contextmanager
def _compressed(layer: Layer) -> Iterator[io.BufferedReader]:
    if layer.source is not None:
        with layer.source() as stream:
            yield stream
    else:
        with open(layer.path, "rb") as f:
            yield f


UNREADABLE: tuple[type[BaseException], ...] = (
    tarfile.TarError,
    EOFError,
    zlib.error,
    zstandard.ZstdError,
    HeaderRefused,
)
"""What reading a layer raises when its bytes are not a well-formed (compressed) tar."""


def is_unreadable(exc: BaseException) -> bool:
    """Whether ``exc`` means "these bytes are not a readable layer" (not a disk error)."""
    if isinstance(exc, UNREADABLE):
        return True
    return isinstance(exc, OSError) and not exc.errno  # BadGzipFile and friends


@contextmanager
def open_tar_stream(layer: Layer, *, limit: int, image: str) -> Iterator[tarfile.TarFile]:
    """The layer's tar members, in stream mode, at most ``limit`` decompressed bytes.

    When the bytes turn out unreadable, the rest of the compressed stream is read
    before the error propagates, so a verifying source compares the digest first:
    tampered content is DataLoss even when it breaks decompression before its end.
    """
    with _compressed(layer) as reader:
        inner: IO[bytes] = reader
        try:
            head = reader.peek(4)[:4]
            kind = compression_of(layer.media_type, head)
            if kind == mediatypes.GZIP:
                inner = _Gunzip(reader)  # type: ignore[assignment]
            else:
                inner = decompressed(reader, layer.media_type, head)
            counted = io.BufferedReader(_CountingReader(inner, limit=limit, image=image), 1 << 16)
            with tarfile.open(fileobj=counted, mode="r|", tarinfo=_CappedTarInfo) as tar:
                yield tar
        except BaseException as exc:
            if is_unreadable(exc) and layer.source is not None:
                if isinstance(inner, _Gunzip):
                    inner.close()  # stop its reads before draining the same stream
                while reader.read(1 << 20):  # the source verifies at its end: DataLoss
                    pass
            raise
        finally:
            if isinstance(inner, _Gunzip):
                inner.close()
