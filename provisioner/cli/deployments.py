"""``rukpak history|rollback|preview``: a BundleDeployment's revisions and its permission
preview from the command line.

The edge over ``provisioner.engine.apply.revisionlog``: reads a BundleDeployment (its
``status.revisions``, written by the manager) through the ``Kube`` adapter and prints
them as ``kubectl rollout history`` does; ``rollback`` writes the rollback annotation
that makes the manager reinstall a kept revision from the node caches, and can wait
until it is installed; ``preview`` prints what a paused one would install and grant (the
ConfigMap its preview run wrote, ``engine.preview``); ``approve`` (its own module) unpauses
one. ``history`` and ``preview`` print through ``provisioner.cli.output`` (``-o``); the
helpers ``ref``, ``get``, ``status_of`` and ``resource_name`` serve ``approve`` and ``get``
too. ``provisioner.cli.main`` calls ``register``.

Exit codes: 0 done; 1 an error (no such BundleDeployment or revision, a v1alpha1-made
object); 3 ``rollback --wait`` ran out of time.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from provisioner.cli import output
from provisioner.runtime import flags
from rukpak.common import command, errors

# The engine is imported by the commands that run, not to build the parser (start-up).
if TYPE_CHECKING:
    from provisioner.engine.apply import revisionlog
    from provisioner.engine.kube.kube import Kube
    from provisioner.engine.objects import Obj, ObjectRef

EXIT_TIMEOUT = 3
GROUP = "core.rukpak.io"
KIND = "BundleDeployment"
V1ALPHA1_MADE = "core.rukpak.io/v1alpha1-template"
"""On objects created as v1alpha1 (their Bundles are the revisions; no rollback)."""


def register(subparsers: Any) -> None:
    """Add ``history``, ``rollback`` and ``preview`` to the ``rukpak`` parser."""
    p = _command(subparsers, "history", run_history)
    p.add_argument("--revision", type=int, help="show this revision in full")
    output.add_output(p)
    flags.add_cluster(p)

    p = _command(subparsers, "rollback", run_rollback)
    p.add_argument("--to-revision", type=int, help="the kept revision (default: the previous)")
    p.add_argument(
        "--wait", type=float, metavar="SECONDS", default=0, help="then wait until it is installed"
    )
    flags.add_cluster(p)

    p = _command(subparsers, "preview", run_preview)
    p.add_argument("--diff", action="store_true", help="what approving changes ('+'/'-' lines)")
    output.add_output(p)
    flags.add_cluster(p)
    flags.add_system_namespace(p, holds="the preview ConfigMap")


def _command(
    subparsers: Any, name: str, run: Callable[[argparse.Namespace], int]
) -> argparse.ArgumentParser:
    """A subcommand on one BundleDeployment, ``NAME``, that ``run`` carries out (and its
    docstring describes, ``command.add``); the caller adds its own flags, then the
    cluster's (in that order, as ``--help`` lists them)."""
    p = command.add(subparsers, name, run)
    p.add_argument("name", metavar="NAME")
    return p


def ref(name: str) -> ObjectRef:
    """The v1alpha2 BundleDeployment ``name``."""
    from provisioner.engine.objects import ObjectRef

    return ObjectRef(GROUP, "v1alpha2", KIND, "", name)


def get(kube: Kube, name: str) -> Obj:
    """The BundleDeployment ``name``; NotFound when there is none."""
    bd = kube.get(ref(name))
    if bd is None:
        raise errors.NotFound(f"bundledeployment {name!r} not found")
    return bd


def status_of(bd: Obj) -> Obj:
    status = bd.get("status")
    return status if isinstance(status, dict) else {}


def _source(rev: revisionlog.Revision) -> str:
    src = rev.source
    if isinstance(src.get("sources"), list):
        return ", ".join(
            f"{_one(s)} at {s.get('destination')}" for s in src["sources"] if isinstance(s, dict)
        )
    return _one(src)


def _one(src: Obj) -> str:
    kind = src.get("type")
    body = src.get(str(kind)) if isinstance(kind, str) else None
    if not isinstance(body, dict):
        return str(kind or "?")
    if kind == "git":
        commit = (body.get("ref") or {}).get("commit") if isinstance(body.get("ref"), dict) else ""
        return f"{body.get('repository')}@{commit}"
    return str(body.get("ref") or body.get("url") or kind)


