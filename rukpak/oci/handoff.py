"""Hand a byte stream to a second thread: a large blob is hashed (or written) there while
the caller's thread reads its next chunk from the network.

Where it sits: under the verifying registry stream (``rukpak.oci.blobio.VerifyingReader``
hashes a large blob through one) and the node's content store
(``rukpak.image.store.Ingest`` writes a large blob through one). ``hashlib`` and
``os.write`` release the GIL for large buffers, so on two cores the reading, the hashing
and the writing of a blob overlap instead of taking turns in one thread.

The caller's bytes are copied into one of a few fixed slots, so the caller may reuse its
buffer at once (copying a chunk costs a small fraction of hashing it); small puts
gather in the current slot and a slot goes to the thread when full, or at
:meth:`Handoff.flush`. When every slot is with the thread, :meth:`Handoff.put` waits for
one: memory stays bounded at ``slots * slot_size``. What the thread's ``consume`` raises
is kept and raised in the caller's thread by the next ``put`` or ``flush`` (later chunks
are dropped), so an error such as ENOSPC reaches the caller as if it had written itself.
:meth:`Handoff.close` stops the thread, dropping what it had not consumed yet.

A caller that reads into memory itself can skip the copy: :meth:`Handoff.borrow` lends it a
free slot, it fills the slot and :meth:`Handoff.give` hands it over as it is. The caller
may go on reading what it gave (writing it to a file while the thread hashes it) but
never changes it: a slot comes back only through the caller's next ``borrow``, after the
thread is done with it.
"""

from __future__ import annotations

import queue
import threading
from collections.abc import Callable
from typing import Final

SLOT: Final[int] = 1 << 20
SLOTS: Final[int] = 4
WORTH: Final[int] = 8 << 20
"""Blobs at least this large go through a thread; smaller ones are done inline (a thread
costs about 100 microseconds to start, a blob of 8 MiB several milliseconds to hash)."""

Consume = Callable[[memoryview], None]


class Handoff:
    """One consumer thread fed with copies of what :meth:`put` is given, in order."""

    def __init__(
        self, consume: Consume, *, name: str, slots: int = SLOTS, slot_size: int = SLOT
    ) -> None:
        self._consume = consume
        self._slots = max(1, slots)
        self._slot_size = max(1, slot_size)
        self._made = 0
        self._free: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
        self._work: queue.SimpleQueue[tuple[bytearray, int] | threading.Event | None] = (
            queue.SimpleQueue()
        )
        self._slot: bytearray | None = None
        self._fill = 0
        self._error: BaseException | None = None
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name=name, daemon=True)
        self._thread.start()

    @property
    def alive(self) -> bool:
        """Whether the consumer thread still runs (False after :meth:`close`)."""
        return self._thread.is_alive()

    def put(self, data: bytes | bytearray | memoryview) -> None:
        """Copy ``data`` for the thread; raise what ``consume`` raised since the last call."""
        self._raise()
        if self._stopping:
            raise ValueError("put after close")
        view = memoryview(data).cast("B")
        while view:
            if self._slot is None:
                self._slot = self._take()
            n = min(len(view), self._slot_size - self._fill)
            self._slot[self._fill : self._fill + n] = view[:n]
            self._fill += n
            view = view[n:]
            if self._fill == self._slot_size:
                self._dispatch()

    def borrow(self) -> bytearray:
        """A free slot for the caller to fill and :meth:`give` (waits while every slot is
        with the thread); raise what ``consume`` raised since the last call."""
        self._raise()
        if self._stopping:
            raise ValueError("borrow after close")
        if self._fill:
            self._dispatch()  # what put gathered goes first, in order
        return self._take()

    def give(self, slot: bytearray, size: int) -> None:
        """Hand ``slot[:size]`` (a slot from :meth:`borrow`) to the thread without copying.

        The caller may still read it, not change it. ``size`` 0 returns the slot unused.
        """
        if size <= 0:
            self._free.put(slot)
            return
        self._raise()
        if self._stopping:
            raise ValueError("give after close")
        self._work.put((slot, size))

    def flush(self) -> None:
        """Wait until the thread consumed everything put so far; raise what it raised."""
        self._raise()
        if self._stopping:
            raise ValueError("flush after close")
        if self._fill:
            self._dispatch()
        done = threading.Event()
        self._work.put(done)
        done.wait()
        self._raise()

    def close(self) -> None:
        """Stop the thread (after the chunk it is consuming), dropping the rest; idempotent."""
        if not self._stopping:
            self._stopping = True
            self._work.put(None)
        self._thread.join()

    def _take(self) -> bytearray:
        try:
            return self._free.get_nowait()
        except queue.Empty:
            pass
        if self._made < self._slots:
            self._made += 1
            return bytearray(self._slot_size)
        return self._free.get()

    def _dispatch(self) -> None:
        assert self._slot is not None
        self._work.put((self._slot, self._fill))
        self._slot, self._fill = None, 0

    def _raise(self) -> None:
        if self._error is not None:
            raise self._error

    def _run(self) -> None:
        while True:
            item = self._work.get()
            if item is None:
                return
            if isinstance(item, threading.Event):
                item.set()
                continue
            slot, size = item
            if self._error is None and not self._stopping:
                try:
                    self._consume(memoryview(slot)[:size])
                except BaseException as exc:  # handed to the caller's thread
                    self._error = exc
            self._free.put(slot)
