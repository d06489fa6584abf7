"""Run-to-completion instances: what the runs of a BundleDeployment say, pure.

Sits under ``plan``. Each run is a pod (``generate.instance_run_pod``) named
``rukpak-instance-<bd>-<revision>-<run>`` that installs once and exits. A
finished install leaves its record on the deployment's inventory ConfigMap
(``InstallRecord``: which pod, which Bundle, the ``engine.appliedrecord`` of the
fields it applied, the optional APIs it set aside), the one install record; the
record, not the pods, is what is installed, so pods can go once their run is
recorded. Runs are bounded across BundleDeployments (``Settings.max_concurrent_runs``):
a run that finds no free slot waits. This module reads that record and the pods;
the planner decides.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from provisioner.engine.apply import appliedrecord, inventory
from provisioner.engine.bundle import words
from provisioner.engine.objects import Obj, ObjectRef, meta_of
from provisioner.manager import conversion, model
from provisioner.manager.model import Settings
from provisioner.manager.planning import actions
from provisioner.manager.planning.generate import instance_run_pod

ACTIVE_PHASES = frozenset({"", "Pending", "Running"})
RUN_SLOT_WAIT = 30.0
"""How soon a run that found no free slot looks again at the latest: a finished run wakes
the oldest waiters at once (``manager.controller``), so waiting BundleDeployments cost no
reconcile every few seconds each."""
SLOT_WAIT_WHY = "waiting for a free run slot"
"""The ``Requeue.why`` of a run waiting for a slot (what the controller recognises)."""
RETRY_SECONDS = 15.0
"""A failed run is retried this long after it ended (at once when a CRD appears)."""

Verdict = tuple[str, str, str]
"""(status, reason, message) of one condition."""
Api = tuple[str, str, str]
"""(group, version, kind)."""


@dataclass(frozen=True)
class InstallRecord:
    """The last finished install, as its run recorded it on the inventory ConfigMap."""

    by: str
    """The run pod that wrote it."""
    bundle: str
    applied: appliedrecord.Record | None = None
    """None when absent or unreadable: drift is then not judged from it."""
    awaiting: frozenset[Api] = field(default_factory=frozenset)
    node: str = ""
    """The node the run ran on ("" from a run that did not say)."""

    def document(self) -> dict[str, Any]:
        """The record as the instance writes it (``inventory.record_configmap``)."""
        doc: dict[str, Any] = {
            "by": self.by,
            "bundle": self.bundle,
            "applied": appliedrecord.encode(self.applied or {}),
            "awaiting": [list(api) for api in sorted(self.awaiting)],
        }
        if self.node:
            doc["node"] = self.node
        return doc

    @classmethod
    def of_inventory(cls, cm: Obj | None) -> InstallRecord | None:
        """The record on an inventory ConfigMap; None when there is none (no install
        finished yet) or it is not one."""
        doc = inventory.record_of(cm)
        if doc is None:
            return None
        by, bundle = str(doc.get("by") or ""), str(doc.get("bundle") or "")
        if not by or not bundle:
            return None
        applied: appliedrecord.Record | None
        try:
            applied = appliedrecord.decode(str(doc.get("applied") or ""))
        except ValueError:
            applied = None
        awaiting = frozenset(
            (str(item[0]), str(item[1]), str(item[2]))
            for item in doc.get("awaiting") or []
            if isinstance(item, list) and len(item) == 3
        )
        node = doc.get("node")
        return cls(by, bundle, applied, awaiting, node if isinstance(node, str) else "")

    def run_of(self, bd_name: str) -> tuple[str, int] | None:
        """(revision, run) of the pod that wrote the record."""
        return model.parse_run_pod_name(bd_name, self.by)


@dataclass(frozen=True)
class Revert:
    """Going back to a kept install record without a run (``runwatch.revert_to``): what to
    apply and what to prune."""

    record: InstallRecord
    """The record of the revision to go back to (as its run wrote it)."""
    bodies: tuple[Obj, ...]
    """Apply bodies of our fields, one per object whose live version differs from the
    record's (from the health watch's good versions), in apply order."""
    prune: tuple[ObjectRef, ...]
    """What the install holds now and the record does not, in deletion order."""


def phase(pod: Obj) -> str:
    return str((pod.get("status") or {}).get("phase") or "")


def deleting(pod: Obj) -> bool:
    return bool(meta_of(pod).get("deletionTimestamp"))


def is_active(pod: Obj) -> bool:
    return phase(pod) in ACTIVE_PHASES and not deleting(pod)


def _terminated(pod: Obj) -> Obj:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        terminated: Obj = (cs.get("state") or {}).get("terminated") or {}
        if terminated:
            return terminated
    return {}


def termination_message(pod: Obj) -> str:
    """What the run pod's container left as its termination message ("" when none)."""
    return str(_terminated(pod).get("message") or "").strip()


def failure(pod: Obj) -> str:
    """Why a Failed run pod failed, from its termination message or status."""
    terminated = _terminated(pod)
    message = str(terminated.get("message") or "").strip()
    if not message:
        status = pod.get("status") or {}
        message = str(status.get("message") or terminated.get("reason") or "").strip()
    return message or "the run failed"


def ended_at(pod: Obj) -> str:
    """When the run pod's container ended ("" when unknown)."""
    return str(_terminated(pod).get("finishedAt") or "")


def waiting(pod: Obj) -> str:
    """What an active run pod waits for, in a few words."""
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        state = cs.get("state") or {}
        if "running" in state:
            return "is installing"
        message = (state.get("waiting") or {}).get("message")
        if message:
            return f"waits: {message}"
    return f"is {phase(pod) or 'Pending'}"


