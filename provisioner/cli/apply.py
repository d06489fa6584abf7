"""``rukpak apply|diff|status|uninstall``: the apply engine from the command line.

The edge over ``provisioner.engine``: parses arguments, builds the ``Kube``
adapter from ``--kubeconfig`` (or $KUBECONFIG, ~/.kube/config, in-cluster),
prints progress on stderr and results on stdout. ``provisioner.cli.main`` calls
``register`` and turns errors into ``error: <message>`` with exit status 1.

Exit codes: 0 done (and, for ``status``, everything ready); 1 an error;
2 a usage error; 3 ``diff`` found changes, ``status`` found objects not ready,
or ``apply --wait`` ran out of time before every object was ready.
"""

from __future__ import annotations

import argparse
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from provisioner.cli import output
from provisioner.runtime import flags
from rukpak.common import command, errors

# The engine is imported by the commands that run it, not to build the parser (start-up).
if TYPE_CHECKING:
    from provisioner.engine.apply import apply, lifecycle
    from provisioner.engine.bundle import formats
    from provisioner.engine.kube.kube import Kube
    from provisioner.engine.objects import ObjectRef
    from provisioner.engine.preview import diff

EXIT_OK = 0
EXIT_CHANGES = 3
"""``diff`` found changes, or objects are not ready (``status``, ``apply --wait``)."""
DEFAULT_CONCURRENCY = 16
"""``provisioner.engine.apply.apply.Options.concurrency``."""


def register(subparsers: Any) -> None:
    """Add ``apply``, ``diff``, ``status`` and ``uninstall`` to the ``rukpak`` parser."""
    p = command.add(subparsers, "apply", run_apply)
    _bundle_args(p)
    p.add_argument("--no-prune", action="store_true", help="keep objects the bundle dropped")
    p.add_argument(
        "--wait",
        type=float,
        metavar="SECONDS",
        default=0,
        help="then wait until all are ready (exit 3 if they are not by then)",
    )
    p.add_argument(
        "--watch", action="store_true", help="then keep correcting drift until interrupted"
    )

    p = command.add(subparsers, "diff", run_diff)
    _bundle_args(p)
    output.add_output(p)

    p = command.add(subparsers, "status", run_status)
    p.add_argument("name", metavar="NAME")
    output.add_output(p)
    _cluster_args(p)

    p = command.add(subparsers, "uninstall", run_uninstall)
    p.add_argument("name", metavar="NAME")
    p.add_argument(
        "--deletion-policy",
        choices=("Delete", "Orphan"),
        default="Delete",
        help="Orphan keeps the objects and only removes the owner label (default: Delete)",
    )
    _cluster_args(p)


def _cluster_args(p: argparse.ArgumentParser) -> None:
    flags.add_cluster(p)
    flags.add_system_namespace(p, holds="inventories")
    p.add_argument(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help="parallel requests (default: %(default)s)",
    )


def _bundle_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("source", metavar="DIR|IMAGE", help="bundle directory or image reference")
    flags.add_deployment(p, name_is="owner label, inventory key")
    p.add_argument(
        "--adopt", action="store_true", help="take over existing objects no deployment owns"
    )
    flags.add_format(p)
    flags.add_registry(p)
    flags.add_platform(p)
    _cluster_args(p)


def _progress(message: str) -> None:
    print(f"rukpak: {message}", file=sys.stderr, flush=True)


def _kube(args: argparse.Namespace) -> Kube:
    return flags.kube(args, pool_size=max(16, args.concurrency + 4))


def _options(args: argparse.Namespace) -> apply.Options:
    from provisioner.engine.apply import apply

    if args.concurrency < 1:
        raise errors.InvalidArgument("--concurrency must be at least 1")
    return apply.Options(
        name=args.name,
        namespace=args.namespace,
        adopt=args.adopt,
        system_namespace=args.system_namespace,
        concurrency=args.concurrency,
        prune=not getattr(args, "no_prune", False),
    )


def _load(args: argparse.Namespace) -> formats.Bundle:
    """Load DIR, or pull IMAGE into a temporary tree, load it, and remove the tree."""
    from provisioner.bundle import source
    from provisioner.engine.bundle import formats
    from rukpak.oci.reference import Reference

    if source.looks_like_directory(args.source):
        return formats.load(Path(args.source).expanduser(), format=args.format)
    ref = Reference.parse(args.source)
    _progress(f"pulling {ref}")
    with source.local_bundle(
        args.source,
        credentials=flags.load_credentials(args.registry_config),
        insecure=flags.insecure_hosts(args, ref),
        platform=args.platform,
    ) as root:
        return formats.load(root, format=args.format)


def run_apply(args: argparse.Namespace) -> int:
    """install or upgrade a bundle directory as a named deployment

    Apply a bundle (plain+v0: DIR/manifests/*.yaml) with server-side apply, in dependency
    order, then prune what the previous revision had and this one lacks.

    exit status: 0 applied (and ready, with --wait); 1 an error; 3 --wait ran out of time
    before every object was ready
    """
    from provisioner.engine.apply import apply, drift

    options = _options(args)
    bundle = _load(args)
    kube = _kube(args)
    started = time.monotonic()
    result = apply.install(kube, bundle, options, progress=_progress)
    print(
        f"deployment {options.name}: applied {len(result.applied)} objects,"
        f" pruned {len(result.pruned)} in {time.monotonic() - started:.1f}s"
    )
    for ref, why in result.skipped:
        print(f"  left alone {ref}: {why}")
    if args.wait > 0:
        code = _wait_ready(kube, options, args.wait)
        if code != EXIT_OK:
            return code
    if args.watch:
        _progress("watching for drift; Ctrl-C to stop")
        watcher = drift.DriftWatcher(kube, options.name, result.applied, report=_progress)
        stop = threading.Event()
        try:
            watcher.run(stop)
        except KeyboardInterrupt:
            stop.set()
            watcher.stop()
    return EXIT_OK


