"""``rukpak-helm-provisioner`` (``python -m rukpak_helm``): the process of the helm
provisioner's Deployment.

The edge: flags, logging, signals, leader election (``api.lead`` on the Lease
``--lease-name`` in the system namespace, so only one replica reconciles and a
rolling update never runs two), then ``controller.Controller`` until SIGTERM or
SIGINT. Exit 0 when stopped by a signal, 1 when the API server cannot be reached
with the given configuration or the Lease was lost.
"""

from __future__ import annotations

import argparse
import logging
import os
import socket
import sys
import threading
import uuid
from pathlib import Path

from provisioner import api
from rukpak_helm import content, controller

log = logging.getLogger("rukpak.helm")
LEASE_NAME = "rukpak-helm-provisioner"


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="rukpak-helm-provisioner",
        description="Install helm charts of Bundles of class core-rukpak-io-helm.",
    )
    p.add_argument("--kubeconfig", help="default: $KUBECONFIG, ~/.kube/config, in-cluster")
    p.add_argument("--system-namespace", default=api.DEFAULT_SYSTEM_NAMESPACE)
    p.add_argument(
        "--install-namespace",
        default="default",
        help="namespace of namespaced objects whose BundleDeployment names no installNamespace",
    )
    p.add_argument("--helm", type=Path, default=Path("/opt/rukpak/bin/helm"), help="helm binary")
    p.add_argument(
        "--cache-dir", type=Path, default=Path("/var/cache/rukpak-helm"), help="bundle content"
    )
    p.add_argument(
        "--insecure-registry",
        action="append",
        default=[],
        metavar="HOST:PORT",
        help="a registry spoken to over plain HTTP (loopback ones always are); repeatable",
    )
    p.add_argument("--leader-elect", action="store_true", help="take the Lease before working")
    p.add_argument("--lease-name", default=LEASE_NAME)
    p.add_argument("-v", "--verbose", action="store_true")
    return p


def identity() -> str:
    return os.environ.get("POD_NAME") or f"{socket.gethostname()}_{uuid.uuid4().hex[:8]}"


def main(argv: list[str] | None = None) -> int:
    args = parser().parse_args(argv)
    logging.basicConfig(
        level=logging.DEBUG if args.verbose else logging.INFO,
        format="time=%(asctime)s level=%(levelname)s logger=%(name)s %(message)s",
        stream=sys.stderr,
    )
    stop = api.stop_on_signals(log)
    try:
        kube = api.Kube.from_kubeconfig(args.kubeconfig)
    except api.RukpakError as err:
        log.error("msg='failed' error=%r", err.message)
        return 1
    lost = threading.Event()
    lock: api.LeaseLock | None = None
    try:
        if args.leader_elect:
            lock = api.lead(
                kube,
                namespace=args.system_namespace,
                name=args.lease_name,
                identity=identity(),
                stop=stop,
                lost=lost,
            )
            if lock is None:  # stopped while waiting
                return 0
        ctl = controller.Controller(
            kube,
            helm=args.helm,
            store=content.Store(args.cache_dir, insecure=args.insecure_registry),
            system_namespace=args.system_namespace,
            default_namespace=args.install_namespace,
        )
        ctl.start()
        log.info("msg='helm provisioner started' class=core-rukpak-io-helm helm=%s", args.helm)
        stop.wait()
        ctl.stop()
    except api.RukpakError as err:
        log.error("msg='failed' error=%r", err.message)
        return 1
    finally:
        if lock is not None:
            lock.release()
        kube.close()
    if lost.is_set():
        log.error("msg='lease lost: another replica leads now'")
        return 1
    return 0
