"""Command-line flags shared by every provisioner command, defined once.

Used by the ``rukpak`` subcommands (``provisioner.cli.apply``,
``provisioner.cli.bundle`` and ``signing``) and the ``rukpak-provisioner`` processes
(``provisioner.instance.process``, ``provisioner.manager.cli`` and ``unpack``,
``provisioner.storage.cli``): the cluster (``--kubeconfig``, ``--context``), where
the system's objects live (``--system-namespace``), the deployment (``--name``,
``-n/--namespace``), the mounted bundle and its format, leader election and
workers of the controllers, the registry (``--insecure``, ``--registry-config``,
``--timeout``, ``--platform``) and ``-v``; the in-cluster processes' ``--log-level`` is
``rukpak.common.flags.add_log_level`` (the node plugin's too). Each ``add_*`` adds
flags to a parser; the readers beside them (``kube``, ``load_credentials``,
``insecure_hosts``, ``registry_client``) turn the parsed values into what the commands
use, so the flags mean the same everywhere.
"""

from __future__ import annotations

import argparse
import os
from pathlib import Path
from typing import TYPE_CHECKING

# The engine, the kubernetes and registry clients are imported only by the commands that use
# them: ``rukpak --help`` builds every parser and must start fast (docs/benchmarks.md). The
# defaults below are the engine's (tests/test_cli_flags.py holds them equal).
if TYPE_CHECKING:
    from provisioner.engine.kube.kube import Kube
    from rukpak.oci import auth
    from rukpak.oci import client as oci_client
    from rukpak.oci.reference import Reference

DEFAULT_SYSTEM_NAMESPACE = "rukpak-system"
"""``provisioner.engine.apply.inventory.DEFAULT_SYSTEM_NAMESPACE``."""
DEFAULT_FORMAT = "plain+v0"
"""``provisioner.engine.bundle.formats.DEFAULT_FORMAT``."""

# -- the cluster ----------------------------------------------------------------------------


def add_cluster(parser: argparse.ArgumentParser, *, context: bool = True) -> None:
    """``--kubeconfig`` and (unless ``context=False``) ``--context``."""
    parser.add_argument(
        "--kubeconfig",
        help="kubeconfig file (default: $KUBECONFIG, ~/.kube/config, else in-cluster)",
    )
    if context:
        parser.add_argument("--context", help="kubeconfig context (default: the current one)")


def kube(args: argparse.Namespace, *, pool_size: int = 16) -> Kube:
    """The API adapter the ``add_cluster`` flags name."""
    from provisioner.engine.kube.kube import Kube

    return Kube.from_kubeconfig(
        args.kubeconfig, context=getattr(args, "context", None), pool_size=pool_size
    )


def add_system_namespace(parser: argparse.ArgumentParser, *, holds: str) -> None:
    """``--system-namespace``; ``holds`` says what lives there, for the help text."""
    parser.add_argument(
        "--system-namespace",
        default=DEFAULT_SYSTEM_NAMESPACE,
        help=f"where {holds} live (default: %(default)s)",
    )


# -- the deployment and its bundle ----------------------------------------------------------


def add_deployment(parser: argparse.ArgumentParser, *, name_is: str) -> None:
    """``--name`` (required; ``name_is`` says what it keys) and ``-n/--namespace``."""
    parser.add_argument("--name", required=True, help=f"deployment name ({name_is})")
    parser.add_argument(
        "-n",
        "--namespace",
        default="default",
        help="namespace for namespaced objects that name none (default: %(default)s)",
    )


def add_bundle_dir(parser: argparse.ArgumentParser) -> None:
    """``--bundle-dir`` (required): where a pod mounted the Bundle's volume."""
    parser.add_argument("--bundle-dir", type=Path, required=True, help="the mounted bundle root")


def add_format(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--format", default=DEFAULT_FORMAT, help="bundle format (default: %(default)s)"
    )


# -- long-running controllers ---------------------------------------------------------------


