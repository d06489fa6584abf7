"""``rukpak approve NAME [--preview-digest D]``: approve a paused BundleDeployment's preview.

Where it sits: beside ``provisioner.cli.deployments`` (``rukpak preview`` shows what a paused
BundleDeployment would install and grant). Approval is unpausing (docs/lifecycle.md): the
manager installs the previewed pin once ``spec.paused`` is false. This command is that
merge patch (``{"spec": {"paused": false}}``) with the resourceVersion it read as a
precondition, so a spec that changes between the check and the patch is refused by the API
server (409) instead of approving content nobody reviewed.

With ``--preview-digest`` it first checks, on what the manager recorded in the status, that
the preview is of that content: ``status.preview`` is there, did not fail, and is of the
current generation; the pin (``status.resolvedSource`` or ``status.resolvedSources``, see
``provisioner.manager.inline``) was made for this generation; and it names ``D`` (an image
digest, a git commit, an http content digest). ``check`` is pure and tested on its own.

Idempotent: approving a BundleDeployment that is not paused changes nothing and says so.
"""

from __future__ import annotations

import argparse
import json
import re
from typing import TYPE_CHECKING, Any

from provisioner.cli import deployments
from provisioner.runtime import flags
from rukpak.common import errors

if TYPE_CHECKING:
    from provisioner.engine.objects import Obj

PIN_ANNOTATION = "core.rukpak.io/pinned"
"""``provisioner.manager.inline.PIN_ANNOTATION``: the generation the recorded pin is for."""
_DIGEST = re.compile(r"^(sha256:[0-9a-f]{64}|sha512:[0-9a-f]{128}|[0-9a-f]{40}|[0-9a-f]{64})$")
_IMAGE_DIGEST = re.compile(r"@(sha256:[0-9a-f]{64}|sha512:[0-9a-f]{128})$")
_HTTP_PIN = re.compile(r"#sha256=([0-9a-f]{64})$")


def register(subparsers: Any) -> None:
    """Add ``approve`` to the ``rukpak`` parser."""
    p = subparsers.add_parser(
        "approve",
        help="approve a paused BundleDeployment's preview (unpause it)",
        description="Approve what `rukpak preview NAME` showed: set spec.paused to false, "
        "with the object's resourceVersion as a precondition (a spec changed meanwhile is "
        "refused). With --preview-digest, first check that the preview recorded in the "
        "status is of that content and of the current spec.",
        epilog="examples:\n  rukpak preview my-operator\n"
        "  rukpak approve my-operator --preview-digest sha256:5b1f...\n\n"
        "exit status: 0 approved (or not paused); 1 an error, or the preview is not of "
        "that digest",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("name", metavar="NAME")
    p.add_argument(
        "--preview-digest",
        metavar="DIGEST",
        help="approve only if the preview is of this content: an image digest "
        "(sha256:<hex>), a git commit or an http content digest",
    )
    flags.add_cluster(p)
    p.set_defaults(func=run_approve)


def digests_of(status: Obj) -> list[str]:
    """The content digests the pin in ``status`` names: image digests, git commits, http
    content digests (``sha256:<hex>``), one per source."""
    found: list[str] = []
    pins: list[Any] = []
    if isinstance(status.get("resolvedSource"), dict):
        pins.append(status["resolvedSource"])
    if isinstance(status.get("resolvedSources"), list):
        pins.extend(status["resolvedSources"])
    while pins:
        pin = pins.pop(0)
        if not isinstance(pin, dict):
            continue
        if isinstance(pin.get("sources"), list):
            pins.extend(pin["sources"])
        body = pin.get(str(pin.get("type")))
        if not isinstance(body, dict):
            continue
        image = _IMAGE_DIGEST.search(str(body.get("ref") or ""))
        http = _HTTP_PIN.search(str(body.get("url") or ""))
        commit = body.get("ref", {}).get("commit") if isinstance(body.get("ref"), dict) else None
        if image:
            found.append(image.group(1))
        elif http:
            found.append(f"sha256:{http.group(1)}")
        elif isinstance(commit, str) and commit:
            found.append(commit)
    return found


def check(bd: Obj, digest: str | None) -> bool:
    """Whether ``bd`` is paused (False: nothing to approve); raises FailedPrecondition when
    ``digest`` is given and the recorded preview is not of it (or not of this spec)."""
    name = deployments.resource_name(str((bd.get("metadata") or {}).get("name") or ""))
    if digest is not None and not _DIGEST.match(digest):
        raise errors.InvalidArgument(
            f"--preview-digest {digest!r} is not a digest: give sha256:<64 hex digits> (an "
            "image or http content digest) or a git commit"
        )
    if not (bd.get("spec") or {}).get("paused"):
        return False
    if digest is None:
        return True
    status = deployments.status_of(bd)
    meta = bd.get("metadata") or {}
    generation = meta.get("generation")
    shown = status.get("preview")
    see = f"see rukpak preview {meta.get('name')}"
    if not isinstance(shown, dict):
        raise errors.FailedPrecondition(f"{name} has no preview yet: wait for it ({see})")
    if shown.get("error"):
        raise errors.FailedPrecondition(f"{name}: the preview failed: {shown['error']}")
    if shown.get("generation") != generation:
        raise errors.FailedPrecondition(
            f"{name}: the preview is of generation {shown.get('generation')}, the spec is at "
            f"generation {generation}: wait for the new preview ({see})"
        )
    try:
        pinned_for = json.loads(str((meta.get("annotations") or {}).get(PIN_ANNOTATION)))
    except ValueError:
        pinned_for = None
    if not isinstance(pinned_for, dict) or pinned_for.get("generation") != generation:
        raise errors.FailedPrecondition(
            f"{name}: the source of generation {generation} is not pinned yet: wait for the "
            f"new preview ({see})"
        )
    pinned = digests_of(status)
    if digest not in pinned:
        raise errors.FailedPrecondition(
            f"{name}: the preview is of {', '.join(pinned) or 'no pinned digest'}, not "
            f"{digest}: review that preview ({see}) before approving it"
        )
    return True


def run_approve(args: argparse.Namespace) -> int:
    kube = flags.kube(args)
    bd = deployments.get(kube, args.name)
    name = deployments.resource_name(args.name)
    if not check(bd, args.preview_digest):
        print(f"{name} is not paused: nothing to approve")
        return 0
    version = (bd.get("metadata") or {}).get("resourceVersion")
    try:
        kube.merge_patch(
            deployments.ref(args.name),
            {"metadata": {"resourceVersion": version}, "spec": {"paused": False}},
        )
    except errors.Aborted as exc:  # 409: changed since it was read
        raise errors.FailedPrecondition(
            f"{name} changed while it was being approved: look at the new preview "
            f"(rukpak preview {args.name}) and approve again ({exc.message})"
        ) from None
    print(f"{name} approved")
    return 0
