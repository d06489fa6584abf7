"""``rukpak get [NAME]`` (``kubectl rukpak get``): BundleDeployments as ``kubectl get bd``
shows them, in every output of ``provisioner.cli.output``.

Where it sits: beside ``provisioner.cli.deployments`` (one BundleDeployment's history and
preview). Reads the v1alpha2 BundleDeployments through the ``Kube`` adapter; the columns
are the CRD's printer columns of v1alpha2 (``provisioner/crds``): NAME, INSTALL STATE,
HEALTHY, REVISION, AGE; ``-o wide`` adds the priority-1 ones, PROVISIONER, ACTIVE BUNDLE
and PAUSED.
"""

from __future__ import annotations

import argparse
import datetime
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from provisioner.cli import deployments, output
from provisioner.runtime import flags
from rukpak.common import command

if TYPE_CHECKING:
    from provisioner.engine.objects import Obj


def register(subparsers: Any) -> None:
    """Add ``get`` to the ``rukpak`` parser."""
    p = command.add(subparsers, "get", run_get)
    p.add_argument("name", metavar="NAME", nargs="?", help="only this one")
    output.add_output(p)
    flags.add_cluster(p)


def _condition(bd: Obj, kind: str, field: str) -> str:
    for c in deployments.status_of(bd).get("conditions") or []:
        if isinstance(c, dict) and c.get("type") == kind:
            return str(c.get(field) or "")
    return ""


def age(created: str, now: datetime.datetime) -> str:
    """A short age of an RFC 3339 time, coarser than kubectl's: whole seconds below two
    minutes, minutes below two hours, hours below two days, then days."""
    try:
        then = datetime.datetime.fromisoformat(created.replace("Z", "+00:00"))
    except ValueError:
        return "<unknown>"
    seconds = max(0, int((now - then).total_seconds()))
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= 2 * size:
            return f"{seconds // size}{unit}"
    return f"{seconds}s"


def view(items: Sequence[Obj], *, one: bool, now: datetime.datetime) -> output.View:
    """``items`` as ``rukpak get`` shows them (``one``: a NAME was given, so ``-o json``
    prints that object rather than a List)."""
    rows, wide, names = [], [], []
    for bd in items:
        meta = bd.get("metadata") or {}
        status, spec = deployments.status_of(bd), bd.get("spec") or {}
        revision = status.get("installedRevision")
        rows.append(
            (
                str(meta.get("name") or ""),
                _condition(bd, "Installed", "reason"),
                _condition(bd, "Healthy", "status"),
                "" if revision is None else str(revision),
                age(str(meta.get("creationTimestamp") or ""), now),
            )
        )
        wide.append(
            (
                str(spec.get("provisionerClassName") or ""),
                str(status.get("activeBundle") or ""),
                str(bool(spec.get("paused"))).lower(),
            )
        )
        names.append(deployments.resource_name(str(meta.get("name") or "")))
    return output.View(
        document=items[0] if one and items else output.kube_list(items),
        names=names,
        columns=("NAME", "INSTALL STATE", "HEALTHY", "REVISION", "AGE"),
        rows=rows,
        wide_columns=("PROVISIONER", "ACTIVE BUNDLE", "PAUSED"),
        wide=wide,
        empty="No resources found",
    )


def run_get(args: argparse.Namespace) -> int:
    """list BundleDeployments (as kubectl get bundledeployments)

    List the BundleDeployments (or the one named) with their install state, health and
    installed revision.

    examples:
      rukpak get
      rukpak get my-operator -o yaml
      kubectl rukpak get -o wide
    """
    kube = flags.kube(args)
    if args.name:
        items = [deployments.get(kube, args.name)]
    else:
        ref = deployments.ref("")
        items, _ = kube.list(ref.api_version, ref.kind)
        items.sort(key=lambda bd: str((bd.get("metadata") or {}).get("name") or ""))
    output.emit(
        view(items, one=bool(args.name), now=datetime.datetime.now(datetime.UTC)), args.output
    )
    return 0
