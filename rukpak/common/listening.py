"""A listening socket served by one accepting thread: its connections, until it is closed.

Where it sits: under the node plugin's store volume sockets (``csi.node.storeserver``) and
the tests' silent server (``tests.deadline_helpers``). The accepting thread iterates
:func:`accepted`; :func:`close` wakes its blocked ``accept`` and ends the iteration.
"""

from __future__ import annotations

import contextlib
import socket
from collections.abc import Iterator


def accepted(listener: socket.socket) -> Iterator[socket.socket]:
    """Each connection ``listener`` accepts, until it is closed (or shut down)."""
    while True:
        try:
            conn, _ = listener.accept()
        except OSError:
            return  # stopped
        yield conn


def close(listener: socket.socket) -> None:
    """Close ``listener``, waking a thread blocked in its ``accept``. Idempotent."""
    with contextlib.suppress(OSError):
        listener.shutdown(socket.SHUT_RDWR)  # wakes accept()
    listener.close()
