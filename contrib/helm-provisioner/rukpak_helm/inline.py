"""The helm provisioner's decisions for BundleDeployments created as v1alpha2, pure.

Where it sits: beside ``plan`` (objects created as v1alpha1, whose template generates
Bundles), under the controller, which picks this planner by ``api.created_in`` and hands
it the object's v1alpha2 view (``api.as_v1alpha2``). A v1alpha2 BundleDeployment names
its chart inline (``spec.source``: an image, or an http URL of the chart's tarball as
upstream's own helm example does) and never has a Bundle object; the core's
v1alpha2 words carry over (``Unpacked``: UnpackPending, UnpackSuccessful, UnpackFailed
with source failures prefixed ``source bundle content: ``; ``HasValidBundle``,
``Installed``; ``status.resolvedSource``). The flow:

1. add our finalizer; ``spec.paused`` plans nothing more (deletion still runs);
2. refuse what cannot be installed: ``spec.sources``, a source other than an image or
   http (or http with credentials), and under ``spec.requireImmutableRefs`` an image tag
   or a URL without ``#sha256=``;
3. pin the source (``plan.Resolve``: the controller fetches it, checks its chart and writes
   ``status.resolvedSource`` and ``Unpacked``). A pin holds while ``Unpacked`` was written
   for the current generation: a resync never re-resolves a tag or URL, so nothing pivots
   silently; a spec change (values included) pins again;
4. render and install the pinned chart, as ``plan`` does for a Bundle, under the revision
   name ``<bd>-<hash of the pin>``; the previous install stays when that fails.
"""

from __future__ import annotations

import hashlib
from typing import Any, Literal

from provisioner import api
from rukpak_helm import plan

UNPACKED = "Unpacked"
SOURCE_PREFIX = api.words.SOURCE_PREFIX
KINDS = ("image", "http")
"""The source types this provisioner fetches."""


def _spec(bd: api.Obj) -> dict[str, Any]:
    spec: dict[str, Any] = bd.get("spec") or {}
    return spec


def condition(bd: api.Obj, kind: str) -> dict[str, Any]:
    for cond in (bd.get("status") or {}).get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == kind:
            return cond
    return {}


def source_of(bd: api.Obj) -> tuple[str, str]:
    """(``image`` or ``http``, the reference or URL) that ``spec.source`` names; ("", "")
    for anything else."""
    source = _spec(bd).get("source") or {}
    kind = str(source.get("type") or "")
    field = "ref" if kind == "image" else "url"
    named = str((source.get(kind) or {}).get(field) or "") if kind in KINDS else ""
    return (kind, named) if named else ("", "")


def pin_of(bd: api.Obj) -> str | None:
    """The pinned image or URL of the current generation (``status.resolvedSource``), or
    None when the source was not resolved for this generation."""
    generation = int((bd.get("metadata") or {}).get("generation") or 0)
    if condition(bd, UNPACKED).get("observedGeneration") != generation:
        return None
    resolved = (bd.get("status") or {}).get("resolvedSource") or {}
    kind = resolved.get("type")
    if kind not in KINDS:
        return None
    pinned = (resolved.get(kind) or {}).get("ref" if kind == "image" else "url")
    return str(pinned) if pinned else None


def revision_name(bd: api.Obj, pinned: str) -> str:
    """The name an install of ``pinned`` goes by in conditions and events."""
    return f"{plan.name_of(bd)}-{hashlib.sha256(pinned.encode()).hexdigest()[:10]}"


def refusal(bd: api.Obj) -> str | None:
    """Why this BundleDeployment's content cannot be installed here, or None."""
    spec = _spec(bd)
    if spec.get("sources"):
        return (
            f"{SOURCE_PREFIX}spec.sources is not supported by {plan.CLASS}: name the chart "
            "(an image or an http URL) in spec.source"
        )
    kind, named = source_of(bd)
    if not kind:
        other = (spec.get("source") or {}).get("type")
        return f'{SOURCE_PREFIX}bundle source type "{other}" not supported by {plan.CLASS}'
    if kind == "http" and ((spec["source"].get("http") or {}).get("auth") or {}).get("secret"):
        return (
            f"{SOURCE_PREFIX}http sources with credentials are not supported by {plan.CLASS} "
            "yet: serve the chart without them, or from an image"
        )
    if spec.get("requireImmutableRefs"):
        if kind == "image" and "@sha256:" not in named:
            return (
                f'{SOURCE_PREFIX}spec.requireImmutableRefs is set: image reference "{named}" '
                "is a tag: name a digest (repository@sha256:...)"
            )
        if kind == "http" and "#sha256=" not in named:
            return (
                f'{SOURCE_PREFIX}spec.requireImmutableRefs is set: http URL "{named}" names '
                "no content digest: append #sha256=<hex of the tarball>"
            )
    return None


def plan_inline(bd: api.Obj, observed: plan.Observed, *, default_namespace: str) -> plan.Plan:
    """What to do for ``bd`` (its v1alpha2 view) now (see the module doc). ``Plan.valid``
    is ``Unpacked`` (``HasValidBundle`` says the same)."""
    meta = bd.get("metadata") or {}
    claimed = plan.FINALIZER in (meta.get("finalizers") or [])
    spec = _spec(bd)
    if meta.get("deletionTimestamp"):
        if not claimed:
            return plan.Plan()
        policy: Literal["Delete", "Orphan"] = (
            "Orphan" if spec.get("deletionPolicy") == "Orphan" else "Delete"
        )
        return plan.Plan([plan.Uninstall(policy), plan.RemoveFinalizer()])
    if spec.get("paused"):
        return plan.Plan()
    out = plan.Plan()
    if not claimed:
        out.actions.append(plan.AddFinalizer())
    refused = refusal(bd)
    if refused is not None:
        out.valid = ("False", "UnpackFailed", refused)
        return out
    pinned = pin_of(bd)
    unpacked = condition(bd, UNPACKED)
    if pinned is None:
        _, named = source_of(bd)
        out.actions.append(plan.Resolve(named))
        out.valid = ("False", "UnpackPending", f"resolving {named}")
        return out
    out.valid = (
        str(unpacked.get("status") or "Unknown"),
        str(unpacked.get("reason") or ""),
        str(unpacked.get("message") or ""),
    )
    if out.valid[0] != "True":
        return out  # the pinned content has no valid chart: nothing to install
    desired = plan.Desired(
        bundle=revision_name(bd, pinned),
        pinned=pinned,
        namespace=plan.install_namespace(bd, default_namespace),
        values_digest=plan.values_digest(bd),
    )
    last = observed.last
    if last is None or last.key != desired.key or not last.final:
        out.actions.append(plan.Install(desired))
    return out


def resolved_status(pinned: str) -> api.Obj:
    """``status.resolvedSource`` of a pinned image (``repo@sha256:...``) or URL."""
    if "@sha256:" in pinned:
        return {"type": "image", "image": {"ref": pinned}}
    return {"type": "http", "http": {"url": pinned}}
