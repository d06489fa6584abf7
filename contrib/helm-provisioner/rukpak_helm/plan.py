"""The helm provisioner's decisions, pure: what a Bundle's status is, what to do for a
BundleDeployment, and the status to write. No API calls, no clock, no helm.

Where it sits: the controller (``controller``) observes from its informer caches and
from what it did itself (``Outcome``: the last render+install of each
BundleDeployment in this process), asks these functions, and performs the answer.

Upstream RukPak v0.16's words carry over: a Bundle's ``status.phase`` (Pending,
Unpacked, Failing) and its ``Unpacked`` condition (UnpackPending, UnpackSuccessful,
UnpackFailed); a BundleDeployment's ``HasValidBundle`` (UnpackPending,
UnpackSuccessful, UnpackFailed, UnsupportedProvisionerClass) and ``Installed``
(InstallationSucceeded, InstallFailed), ``status.activeBundle`` and
``observedGeneration``.

A BundleDeployment's flow:

1. add our finalizer; 2. generate its Bundle (``api.desired_bundle``: the name
``<bd>-<template hash>``, labels and owner reference the core uses); 3. once that
Bundle is Unpacked, render and install it with the current values, unless this
process already did so for exactly this (Bundle, values, install namespace); 4. keep
the previous install when rendering or installing fails (``Installed=False``
InstallFailed with helm's or the engine's message; ``activeBundle`` stays);
5. delete owned Bundles that are neither wanted nor active. Deletion: stop correcting
drift, uninstall with ``spec.deletionPolicy``, delete the Bundles, drop the finalizer.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from typing import Any, Literal

from provisioner import api
from provisioner.api import actions

CLASS = "core-rukpak-io-helm"
FINALIZER = "core.rukpak.io/helm-uninstall"
OWNER_KIND_LABEL = "core.rukpak.io/owner-kind"
OWNER_NAME_LABEL = "core.rukpak.io/owner-name"

HAS_VALID_BUNDLE = "HasValidBundle"
INSTALLED = "Installed"
UNPACKED = "Unpacked"
WARNING_REASONS = frozenset(
    {
        "UnsupportedProvisionerClass",
        "UnsupportedSource",
        "UnpackFailed",
        "InstallFailed",
    }
)

Verdict = tuple[str, str, str]
"""(status, reason, message) of one condition."""


def handles(obj: api.Obj) -> bool:
    """Whether ``obj`` (a Bundle or a BundleDeployment) is ours: upstream's class filter."""
    return (obj.get("spec") or {}).get("provisionerClassName") == CLASS


def name_of(obj: api.Obj) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def _meta(obj: api.Obj) -> dict[str, Any]:
    meta: dict[str, Any] = obj.get("metadata") or {}
    return meta


# -- Bundles ------------------------------------------------------------------------------


def image_ref(bundle: api.Obj) -> str | None:
    """The image a Bundle names; None for any other source type."""
    source = (bundle.get("spec") or {}).get("source") or {}
    if source.get("type") != "image":
        return None
    return str((source.get("image") or {}).get("ref") or "") or None


def source_problem(bundle: api.Obj) -> str | None:
    """Why this provisioner cannot fetch the Bundle's source (upstream's words), or None."""
    kind = ((bundle.get("spec") or {}).get("source") or {}).get("type")
    if kind == "image" and image_ref(bundle):
        return None
    return f'source bundle content: bundle source type "{kind}" not supported by {CLASS}'


def pinned_ref(bundle: api.Obj) -> str | None:
    """``status.resolvedSource.image.ref`` of an Unpacked Bundle; None otherwise."""
    status = bundle.get("status") or {}
    if status.get("phase") != "Unpacked":
        return None
    resolved = status.get("resolvedSource") or {}
    ref = (resolved.get("image") or {}).get("ref") if resolved.get("type") == "image" else None
    return str(ref) if ref else None


def is_final(bundle: api.Obj) -> bool:
    """Unpacked and Failing are final: a Bundle's content never changes."""
    return (bundle.get("status") or {}).get("phase") in ("Unpacked", "Failing")


