"""Approval bound to what was reviewed: a paused v1alpha2 BundleDeployment installs only the
content its preview showed.

Where it sits: under ``inline`` (the planner of BundleDeployments created as v1alpha2),
beside ``revisions``; pure, like the planner. The preview (``inline._plan_preview``) records
in ``status.preview`` the digests it reviewed (``digests``: image digests, git commits, http
content digests) and a hash of the spec it was made for, ``paused`` left out (``specHash``).
Two rules follow:

- **Unpausing keeps the reviewed pin.** Setting ``spec.paused`` to false is a new
  generation, which would pin the source again: a tag that moved since the preview would be
  installed unreviewed. While ``status.preview`` is of the pin in the status and of the
  same spec but for ``paused``, that pin holds (:func:`reviewed`), and
  ``spec.pollInterval`` does not move it before it is installed.
- **An approval names digests.** The annotation :data:`APPROVED_ANNOTATION` (what
  ``rukpak approve`` writes) lists the digests approved, comma-separated (the preview's
  ``revision`` for content without a digest, ConfigMaps). While paused, the preview of the
  current pin is installed only when the annotation names exactly its digests; when the
  pin moved since (a new ``pollInterval`` pin, a spec change), the BundleDeployment stays
  paused with a new preview and ``Approved`` False, reason :data:`REASON_CHANGED`, naming
  both. :func:`verdict` is the ``Approved`` condition.
- **Upgrades that grant more wait, when asked.** Under ``spec.upgradePolicy:
  ApproveEscalations`` an unpaused BundleDeployment previews an upgrade (a new pin over an
  installed revision, :func:`gated`) before installing it; when the preview lists
  permissions the installed revision lacks (``newRules``: new ClusterRole or Role rules,
  verbs, resources), it installs nothing until approved as above, ``Approved`` False with
  reason :data:`REASON_ESCALATION` listing them; otherwise it goes on at once
  (:data:`REASON_NO_ESCALATION`).
"""

from __future__ import annotations

from provisioner.engine.objects import Obj, meta_of
from provisioner.manager import model
from provisioner.manager.planning import sources
from rukpak.sources import pins

APPROVED_ANNOTATION = "core.rukpak.io/approved-digest"
"""The digests (or the preview's revision) approved for installation while paused."""
APPROVED = "Approved"
"""The condition of a paused BundleDeployment: is the preview of its current pin approved."""
REASON_AWAITING = "AwaitingApproval"
REASON_APPROVED = "Approved"
REASON_CHANGED = "PreviewChanged"
REASON_ESCALATION = "EscalationNeedsApproval"
REASON_NO_ESCALATION = "NoNewPermissions"
APPROVE_ESCALATIONS = "ApproveEscalations"
"""``spec.upgradePolicy``: upgrades that grant more wait for an approval."""

Verdict = tuple[str, str, str]


def spec_hash(spec: Obj) -> str:
    """A hash of ``spec`` without ``paused``: what a preview was made for."""
    return model.stable_hash({k: v for k, v in spec.items() if k != "paused"}, 16)


def digests_of(resolved: Obj) -> list[str]:
    """The content digests a pin names, one per source that has one (ConfigMaps have none)."""
    found: list[str] = []
    for _, pin in (
        sources.parts(resolved) if resolved.get("type") == sources.MULTI else [("", resolved)]
    ):
        digest = pins.content_digest(pin.get(str(pin.get("type"))))
        if digest is not None:
            found.append(digest)
    return found


def preview_fields(bd: Obj, resolved: Obj) -> Obj:
    """What a preview records beside its summary to bind an approval to it."""
    return {"digests": digests_of(resolved), "specHash": spec_hash(bd.get("spec") or {})}


def reviewed(bd: Obj, revision: str) -> bool:
    """Whether ``status.preview`` reviewed ``revision`` (the pin in the status, under the
    configuration of the spec) for this spec but for ``paused``, and did not fail."""
    shown = (bd.get("status") or {}).get("preview")
    return (
        isinstance(shown, dict)
        and not shown.get("error")
        and shown.get("revision") == revision
        and shown.get("specHash") == spec_hash(bd.get("spec") or {})
    )


def approved(bd: Obj) -> list[str]:
    """What :data:`APPROVED_ANNOTATION` approves (empty when nothing is)."""
    value = (meta_of(bd).get("annotations") or {}).get(APPROVED_ANNOTATION)
    return [p.strip() for p in str(value or "").split(",") if p.strip()]


def gated(spec: Obj, installed: str | None, target: str) -> bool:
    """Whether installing ``target`` over ``installed`` is an upgrade that
    ``upgradePolicy: ApproveEscalations`` previews first."""
    return (
        spec.get("upgradePolicy") == APPROVE_ESCALATIONS
        and installed is not None
        and installed != target
    )


def new_rules_of(shown: object) -> list[str]:
    """The permissions a preview (``status.preview``) says an upgrade adds; one line saying
    so when the preview run did not tell (an older instance image)."""
    rules = shown.get("newRules") if isinstance(shown, dict) else None
    if not isinstance(rules, list):
        return ["(the preview run did not list new permissions)"]
    return [str(r) for r in rules]


def verdict(
    bd: Obj, revision: str, digests: list[str], name: str, *, new_rules: list[str] | None = None
) -> Verdict:
    """``Approved`` for a BundleDeployment whose current pin is ``revision`` with
    ``digests`` and has been previewed: paused, or (``new_rules`` given) an upgrade under
    ``upgradePolicy: ApproveEscalations`` that adds ``new_rules``."""
    asked = approved(bd)
    shown = ", ".join(digests) or revision
    if new_rules is not None and not new_rules:
        return (
            "True",
            REASON_NO_ESCALATION,
            f"the upgrade to {shown} grants no permission the installed revision lacks: "
            "installing it",
        )
    if asked and (sorted(set(asked)) == sorted(set(digests)) if digests else asked == [revision]):
        return "True", REASON_APPROVED, f"{shown} approved ({APPROVED_ANNOTATION}): installing it"
    how = (
        f"rukpak approve {name} --preview-digest {digests[0]}"
        if len(digests) == 1
        else f"annotate {APPROVED_ANNOTATION}={','.join(digests) or revision}"
    )
    if new_rules:
        return (
            "False",
            REASON_ESCALATION,
            f"the upgrade to {shown} grants permissions the installed revision lacks: "
            f"{'; '.join(new_rules)}; nothing installed: review it (rukpak preview {name} "
            f"--diff) and approve it ({how})",
        )
    if asked:
        return (
            "False",
            REASON_CHANGED,
            f"approved {', '.join(asked)}, but the source now pins {shown} (it moved since "
            f"the preview that was approved): nothing installed; review the new preview "
            f"(rukpak preview {name}) and approve it ({how})",
        )
    return (
        "False",
        REASON_AWAITING,
        f"preview of {shown} ready: review it (rukpak preview {name}) and approve it ({how}), "
        "or set spec.paused to false",
    )