def _wait_ready(kube: Kube, options: apply.Options, timeout: float) -> int:
    from provisioner.engine.apply import lifecycle

    deadline = time.monotonic() + timeout
    while True:
        states = lifecycle.status(kube, options.name, system_namespace=options.system_namespace)
        waiting = [s for s in states if not s.health.ready]
        if not waiting:
            _progress("all objects ready")
            return EXIT_OK
        if time.monotonic() > deadline:
            for s in waiting:
                print(f"  not ready {s.ref}: {s.health.reason}")
            return EXIT_CHANGES
        time.sleep(1.0)


def run_diff(args: argparse.Namespace) -> int:
    """show what apply would change (server-side dry run); exit 3 if anything

    exit status: 0 nothing would change; 1 an error; 3 something would change
    """
    from provisioner.engine.preview import diff

    options = _options(args)
    changes = list(diff.plan(_kube(args), _load(args), options))
    view = diff_view(changes)
    output.emit(view, args.output)
    print(f"{len(view.names)} of {len(changes)} objects would change", file=sys.stderr)
    return EXIT_CHANGES if view.names else EXIT_OK


def _kubectl_name(ref: ObjectRef) -> str:
    """``configmap/a``, ``deployment.apps/web``: an object as ``kubectl -o name`` names it."""
    resource = f"{ref.kind.lower()}.{ref.group}" if ref.group else ref.kind.lower()
    return f"{resource}/{ref.name}"


def _ref_document(ref: ObjectRef) -> dict[str, str]:
    return {
        "apiVersion": ref.api_version,
        "kind": ref.kind,
        "namespace": ref.namespace,
        "name": ref.name,
    }


def diff_view(changes: list[diff.Change]) -> output.View:
    """``rukpak diff``: each object that would change, its action and its unified diff (an
    update) or note; ``-o name`` the objects, ``-o json|yaml`` them with action and detail."""
    text, names, items = [], [], []
    for c in changes:
        if c.action == "unchanged":
            continue
        note = f" ({c.detail})" if c.detail and c.action != "update" else ""
        text.append(f"{c.action:9} {c.ref}{note}\n" + (c.detail if c.action == "update" else ""))
        names.append(_kubectl_name(c.ref))
        items.append({**_ref_document(c.ref), "action": c.action, "detail": c.detail})
    return output.View(document={"changes": items}, names=names, text="".join(text))


def run_status(args: argparse.Namespace) -> int:
    """health of every object a deployment applied; exit 3 if any is not ready

    exit status: 0 every object ready; 1 an error; 3 some object not ready
    """
    from provisioner.engine.apply import lifecycle

    states = lifecycle.status(
        _kube(args), args.name, system_namespace=args.system_namespace, concurrency=args.concurrency
    )
    output.emit(status_view(args.name, states), args.output)
    ready = sum(1 for s in states if s.health.ready)
    print(f"{ready}/{len(states)} ready", file=sys.stderr)
    return EXIT_OK if ready == len(states) else EXIT_CHANGES


def status_view(name: str, states: list[lifecycle.ObjectStatus]) -> output.View:
    """``rukpak status``: one row per object of deployment ``name``; ``-o name`` gives each
    object as kubectl names it (``configmap/a``), ``-o json|yaml`` each object's reference
    and readiness, ``-o wide`` adds the API version."""
    rows, wide, names, items = [], [], [], []
    for s in states:
        ref = s.ref
        rows.append(("ready" if s.health.ready else "NOT READY", str(ref), s.health.reason))
        wide.append((ref.api_version,))
        names.append(_kubectl_name(ref))
        items.append({**_ref_document(ref), "ready": s.health.ready, "reason": s.health.reason})
    document = {"deployment": name, "objects": items}
    return output.View(
        document=document,
        names=names,
        columns=("STATUS", "OBJECT", "REASON"),
        rows=rows,
        wide_columns=("API VERSION",),
        wide=wide,
        empty=f"deployment {name} has no objects",
    )


def run_uninstall(args: argparse.Namespace) -> int:
    """delete everything a deployment applied"""
    from provisioner.engine.apply import lifecycle

    result = lifecycle.uninstall(
        _kube(args),
        args.name,
        policy=args.deletion_policy,
        system_namespace=args.system_namespace,
        concurrency=args.concurrency,
        progress=_progress,
    )
    print(
        f"deployment {args.name}: deleted {len(result.pruned)},"
        f" orphaned {len(result.orphaned)}, left alone {len(result.skipped)}"
    )
    return EXIT_OK


def main(argv: list[str] | None = None) -> int:
    """Run one of these subcommands alone (tests; ``rukpak`` is the real entry point)."""
    parser = argparse.ArgumentParser(prog="rukpak")
    register(parser.add_subparsers(dest="command", required=True))
    args = parser.parse_args(argv)
    try:
        code: int = args.func(args)
    except errors.RukpakError as err:
        print(f"error: {err.message}", file=sys.stderr)
        return 1
    return code
