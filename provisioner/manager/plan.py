"""The BundleDeployment planner: ``plan(bd, observed) -> actions``, pure.

Sits between the controller (which observes: the BD, the Bundles it owns,
its instance Deployment and pods, the instance Lease's holder, the health of
what its inventory lists) and ``actuate`` (which performs the actions). It
never talks to the API and never reads the clock: ``Observed.now`` is the
time to stamp on condition transitions.

BDs of our provisioner classes (``model.CLASS_FORMATS``: plain+v0, registry+v1)
are planned; the template's class picks the format the instance loads (upstream
pairs a ``core-rukpak-io-plain`` BD with ``core-rukpak-io-registry`` Bundles, or
uses the registry class for both; either works here). The flow for a live BD
(DESIGN.md "Manager"):

1. add the uninstall finalizer;
2. generate the Bundle ``<bd>-<hash of template.spec>`` (a template change
   is a new name: the pivot);
3. wait for the Bundle controller (``bundleplan``) to resolve and unpack it:
   ``HasValidBundle`` follows its ``Unpacked`` condition in upstream's words
   (UnpackPending, UnpackFailed with the unpack message, UnpackSuccessful);
4. point the instance Deployment at the Unpacked Bundle. Until then the
   instance keeps running the previous Bundle, so the cluster stays as it was;
5. delete owned Bundles that are neither wanted, deployed nor active:
   ``status.activeBundle`` names a Bundle only once it is installed (its
   instance pod runs and holds the Lease), so the old Bundle goes once the
   new one is installed;
6. write the status (``activeBundle``, conditions ``HasValidBundle``,
   ``Installed``, ``Healthy``) when it changed, with an event per transition.

``spec.paused`` plans nothing. Deletion (a ``deletionTimestamp`` with our
finalizer) stops the instance first (so it cannot re-apply), waits for its
pods to go, uninstalls with the BD's ``deletionPolicy``, deletes the
Bundles, then removes the finalizer; deletion runs even when paused, or the
BD could never go away.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from provisioner.engine.health import Health as Health
from provisioner.engine.objects import Obj
from provisioner.manager import model, runs, sources
from provisioner.manager.actions import Action as Action
from provisioner.manager.actions import AddFinalizer as AddFinalizer
from provisioner.manager.actions import ApplyInstance as ApplyInstance
from provisioner.manager.actions import CreateBundle as CreateBundle
from provisioner.manager.actions import CreateRun as CreateRun
from provisioner.manager.actions import DeleteBundle as DeleteBundle
from provisioner.manager.actions import DeleteInstance as DeleteInstance
from provisioner.manager.actions import DeleteLease as DeleteLease
from provisioner.manager.actions import DeletePod as DeletePod
from provisioner.manager.actions import RecordEvent as RecordEvent
from provisioner.manager.actions import RemoveFinalizer as RemoveFinalizer
from provisioner.manager.actions import Requeue as Requeue
from provisioner.manager.actions import Uninstall as Uninstall
from provisioner.manager.actions import WriteStatus as WriteStatus
from provisioner.manager.generate import desired_bundle, instance_deployment
from provisioner.manager.model import Settings

HAS_VALID_BUNDLE = "HasValidBundle"
INSTALLED = "Installed"
HEALTHY = "Healthy"
WARNING_REASONS = frozenset(
    {
        "UnsupportedSource",
        "UnsupportedProvisionerClass",
        "ResolveFailed",
        "UnpackFailed",
        "InstallFailed",
        "Unhealthy",
    }
)
POLL_SECONDS = 2.0


# -- what was observed -------------------------------------------------------------------


@dataclass(frozen=True)
class Observed:
    bundles: tuple[Obj, ...] = ()
    """Bundles labelled with the BD's name."""
    instance: Obj | None = None
    """The instance Deployment."""
    pods: tuple[Obj, ...] = ()
    """The instance Deployment's pods."""
    lease_holder: str = ""
    """Who holds the instance Lease ("" when nobody)."""
    installed_by: str = ""
    """Which holder marked the instance Lease as installed ("" when none did)."""
    record: runs.InstallRecord | None = None
    """Run mode: the last finished install, from the instance Lease."""
    drift: tuple[str, ...] = ()
    """Run mode: why the recorded install no longer holds (drifted objects, optional APIs
    that became served), confirmed by a fresh read; empty when it holds."""
    health: Health | None = None
    """Of the objects the inventory lists, as one ``Health``: ``ready`` when all are, else
    the ``reason`` names some that are not. None when nothing is installed (no inventory)
    or health was not read."""
    now: str = "1970-01-01T00:00:00Z"


def _meta(obj: Obj) -> dict[str, Any]:
    meta: dict[str, Any] = obj.get("metadata") or {}
    return meta


# -- judging what was observed -----------------------------------------------------------


def _annotation(obj: Obj | None, key: str) -> str:
    if obj is None:
        return ""
    return str((_meta(obj).get("annotations") or {}).get(key) or "")


def _pod_annotation(pod: Obj) -> str:
    return _annotation(pod, model.BUNDLE_ANNOTATION)


