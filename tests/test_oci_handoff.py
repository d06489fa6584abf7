"""Large blobs hashed and written beside the reading thread (``rukpak.oci.handoff``), and
what must hold however that thread fares: every byte is hashed before a blob is declared
verified, a tampered, short or long blob is DataLoss and nothing is kept, a connection
that drops mid-blob is a broken download (Unavailable) and nothing is kept, a write error
met by the thread reaches the caller, and no thread outlives its stream or ingest.

The handoff and verification rules are pure logic (fed from memory); the dropped
connection is a real HTTP server that closes the socket half way through a blob, and the
deadline passing mid-blob is Debian's docker-registry, each read through the registry
client into the node's content store as the image cache reads an artifact's file layer.
"""

from __future__ import annotations

import contextlib
import errno
import http.server
import io
import os
import resource
import signal
import threading
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import BinaryIO, cast

import pytest

from rukpak.common import backoff, errors
from rukpak.image import store as store_module
from rukpak.image.store import ContentStore
from rukpak.oci import blobio, handoff, mediatypes
from rukpak.oci import digest as digests
from rukpak.oci.client import RegistryClient
from rukpak.oci.handoff import Handoff
from rukpak.oci.manifest import Descriptor
from rukpak.oci.reference import Reference
from tests.registry import RegistryServer
from tests.source_servers import local_http

BIG = handoff.WORTH + 12_345  # past the threshold: the thread path, not a multiple of a slot


def big_blob() -> bytes:
    return os.urandom(BIG)


def handoff_threads() -> list[str]:
    """Names of the hashing and ingest threads still running."""
    return [t.name for t in threading.enumerate() if t.name.startswith(("hash ", "ingest "))]


def visible(root: Path) -> dict[str, list[str]]:
    return {
        "blobs": sorted(p.name for p in (root / "blobs").rglob("*") if p.is_file()),
        "ingest": sorted(p.name for p in (root / "ingest").iterdir()),
    }


def read_in_chunks(stream: io.BufferedReader, size: int = 1 << 20) -> bytes:
    out = bytearray()
    view = memoryview(bytearray(size))
    while n := stream.readinto(view):
        out += view[:n]
    return bytes(out)


# -- the handoff itself --------------------------------------------------------------


def test_what_is_put_reaches_the_thread_in_order_while_the_caller_reuses_its_buffer() -> None:
    got = bytearray()
    pieces = [os.urandom(n) for n in (1, 6, 7, 20, 3, 0, 50, 2)]
    work = Handoff(lambda view: got.extend(view), name="test handoff", slots=2, slot_size=7)
    buffer = bytearray(64)
    try:
        for piece in pieces:
            buffer[: len(piece)] = piece
            work.put(memoryview(buffer)[: len(piece)])
            buffer[:] = b"\xff" * len(buffer)  # reused at once: the thread has its own copy
        work.flush()
    finally:
        work.close()
    assert bytes(got) == b"".join(pieces)


def test_an_error_in_the_thread_is_raised_in_the_callers_thread_then_nothing_is_consumed() -> None:
    seen: list[bytes] = []

    def consume(view: memoryview) -> None:
        if seen:
            raise OSError(errno.ENOSPC, "No space left on device")
        seen.append(bytes(view))

    work = Handoff(consume, name="test handoff", slots=2, slot_size=4)
    try:
        work.put(b"abcd")  # consumed
        work.put(b"efgh")  # the thread fails on this one
        with pytest.raises(OSError) as caught:
            work.flush()
        assert caught.value.errno == errno.ENOSPC
        with pytest.raises(OSError):  # and keeps failing: nothing more is consumed
            work.put(b"ijkl")
    finally:
        work.close()
    assert seen == [b"abcd"]


def test_close_stops_the_thread_is_idempotent_and_refuses_more() -> None:
    work = Handoff(lambda view: None, name="test handoff")
    work.put(b"x" * 100)
    work.close()
    work.close()
    assert not work.alive
    with pytest.raises(ValueError, match="after close"):
        work.put(b"y")
    with pytest.raises(ValueError, match="after close"):
        work.flush()