def _name_of(bd: Obj) -> str:
    meta = bd.get("metadata")
    return str((meta if isinstance(meta, dict) else {}).get("name") or "")


def resource_name(name: str) -> str:
    """``bundledeployment.core.rukpak.io/NAME``, as ``-o name`` prints it."""
    return f"bundledeployment.{GROUP}/{name}"


def history_view(bd: Obj) -> output.View:
    """The revisions of ``bd`` (``rukpak history``): a table (``-o wide`` adds each
    revision's record name and when it became the installed one), or ``-o json|yaml``
    the installed and previous revision numbers with every kept revision in full."""
    from provisioner.engine.apply import revisionlog

    status = status_of(bd)
    installed, previous = status.get("installedRevision"), status.get("previousRevision")
    kept = revisionlog.of_status(bd)
    rows, wide = [], []
    for rev in kept:
        mark = "*" if rev.number == installed else "-" if rev.number == previous else ""
        rows.append(
            (
                f"{rev.number}{mark}",
                rev.outcome,
                str(rev.objects),
                str(rev.generation),
                rev.time,
                _source(rev),
            )
        )
        wide.append((rev.name, rev.installed_at or "-"))
    name = _name_of(bd)
    return output.View(
        document={
            "name": name,
            "installedRevision": installed,
            "previousRevision": previous,
            "revisions": [rev.document() for rev in kept],
        },
        names=[resource_name(name)],
        columns=("REVISION", "OUTCOME", "OBJECTS", "GENERATION", "TIME", "SOURCE"),
        rows=rows,
        wide_columns=("RECORD", "INSTALLED AT"),
        wide=wide,
        heading=resource_name(name),
        empty=f"{resource_name(name)}: no revisions recorded yet",
    )


def history_table(bd: Obj) -> str:
    """The revisions of ``bd`` as a table (``rukpak history``)."""
    return output.render(history_view(bd), output.TABLE)


def run_history(args: argparse.Namespace) -> int:
    """list a BundleDeployment's kept revisions (as kubectl rollout history)

    List the revisions the manager keeps for a BundleDeployment (spec.revisionHistoryLimit,
    default 5): number, outcome, objects, generation, when, and the pinned source. The
    installed one is marked *, the previous one -.

    examples:
      rukpak history my-operator
      rukpak history my-operator --revision 2   # one revision in full (YAML)
    """
    from provisioner.engine.apply import revisionlog

    bd = get(flags.kube(args), args.name)
    kept = revisionlog.of_status(bd)
    if args.revision is None:
        output.emit(history_view(bd), args.output)
        return 0
    rev = revisionlog.find(kept, args.revision)
    if rev is None:
        numbers = ", ".join(str(r.number) for r in kept) or "none"
        raise errors.NotFound(f"revision {args.revision} is not kept (kept: {numbers})")
    one = output.View(
        document=rev.document(),
        names=[resource_name(args.name)],
        text=output.render(output.View(rev.document(), ()), "yaml"),
    )  # one revision in full: YAML unless asked otherwise
    output.emit(one, args.output)
    return 0


def choose(bd: Obj, wanted: int | None) -> revisionlog.Revision:
    """The kept revision a rollback of ``bd`` goes to; ``errors`` say why none can."""
    from provisioner.engine.apply import revisionlog

    name = _name_of(bd)
    annotations = (bd.get("metadata") or {}).get("annotations") or {}
    if V1ALPHA1_MADE in annotations:
        raise errors.FailedPrecondition(
            f"bundledeployment {name!r} was created as v1alpha1: its revisions are Bundles; "
            "change spec.template to go back"
        )
    kept = revisionlog.of_status(bd)
    status = status_of(bd)
    number = wanted if wanted is not None else status.get("previousRevision")
    if not isinstance(number, int):
        raise errors.FailedPrecondition(
            f"bundledeployment {name!r} has no previous revision: name one with --to-revision"
        )
    rev = revisionlog.find(kept, number)
    if rev is None:
        numbers = ", ".join(str(r.number) for r in kept) or "none"
        raise errors.NotFound(f"revision {number} is not kept (kept: {numbers})")
    return rev


