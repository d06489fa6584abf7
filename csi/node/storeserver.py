"""The socket a store volume serves into its pod: accept, read request lines, answer.

Where it sits: ``csi.node.storevolume`` starts one :class:`StoreSocket` per published
store volume, on ``<volume dir>/.rukpak-store.sock`` (a socket can be connected through
the read-only bind of that directory the pod sees), and hands each parsed request to its
``handle`` callable (the publish spine). The wire format is
``rukpak.sources.storeprotocol``'s.

Bounds, so that a hostile or looping pod costs the node little: at most
``MAX_CONNECTIONS`` connections per volume (one more is answered RESOURCE_EXHAUSTED and
closed), requests on one connection are served one after the other, a line is at most
``storeprotocol.MAX_LINE`` bytes (a longer one is answered once and the connection
closed), a connection idle for ``IDLE_SECONDS`` is closed. Bad lines are answered with
INVALID_ARGUMENT and the connection stays usable. Nothing a pod sends is logged beyond
the ref and the outcome.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path

from rukpak.common import errors, listening
from rukpak.sources import storeprotocol as protocol

log = logging.getLogger(__name__)

MAX_CONNECTIONS = 16
IDLE_SECONDS = 600.0
STOP_WAIT = 10.0
"""Seconds `stop` waits for the connections' threads to close their sockets."""

Handler = Callable[[protocol.StoreRequest], protocol.StoreAnswer]


def answer_line(line: bytes, handle: Handler) -> protocol.StoreAnswer:
    """The answer to one request line: parse errors and the handler's errors become
    error answers; anything else is INTERNAL (logged with its traceback)."""
    try:
        return handle(protocol.parse_request(line))
    except errors.RukpakError as exc:
        return protocol.failure(exc)
    except Exception:
        log.exception("msg=%r", "store volume request failed")
        return protocol.failure(errors.Internal("the request failed inside the node plugin"))


class StoreSocket:
    """A listening unix socket at ``path`` answering requests with ``handle``."""

    def __init__(self, path: Path, handle: Handler, *, name: str) -> None:
        self.path = path
        self.handle = handle
        self.name = name  # the volume, for logs and thread names
        self._lock = threading.Lock()
        self._conns: set[socket.socket] = set()
        self._servers: set[threading.Thread] = set()
        self._stopped = False
        with contextlib.suppress(FileNotFoundError):
            path.unlink()  # a previous process's socket
        self._listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        address, fd = protocol.short_path(path.parent, path.name)
        try:
            self._listener.bind(address)
        finally:
            os.close(fd)
        os.chmod(path, 0o666)  # any user of the pod may ask; the pod is the unit of trust
        self._listener.listen(MAX_CONNECTIONS)
        self._thread = threading.Thread(target=self._accept, name=f"store-{name[:16]}", daemon=True)
        self._thread.start()

    def connections(self) -> int:
        with self._lock:
            return len(self._conns)

    def _accept(self) -> None:
        for conn in listening.accepted(self._listener):
            with self._lock:
                if self._stopped:
                    conn.close()
                    return
                full = len(self._conns) >= MAX_CONNECTIONS
                if not full:
                    self._conns.add(conn)
            if full:
                self._refuse(conn)
                continue
            server = threading.Thread(
                target=self._serve, args=(conn,), name=f"store-conn-{self.name[:12]}", daemon=True
            )
            with self._lock:
                self._servers.add(server)
            server.start()

    def _refuse(self, conn: socket.socket) -> None:
        busy = errors.ResourceExhausted(
            f"the store volume has {MAX_CONNECTIONS} connections open; reuse one (requests on "
            "one connection are answered in order)"
        )
        with contextlib.suppress(OSError):
            conn.settimeout(1.0)
            conn.sendall(protocol.encode_answer(protocol.failure(busy)))
        conn.close()

    def _serve(self, conn: socket.socket) -> None:
        try:
            conn.settimeout(IDLE_SECONDS)
            with conn.makefile("rb") as reader:
                while True:
                    line = reader.readline(protocol.MAX_LINE + 1)
                    if not line:
                        return
                    if len(line) > protocol.MAX_LINE:
                        conn.sendall(
                            protocol.encode_answer(
                                protocol.failure(
                                    errors.InvalidArgument(
                                        f"request line longer than {protocol.MAX_LINE} bytes; "
                                        "closing the connection"
                                    )
                                )
                            )
                        )
                        return
                    if not line.strip():
                        continue
                    conn.sendall(protocol.encode_answer(answer_line(line, self.handle)))
        except OSError:
            return  # the pod went away, idled out, or the volume was unpublished
        finally:
            conn.close()
            with self._lock:
                self._conns.discard(conn)
                self._servers.discard(threading.current_thread())

    def stop(self, wait: float = STOP_WAIT) -> None:
        """Close the socket and every connection; remove the socket file. Idempotent.

        Waits (up to ``wait`` seconds) for each connection's thread to close its socket: an
        accepted unix socket holds its path, so an open one keeps the volume's directory
        busy and the unmount after this would fail with EBUSY."""
        with self._lock:
            if self._stopped:
                return
            self._stopped = True
            conns = list(self._conns)
        listening.close(self._listener)
        for conn in conns:
            with contextlib.suppress(OSError):
                conn.shutdown(socket.SHUT_RDWR)
        self._thread.join(timeout=5)
        deadline = time.monotonic() + wait
        with self._lock:
            servers = list(self._servers)
        for server in servers:
            server.join(timeout=max(0.0, deadline - time.monotonic()))
        with contextlib.suppress(FileNotFoundError):
            self.path.unlink()