# -- the run-mode plan ---------------------------------------------------------------------


@dataclass(frozen=True)
class Target:
    """The Bundle the runs should install, and its pinned source."""

    bundle: str
    resolved: Obj
    prefer_nodes: tuple[str, ...] = ()
    """Nodes the run should go to when it can (a kept revision's: their caches hold it)."""


@dataclass(frozen=True)
class Decision:
    actions: list[actions.Action]
    installed: Verdict
    active: str
    """The Bundle installed now ("" when none is)."""


def decide(
    bd: Obj,
    target: Target | None,
    pods: tuple[Obj, ...],
    record: InstallRecord | None,
    drift: tuple[str, ...],
    *,
    settings: Settings,
    now: str,
    other_runs: int = 0,
) -> Decision:
    """What the runs of ``bd`` need: start one, wait, retry, or clean up; and ``Installed``.

    ``target`` is the Bundle to install (the wanted one once Unpacked, else the one the
    record names, so drift of the installed content is still corrected while a new
    Bundle fails to unpack). A run starts when the record is of another revision, or
    when ``drift`` says the recorded install no longer holds. Active runs of another
    revision are obsolete and stopped; finished runs go once recorded. A new run starts
    only while fewer than ``settings.max_concurrent_runs`` runs of other BundleDeployments
    (``other_runs``) are active.
    """
    name = model.name_of(bd)
    ns = settings.system_namespace
    out: list[actions.Action] = []
    installed_bundle = record.bundle if record is not None else ""
    if target is None:  # nothing to install: a run left over (an early one) goes
        stale: list[actions.Action] = [
            actions.DeletePod(ns, model.name_of(pod))
            for pod in pods
            if model.parse_run_pod_name(name, model.name_of(pod)) is not None and not deleting(pod)
        ]
        if record is None:
            return Decision(stale, ("False", "InstallPending", "no Bundle is active yet"), "")
        return Decision(stale, _installed(installed_bundle, record), installed_bundle)

    want = instance_run_pod(bd, target.bundle, target.resolved, settings, 0)
    revision = str(want["metadata"]["annotations"][model.SPEC_HASH_ANNOTATION])
    recorded = record.run_of(name) if record is not None else None
    current = recorded is not None and recorded[0] == revision
    number = recorded[1] + 1 if recorded is not None and current else 0
    if current and not drift:
        number = -1  # nothing to run

    keep = number if number >= 0 else None
    mine: dict[int, Obj] = {}
    for pod in pods:
        parsed = model.parse_run_pod_name(name, model.name_of(pod))
        same = parsed is not None and parsed[0] == revision
        if parsed is not None and same:
            mine[parsed[1]] = pod
            if keep is not None and parsed[1] >= keep:
                continue  # the run we want (or a newer one)
        if is_active(pod):
            if not same:
                out.append(actions.DeletePod(ns, model.name_of(pod)))  # an obsolete revision
        elif not deleting(pod):
            out.append(actions.DeletePod(ns, model.name_of(pod)))  # recorded or superseded

    verdict = _installed(installed_bundle, record) if installed_bundle == target.bundle else None
    if keep is None:
        return Decision(out, verdict or _installed(target.bundle, record), target.bundle)
    found = mine.get(keep)
    if found is None:
        if other_runs >= settings.max_concurrent_runs:
            out.append(actions.Requeue(RUN_SLOT_WAIT, SLOT_WAIT_WHY))
            pending = (  # no count in it: a message that changes is a status write
                f"waiting for a free run slot: --max-concurrent-runs "
                f"{settings.max_concurrent_runs} instance runs are active"
            )
            return Decision(out, verdict or ("False", "InstallPending", pending), installed_bundle)
        if not any(is_active(p) for p in pods):
            run = instance_run_pod(
                bd, target.bundle, target.resolved, settings, keep, prefer=target.prefer_nodes
            )
            out.append(actions.CreatePod(run))
        pending = f"waiting for the instance run of Bundle {target.bundle}"
        return Decision(out, verdict or ("False", "InstallPending", pending), installed_bundle)
    pod = found
    running = is_active(pod)
    pod_name = model.name_of(pod)
    if running:
        pending = f"instance pod {pod_name} {waiting(pod)}"
        return Decision(out, verdict or ("False", "InstallPending", pending), installed_bundle)
    if phase(pod) == "Failed":
        failed = words.install_failed(conversion.origin(bd), pod_name, failure(pod))
        since = model.seconds_between(ended_at(pod), now)
        if since is not None and since >= RETRY_SECONDS and not deleting(pod):
            out.append(actions.DeletePod(ns, pod_name))
        else:
            wait = RETRY_SECONDS - (since or 0.0)
            out.append(actions.Requeue(max(wait, 1.0), "retrying a failed instance run"))
        return Decision(out, failed, installed_bundle)
    # Succeeded (its record is not in the cache yet) or being deleted: look again soon
    out.append(actions.Requeue(1.0, f"waiting for the record of {pod_name}"))
    pending = f"instance pod {pod_name} is {phase(pod) or 'Pending'}"
    return Decision(out, verdict or ("False", "InstallPending", pending), installed_bundle)


def _installed(bundle: str, record: InstallRecord | None = None) -> Verdict:
    message = words.installation_succeeded(bundle)
    if record is not None and record.awaiting:
        apis = ", ".join(
            f"{'/'.join(api[:2]).lstrip('/')} {api[2]}" for api in sorted(record.awaiting)
        )
        message += (
            f"; optional objects skipped, their API is not served: {apis} "
            "(they are created when the API appears)"
        )
    return "True", words.INSTALLATION_SUCCEEDED, message