def add_controller(
    parser: argparse.ArgumentParser, *, lease: str, workers: str, lease_namespace: bool = False
) -> None:
    """``--leader-elect`` (take the ``lease`` Lease before working), ``--workers`` (what
    each does, for the help text) and, with ``lease_namespace``,
    ``--leader-election-namespace`` (env ``POD_NAMESPACE``; else the Lease lives in the
    system namespace)."""
    parser.add_argument("--leader-elect", action="store_true", help=f"take the {lease} Lease first")
    if lease_namespace:
        parser.add_argument(
            "--leader-election-namespace",
            default=os.environ.get("POD_NAMESPACE", "rukpak-system"),
            help="namespace of the Lease (env POD_NAMESPACE; default: %(default)s)",
        )
    parser.add_argument(
        "--workers", type=int, default=2, help=f"{workers} workers (default: %(default)s)"
    )


def add_health(parser: argparse.ArgumentParser, *, ready: str = "") -> None:
    """``--health-port`` (0: none) and ``--health-bind``: where ``/livez`` and ``/healthz``
    are served; ``ready`` says what readiness waits for, for the help text."""
    readiness = f"readiness: {ready}" if ready else "readiness"
    parser.add_argument(
        "--health-port",
        type=int,
        default=0,
        help=f"serve /livez (liveness) and /healthz ({readiness}) over HTTP on this port, at "
        "the address --health-bind names; 0 disables (default: %(default)s)",
    )
    parser.add_argument(
        "--health-bind",
        default="0.0.0.0",
        help="address of the health port: kubelet's probes dial the pod's address "
        "(default: %(default)s)",
    )


# -- the registry ---------------------------------------------------------------------------


def add_registry(parser: argparse.ArgumentParser, *, timeout: bool = False) -> None:
    """``--insecure``, ``--registry-config`` and (with ``timeout``) ``--timeout``."""
    parser.add_argument(
        "--insecure", action="store_true", help="allow plain HTTP to a non-loopback registry"
    )
    parser.add_argument(
        "--registry-config",
        type=Path,
        metavar="FILE",
        help="docker config.json with credentials (default ~/.docker/config.json)",
    )
    if timeout:
        parser.add_argument(
            "--timeout",
            type=float,
            default=30.0,
            metavar="SECONDS",
            help="per request (default 30)",
        )


def add_registry_command(parser: argparse.ArgumentParser) -> None:
    """The flags of a ``rukpak bundle`` subcommand that talks to a registry:
    ``add_registry`` with ``--timeout`` (what ``registry_client`` reads), and ``-v`` (hidden),
    also accepted after the subcommand's name."""
    add_verbose(parser, hidden=True)
    add_registry(parser, timeout=True)


def add_platform(parser: argparse.ArgumentParser) -> None:
    """``--platform`` of a command that reads an image: which manifest of an index."""
    parser.add_argument(
        "--platform", metavar="OS/ARCH", help="which manifest of an index (default: this machine)"
    )


def insecure_hosts(args: argparse.Namespace, ref: Reference) -> tuple[str, ...]:
    """The registries ``--insecure`` allows plain HTTP to: ``ref``'s, or none."""
    return (ref.registry,) if args.insecure else ()


def registry_client(args: argparse.Namespace, ref: Reference) -> oci_client.RegistryClient:
    """The client the ``add_registry(timeout=True)`` flags describe, for ``ref``'s registry:
    ``--registry-config`` credentials, ``--insecure`` and ``--timeout``."""
    from rukpak.oci import client as oci_client

    return oci_client.RegistryClient(
        credentials=load_credentials(args.registry_config),
        insecure=insecure_hosts(args, ref),
        timeout=args.timeout,
    )


def load_credentials(path: Path | None) -> auth.Credentials | None:
    """Credentials from ``--registry-config`` (must exist), else the user's
    docker config (``$DOCKER_CONFIG/config.json`` or ``~/.docker/config.json``)
    when present: its ``auths``, ``credHelpers`` and ``credsStore``
    (``rukpak.oci.dockerconfig``)."""
    from rukpak.oci import dockerconfig

    return dockerconfig.load(path)


# -- logging --------------------------------------------------------------------------------


def add_verbose(parser: argparse.ArgumentParser, *, hidden: bool = False) -> None:
    """``-v/--verbose``; ``hidden`` on subcommands that also accept it after their name."""
    if hidden:
        parser.add_argument(
            "-v",
            "--verbose",
            action="store_true",
            default=argparse.SUPPRESS,
            help=argparse.SUPPRESS,
        )
    else:
        parser.add_argument(
            "-v", "--verbose", action="store_true", help="log what happens (stderr)"
        )
