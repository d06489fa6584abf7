"""Readiness per kind, as pure functions on live object dicts.

Used after apply (the BundleDeployment's ``Healthy`` condition, ``rukpak
status``): each rule says whether one object is ready and, when it is not, a
reason a person can act on. Kinds without a rule are healthy once present.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from provisioner.engine.objects import Obj, ObjectRef, condition, meta_of


@dataclass(frozen=True)
class Health:
    ready: bool
    reason: str = ""


READY = Health(True)


def _generation_seen(obj: Obj) -> Health | None:
    meta_gen = meta_of(obj).get("generation")
    seen = (obj.get("status") or {}).get("observedGeneration")
    if meta_gen is not None and (seen is None or seen < meta_gen):
        return Health(False, f"controller has not observed generation {meta_gen} yet")
    return None


def _condition_true(obj: Obj, kind: str) -> Health:
    cond = condition(obj, kind)
    if cond is None:
        return Health(False, f"no {kind} condition yet")
    if cond.get("status") != "True":
        why = cond.get("message") or cond.get("reason") or "no reason given"
        return Health(False, f"{kind} is {cond.get('status')}: {why}")
    return READY


def deployment(obj: Obj) -> Health:
    if (h := _generation_seen(obj)) is not None:
        return h
    progressing = condition(obj, "Progressing")
    if progressing and progressing.get("reason") == "ProgressDeadlineExceeded":
        return Health(False, f"rollout stalled: {progressing.get('message', '')}".rstrip(": "))
    status = obj.get("status") or {}
    want = (obj.get("spec") or {}).get("replicas", 1)
    updated = status.get("updatedReplicas", 0)
    if updated < want:
        return Health(False, f"{updated} of {want} replicas updated")
    if status.get("replicas", 0) > updated:
        old = status.get("replicas", 0) - updated
        return Health(False, f"{old} old replicas pending termination")
    return _condition_true(obj, "Available")


def statefulset(obj: Obj) -> Health:
    if (h := _generation_seen(obj)) is not None:
        return h
    spec = obj.get("spec") or {}
    status = obj.get("status") or {}
    want = spec.get("replicas", 1)
    ready = status.get("readyReplicas", 0)
    if ready < want:
        return Health(False, f"{ready} of {want} replicas ready")
    strategy = (spec.get("updateStrategy") or {}).get("type", "RollingUpdate")
    if strategy == "RollingUpdate":
        if status.get("updatedReplicas", 0) < want:
            return Health(False, f"{status.get('updatedReplicas', 0)} of {want} replicas updated")
        if status.get("currentRevision") != status.get("updateRevision"):
            return Health(False, f"rolling out revision {status.get('updateRevision')}")
    return READY


def daemonset(obj: Obj) -> Health:
    if (h := _generation_seen(obj)) is not None:
        return h
    status = obj.get("status") or {}
    want = status.get("desiredNumberScheduled", 0)
    updated = status.get("updatedNumberScheduled", 0)
    available = status.get("numberAvailable", 0)
    if updated < want:
        return Health(False, f"{updated} of {want} nodes updated")
    if available < want:
        return Health(False, f"{available} of {want} nodes available")
    return READY


def crd(obj: Obj) -> Health:
    names = condition(obj, "NamesAccepted")
    if names is not None and names.get("status") == "False":
        return Health(False, f"names not accepted: {names.get('message', '')}")
    return _condition_true(obj, "Established")


def job(obj: Obj) -> Health:
    failed = condition(obj, "Failed")
    if failed is not None and failed.get("status") == "True":
        return Health(False, f"job failed: {failed.get('message') or failed.get('reason')}")
    return _condition_true(obj, "Complete")


def apiservice(obj: Obj) -> Health:
    return _condition_true(obj, "Available")


def pod(obj: Obj) -> Health:
    phase = (obj.get("status") or {}).get("phase")
    if phase == "Succeeded":
        return READY
    if phase == "Failed":
        return Health(False, "pod failed")
    return _condition_true(obj, "Ready")


RULES: dict[tuple[str, str], Callable[[Obj], Health]] = {
    ("apps", "Deployment"): deployment,
    ("apps", "StatefulSet"): statefulset,
    ("apps", "DaemonSet"): daemonset,
    ("apiextensions.k8s.io", "CustomResourceDefinition"): crd,
    ("batch", "Job"): job,
    ("apiregistration.k8s.io", "APIService"): apiservice,
    ("", "Pod"): pod,
}


def assess(obj: Obj | None) -> Health:
    """Health of one live object; ``None`` (not found) is unhealthy."""
    if obj is None:
        return Health(False, "not found")
    ref = ObjectRef.of(obj)
    rule = RULES.get((ref.group, ref.kind))
    return rule(obj) if rule else READY


def unhealthy(objs: Iterable[tuple[ObjectRef, Obj | None]]) -> list[tuple[ObjectRef, str]]:
    """The refs that are not ready, each with its reason."""
    out: list[tuple[ObjectRef, str]] = []
    for ref, obj in objs:
        h = assess(obj)
        if not h.ready:
            out.append((ref, h.reason))
    return out
