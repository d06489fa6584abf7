"""Stopping a long-running provisioner process: SIGTERM and SIGINT set one Event.

Used by the ``rukpak-provisioner`` processes that run until told to stop
(``provisioner.storage.cli`` volumes, ``provisioner.manager.cli`` manager, and out-of-tree
provisioners through ``provisioner.api.stop_on_signals``): their
main thread waits on the Event, then stops its threads and releases its Lease.
"""

from __future__ import annotations

import logging
import signal
import threading
from types import FrameType


def stop_on_signals(log: logging.Logger) -> threading.Event:
    """An Event that SIGTERM and SIGINT set (each logged); call it from the main thread."""
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("msg='stopping' signal=%s", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    return stop
