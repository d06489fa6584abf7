"""What tells the manager to run an instance again: drift and newly served APIs.

Sits beside ``controller`` (which owns the informers and the queue) for
run-to-completion instances (``runs``). ``drift(name, record)`` judges a
BundleDeployment's recorded install against the health watch's caches of the
installed objects (``appliedrecord.drifted``: gone, relabelled, or a field we
apply taken by another writer) and confirms a suspicion with fresh reads of the
Lease and the suspected objects, so a cache that lags behind the run that wrote
the record never starts a run. The CRD handlers keep the set of (group,
version, kind) that established CRDs serve: a recorded install that set aside
optional objects of a now-served API has drifted too; a CRD that becomes
established also restarts failed instances (they may have waited for it).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from provisioner.engine import appliedrecord, listwatch
from provisioner.engine.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef
from provisioner.manager import healthwatch, model, runs
from provisioner.runtime import lease
from rukpak.common import errors

log = logging.getLogger("rukpak.manager")

CONFIRM_LIMIT = 20
"""Suspected drifted objects read afresh per reconcile (one is enough to start a run)."""


def served_by(crd: Obj) -> frozenset[runs.Api]:
    """(group, version, kind) a CRD serves once Established; empty before."""
    status = crd.get("status") or {}
    if not any(
        c.get("type") == "Established" and c.get("status") == "True"
        for c in status.get("conditions") or []
        if isinstance(c, dict)
    ):
        return frozenset()
    spec = crd.get("spec") or {}
    group = str(spec.get("group") or "")
    kind = str((spec.get("names") or {}).get("kind") or "")
    return frozenset(
        (group, str(v.get("name") or ""), kind)
        for v in spec.get("versions") or []
        if isinstance(v, dict) and v.get("served") is not False
    )


@dataclass(eq=False)
class RunWatch:
    kube: Kube
    system_namespace: str
    health: healthwatch.HealthWatch
    leases: listwatch.Informer
    pods: listwatch.Informer
    wake: Callable[[str], None]
    """Queue a BundleDeployment by name."""
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False)
    _apis: dict[str, frozenset[runs.Api]] = field(default_factory=dict, init=False)

    # -- CRDs ------------------------------------------------------------------------------

    def served_apis(self) -> frozenset[runs.Api]:
        with self._lock:
            return frozenset(api for apis in self._apis.values() for api in apis)

    def crds_listed(self, items: list[Obj], _rv: str) -> None:
        with self._lock:
            self._apis = {model.name_of(crd): served_by(crd) for crd in items}
        self._wake_awaiting()

    def crd_event(self, type_: str, obj: Obj) -> None:
        name = model.name_of(obj)
        with self._lock:
            if type_ == "DELETED":
                self._apis.pop(name, None)
                return
            apis = served_by(obj)
            new = bool(apis) and not self._apis.get(name)
            self._apis[name] = apis
        if not new:
            return
        self._wake_awaiting()
        for pod in self.pods.items():  # instances that failed may have waited for this CRD
            if runs.phase(pod) == "Failed" and not runs.deleting(pod):
                self._restart(pod)
                continue
            for cs in (pod.get("status") or {}).get("containerStatuses") or []:
                waiting = (cs.get("state") or {}).get("waiting") or {}
                if waiting.get("reason") == "CrashLoopBackOff":
                    self._restart(pod)
                    break

    def _wake_awaiting(self) -> None:
        """Queue every BD whose last install set aside an optional object whose API a CRD
        now serves (its next run creates the object)."""
        served = self.served_apis()
        prefix = lease.lease_name("")
        for obj in self.leases.items():
            record = runs.InstallRecord.of_lease(obj)
            if record is not None and record.awaiting & served:
                self.wake(model.name_of(obj)[len(prefix) :])

    def _restart(self, pod: Obj) -> None:
        meta = pod.get("metadata") or {}
        log.info("msg='new CRD: restarting a failed instance' pod=%s", meta.get("name"))
        try:
            self.kube.delete(
                ObjectRef("", "v1", "Pod", str(meta.get("namespace")), str(meta.get("name")))
            )
        except errors.RukpakError as err:
            log.warning("msg='cannot restart instance pod' error=%r", err.message)

    # -- drift -----------------------------------------------------------------------------

    def drift(self, name: str, record: runs.InstallRecord) -> tuple[str, ...]:
        """Why the recorded install no longer holds, confirmed by fresh reads (the caches
        may lag behind the run that wrote the record); () when it holds or is unknown."""
        served = self.served_apis()
        reasons = [f"{'/'.join(api)} is served now" for api in sorted(record.awaiting & served)]
        if record.applied is None:
            return tuple(reasons)
        suspects = appliedrecord.drifted(record.applied, name, self.health.lookup)
        if not suspects:
            return tuple(reasons)
        lease_ref = ObjectRef(
            "coordination.k8s.io", "v1", "Lease", self.system_namespace, lease.lease_name(name)
        )
        fresh = runs.InstallRecord.of_lease(self.kube.get(lease_ref))
        if fresh is None or fresh.applied is None or fresh.by != record.by:
            return tuple(reasons)  # a newer record is on its way: judge that one
        for key in sorted(suspects)[:CONFIRM_LIMIT]:
            live = self.kube.get(appliedrecord.ref_of(key))
            why = appliedrecord.drift_of(fresh.applied.get(key, ""), live, name)
            if why is not None:
                reasons.append(f"{appliedrecord.ref_of(key)}: {why}")
        if reasons:
            log.info("msg='drift' bd=%s reasons=%s", name, reasons[:5])
        return tuple(reasons)
