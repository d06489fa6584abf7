"""Reading layers: a layer's bytes (from the store or a live download) → a tar stream.

Where it sits: under the extractor (``csi.image.extract``), which walks the tar
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
import io
import queue
import tarfile
import threading
import zlib
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

import zstandard

from csi.common import errors

GZIP_MAGIC = b"\x1f\x8b"
ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"

Source = Callable[[], AbstractContextManager[io.BufferedReader]]
"""Opens a layer's compressed bytes as a stream. Leaving the context normally
must check the content (and may commit it somewhere); an error leaving it
fails the layer."""


@dataclass(frozen=True)
class Layer:
    """A layer: a verified blob at ``path``, or the stream ``source`` opens instead."""

    path: Path
    media_type: str = ""
    digest: str = ""
    source: Source | None = None


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

    zlib releases the GIL while it inflates, so decompression (and, for a live
    download, receiving, hashing and storing the compressed bytes) overlaps
    with writing files. Output goes through a bounded queue in chunks of at
    most ``CHUNK`` bytes (so a bomb never inflates more than ``DEPTH`` chunks
    ahead of the byte budget); errors are raised to the reader; :meth:`close`
    stops and joins the thread.
    """

    CHUNK = 1 << 20
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
def _compressed(layer: Layer) -> Iterator[io.BufferedReader]:
    if layer.source is not None:
        with layer.source() as stream:
            yield stream
    else:
        with open(layer.path, "rb") as f:
            yield f


@contextmanager
def open_tar_stream(layer: Layer, *, limit: int, image: str) -> Iterator[tarfile.TarFile]:
    """The layer's tar members, in stream mode, at most ``limit`` decompressed bytes."""
    with _compressed(layer) as reader:
        inner: IO[bytes] = reader
        try:
            head = reader.peek(4)[:4]
            kind = compression_of(layer.media_type, head)
            if kind == "gzip":
                inner = _Gunzip(reader)  # type: ignore[assignment]
            elif kind == "zstd":
                inner = zstandard.ZstdDecompressor().stream_reader(reader, closefd=False)
            counted = io.BufferedReader(_CountingReader(inner, limit=limit, image=image), 1 << 16)
            with tarfile.open(fileobj=counted, mode="r|") as tar:
                yield tar
        finally:
            if isinstance(inner, _Gunzip):
                inner.close()