def bundle_status(
    *, phase: Literal["Pending", "Unpacked", "Failing"], message: str, now: str, pinned: str = ""
) -> api.Obj:
    """A Bundle's whole status for ``phase``, with its ``Unpacked`` condition."""
    reason, state = {
        "Pending": ("UnpackPending", "False"),
        "Unpacked": ("UnpackSuccessful", "True"),
        "Failing": ("UnpackFailed", "False"),
    }[phase]
    status: api.Obj = {
        "phase": phase,
        "conditions": [
            {
                "type": UNPACKED,
                "status": state,
                "reason": reason,
                "message": message,
                "lastTransitionTime": now,
            }
        ],
    }
    if pinned:
        status["resolvedSource"] = {"type": "image", "image": {"ref": pinned}}
    return status


# -- BundleDeployments --------------------------------------------------------------------


@dataclass(frozen=True)
class Desired:
    """One render+install: of which Bundle's content, with which values, where."""

    bundle: str
    pinned: str
    namespace: str
    values_digest: str

    @property
    def key(self) -> tuple[str, str, str, str]:
        return (self.bundle, self.pinned, self.namespace, self.values_digest)


@dataclass(frozen=True)
class Outcome:
    """What this process's last render+install of a BundleDeployment came to."""

    key: tuple[str, str, str, str]
    installed: Verdict
    final: bool = True
    """False for a failure worth another try (the API server busy, a conflict)."""


@dataclass(frozen=True)
class Observed:
    bundles: tuple[api.Obj, ...] = ()
    """The Bundles this BundleDeployment owns (owner labels)."""
    last: Outcome | None = None
    now: str = "1970-01-01T00:00:00Z"


# The core's own BundleDeployment actions (``api.actions``), under the names the controller
# matches on.
AddFinalizer = actions.AddFinalizer
RemoveFinalizer = actions.RemoveFinalizer
CreateBundle = actions.CreateBundle
DeleteBundle = actions.DeleteBundle
Uninstall = actions.Uninstall


@dataclass(frozen=True)
class Install:
    """Render ``desired`` and install it; the controller turns the result into an Outcome."""

    desired: Desired


@dataclass(frozen=True)
class Resolve:
    """Pin ``ref`` (an image, or the URL of an http source) for a BundleDeployment created
    as v1alpha2 (``inline``): fetch it, check its chart, write ``resolvedSource`` and
    ``Unpacked``."""

    ref: str


Action = (
    AddFinalizer | RemoveFinalizer | CreateBundle | DeleteBundle | Uninstall | Install | Resolve
)


@dataclass
class Plan:
    actions: list[Action] = field(default_factory=list)
    valid: Verdict | None = None
    """HasValidBundle; None while the BundleDeployment is being deleted or paused."""