def _unpacked_message(bundle: Obj) -> str:
    for cond in (bundle.get("status") or {}).get("conditions") or []:
        if cond.get("type") == "Unpacked":
            return str(cond.get("message") or "")
    return ""


def _failure(bundle: Obj) -> str | None:
    status = bundle.get("status") or {}
    if status.get("phase") != "Failing":
        return None
    for cond in status.get("conditions") or []:
        if cond.get("status") == "False" and cond.get("message"):
            return str(cond["message"])
    return "the Bundle failed"


Verdict = tuple[str, str, str]
"""(status, reason, message) of one condition."""


def installed(observed: Observed, active: str) -> Verdict:
    """Installed: the active Bundle's instance pod runs, holds the instance Lease and marked
    it as installed (its apply finished)."""
    if not active:
        return "False", "InstallPending", "no Bundle is active yet"
    pods = [
        p
        for p in observed.pods
        if _pod_annotation(p) == active and not _meta(p).get("deletionTimestamp")
    ]
    if not pods:
        return "False", "InstallPending", f"waiting for the instance pod of Bundle {active}"
    for pod in pods:
        name = model.name_of(pod)
        statuses = (pod.get("status") or {}).get("containerStatuses") or []
        for cs in statuses:
            state = cs.get("state") or {}
            for terminated in (
                state.get("terminated"),
                (cs.get("lastState") or {}).get("terminated"),
            ):
                if (
                    terminated
                    and int(terminated.get("exitCode") or 0) != 0
                    and "running" not in state
                ):
                    message = str(terminated.get("message") or terminated.get("reason") or "")
                    return (
                        "False",
                        "InstallFailed",
                        f"instance pod {name} failed: {message.strip()}",
                    )
            if "running" in state and observed.lease_holder == observed.installed_by == name:
                return "True", "InstallationSucceeded", f"Instantiated bundle {active} successfully"
            waiting = state.get("waiting") or {}
            if waiting.get("message"):
                return "False", "InstallPending", f"instance pod {name}: {waiting['message']}"
    phase = (pods[0].get("status") or {}).get("phase") or "Pending"
    return "False", "InstallPending", f"instance pod {model.name_of(pods[0])} is {phase}"


def healthy(observed: Observed, installed_status: str) -> Verdict:
    if observed.health is None or installed_status != "True":
        return "Unknown", "NotInstalled", "health is known once the bundle is installed"
    if observed.health.ready:
        return "True", "Healthy", observed.health.reason or "every installed object is healthy"
    return "False", "Unhealthy", observed.health.reason


# -- status ------------------------------------------------------------------------------


def _condition(kind: str, verdict: Verdict, old: Obj | None, now: str, generation: int) -> Obj:
    status, reason, message = verdict
    changed = old is None or old.get("status") != status
    return {
        "type": kind,
        "status": status,
        "reason": reason,
        "message": message,
        "lastTransitionTime": now if changed or old is None else old.get("lastTransitionTime", now),
        "observedGeneration": generation,
    }


def _status(
    bd: Obj, active: str, verdicts: dict[str, Verdict], now: str
) -> tuple[Obj, list[Action]]:
    old_status = bd.get("status") or {}
    old = {c.get("type"): c for c in old_status.get("conditions") or [] if isinstance(c, dict)}
    generation = int(_meta(bd).get("generation") or 0)
    conditions = [
        _condition(kind, verdict, old.get(kind), now, generation)
        for kind, verdict in verdicts.items()
    ]
    status: Obj = {"observedGeneration": generation, "conditions": conditions}
    if active:
        status["activeBundle"] = active
    events: list[Action] = []
    for cond in conditions:
        before = old.get(cond["type"])
        keys = (
            ("status", "reason", "message")
            if cond["type"] == INSTALLED and cond["status"] == "True"
            else ("status", "reason")
        )
        # (a finished install's message says what it set aside: a change of it is news too)
        if before is None or any(before.get(k) != cond[k] for k in keys):
            kind: Literal["Normal", "Warning"] = (
                "Warning" if cond["reason"] in WARNING_REASONS else "Normal"
            )
            events.append(
                RecordEvent(
                    kind, cond["reason"], f"{cond['type']}={cond['status']}: {cond['message']}"
                )
            )
    if status == old_status:
        return status, []
    return status, [WriteStatus(status), *events]


# -- the planner -------------------------------------------------------------------------


