"""``rukpak approve NAME [--preview-digest D]``: approve a paused BundleDeployment's preview.

Where it sits: beside ``provisioner.cli.deployments`` (``rukpak preview`` shows what a paused
BundleDeployment would install and grant). An approval names content, not a spec
(docs/lifecycle.md): this command writes the annotation ``core.rukpak.io/approved-digest``
with the digests the preview reviewed (``D``, or all of them when no ``D`` is given), with the
resourceVersion it read as a precondition, so a BundleDeployment that changes between the
check and the patch is refused by the API server (409). ``spec.paused`` stays true: the
manager (``provisioner.manager.planning.approval``) installs the previewed pin only while it names
exactly those digests; a tag that moved meanwhile gets a new preview and ``Approved`` False
(PreviewChanged), and later changes wait for an approval of their own.

Before writing, it checks on what the manager recorded in the status that there is a
preview to approve: ``status.preview`` is there, did not fail, is of the current generation;
the pin (``status.resolvedSource`` or ``status.resolvedSources``, see
``provisioner.manager.planning.inline``) was made for this generation; and, with ``D``, it reviewed
``D`` (an image digest, a git commit, an http content digest). ``check`` is pure and tested
on its own.

The same approves an upgrade that ``spec.upgradePolicy: ApproveEscalations`` holds because
it grants more (condition ``Approved``, reason EscalationNeedsApproval).

Idempotent: approving a BundleDeployment that is not paused changes nothing and says so;
approving twice writes the same annotation.
"""

from __future__ import annotations

import argparse
import json
import re
from typing import TYPE_CHECKING, Any

from provisioner.cli import deployments
from provisioner.runtime import flags
from rukpak.common import command, errors
from rukpak.sources import pins

if TYPE_CHECKING:
    from provisioner.engine.objects import Obj

APPROVED_ANNOTATION = "core.rukpak.io/approved-digest"
"""``provisioner.manager.planning.approval.APPROVED_ANNOTATION``: what is approved while paused."""
ESCALATION = "EscalationNeedsApproval"
"""``provisioner.manager.planning.approval.REASON_ESCALATION``: an upgrade waits for an approval."""
PIN_ANNOTATION = "core.rukpak.io/pinned"
"""``provisioner.manager.planning.inline.PIN_ANNOTATION``: the recorded pin's generation."""
_DIGEST = re.compile(r"^(sha256:[0-9a-f]{64}|sha512:[0-9a-f]{128}|[0-9a-f]{40}|[0-9a-f]{64})$")


def register(subparsers: Any) -> None:
    """Add ``approve`` to the ``rukpak`` parser."""
    p = command.add(subparsers, "approve", run_approve)
    p.add_argument("name", metavar="NAME")
    p.add_argument(
        "--preview-digest",
        metavar="DIGEST",
        help="approve only if the preview is of this content: an image digest "
        "(sha256:<hex>), a git commit or an http content digest",
    )
    flags.add_cluster(p)


def digests_of(status: Obj) -> list[str]:
    """The content digests the pin in ``status`` names: image digests, git commits, http
    content digests (``sha256:<hex>``), one per source."""
    found: list[str] = []
    todo: list[Any] = []
    if isinstance(status.get("resolvedSource"), dict):
        todo.append(status["resolvedSource"])
    if isinstance(status.get("resolvedSources"), list):
        todo.extend(status["resolvedSources"])
    while todo:
        pin = todo.pop(0)
        if not isinstance(pin, dict):
            continue
        if isinstance(pin.get("sources"), list):
            todo.extend(pin["sources"])
        digest = pins.content_digest(pin.get(str(pin.get("type"))))
        if digest is not None:
            found.append(digest)
    return found