def run_rollback(args: argparse.Namespace) -> int:
    """reinstall a kept revision from the node caches

    Reinstall a kept revision of a BundleDeployment created as v1alpha2 (default: the
    previous one). Its pinned content is mounted from the node caches: no registry, git or
    http server is asked. The rollback holds until the spec changes; the next spec change
    installs what the spec then names.

    examples:
      rukpak rollback my-operator
      rukpak rollback my-operator --to-revision 2 --wait 120

    exit status: 0 asked (and installed, with --wait); 1 an error; 3 --wait ran out of time
    """
    from provisioner.engine.apply import revisionlog
    from provisioner.engine.objects import condition, meta_of

    kube = flags.kube(args)
    bd = get(kube, args.name)
    rev = choose(bd, args.to_revision)
    meta = meta_of(bd)
    generation = int(meta.get("generation") or 0)
    value = revisionlog.rollback_annotation(rev.number, generation, revisionlog.MANUAL)
    kube.merge_patch(
        ref(args.name),
        {
            "metadata": {
                "annotations": {revisionlog.ROLLBACK_ANNOTATION: value},
                "resourceVersion": meta.get("resourceVersion"),
            }
        },
    )
    print(f"bundledeployment.{GROUP}/{args.name} rolling back to revision {rev.number}")
    if args.wait <= 0:
        return 0
    deadline = time.monotonic() + args.wait
    while time.monotonic() < deadline:
        now = get(kube, args.name)
        installed = condition(now, "Installed") or {}
        if (
            status_of(now).get("installedRevision") == rev.number
            and installed.get("status") == "True"
            and installed.get("observedGeneration") == generation
        ):
            print(f"bundledeployment.{GROUP}/{args.name} revision {rev.number} installed")
            return 0
        time.sleep(1.0)
    last = json.dumps(status_of(get(kube, args.name)).get("conditions") or [])[:400]
    print(f"timed out waiting for revision {rev.number}: {last}", file=sys.stderr)
    return EXIT_TIMEOUT


def run_preview(args: argparse.Namespace) -> int:
    """what a paused BundleDeployment would install and grant

    Print the permission preview of a BundleDeployment created (or changed) with
    spec.paused: true: its objects by kind and namespace, the cluster-scoped ones, the CRDs
    it changes, the RBAC rules it grants (aggregated) and what a reviewer must notice
    (wildcards, escalate, bind, impersonate, secrets). Unpausing is the approval (rukpak
    approve).

    examples:
      rukpak preview my-operator
      rukpak preview my-operator --diff   # against what is installed
      rukpak preview my-operator -o json  # the summary, the text and the diff
      rukpak approve my-operator
    """
    from provisioner.engine.objects import ObjectRef
    from provisioner.engine.preview import preview

    kube = flags.kube(args)
    bd = get(kube, args.name)
    shown = status_of(bd).get("preview")
    where = ObjectRef(
        "", "v1", "ConfigMap", args.system_namespace, preview.configmap_name(args.name)
    )
    cm = kube.get(where)
    if cm is None or not isinstance(cm.get("data"), dict):
        if isinstance(shown, dict) and shown.get("error"):
            raise errors.FailedPrecondition(f"the preview failed: {shown['error']}")
        raise errors.NotFound(
            f"bundledeployment {args.name!r} has no preview yet: set spec.paused to true "
            "(a preview is made for each content and configuration while paused)"
        )
    data = cm["data"]
    if isinstance(shown, dict) and shown.get("revision") not in (None, data.get("revision")):
        print(
            "note: the preview is of an earlier revision; a new one is on its way",
            file=sys.stderr,
        )
    text = str(data.get(preview.RENDER_KEY) or "")
    changes = str(data.get(preview.DIFF_KEY) or "")
    if args.diff:
        text = changes or "no changes against what is installed\n"
    try:
        summary = json.loads(str(data.get(preview.SUMMARY_KEY) or "null"))
    except ValueError:
        summary = None
    paused = bool((bd.get("spec") or {}).get("paused"))
    document = {
        "name": args.name,
        "paused": paused,
        "revision": data.get(preview.REVISION_KEY),
        "status": shown if isinstance(shown, dict) else None,
        "summary": summary,
        "preview": str(data.get(preview.RENDER_KEY) or ""),
        "diff": changes,
    }
    output.emit(
        output.View(document=document, names=[resource_name(args.name)], text=text),
        args.output,
    )
    if not paused and not args.diff:
        print("note: spec.paused is false: this was approved", file=sys.stderr)
    return 0