def plan(bd: Obj, observed: Observed, *, settings: Settings) -> list[Action]:
    """Everything to do, in order, to move ``bd`` towards its spec (see the module doc)."""
    meta = _meta(bd)
    spec = bd.get("spec") or {}
    claimed = model.FINALIZER in (meta.get("finalizers") or [])
    if model.bundle_format(spec.get("provisionerClassName")) is None and not claimed:
        return []  # another provisioner's BundleDeployment: upstream filters by class
    if meta.get("deletionTimestamp"):
        return _plan_deletion(bd, observed)
    if spec.get("paused"):
        return []
    actions: list[Action] = []
    if not claimed:
        actions.append(AddFinalizer())

    bundles = {model.name_of(b): b for b in observed.bundles}
    wanted = model.bundle_name(bd)
    template_spec = (spec.get("template") or {}).get("spec") or {}
    source = template_spec.get("source") or {}
    bundle_class = template_spec.get("provisionerClassName") or spec.get("provisionerClassName")
    current = bundles.get(wanted)
    valid: Verdict
    target: runs.Target | None = None
    ours = " or ".join(sorted(model.CLASS_FORMATS))
    if model.bundle_format(spec.get("provisionerClassName")) is None:
        valid = (
            "False",
            "UnsupportedProvisionerClass",
            f"provisionerClassName {spec.get('provisionerClassName')!r} is not handled here; "
            f"use {ours}",
        )
    elif model.bundle_format(bundle_class) is None:
        valid = (
            "False",
            "UnsupportedProvisionerClass",
            f"template provisionerClassName {bundle_class!r} is not handled here (its Bundle "
            f"would never be unpacked); use {ours}",
        )
    elif (unsupported := sources.unsupported(source)) is not None:
        valid = ("False", "UnsupportedSource", unsupported)
    elif current is None:
        actions.append(CreateBundle(desired_bundle(bd)))
        valid = ("True", "UnpackPending", f"Waiting for the {wanted} Bundle to be unpacked")
    elif (failure := _failure(current)) is not None:
        valid = ("False", "UnpackFailed", f"Failed to unpack the {wanted} Bundle: {failure}")
    elif (current.get("status") or {}).get("phase") != "Unpacked" or not (
        resolved := sources.pinned(current)
    ):
        waiting = _unpacked_message(current)
        valid = (
            "True",
            "UnpackPending",
            f"Waiting for the {wanted} Bundle to be unpacked" + (f": {waiting}" if waiting else ""),
        )
    else:
        valid = ("True", "UnpackSuccessful", f"Successfully unpacked the {wanted} Bundle")
        target = runs.Target(wanted, resolved)
        if settings.instance_mode == model.DEPLOYMENT_MODE:  # run mode: ``runs`` makes pods
            want = instance_deployment(bd, wanted, resolved, settings)
            hash_of = model.SPEC_HASH_ANNOTATION
            if _annotation(observed.instance, hash_of) != _annotation(want, hash_of):
                actions.append(ApplyInstance(want))

    previous = str((bd.get("status") or {}).get("activeBundle") or "")
    if settings.instance_mode == model.RUN_MODE:
        if target is None and observed.record is not None:
            # the wanted Bundle is not ready: keep the installed one applied
            old = bundles.get(observed.record.bundle)
            pinned = sources.pinned(old) if old is not None else None
            if pinned is not None:
                target = runs.Target(observed.record.bundle, pinned)
        decision = runs.decide(
            bd,
            target,
            observed.pods,
            observed.record,
            observed.drift,
            settings=settings,
            now=observed.now,
        )
        actions += decision.actions
        deployed = target.bundle if target is not None else ""
        installed_verdict = decision.installed
        active = decision.active or previous
    else:
        deployed = _annotation(observed.instance, model.BUNDLE_ANNOTATION)
        installed_verdict = installed(observed, deployed)
        active = deployed if installed_verdict[0] == "True" else previous
    for name in sorted(bundles):
        if name not in (wanted, deployed, active):
            actions.append(DeleteBundle(name))

    verdicts = {
        HAS_VALID_BUNDLE: valid,
        INSTALLED: installed_verdict,
        HEALTHY: healthy(observed, installed_verdict[0]),
    }
    _, status_actions = _status(bd, active, verdicts, observed.now)
    return actions + status_actions


def _plan_deletion(bd: Obj, observed: Observed) -> list[Action]:
    if model.FINALIZER not in (_meta(bd).get("finalizers") or []):
        return []
    if observed.instance is not None:
        inst = _meta(observed.instance)
        return [
            RecordEvent("Normal", "Uninstalling", "stopping the instance before uninstalling"),
            DeleteInstance(str(inst.get("namespace") or ""), str(inst.get("name") or "")),
            Requeue(POLL_SECONDS, "waiting for the instance to stop"),
        ]
    if observed.pods:
        doomed = [p for p in observed.pods if not _meta(p).get("deletionTimestamp")]
        stop: list[Action] = [
            DeletePod(str(_meta(p).get("namespace") or ""), model.name_of(p)) for p in doomed
        ]
        return [*stop, Requeue(POLL_SECONDS, "waiting for the instance pods to stop")]
    policy: Literal["Delete", "Orphan"] = (
        "Orphan" if (bd.get("spec") or {}).get("deletionPolicy") == "Orphan" else "Delete"
    )
    actions: list[Action] = [Uninstall(policy), DeleteLease()]
    actions += [DeleteBundle(model.name_of(b)) for b in observed.bundles]
    actions.append(RemoveFinalizer())
    return actions


@dataclass
class Summary:
    """For logs: how many actions of each kind a plan holds."""

    counts: dict[str, int] = field(default_factory=dict)

    @classmethod
    def of(cls, actions: list[Action]) -> Summary:
        out: dict[str, int] = {}
        for action in actions:
            out[type(action).__name__] = out.get(type(action).__name__, 0) + 1
        return cls(out)