def values_digest(bd: api.Obj) -> str:
    """A digest of ``spec.config``: any change of the values re-renders."""
    config = (bd.get("spec") or {}).get("config") or {}
    text = json.dumps(config, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def install_namespace(bd: api.Obj, default: str) -> str:
    return str((bd.get("spec") or {}).get("installNamespace") or default)


def active_bundle(bd: api.Obj) -> str:
    return str((bd.get("status") or {}).get("activeBundle") or "")


def plan(bd: api.Obj, observed: Observed, *, default_namespace: str) -> Plan:
    """What to do for ``bd``, created as v1alpha1, now (see the module doc; ``inline``
    plans those created as v1alpha2)."""
    meta = _meta(bd)
    if meta.get("deletionTimestamp"):
        if FINALIZER not in (meta.get("finalizers") or []):
            return Plan()
        policy: Literal["Delete", "Orphan"] = (
            "Orphan" if (bd.get("spec") or {}).get("deletionPolicy") == "Orphan" else "Delete"
        )
        actions: list[Action] = [Uninstall(policy)]
        actions += [DeleteBundle(name_of(b)) for b in observed.bundles]
        return Plan([*actions, RemoveFinalizer()])
    spec = bd.get("spec") or {}
    if spec.get("paused"):
        return Plan()
    out = Plan()
    if FINALIZER not in (meta.get("finalizers") or []):
        out.actions.append(AddFinalizer())
    template_spec = (spec.get("template") or {}).get("spec") or {}
    desired_bundle = api.desired_bundle(bd)
    wanted = name_of(desired_bundle)
    bundles = {name_of(b): b for b in observed.bundles}
    current = bundles.get(wanted)
    if template_spec.get("provisionerClassName") != CLASS:
        out.valid = (
            "False",
            "UnsupportedProvisionerClass",
            f"template provisionerClassName {template_spec.get('provisionerClassName')!r} is "
            f"not handled by {CLASS}; a helm BundleDeployment's Bundles are of class {CLASS}",
        )
    elif current is None:
        out.actions.append(CreateBundle(desired_bundle))
        out.valid = ("True", "UnpackPending", f"Waiting for the {wanted} Bundle to be unpacked")
    elif (current.get("status") or {}).get("phase") == "Failing":
        out.valid = (
            "False",
            "UnpackFailed",
            f"Failed to unpack the {wanted} Bundle: {_unpacked_message(current)}",
        )
    elif (pinned := pinned_ref(current)) is None:
        waiting = _unpacked_message(current)
        out.valid = (
            "True",
            "UnpackPending",
            f"Waiting for the {wanted} Bundle to be unpacked" + (f": {waiting}" if waiting else ""),
        )
    else:
        out.valid = ("True", "UnpackSuccessful", f"Successfully unpacked the {wanted} Bundle")
        desired = Desired(
            bundle=wanted,
            pinned=pinned,
            namespace=install_namespace(bd, default_namespace),
            values_digest=values_digest(bd),
        )
        last = observed.last
        if last is None or last.key != desired.key or not last.final:
            out.actions.append(Install(desired))
    active = active_bundle(bd)
    for name in sorted(bundles):
        if name not in (wanted, active):
            out.actions.append(DeleteBundle(name))
    return out


def _unpacked_message(bundle: api.Obj) -> str:
    for cond in (bundle.get("status") or {}).get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == UNPACKED:
            return str(cond.get("message") or "")
    return ""


def installed_verdict(bd: api.Obj, last: Outcome | None) -> Verdict:
    """``Installed``: what the last install in this process said, else what the status
    says already (a restarted provisioner re-installs and then knows), else pending."""
    if last is not None:
        return last.installed
    for cond in (bd.get("status") or {}).get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == INSTALLED:
            return (
                str(cond.get("status") or "Unknown"),
                str(cond.get("reason") or ""),
                str(cond.get("message") or ""),
            )
    return "False", "InstallPending", "no Bundle is installed yet"


def succeeded(bundle: str) -> Verdict:
    return "True", "InstallationSucceeded", f"Instantiated bundle {bundle} successfully"


def failed(bundle: str, why: str, *, kept: str) -> Verdict:
    keep = f"; {kept} stays installed" if kept and kept != bundle else ""
    return "False", "InstallFailed", f"Failed to install bundle {bundle}: {why}{keep}"


@dataclass(frozen=True)
class Event:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


def status(
    bd: api.Obj,
    verdicts: dict[str, Verdict],
    *,
    active: str,
    now: str,
    extra: api.Obj | None = None,
) -> tuple[api.Obj | None, list[Event]]:
    """The status to write (None when it would not change) and an event per transition.

    Conditions keep their ``lastTransitionTime`` while their status stays the same.
    ``extra`` holds more fields to write (``resolvedSource``); a None value removes one.
    """
    old_status = bd.get("status") or {}
    old = {c.get("type"): c for c in old_status.get("conditions") or [] if isinstance(c, dict)}
    generation = int(_meta(bd).get("generation") or 0)
    conditions = []
    events = []
    for kind, (state, reason, message) in verdicts.items():
        before = old.get(kind)
        changed = before is None or before.get("status") != state
        conditions.append(
            {
                "type": kind,
                "status": state,
                "reason": reason,
                "message": message,
                "lastTransitionTime": (
                    now if before is None or changed else before.get("lastTransitionTime", now)
                ),
                "observedGeneration": generation,
            }
        )
        if before is None or (before.get("status"), before.get("reason")) != (state, reason):
            level: Literal["Normal", "Warning"] = (
                "Warning" if reason in WARNING_REASONS else "Normal"
            )
            events.append(Event(level, reason, f"{kind}={state}: {message}"))
    new: api.Obj = {"observedGeneration": generation, "conditions": conditions}
    if active:
        new["activeBundle"] = active
    new.update(extra or {})
    if {k: v for k, v in new.items() if v is not None} == old_status:
        return None, []
    return new, events
