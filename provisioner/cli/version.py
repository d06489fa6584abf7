"""``rukpak version`` and ``rukpak --version``: the client's version, and the manager's.

Where it sits: a command module of ``provisioner.cli.main``. The client's version is the
installed distribution's (``rukpak-python``, from its package metadata). ``version`` also
asks the cluster, when one is reachable, for the manager: the Deployment
``rukpak-manager`` in the system namespace (``deploy/manager/deployment.yaml``); its
version is the Deployment's ``app.kubernetes.io/version`` label when it has one, else the
tag (or digest) of its ``manager`` container's image, which is what a release pins. An
unreachable cluster, or one without the manager, is said on stderr; the client's version
is printed all the same and the exit status is 0 (``--client`` does not ask at all).
"""

from __future__ import annotations

import argparse
import sys
from typing import TYPE_CHECKING, Any

from provisioner.cli import output
from provisioner.runtime import flags
from rukpak.common import command, errors

if TYPE_CHECKING:
    from provisioner.engine.objects import Obj

DISTRIBUTION = "rukpak-python"
MANAGER_DEPLOYMENT = "rukpak-manager"
MANAGER_CONTAINER = "manager"
VERSION_LABEL = "app.kubernetes.io/version"


def client_version() -> str:
    """The installed ``rukpak-python``'s version ("unknown" when not installed)."""
    from importlib import metadata

    try:
        return metadata.version(DISTRIBUTION)
    except metadata.PackageNotFoundError:
        return "unknown"


class PrintVersion(argparse.Action):
    """``--version``: the client's version, then exit (the parser's own ``version`` action
    would need it while building the parser, which must stay fast)."""

    def __init__(self, option_strings: list[str], dest: str, **kwargs: Any) -> None:
        super().__init__(option_strings, dest, nargs=0, default=argparse.SUPPRESS, **kwargs)

    def __call__(self, parser: argparse.ArgumentParser, *_: Any) -> None:
        sys.stdout.write(f"{parser.prog} {client_version()}\n")
        parser.exit()


def add_version_flag(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--version", action=PrintVersion, help="print the client's version")


def register(subparsers: Any) -> None:
    """Add ``version`` to the ``rukpak`` parser."""
    p = command.add(subparsers, "version", run_version)
    p.add_argument("--client", action="store_true", help="only the client's; ask no cluster")
    output.add_output(p, formats=("json", "yaml"))
    flags.add_cluster(p)
    flags.add_system_namespace(p, holds="the manager's Deployment")


def manager_version(deployment: Obj) -> dict[str, str]:
    """What the manager's Deployment says of its version: ``version``, ``image``."""
    meta = deployment.get("metadata") or {}
    spec = ((deployment.get("spec") or {}).get("template") or {}).get("spec") or {}
    containers = [c for c in spec.get("containers") or [] if isinstance(c, dict)]
    chosen = next((c for c in containers if c.get("name") == MANAGER_CONTAINER), None)
    image = str((chosen or (containers[0] if containers else {})).get("image") or "")
    version = str((meta.get("labels") or {}).get(VERSION_LABEL) or "") or _image_version(image)
    return {"version": version or "unknown", "image": image}


def _image_version(image: str) -> str:
    """The tag of ``image`` (``host:5000/r:v1`` -> ``v1``), else its digest, else ""."""
    name, at, digest = image.partition("@")
    if at:
        return digest
    last = name.rsplit("/", 1)[-1]
    return last.partition(":")[2]


def _ask_manager(args: argparse.Namespace) -> dict[str, str] | None:
    from provisioner.engine.objects import ObjectRef

    where = f"{args.system_namespace}/{MANAGER_DEPLOYMENT}"
    try:
        kube = flags.kube(args)
        found = kube.get(
            ObjectRef("apps", "v1", "Deployment", args.system_namespace, MANAGER_DEPLOYMENT)
        )
    except errors.RukpakError as exc:
        print(
            f"note: no manager version: the cluster did not answer: {exc.message}", file=sys.stderr
        )
        return None
    if found is None:
        print(f"note: no manager in this cluster (no Deployment {where})", file=sys.stderr)
        return None
    return {**manager_version(found), "deployment": where}


def run_version(args: argparse.Namespace) -> int:
    """print the client's version and the manager's

    Print this client's version and, when a cluster is reachable, the manager's: the
    rukpak-manager Deployment's app.kubernetes.io/version label, else the tag of its manager
    container's image.
    """
    client = {"version": client_version(), "python": sys.version.split()[0]}
    manager = None if args.client else _ask_manager(args)
    document: dict[str, Any] = {"clientVersion": client}
    lines = [f"Client Version: {client['version']}"]
    if manager is not None:
        document["managerVersion"] = manager
        lines.append(f"Manager Version: {manager['version']} (image {manager['image']})")
    output.emit(output.View(document=document, names=(), text="\n".join(lines) + "\n"), args.output)
    return 0
