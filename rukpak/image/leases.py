"""Leases on cache content: what an in-flight pull uses cannot be evicted (as in containerd).

Where it sits: inside the image cache (``rukpak.image.cache``). A pull leases its
manifest digest and every blob it will read or write *before* it looks at the
content store; eviction (``ImageCache.evict``) asks :meth:`Leases.leased` and
deletes blobs only through :meth:`Leases.unless_leased`, under the same lock, so
no blob a pull found present can disappear under it.
"""

from __future__ import annotations

import contextlib
import threading
from collections import Counter
from collections.abc import Callable, Iterable, Iterator


class Leases:
    """Use counts per digest; thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Counter[str] = Counter()

    def __len__(self) -> int:
        with self._lock:
            return len(self._counts)

    @contextlib.contextmanager
    def lease(self, digests: Iterable[str]) -> Iterator[None]:
        """Hold every digest in ``digests`` for the ``with`` block."""
        held = sorted(set(digests))
        with self._lock:
            self._counts.update(held)
        try:
            yield
        finally:
            with self._lock:
                self._counts.subtract(held)
                for d in held:
                    if self._counts[d] <= 0:
                        del self._counts[d]

    def leased(self, digest: str) -> bool:
        with self._lock:
            return self._counts[digest] > 0

    def unless_leased(self, digest: str, action: Callable[[], object]) -> bool:
        """Run ``action`` (a quick delete) if nobody leases ``digest``; whether it ran."""
        with self._lock:
            if self._counts[digest] > 0:
                return False
            action()
            return True