def test_lent_slots_reach_the_thread_in_order_with_what_was_put_and_uncopied() -> None:
    got: list[bytes] = []
    seen_slots: list[int] = []

    def consume(view: memoryview) -> None:
        got.append(bytes(view))
        seen_slots.append(id(view.obj))

    work = Handoff(consume, name="test handoff", slots=2, slot_size=8)
    try:
        work.put(b"abc")  # gathered, then sent ahead of the first lent slot
        lent = []
        for piece in (b"defgh", b"ij", b"klmnopqr"):
            slot = work.borrow()
            slot[: len(piece)] = piece
            work.give(slot, len(piece))
            lent.append(id(slot))
        unused = work.borrow()
        work.give(unused, 0)  # returned unused: nothing reaches the thread
        work.flush()
    finally:
        work.close()
    assert got == [b"abc", b"defgh", b"ij", b"klmnopqr"]
    assert seen_slots[1:] == lent  # the thread hashed the lent slots themselves
    assert len(set(lent)) <= 2  # and never more slots than it was given


def test_a_slot_is_lent_again_only_after_the_thread_is_done_with_it() -> None:
    release = threading.Event()
    done: list[bytes] = []

    def consume(view: memoryview) -> None:
        release.wait(10)
        done.append(bytes(view))

    work = Handoff(consume, name="test handoff", slots=1, slot_size=4)
    try:
        slot = work.borrow()
        slot[:] = b"wxyz"
        work.give(slot, 4)
        lent: list[bytearray] = []
        waiter = threading.Thread(target=lambda: lent.append(work.borrow()))
        waiter.start()
        waiter.join(0.2)
        assert lent == []  # the only slot is still being consumed
        release.set()
        waiter.join(10)
        assert lent == [slot] and done == [b"wxyz"]
        work.give(lent[0], 0)
    finally:
        release.set()
        work.close()
    with pytest.raises(ValueError, match="after close"):
        work.borrow()


# -- a verifying stream hashing in a thread ---------------------------------------------


def verifying(served: bytes, expected: bytes) -> blobio.VerifyingReader:
    return blobio.VerifyingReader(
        io.BytesIO(served), digest=digests.of(expected), size=len(expected), subject="blob x"
    )


def test_a_large_blob_hashed_in_a_thread_verifies_and_the_thread_ends_with_the_stream() -> None:
    data = big_blob()
    reader = verifying(data, data)
    with contextlib.closing(reader):
        assert handoff_threads()  # the large blob is hashed beside the reader
        assert read_in_chunks(io.BufferedReader(reader, 64 << 10)) == data
        reader.verify_rest()
        assert reader.verified
    assert handoff_threads() == []


