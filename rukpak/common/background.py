"""One background thread per chore, woken on demand: the shape of every "later, off the
request path" job of the node plugin.

Where it sits: under the image cache's eviction (``rukpak.image.eviction``), its record
writer (``rukpak.image.cachestate``) and tree syncer (``rukpak.store.commit``), and the
FUSE store's collector (``csi.fuse.collect``). :meth:`Chore.wake` asks for one more
run; wake-ups that come while a run is going make exactly one more run after it. The
thread ends when nothing is asked and starts again on the next wake-up, so an idle
plugin holds no thread for it. A failed run is logged and waits for the next wake-up.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable

log = logging.getLogger(__name__)

STARTER_FIRST = 0.002
"""Seconds a background thread sleeps before its first work (:func:`let_starter_finish`)."""


def let_starter_finish() -> None:
    """Give the interpreter back to the thread that started this one, first thing.

    ``Thread.start`` waits until the new thread runs; a new thread that goes straight to
    work keeps the interpreter up to a switch interval (5 ms) before its starter may go
    on, and a request that started two (a lazy publish: the store's collection and the
    background fetch) answered ~15 ms later for it. Two milliseconds asleep let the
    request finish first; the work waits that long.
    """
    time.sleep(STARTER_FIRST)


class Chore:
    """Runs ``work`` in a thread named ``name`` after each :meth:`wake`."""

    def __init__(self, name: str, work: Callable[[], object], *, failure: str) -> None:
        self.name = name
        self._work = work
        self._failure = failure  # logged (with the error) when a run raises
        self._lock = threading.Lock()
        self._wanted = False
        self._thread: threading.Thread | None = None

    def wake(self) -> None:
        with self._lock:
            self._wanted = True
            if self._thread is None:
                self._thread = threading.Thread(target=self._loop, name=self.name, daemon=True)
                self._thread.start()

    def _loop(self) -> None:
        let_starter_finish()
        while True:
            with self._lock:  # decided under the lock: a wake-up is never left unserved
                if not self._wanted:
                    self._thread = None
                    return
                self._wanted = False
            try:
                self._work()
            except Exception as exc:  # a disk error is expected; anything else gets a trace
                log.error(
                    "msg=%r chore=%s error=%r",
                    self._failure,
                    self.name,
                    str(exc)[:500],
                    exc_info=not isinstance(exc, OSError),
                )
