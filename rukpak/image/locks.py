"""Per-key locks whose number stays bounded: one lock per key while someone uses it.

Where it sits: the image cache serialises work per image reference and per
manifest digest with it, the publish core per target path. A lock exists only
while a caller holds it or waits for it (a use count), so the table never keeps
one lock for every key ever seen.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Iterator


class KeyedLocks:
    """A lock per key, created on first use and dropped when its last user leaves."""

    def __init__(self) -> None:
        self._guard = threading.Lock()
        self._locks: dict[str, tuple[threading.Lock, int]] = {}

    def __len__(self) -> int:
        """Keys with a lock right now (held or waited for)."""
        with self._guard:
            return len(self._locks)

    @contextlib.contextmanager
    def hold(self, key: str) -> Iterator[None]:
        with self._guard:
            found = self._locks.get(key)
            lock, users = found if found is not None else (threading.Lock(), 0)
            self._locks[key] = (lock, users + 1)
        try:
            with lock:
                yield
        finally:
            with self._guard:
                lock, users = self._locks[key]
                if users <= 1:
                    del self._locks[key]
                else:
                    self._locks[key] = (lock, users - 1)