@pytest.mark.parametrize(
    "corrupt",
    [
        pytest.param(lambda b: b[:-1] + bytes([b[-1] ^ 1]), id="last-byte-flipped"),
        pytest.param(lambda b: b[: len(b) // 2], id="short"),
    ],
)
def test_a_large_blob_that_does_not_match_is_data_loss_at_its_end(corrupt: object) -> None:
    data = big_blob()
    served = corrupt(data)  # type: ignore[operator]
    reader = verifying(served, data)
    with contextlib.closing(reader), pytest.raises(errors.DataLoss, match="does not match"):
        read_in_chunks(io.BufferedReader(reader, 64 << 10))
    assert not reader.verified
    assert handoff_threads() == []


def test_a_large_blob_longer_than_its_descriptor_is_data_loss_as_soon_as_it_overflows() -> None:
    data = big_blob()
    reader = verifying(data + b"\0" * (2 << 20), data)
    stream = io.BufferedReader(reader, 64 << 10)
    view = memoryview(bytearray(1 << 20))
    total = 0
    with contextlib.closing(reader), pytest.raises(errors.DataLoss, match="bytes arrived"):
        while n := stream.readinto(view):
            total += n
    assert total <= len(data)
    assert handoff_threads() == []


def test_a_large_blob_read_in_pieces_into_the_hashing_slots_verifies_and_ends_its_thread() -> None:
    data = big_blob()
    reader = verifying(data, data)
    with contextlib.closing(reader):
        out = bytearray()
        for piece in reader.pieces(100_000):  # not a divisor of a slot: pieces end short
            assert 0 < len(piece) <= 100_000
            out += piece
        assert reader.verified
    assert bytes(out) == data
    assert handoff_threads() == []


@pytest.mark.parametrize(
    ("served", "match"),
    [
        pytest.param(lambda b: b[:-1] + bytes([b[-1] ^ 1]), "hashes to", id="last-byte-flipped"),
        pytest.param(lambda b: b[: len(b) // 2], "bytes arrived", id="short"),
        pytest.param(lambda b: b + b"\0" * (2 << 20), "bytes arrived", id="long"),
    ],
)
def test_a_large_blob_read_in_pieces_that_does_not_match_is_data_loss(
    served: object, match: str, tmp_path: Path
) -> None:
    """As the image cache reads an artifact's file into its store: nothing is kept."""
    data = big_blob()
    reader = verifying(served(data), data)  # type: ignore[operator]
    store = ContentStore(tmp_path)
    stream = cast(BinaryIO, io.BufferedReader(reader, 64 << 10))
    with (
        contextlib.closing(reader),
        pytest.raises(errors.DataLoss, match=match),
        store.ingest(digests.of(data), len(data), durable=False, source_verified=True) as sink,
    ):
        for piece in blobio.pieces(stream):
            sink.write(piece)
    assert not reader.verified
    assert visible(tmp_path) == {"blobs": [], "ingest": []}
    assert handoff_threads() == []


def test_a_blob_stream_already_read_from_is_read_on_through_its_buffer_and_verified() -> None:
    """``blobio.pieces`` reads past the stream's buffer only when it holds nothing yet."""
    data = big_blob()
    reader = verifying(data, data)
    stream = io.BufferedReader(reader, 64 << 10)
    with contextlib.closing(reader):
        head = stream.read(10)  # the buffer now holds bytes the raw reader counted
        assert not reader.fresh
        rest = b"".join(bytes(p) for p in blobio.pieces(cast(BinaryIO, stream), 1 << 20))
        assert reader.verified
    assert head + rest == data


def test_a_blob_stream_left_half_way_stops_its_thread_and_is_not_verified() -> None:
    data = big_blob()
    reader = verifying(data, data)
    with contextlib.closing(reader):
        pieces = reader.pieces(1 << 20)
        next(pieces)
        pieces.close()  # the caller stopped: the lent slot goes back unhashed
        assert not reader.verified
    assert handoff_threads() == []


# -- the content store's ingest writing in a thread ---------------------------------------


def test_a_large_ingest_is_hashed_and_written_in_a_thread_and_commits_matching_content(
    tmp_path: Path,
) -> None:
    store = ContentStore(tmp_path)
    data = big_blob()
    digest = digests.of(data)
    with store.ingest(digest, len(data)) as sink:
        assert handoff_threads()
        for start in range(0, len(data), 100_000):
            sink.write(memoryview(data)[start : start + 100_000])
    assert store.path(digest).read_bytes() == data
    assert handoff_threads() == []


def test_a_large_tampered_ingest_is_data_loss_and_keeps_nothing(tmp_path: Path) -> None:
    store = ContentStore(tmp_path)
    data = big_blob()
    digest = digests.of(data)
    with pytest.raises(errors.DataLoss, match="hashes to"), store.ingest(digest, len(data)) as sink:
        sink.write(data[:-1] + bytes([data[-1] ^ 1]))
    assert visible(tmp_path) == {"blobs": [], "ingest": []}
    assert handoff_threads() == []


@contextlib.contextmanager
def file_size_limit(limit: int) -> Iterator[None]:
    """Writes past ``limit`` bytes fail with EFBIG (SIGXFSZ ignored), as a full disk fails."""
    old_limit = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (limit, old_limit[1]))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, old_limit)
        signal.signal(signal.SIGXFSZ, old_handler)


def test_a_large_ingest_that_cannot_fit_fails_before_its_first_byte_and_keeps_nothing(
    tmp_path: Path,
) -> None:
    """Its disk is allocated before the download starts (``fsio.preallocate``)."""
    store = ContentStore(tmp_path)
    data = big_blob()
    entered = False
    with (
        file_size_limit(2 << 20),
        pytest.raises(OSError) as caught,
        store.ingest(digests.of(data), len(data)),
    ):
        entered = True
    assert caught.value.errno == errno.EFBIG
    assert not entered
    assert visible(tmp_path) == {"blobs": [], "ingest": []}
    assert handoff_threads() == []


def test_a_write_error_met_by_the_ingest_thread_reaches_the_caller_and_keeps_nothing(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # as on a filesystem without fallocate: the error comes from a write in the thread
    monkeypatch.setattr(store_module, "preallocate", lambda fd, size: False)
    store = ContentStore(tmp_path)
    data = big_blob()
    with (
        file_size_limit(2 << 20),
        pytest.raises(OSError) as caught,
        store.ingest(digests.of(data), len(data)) as sink,
    ):
        for start in range(0, len(data), 1 << 20):
            sink.write(data[start : start + (1 << 20)])
    assert caught.value.errno == errno.EFBIG
    assert visible(tmp_path) == {"blobs": [], "ingest": []}
    assert handoff_threads() == []


# -- a real connection dropped half way ------------------------------------------------------


class _DropsHalfWay(http.server.BaseHTTPRequestHandler):
    """Promises the whole blob (Content-Length), sends half of it and closes."""

    content = b""
    hits = 0

    def log_message(self, format: str, *args: object) -> None:
        return

    def do_GET(self) -> None:
        type(self).hits += 1
        self.send_response(200)
        self.send_header("Content-Length", str(len(self.content)))
        self.end_headers()
        self.wfile.write(self.content[: len(self.content) // 2])
        self.wfile.flush()
        self.close_connection = True


@pytest.fixture
def dropping_server() -> Iterator[tuple[str, type[_DropsHalfWay]]]:
    handler = type("Handler", (_DropsHalfWay,), {"hits": 0, "content": big_blob()})
    with local_http(handler) as host:
        yield host, handler


def read_into_buffer(stream: BinaryIO) -> Iterator[memoryview]:
    """A blob stream read as any binary stream: ``readinto`` one 1 MiB buffer."""
    view = memoryview(bytearray(1 << 20))
    while n := cast(io.BufferedReader, stream).readinto(view):
        yield view[:n]


READERS = [
    pytest.param(blobio.pieces, id="pieces-into-the-hashing-slots"),  # the image cache's
    pytest.param(read_into_buffer, id="readinto-a-buffer"),
]


@pytest.mark.parametrize("read", READERS)
def test_a_connection_dropped_mid_blob_is_a_broken_download_and_nothing_is_kept(
    dropping_server: tuple[str, type[_DropsHalfWay]],
    tmp_path: Path,
    read: Callable[[BinaryIO], Iterator[memoryview]],
) -> None:
    """As the image cache streams an artifact's file into its store (the source verifies,
    the ingest only counts): the stream hashing in its thread must not take the early
    end for a short blob (DataLoss) but for a broken connection, which the cache answers
    by downloading the blob again."""
    host, handler = dropping_server
    data = handler.content
    desc = Descriptor("application/octet-stream", digests.of(data), len(data))
    ref = Reference.parse(f"{host}/a/model:v1")
    store = ContentStore(tmp_path)
    with (
        RegistryClient(retries=0) as client,
        pytest.raises(errors.Unavailable) as caught,
        store.ingest(desc.digest, desc.size, durable=False, source_verified=True) as sink,
        client.open_blob(ref, desc) as stream,
    ):
        for piece in read(stream):
            sink.write(piece)
    assert not isinstance(caught.value, errors.DataLoss)
    assert "broke during the download" in caught.value.message
    assert handler.hits == 1
    assert visible(tmp_path) == {"blobs": [], "ingest": []}
    assert handoff_threads() == []


def test_a_small_blob_hashed_inline_dropped_mid_way_is_a_broken_download_too(
    dropping_server: tuple[str, type[_DropsHalfWay]],
) -> None:
    host, handler = dropping_server
    handler.content = handler.content[: 1 << 20]
    data = handler.content
    desc = Descriptor(mediatypes.OCI_LAYER_TAR, digests.of(data), len(data))
    with (
        RegistryClient(retries=0) as client,
        pytest.raises(errors.Unavailable, match="broke during the download"),
        client.open_blob(Reference.parse(f"{host}/a/model:v1"), desc) as stream,
    ):
        read_in_chunks(stream)  # type: ignore[arg-type]


@pytest.mark.registry
@pytest.mark.parametrize("read", READERS)
def test_a_deadline_passing_mid_blob_stops_the_stream_and_its_thread_and_keeps_nothing(
    registry: RegistryServer, tmp_path: Path, read: Callable[[BinaryIO], Iterator[memoryview]]
) -> None:
    """The deadline in force where the stream opened is checked before every read, in the
    reading thread, whatever the hashing thread is doing (a clock moved by hand)."""
    data = big_blob()
    ref = Reference.parse(f"{registry.host}/handoff/deadline:v1")
    now = [0.0]
    deadline = backoff.Deadline.after(60, what="the test deadline", clock=lambda: now[0])
    store = ContentStore(tmp_path)
    with RegistryClient(retries=0) as client:
        desc = client.push_blob(ref, data, media_type="application/octet-stream")
        with (
            pytest.raises(errors.DeadlineExceeded, match="the test deadline") as caught,
            backoff.within(deadline),
            store.ingest(desc.digest, desc.size, durable=False, source_verified=True) as sink,
            client.open_blob(ref, desc) as stream,
        ):
            pieces = read(stream)
            sink.write(next(pieces))
            assert handoff_threads()
            now[0] = 61.0  # the deadline passes mid-blob
            for piece in pieces:
                sink.write(piece)
    assert registry.host in caught.value.message
    assert visible(tmp_path) == {"blobs": [], "ingest": []}
    assert handoff_threads() == []
