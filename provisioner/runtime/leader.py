"""Leader election among a process's replicas, on one ``lease.LeaseLock``.

Where it sits: above ``lease`` (the lock itself) and under the long-running
processes that must have one active replica: the manager and the PV provisioner
(``provisioner.runtime.service``, Leases ``rukpak-manager`` and
``rukpak-csi-provisioner``) and, through ``provisioner.api``, the helm provisioner.
``lead`` takes the Lease (waiting while another replica holds it) and keeps it
renewed; losing it sets ``lost`` and ``stop``, so the process stops working before
another replica starts. ``leading`` wraps that around a block of work, releasing the
Lease on the way out so the next replica takes over at once.
"""

from __future__ import annotations

import contextlib
import logging
import os
import socket
import threading
import uuid
from collections.abc import Iterator
from dataclasses import dataclass

from provisioner.engine.kube.kube import Kube
from provisioner.runtime.lease import LeaseLock

log = logging.getLogger(__name__)

LEASE_DURATION = 15.0
"""client-go's (and controller-runtime's) LeaseDuration; the renew deadline is 10 s."""
RENEW_INTERVAL = 5.0
RETRY_INTERVAL = 5.0
"""At rest the leader renews (one PATCH) and a standby looks (one GET) every 5 s: 12 + 12
requests a minute for two replicas, whatever the number of BundleDeployments. A standby
takes over within 15-20 s of the leader's last renewal (client-go's RetryPeriod of 2 s
would cost 30 a minute for the standby alone)."""


def default_identity() -> str:
    """``$POD_NAME``, else ``hostname_random`` (unique even for two processes on one host)."""
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def lead(
    kube: Kube,
    *,
    namespace: str,
    name: str,
    identity: str,
    stop: threading.Event,
    lost: threading.Event,
) -> LeaseLock | None:
    """Leader election for a process's replicas: take Lease ``namespace/name`` (waiting
    while another replica holds it), then keep it renewed; losing it sets ``lost`` and
    ``stop``. None when ``stop`` was set before the Lease was taken."""

    def on_lost(_why: str) -> None:
        lost.set()
        stop.set()

    lock = LeaseLock(
        kube,
        namespace=namespace,
        name=name,
        identity=identity,
        duration=LEASE_DURATION,
        renew_interval=RENEW_INTERVAL,
        retry_interval=RETRY_INTERVAL,
        on_lost=on_lost,
    )
    log.info("msg='taking lease' lease=%s identity=%s", lock, lock.identity)
    if not lock.acquire(stop=stop):
        return None
    lock.start_renewing()
    log.info("msg='lease acquired' lease=%s", lock)
    return lock


@dataclass
class Leadership:
    """What ``leading`` yields: whether to go on, and whether the Lease was lost since."""

    leading: bool
    lost: threading.Event


@contextlib.contextmanager
def leading(
    kube: Kube,
    *,
    enabled: bool,
    namespace: str,
    name: str,
    identity: str,
    stop: threading.Event,
) -> Iterator[Leadership]:
    """A replica's leader election around its work (``--leader-elect``): when ``enabled``,
    ``lead`` first (``leading`` is False when ``stop`` came first), and release the Lease
    on the way out; otherwise just go on."""
    lost = threading.Event()
    lock = None
    if enabled:
        lock = lead(kube, namespace=namespace, name=name, identity=identity, stop=stop, lost=lost)
    try:
        yield Leadership(leading=lock is not None or not enabled, lost=lost)
    finally:
        if lock is not None and lock.held:
            lock.release()
