"""BundleDeployments, Bundles and readers of planned actions for the manager's planner.

Where it sits: the pure planner's tests (``test_manager_plan``) and the run-history tests
(``test_manager_runs``) build their observed state from these and read the planner's
actions with ``kinds`` and ``cond``; the v1alpha2 planner's tests (``test_manager_inline``,
``test_manager_revisions``, ``test_manager_preview``) build their objects with ``bd_v2``,
and the ones that walk a BundleDeployment through its plans as the manager would
(``test_manager_revisions``, ``test_dependency_order_unit``) use ``step`` and ``installed``.
"""

from __future__ import annotations

from typing import Any

from provisioner.engine.health.health import Health
from provisioner.engine.objects import Obj
from provisioner.manager import model
from provisioner.manager.planning import generate as build
from provisioner.manager.planning import inline, plan, revisions, runs, sources
from rukpak.oci.auth import Credentials

DIGEST = "registry.example/hello@sha256:" + "a" * 64


def bd_v2(
    *,
    generation: int = 1,
    pin: tuple[int, str] | None = None,
    digest: str = DIGEST,
    status: Obj | None = None,
    **spec: Any,
) -> Obj:
    """A v1alpha2 BundleDeployment ``hello`` (claimed), of an image tag into ``apps``; with
    ``pin`` (generation, time) its source pinned to ``digest``. ``spec`` values of None
    remove a default."""
    body: Obj = {
        "installNamespace": "apps",
        "provisionerClassName": model.PLAIN_CLASS,
        "source": {"type": "image", "image": {"ref": "registry.example/hello:v1"}},
        **spec,
    }
    obj: Obj = {
        "apiVersion": model.API_VERSION_V2,
        "kind": model.BUNDLE_DEPLOYMENT,
        "metadata": {
            "name": "hello",
            "uid": "u-1",
            "generation": generation,
            "finalizers": [model.FINALIZER],
        },
        "spec": {k: v for k, v in body.items() if v is not None},
    }
    if status is not None:
        obj["status"] = dict(status)
    if pin is not None:
        obj["metadata"]["annotations"] = {
            inline.PIN_ANNOTATION: inline.pin_annotation(pin[0], pin[1])
        }
        obj["status"] = {**(status or {}), "resolvedSource": sources.pinned_image(digest)}
    return obj


def bd(**spec: Any) -> Obj:
    base: Obj = {
        "apiVersion": model.API_VERSION,
        "kind": model.BUNDLE_DEPLOYMENT,
        "metadata": {
            "name": "hello",
            "uid": "uid-1",
            "generation": 1,
            "finalizers": [model.FINALIZER],
        },
        "spec": {
            "provisionerClassName": model.PLAIN_CLASS,
            "template": {
                "metadata": {"labels": {"app": "hello"}},
                "spec": {
                    "provisionerClassName": model.PLAIN_CLASS,
                    "source": {"type": "image", "image": {"ref": "registry.example/hello:v1"}},
                },
            },
        },
    }
    base["spec"].update(spec)
    return base


def bundle(of: Obj, *, resolved: str = "", failing: str = "", phase: str = "Unpacked") -> Obj:
    b = build.desired_bundle(of)
    if resolved:
        b["status"] = {
            "phase": phase,
            "resolvedSource": {"type": "image", "image": {"ref": resolved}},
        }
    if failing:
        b["status"] = {
            "phase": "Failing",
            "conditions": [{"type": "Unpacked", "status": "False", "message": failing}],
        }
    return b


def kinds(actions: list[plan.Action]) -> list[str]:
    return [type(a).__name__ for a in actions if not isinstance(a, plan.RecordEvent)]


def status_of(actions: list[plan.Action]) -> Obj:
    (written,) = [a for a in actions if isinstance(a, plan.WriteStatus)]
    return written.status


def cond(actions: list[plan.Action], kind: str) -> tuple[str, str]:
    c = next(c for c in status_of(actions)["conditions"] if c["type"] == kind)
    return c["status"], c["reason"]


B = bd()


def as_is(ref: str, /, *, credentials: Credentials | None = None) -> str:
    """An image resolver that pins nothing (for tests whose sources need no registry)."""
    return ref


# -- walking the v1alpha2 planner (inline) as the manager would ------------------------------

INLINE_SETTINGS = model.Settings(
    image="registry.example/rukpak:1", system_namespace="rukpak-system"
)
T0 = "2026-11-25T12:00:00Z"
D1 = "registry.example/hello@sha256:" + "1" * 64
D2 = "registry.example/hello@sha256:" + "2" * 64


def step(the_bd: Obj, observed: plan.Observed) -> tuple[list[plan.Action], Obj]:
    """One plan, and ``the_bd`` with the status (and rollback annotation) it wrote."""
    actions = inline.plan_inline(the_bd, observed, settings=INLINE_SETTINGS)
    out = {**the_bd, "status": dict(the_bd.get("status") or {})}
    for action in actions:
        if isinstance(action, plan.WriteStatus):
            out["status"].update(action.status)
        if isinstance(action, plan.SetRollback):
            value = revisions.rollback_annotation(action.revision, action.generation, action.reason)
            meta = dict(out["metadata"])
            meta["annotations"] = {**meta["annotations"], revisions.ROLLBACK_ANNOTATION: value}
            out["metadata"] = meta
    return actions, out


def record_of(actions: list[plan.Action]) -> runs.InstallRecord:
    """The install record the run ``actions`` start leaves, of two objects."""
    run = next(a.pod for a in actions if isinstance(a, plan.CreatePod))
    return runs.InstallRecord(
        by=model.name_of(run),
        bundle=run["metadata"]["annotations"][model.BUNDLE_ANNOTATION],
        applied={"a": "x", "b": "y"},
    )


def installed(the_bd: Obj, now: str = T0) -> tuple[Obj, runs.InstallRecord]:
    """Plan until the run starts, then report its record, healthy: the BD as the manager
    leaves it, and the record."""
    actions, the_bd = step(the_bd, plan.Observed(now=now))
    record = record_of(actions)
    _, the_bd = step(the_bd, plan.Observed(record=record, health=Health(True), now=now))
    return the_bd, record
