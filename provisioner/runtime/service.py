"""The lifecycle of a long-running, leader-elected provisioner process, written once.

Where it sits: the edge of ``rukpak-provisioner manager`` (``provisioner.manager.cli``)
and ``rukpak-provisioner volumes`` (``provisioner.storage.cli``), after each has parsed
its flags and made its API adapter. ``serve`` takes the process's Lease when
``--leader-elect`` asks for it (an ``Election``, through
``provisioner.runtime.leader.leading``), starts the work, waits for SIGTERM/SIGINT
(``signals.stop_on_signals``) or a lost Lease, stops the work before the Lease goes, and
turns the way it ended into the exit code.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass

from provisioner.engine.kube.kube import Kube
from provisioner.runtime.leader import default_identity, leading
from rukpak.common import errors

EXIT_OK = 0
EXIT_ERROR = 1


def failed(log: logging.Logger, err: errors.RukpakError) -> int:
    """Log a fatal error the one way these processes do; the exit code for it."""
    log.error("msg='failed' error=%r", err.message)
    return EXIT_ERROR


@dataclass(frozen=True)
class Election:
    """Whether to take a Lease first (``--leader-elect``), and which."""

    enabled: bool
    namespace: str
    name: str


def serve(
    kube: Kube,
    election: Election,
    start: Callable[[], Callable[[], None]],
    *,
    stop: threading.Event,
    log: logging.Logger,
    lost: str,
) -> int:
    """Run ``start()`` (it returns the function that stops what it started) as the holder
    of the ``election``'s Lease (when enabled) until ``stop`` is set.

    0 when stopped by a signal, also while still waiting for the Lease; 1 on an error
    (logged) or when the Lease was lost (``lost`` says what stopped, for the log).
    """
    try:
        with leading(
            kube,
            enabled=election.enabled,
            namespace=election.namespace,
            name=election.name,
            identity=default_identity(),
            stop=stop,
        ) as leader:
            if not leader.leading:  # stopped while waiting for the Lease
                return EXIT_OK
            halt = start()
            try:
                stop.wait()
            finally:
                halt()  # before the Lease goes
    except errors.RukpakError as err:
        return failed(log, err)
    if leader.lost.is_set():
        log.error("msg='lease lost; %s'", lost)
        return EXIT_ERROR
    log.info("msg='stopped'")
    return EXIT_OK
