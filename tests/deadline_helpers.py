"""A server that accepts connections and never answers, and the constants of the deadline tests.

Where it sits: shared by ``test_publish_deadline``, ``test_publish_deadline_core`` and
``test_probe_while_publishing`` (the hanging server every source meets there).
"""

from __future__ import annotations

import contextlib
import socket
import threading
from collections.abc import Iterator

from rukpak.common import listening

MARGIN = 5.0  # process scheduling on a busy machine, not a performance budget
PIN = "sha256:" + "0" * 64
COMMIT = "a" * 40


class SilentServer:
    """Accepts TCP connections on loopback and never sends a byte; stopped by ``stop``."""

    def __init__(self) -> None:
        self._listener = socket.create_server(("127.0.0.1", 0), backlog=64)
        self.port = int(self._listener.getsockname()[1])
        self._accepted: list[socket.socket] = []
        self._changed = threading.Condition()
        self._thread = threading.Thread(target=self._accept, name="silent", daemon=True)
        self._thread.start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.port}"

    @property
    def accepted(self) -> int:
        with self._changed:
            return len(self._accepted)

    def wait_for(self, connections: int, *, timeout: float) -> None:
        """Until ``connections`` connections were accepted (AssertionError after ``timeout``)."""
        with self._changed:
            if not self._changed.wait_for(lambda: len(self._accepted) >= connections, timeout):
                raise AssertionError(
                    f"{len(self._accepted)} connections after {timeout}s, {connections} expected"
                )

    def _accept(self) -> None:
        for conn in listening.accepted(self._listener):
            with self._changed:
                self._accepted.append(conn)
                self._changed.notify_all()

    def stop(self) -> None:
        listening.close(self._listener)
        self._thread.join(timeout=10)
        with self._changed:
            for conn in self._accepted:
                conn.close()


@contextlib.contextmanager
def silent_server() -> Iterator[SilentServer]:
    server = SilentServer()
    try:
        yield server
    finally:
        server.stop()
