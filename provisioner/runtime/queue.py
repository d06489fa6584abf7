"""A work queue of BundleDeployment names: per-key dedup, delays, exponential backoff.

Sits between the watches (which ``add`` names) and the reconcile workers
(``get`` / ``done``), like client-go's rate-limited work queue: a name is in
the queue at most once; a name being processed is not handed to a second
worker, and an ``add`` meanwhile marks it dirty so it runs once more after
``done``. ``retry`` re-adds with a per-key delay from a ``rukpak.common.backoff``
schedule (doubling from ``base`` up to ``cap``, or the ``backoff`` given);
``forget`` resets it after a success. ``workers`` drains the queue.
"""

from __future__ import annotations

import heapq
import threading
import time
from typing import Protocol

from rukpak.common.backoff import Backoff


class Observer(Protocol):
    """What a queue reports (``runtime.metrics.QueueMetrics``: client-go's workqueue names)."""

    def added(self) -> None: ...
    def retried(self) -> None: ...
    def waited(self, seconds: float) -> None: ...
    def worked(self, seconds: float) -> None: ...


class WorkQueue:
    def __init__(
        self, *, base: float = 0.5, cap: float = 60.0, backoff: Backoff | None = None
    ) -> None:
        self.backoff = backoff or Backoff(base=base, cap=cap)
        self._cond = threading.Condition()
        self._ready: list[str] = []
        self._queued: set[str] = set()
        self._processing: set[str] = set()
        self._dirty: set[str] = set()
        self._delayed: list[tuple[float, str]] = []
        self._failures: dict[str, int] = {}
        self._shutdown = False
        self._ready_since: dict[str, float] = {}
        self._working_since: dict[str, float] = {}
        self.observer: Observer | None = None
        """Set once, before use: gets adds, retries, wait and work times."""

    def add(self, key: str) -> None:
        """Queue ``key`` now (no-op when queued; once more after ``done`` when processing)."""
        with self._cond:
            if self._enqueue(key):
                self._cond.notify()

    def add_after(self, key: str, delay: float) -> None:
        with self._cond:
            heapq.heappush(self._delayed, (time.monotonic() + delay, key))
            self._cond.notify()

    def retry(self, key: str) -> float:
        """Re-add after the key's backoff delay; returns the delay."""
        if self.observer is not None:
            self.observer.retried()
        with self._cond:
            n = self._failures.get(key, 0)
            self._failures[key] = n + 1
        delay = self.backoff.delay(n)
        self.add_after(key, delay)
        return delay

    def forget(self, key: str) -> None:
        with self._cond:
            self._failures.pop(key, None)

    def failures(self, key: str) -> int:
        with self._cond:
            return self._failures.get(key, 0)

    def _enqueue(self, key: str) -> bool:
        """Make ``key`` ready, or mark it dirty while it is processed (the caller holds the
        lock); True when it became ready."""
        if key in self._processing:
            self._dirty.add(key)
            return False
        if key in self._queued:
            return False
        self._queued.add(key)
        self._ready.append(key)
        self._ready_since[key] = time.monotonic()
        if self.observer is not None:
            self.observer.added()
        return True

    def _promote(self) -> float | None:
        """Move due delayed keys to ready; seconds until the next one is due."""
        now = time.monotonic()
        while self._delayed and self._delayed[0][0] <= now:
            _, key = heapq.heappop(self._delayed)
            self._enqueue(key)
        return self._delayed[0][0] - now if self._delayed else None

    def get(self, timeout: float | None = None) -> str | None:
        """The next key to process (marked processing), or None on shutdown or timeout."""
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                if self._shutdown:
                    return None
                wait = self._promote()
                if self._ready:
                    key = self._ready.pop(0)
                    self._queued.discard(key)
                    self._processing.add(key)
                    now = time.monotonic()
                    self._working_since[key] = now
                    ready = self._ready_since.pop(key, now)
                    if self.observer is not None:
                        self.observer.waited(now - ready)
                    return key
                if deadline is not None:
                    left = deadline - time.monotonic()
                    if left <= 0:
                        return None
                    wait = left if wait is None else min(wait, left)
                self._cond.wait(wait)

    def done(self, key: str) -> None:
        with self._cond:
            self._processing.discard(key)
            started = self._working_since.pop(key, None)
            if started is not None and self.observer is not None:
                self.observer.worked(time.monotonic() - started)
            if key in self._dirty:
                self._dirty.discard(key)
                if self._enqueue(key):
                    self._cond.notify()

    def shutdown(self) -> None:
        with self._cond:
            self._shutdown = True
            self._cond.notify_all()

    def __len__(self) -> int:
        with self._cond:
            return len(self._ready)
