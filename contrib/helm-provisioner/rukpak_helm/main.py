"""``rukpak-helm-provisioner`` (``python -m rukpak_helm``): the process of the helm
provisioner's Deployment.

The edge: flags, logging, signals, then ``api.serve``: leader election on the Lease
``--lease-name`` in the system namespace when ``--leader-elect`` (so only one replica
reconciles and a rolling update never runs two), ``controller.Controller`` until SIGTERM
or SIGINT, the controller stopped before the Lease is released. Exit 0 when stopped by
a signal, 1 when the API server cannot be reached with the given configuration or the
Lease was lost.
"""

from __future__ import annotations

import argparse
import logging
import sys
from collections.abc import Callable
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
    p.add_argument(
        "--store-dir",
        type=Path,
        default=None,
        help="the node plugin's store volume (kind: store) is mounted here: images are served "
        "by it by digest, not pulled by this process (the standing pattern)",
    )
    p.add_argument("--leader-elect", action="store_true", help="take the Lease before working")
    p.add_argument("--lease-name", default=LEASE_NAME)
    p.add_argument("-v", "--verbose", action="store_true")
    return p


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

    def start() -> Callable[[], None]:
        ctl = controller.Controller(
            kube,
            helm=args.helm,
            store=content.Store(
                args.cache_dir, insecure=args.insecure_registry, node_store=args.store_dir
            ),
            system_namespace=args.system_namespace,
            default_namespace=args.install_namespace,
        )
        ctl.start()
        log.info("msg='helm provisioner started' class=core-rukpak-io-helm helm=%s", args.helm)
        return ctl.stop

    election = api.Election(args.leader_elect, args.system_namespace, args.lease_name)
    try:
        return api.serve(
            kube, election, start, stop=stop, log=log, lost="another replica leads now"
        )
    finally:
        kube.close()