def check(bd: Obj, digest: str | None) -> str | None:
    """The value of ``APPROVED_ANNOTATION`` that approves ``bd``'s preview: ``digest``, or
    every digest the preview reviewed when ``digest`` is None; None when ``bd`` is neither
    paused nor holding an upgrade for approval (``upgradePolicy: ApproveEscalations``).
    FailedPrecondition when there is no preview of the current spec to approve, or it is not
    of ``digest``."""
    name = deployments.resource_name(str((bd.get("metadata") or {}).get("name") or ""))
    if digest is not None and not _DIGEST.match(digest):
        raise errors.InvalidArgument(
            f"--preview-digest {digest!r} is not a digest: give sha256:<64 hex digits> (an "
            "image or http content digest) or a git commit"
        )
    status = deployments.status_of(bd)
    waiting = any(
        isinstance(c, dict) and c.get("type") == "Approved" and c.get("reason") == ESCALATION
        for c in status.get("conditions") or []
    )
    if not (bd.get("spec") or {}).get("paused") and not waiting:
        return None
    meta = bd.get("metadata") or {}
    generation = meta.get("generation")
    shown = status.get("preview")
    see = f"see rukpak preview {meta.get('name')}"
    if not isinstance(shown, dict):
        raise errors.FailedPrecondition(f"{name} has no preview yet: wait for it ({see})")
    if shown.get("error"):
        raise errors.FailedPrecondition(f"{name}: the preview failed: {shown['error']}")
    bound = "specHash" in shown  # the manager binds the approval to this preview itself
    if not bound and shown.get("generation") != generation:
        raise errors.FailedPrecondition(
            f"{name}: the preview is of generation {shown.get('generation')}, the spec is at "
            f"generation {generation}: wait for the new preview ({see})"
        )
    try:
        pinned_for = json.loads(str((meta.get("annotations") or {}).get(PIN_ANNOTATION)))
    except ValueError:
        pinned_for = None
    if not bound and (
        not isinstance(pinned_for, dict) or pinned_for.get("generation") != generation
    ):
        raise errors.FailedPrecondition(
            f"{name}: the source of generation {generation} is not pinned yet: wait for the "
            f"new preview ({see})"
        )
    reviewed = shown.get("digests")
    pinned = [str(d) for d in reviewed] if isinstance(reviewed, list) else digests_of(status)
    if bound and sorted(digests_of(status)) != sorted(pinned):
        raise errors.FailedPrecondition(
            f"{name}: the preview is of {', '.join(pinned) or 'no digest'}, the source now "
            f"pins {', '.join(digests_of(status)) or 'no digest'}: wait for its preview ({see})"
        )
    if digest is None:
        return ",".join(pinned) or str(shown.get("revision") or "")
    if digest not in pinned:
        raise errors.FailedPrecondition(
            f"{name}: the preview is of {', '.join(pinned) or 'no pinned digest'}, not "
            f"{digest}: review that preview ({see}) before approving it"
        )
    return ",".join(pinned) if len(pinned) > 1 else digest


def run_approve(args: argparse.Namespace) -> int:
    """approve a paused BundleDeployment's preview (install exactly what it showed)

    Approve what `rukpak preview NAME` showed: annotate the BundleDeployment with
    core.rukpak.io/approved-digest (the digests the preview reviewed), with the object's
    resourceVersion as a precondition (a change meanwhile is refused). The manager installs
    that content only: if the source moved since, it stays paused with a new preview.
    spec.paused stays true, so later changes are previewed and wait for approval again. An
    upgrade that upgradePolicy: ApproveEscalations holds is approved the same way. With
    --preview-digest, first check that the preview recorded in the status is of that content
    and of the current spec.

    examples:
      rukpak preview my-operator
      rukpak approve my-operator --preview-digest sha256:5b1f...

    exit status: 0 approved (or not paused); 1 an error, no preview yet, or the preview is
    not of that digest
    """
    kube = flags.kube(args)
    bd = deployments.get(kube, args.name)
    name = deployments.resource_name(args.name)
    value = check(bd, args.preview_digest)
    if value is None:
        print(f"{name} is not paused: nothing to approve")
        return 0
    version = (bd.get("metadata") or {}).get("resourceVersion")
    patch = {"metadata": {"resourceVersion": version, "annotations": {APPROVED_ANNOTATION: value}}}
    try:
        kube.merge_patch(deployments.ref(args.name), patch)
    except errors.Aborted as exc:  # 409: changed since it was read
        raise errors.FailedPrecondition(
            f"{name} changed while it was being approved: look at the new preview "
            f"(rukpak preview {args.name}) and approve again ({exc.message})"
        ) from None
    print(f"{name} approved: {value}")
    return 0
