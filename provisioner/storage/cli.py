"""``rukpak-provisioner volumes``: the edge of the PV provisioner process.

Runs beside the CSI plugin (Controller service) in the ``rukpak-csi-controller``
Deployment, sharing its socket through an emptyDir. Connects to the plugin and
checks it (driver name, Controller service, CREATE_DELETE_VOLUME), optionally
takes a Lease so only one replica provisions, then runs
``provisioner.storage.controller`` until SIGTERM/SIGINT or a lost Lease.
Exit 0 when stopped by a signal, 1 on a fatal error or a lost Lease.

With ``--metrics-port`` it serves ``provisioner.storage.metrics`` from the start. With
``--health-port`` it answers kubelet's probes from the start
(``provisioner.runtime.liveness.serve``): ``/livez`` is its ``Liveness`` (waiting for the
plugin or the Lease, leading: the work queue), ``/healthz`` (readiness) also waits until
the plugin was connected and checked.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import threading
from collections.abc import Callable
from typing import Any

from provisioner.runtime import flags, liveness, service, signals
from provisioner.storage import controller
from provisioner.storage import metrics as storage_metrics
from provisioner.storage.csiclient import CsiClient
from provisioner.storage.events import Recorder
from rukpak.common import errors
from rukpak.common import flags as csi_flags
from rukpak.common.backoff import Backoff

log = logging.getLogger("rukpak.volumes")
LEASE_NAME = "rukpak-csi-provisioner"


def register(subparsers: Any) -> None:
    env = os.environ.get
    p = subparsers.add_parser(
        "volumes",
        help="the PV provisioner for StorageClasses of csi.rukpak.io (CreateVolume for PVCs)",
        description="Watch PersistentVolumeClaims whose StorageClass names the CSI driver, "
        "call its CreateVolume/DeleteVolume over the CSI socket, and create, bind and delete "
        "their PersistentVolumes, as kubernetes-csi external-provisioner does.",
    )
    flags.add_cluster(p, context=False)
    p.add_argument(
        "--csi-address",
        default=env("CSI_ADDRESS", "/csi/csi.sock"),
        help="the CSI plugin's unix socket (env CSI_ADDRESS; default: %(default)s)",
    )
    csi_flags.add_driver_name(p, role="the plugin must report it, and StorageClasses name it")
    p.add_argument(
        "--timeout",
        type=float,
        default=60.0,
        help="seconds a CreateVolume/DeleteVolume call may take (it resolves the image tag "
        "at the registry; default: %(default)s)",
    )
    p.add_argument(
        "--connect-timeout",
        type=float,
        default=120.0,
        help="seconds to wait for the plugin's socket at start (default: %(default)s)",
    )
    p.add_argument(
        "--retry-interval-start",
        type=float,
        default=controller.RETRY.base,
        help="first retry delay of a failed claim or volume, doubling (default: %(default)ss)",
    )
    p.add_argument(
        "--retry-interval-max",
        type=float,
        default=controller.RETRY.cap,
        help="longest retry delay (default: %(default)ss)",
    )
    flags.add_controller(p, lease=LEASE_NAME, workers="sync", lease_namespace=True)
    flags.add_health(p)
    p.add_argument(
        "--metrics-port",
        type=int,
        default=0,
        help="serve Prometheus metrics at /metrics over HTTP on this port (provisions and "
        "deletions by StorageClass, CSI calls, the work queue, process_*), at the address "
        "--metrics-bind names; 0 disables (default: %(default)s)",
    )
    p.add_argument(
        "--metrics-bind",
        default="0.0.0.0",
        help="address of the metrics port: Prometheus scrapes the pod's address "
        "(default: %(default)s)",
    )
    p.set_defaults(func=run_volumes)


def run_volumes(args: argparse.Namespace) -> int:
    stop = signals.stop_on_signals(log)
    alive = liveness.Liveness()  # on this thread, which runs the election
    alive.waiting(f"waiting for the CSI plugin at {args.csi_address}")
    connected = threading.Event()

    def ready() -> tuple[bool, str]:
        if not connected.is_set():
            return False, f"not connected to the CSI plugin at {args.csi_address} yet"
        return alive.check()

    servers = []
    if args.health_port:
        servers.append(
            liveness.serve(
                host=args.health_bind, port=args.health_port, live=alive.check, ready=ready
            )
        )
    metrics = storage_metrics.Metrics(driver_name=args.driver_name)
    metrics.leader.labels(LEASE_NAME).set(0)
    if args.metrics_port:
        servers.append(
            storage_metrics.serve(metrics, host=args.metrics_bind, port=args.metrics_port)
        )
    try:
        return provision(args, stop, alive, connected, metrics)
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


def provision(
    args: argparse.Namespace,
    stop: threading.Event,
    alive: liveness.Liveness,
    connected: threading.Event,
    metrics: storage_metrics.Metrics,
) -> int:
    """Connect to the plugin (``connected`` is set once it was checked), then provision as
    the holder of the Lease until ``stop``; the exit code."""
    csi = CsiClient(args.csi_address, timeout=args.timeout)
    try:
        driver = csi.connect(driver=args.driver_name, wait=args.connect_timeout)
        kube = flags.kube(args)
    except errors.RukpakError as err:
        csi.close()
        return service.failed(log, err)
    connected.set()
    alive.waiting(f"waiting for the Lease {LEASE_NAME}" if args.leader_elect else "starting")

    def start() -> Callable[[], None]:
        alive.starting()
        component = f"{driver}_{os.environ.get('POD_NAME') or socket.gethostname()}"
        provisioner = controller.VolumeProvisioner(
            kube,
            csi,
            driver=driver,
            recorder=Recorder(kube, component=component),
            backoff=Backoff(
                base=args.retry_interval_start, cap=args.retry_interval_max, jitter=0.1
            ),
            metrics=metrics,
        )
        alive.follow(provisioner.queue)
        provisioner.start(workers=args.workers)
        alive.leading()
        metrics.leader.labels(LEASE_NAME).set(1)
        log.info("msg='provisioning' driver=%s csi_address=%s", driver, args.csi_address)

        def halt() -> None:
            alive.stopping()
            metrics.leader.labels(LEASE_NAME).set(0)
            provisioner.stop()

        return halt

    try:
        election = service.Election(args.leader_elect, args.leader_election_namespace, LEASE_NAME)
        return service.serve(kube, election, start, stop=stop, log=log, lost="stopped provisioning")
    finally:
        kube.close()
        csi.close()
