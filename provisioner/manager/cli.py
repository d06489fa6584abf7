"""``rukpak-provisioner manager``: the edge of the manager process.

Parses flags into ``model.Settings``, optionally takes the ``rukpak-manager``
Lease (``provisioner.instance.lease.LeaseLock``) before reconciling, runs the
``controller`` until SIGTERM/SIGINT or the Lease is lost, then stops the
workers and releases the Lease. Exit 0 when stopped by a signal, 1 on a
fatal error or a lost Lease.
"""

from __future__ import annotations

import argparse
import logging
import signal
import threading
from types import FrameType
from typing import Any

from csi.common import errors
from provisioner.engine import inventory
from provisioner.engine.kube import Kube
from provisioner.instance import lease
from provisioner.instance.process import default_identity
from provisioner.manager import actuate, controller, model

log = logging.getLogger("rukpak.manager")
LEASE_NAME = "rukpak-manager"


def register(subparsers: Any) -> None:
    p = subparsers.add_parser(
        "manager",
        help="the BundleDeployment controller: generated Bundles and instance Deployments",
        description="Reconcile BundleDeployments: generate their Bundles, resolve image tags "
        "to digests, run one instance Deployment per BundleDeployment, report conditions.",
    )
    p.add_argument("--kubeconfig", help="kubeconfig (default: $KUBECONFIG, else in-cluster)")
    p.add_argument(
        "--image",
        default="",
        help="image of the instance pods (must hold /opt/rukpak/bin/rukpak-provisioner)",
    )
    p.add_argument(
        "--system-namespace",
        default=inventory.DEFAULT_SYSTEM_NAMESPACE,
        help="namespace of instance Deployments, inventories and Leases (default: %(default)s)",
    )
    p.add_argument(
        "--instance-service-account",
        default="rukpak-instance",
        help="ServiceAccount of instance pods unless a BD names one (default: %(default)s)",
    )
    p.add_argument(
        "--instance-host-network",
        action="store_true",
        help="run instance pods on the host network (clusters without a service proxy)",
    )
    p.add_argument(
        "--instance-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for instance pods (repeatable)",
    )
    p.add_argument("--leader-elect", action="store_true", help="take the rukpak-manager Lease")
    p.add_argument("--workers", type=int, default=2, help="reconcile workers (default: 2)")
    p.add_argument(
        "--resync", type=float, default=30.0, help="seconds between full resyncs (default: 30)"
    )
    p.set_defaults(func=run_manager)


def settings_from(args: argparse.Namespace) -> model.Settings:
    env: list[tuple[str, str]] = []
    for item in args.instance_env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise errors.InvalidArgument(f"--instance-env wants KEY=VALUE, not {item!r}")
        env.append((key, value))
    if not args.image:
        raise errors.InvalidArgument("--image is required: the instance pods' image")
    return model.Settings(
        image=args.image,
        system_namespace=args.system_namespace,
        service_account=args.instance_service_account,
        host_network=args.instance_host_network,
        env=tuple(env),
    )


def _lost(lost: threading.Event, stop: threading.Event) -> None:
    lost.set()
    stop.set()


def run_manager(args: argparse.Namespace) -> int:
    stop = threading.Event()

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        log.info("msg='stopping' signal=%s", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    try:
        settings = settings_from(args)
        kube = Kube.from_kubeconfig(args.kubeconfig)
    except errors.RukpakError as err:
        log.error("msg='failed' error=%r", err.message)
        return 1
    lock: lease.LeaseLock | None = None
    lost = threading.Event()
    try:
        if args.leader_elect:
            lock = lease.LeaseLock(
                kube,
                namespace=settings.system_namespace,
                name=LEASE_NAME,
                identity=default_identity(),
                on_lost=lambda why: _lost(lost, stop),
            )
            log.info("msg='taking lease' lease=%s identity=%s", lock, lock.identity)
            if not lock.acquire(stop=stop):
                return 0
            lock.start_renewing()
            log.info("msg='lease acquired' lease=%s", lock)
        ctl = controller.Controller(
            kube, settings, resolve=actuate.RegistryResolver(), resync=args.resync
        )
        ctl.start(workers=args.workers)
        log.info("msg='manager started' system_namespace=%s", settings.system_namespace)
        stop.wait()
        ctl.stop()
    finally:
        if lock is not None and lock.held:
            lock.release()
        kube.close()
    if lost.is_set():
        log.error("msg='lease lost; stopped reconciling'")
        return 1
    log.info("msg='stopped'")
    return 0
