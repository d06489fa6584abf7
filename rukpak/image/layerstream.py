"""A layer read while it downloads: the registry stream teed into the content store.

Where it sits: the image cache (``rukpak.image.cache``) hands the extractor
(``rukpak.image.extract``) one :data:`rukpak.image.layerio.Source` per layer made here.
Opening it streams the blob from the registry (``StreamingPuller.open_blob``,
which verifies size and digest as it is read) and appends every byte to the
content store's ingest file, so download, hashing, decompression and file
creation overlap as in ``curl | tar -xz``. Leaving the context normally commits
the blob to the store (which checks count and hash again); an error discards it.
A blob already in the store is read from there instead.
"""

from __future__ import annotations

import contextlib
import io
from collections.abc import Iterator
from typing import BinaryIO

from rukpak.image.layerio import Source
from rukpak.image.locks import KeyedLocks
from rukpak.image.seams import StreamingPuller
from rukpak.image.store import ContentStore, Ingest
from rukpak.oci.manifest import Descriptor
from rukpak.oci.reference import Reference


class Tee(io.RawIOBase):
    """Reads a blob stream as a raw file and appends every byte read to the store's
    ingest file ``sink`` (when there is one: FUSE mode stores files, not blobs)."""

    CHUNK = 1 << 20

    def __init__(self, stream: BinaryIO, sink: Ingest | None = None) -> None:
        super().__init__()
        self._stream = stream
        self._sink = sink

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: memoryview | bytearray) -> int:  # type: ignore[override]
        data = self._stream.read(len(buffer))
        n = len(data)
        memoryview(buffer).cast("B")[:n] = data
        if self._sink is not None:
            self._sink.write(data)
        return n

    def drain(self) -> None:
        """Store what the extractor left unread (tar padding after the end marker)."""
        while data := self._stream.read(self.CHUNK):
            if self._sink is not None:
                self._sink.write(data)


def layer_source(
    store: ContentStore,
    puller: StreamingPuller,
    ref: Reference,
    desc: Descriptor,
    *,
    locks: KeyedLocks,
) -> Source:
    """A source that reads ``desc`` from the store, or streams it into the store.

    ``locks`` holds one lock per blob digest for the whole stream: a concurrent
    pull of another image sharing this layer waits, then reads the committed blob
    from the store instead of downloading it again.
    """

    @contextlib.contextmanager
    def open_layer() -> Iterator[io.BufferedReader]:
        with locks.hold(desc.digest):
            if store.has(desc.digest):  # another pull stored it, or it repeats in this image
                with open(store.path(desc.digest), "rb") as f:
                    yield f
                return
            # Exits run inner first: the client verifies what it streamed, then the
            # store checks its own count and hash and commits the blob. Not fsynced
            # here (77 MB of a 100 MB bundle's publish): the image cache's background
            # syncfs makes it durable with the tree, and at start the cache drops
            # blobs that no kept tree lists (``ImageCache`` start-up).
            with (
                store.ingest(desc.digest, desc.size, durable=False) as sink,
                puller.open_blob(ref, desc) as stream,
            ):
                tee = Tee(stream, sink)
                yield io.BufferedReader(tee, Tee.CHUNK)
                tee.drain()

    return open_layer


def streamed(puller: StreamingPuller, ref: Reference, desc: Descriptor) -> Source:
    """A source that streams ``desc`` from the registry without keeping it (FUSE mode's
    file store keeps the members it needs instead of the compressed blob)."""

    @contextlib.contextmanager
    def open_layer() -> Iterator[io.BufferedReader]:
        # Leaving open_blob normally reads what the walker left (tar padding) and
        # checks size and digest: DataLoss fails the pull before anything is committed.
        with puller.open_blob(ref, desc) as stream:
            yield io.BufferedReader(Tee(stream), Tee.CHUNK)

    return open_layer
