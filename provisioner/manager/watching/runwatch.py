"""What the manager does about an install that no longer holds: restore, or run again.

Sits beside ``controller`` (which owns the informers and the queue) for
run-to-completion instances (``runs``). ``drift(name, record)`` judges a
BundleDeployment's recorded install against the health watch's caches of the
installed objects (``appliedrecord.drifted``: gone, relabelled, or a field we
apply taken by another writer) and confirms a suspicion with fresh reads of the
inventory ConfigMap (the record) and the suspected objects, so a cache that lags
behind the run that wrote the record never acts. A confirmed object whose good
version the health watch still holds (``last_good``: our fields as the record
hashed them) is restored by re-applying exactly those fields
(``engine.restore.ours``), no run needed; the fields another writer took and who
took them come along for the fight's message, and who changed what
(``authors``: ``field manager "kubectl-edit" changed spec.replicas of Deployment ns/web``)
for the ``Drifted`` condition. The BundleDeployment's ignore rules (``engine.ignore``)
hold here too: an object whose only change is to ignored fields has not drifted (nothing
restored, no run), judged from the caches before any read, and a restore body never takes
an ignored field back from the writer that owns it. Anything else needs a run. The CRD
handlers keep the set of (group,
version, kind) that established CRDs serve: a recorded install that set aside
optional objects of a now-served API has drifted too; a CRD that becomes
established also restarts failed instances (they may have waited for it).
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from dataclasses import dataclass, field

from provisioner.engine.apply import appliedrecord, ignore, inventory, ordering, restore
from provisioner.engine.apply.ownership import applied_fields
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import OWNER_LABEL, Obj, ObjectRef, meta_of, owner_of
from provisioner.instance import runrecord
from provisioner.manager import model
from provisioner.manager.planning import runs
from provisioner.manager.watching import healthwatch
from rukpak.common import errors

log = logging.getLogger("rukpak.manager")

CONFIRM_LIMIT = 200
"""Suspected drifted objects read afresh per reconcile (the rest wait for the next one)."""


@dataclass(frozen=True)
class Drift:
    """A recorded install that no longer holds: what to restore, what needs a run."""

    reasons: tuple[str, ...] = ()
    """Why a run is needed (objects with no good version kept, newly served APIs)."""
    restore: tuple[Obj, ...] = ()
    """Apply bodies of our fields, one per drifted object kept in a good version."""
    restored: tuple[str, ...] = ()
    """Why each of ``restore`` drifted, for the event."""
    taken: tuple[str, ...] = ()
    """``field of ref (by manager)`` for each field another writer owns now."""
    authors: tuple[str, ...] = ()
    """Per restored object, who changed what: ``field manager "m" changed a, b of ref``
    (``ref was deleted``, ``... relabelled`` when nobody is named)."""


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
    pods: runrecord.Runs
    """The run pods (and, in standing mode, the run ConfigMaps read as pods)."""
    wake: Callable[[str], None]
    """Queue a BundleDeployment by name."""
    as_instance: Callable[[str], Kube | None] = lambda _name: None
    """A BundleDeployment's name -> the client that reads its installed objects (as its
    instance's ServiceAccount); None (the default): ``kube`` itself."""
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
        for cm in self.health.inventories.items():
            record = runs.InstallRecord.of_inventory(cm)
            owner = str((meta_of(cm).get("labels") or {}).get(OWNER_LABEL) or "")
            if record is not None and owner and record.awaiting & served:
                self.wake(owner)

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

    def record(self, name: str) -> runs.InstallRecord | None:
        """The install record of ``name`` from the inventory cache."""
        cm = self.health.inventories.get(self.system_namespace, inventory.configmap_name(name))
        return runs.InstallRecord.of_inventory(cm)

    def drift(
        self,
        name: str,
        record: runs.InstallRecord,
        *,
        restorable: bool = True,
        rules: tuple[ignore.Rule, ...] = (),
    ) -> Drift:
        """Why the recorded install no longer holds, confirmed by fresh reads (the caches
        may lag behind the run that wrote the record), and what can be restored without a
        run (none when not ``restorable``); an empty ``Drift`` when it holds or is unknown.
        A change only to fields ``rules`` ignore is no drift."""
        served = self.served_apis()
        reasons = [f"{'/'.join(api)} is served now" for api in sorted(record.awaiting & served)]
        if record.applied is None:
            return Drift(tuple(reasons))
        suspects = appliedrecord.drifted(
            record.applied, name, lambda ref: self.health.lookup(ref, owner=name)
        )
        if suspects and rules:  # judged from the caches first: no read for such a change
            suspects = {
                key: why
                for key, why in suspects.items()
                if not self._only_ignored(key, record.applied.get(key, ""), name=name, rules=rules)
            }
        if not suspects:
            return Drift(tuple(reasons))
        cm_ref = ObjectRef(
            "", "v1", "ConfigMap", self.system_namespace, inventory.configmap_name(name)
        )
        fresh = runs.InstallRecord.of_inventory(self.kube.get(cm_ref))
        if fresh is None or fresh.applied is None or fresh.by != record.by:
            return Drift(tuple(reasons))  # a newer record is on its way: judge that one
        reader = self.as_instance(name) or self.kube
        bodies: list[Obj] = []
        restored: list[str] = []
        taken: list[str] = []
        authors: list[str] = []
        for key in sorted(suspects)[:CONFIRM_LIMIT]:
            ref = appliedrecord.ref_of(key)
            recorded = fresh.applied.get(key, "")
            live = reader.get(ref)
            why = appliedrecord.drift_of(recorded, live, name)
            if why is None:
                continue
            good = self.health.last_good(key, recorded, owner=name)
            if rules and ignore.only_ignored(
                applied_fields(good) if good else None, good, live=live, owner=name, rules=rules
            ):
                continue
            kept = good if restorable else None
            body = _restore_body(kept)
            if kept is None or body is None:
                reasons.append(f"{ref}: {why}")
                continue
            if rules and live is not None:
                body = ignore.shape(body, live, pointers=ignore.pointers_for(rules, live))
            bodies.append(body)
            restored.append(f"{ref}: {why}")
            fields = frozenset(restore.fields_of(applied_fields(kept)))
            writers = restore.others_owning(live, fields)
            taken += [f"{path} of {ref} (by {who})" for who, path in writers]
            authors += author_lines(ref, kept, live=live, why=why, writers=writers)
        if reasons or bodies:
            log.info("msg='drift' bd=%s run=%s restore=%s", name, reasons[:5], restored[:5])
        return Drift(tuple(reasons), tuple(bodies), tuple(restored), tuple(taken), tuple(authors))

    def _only_ignored(
        self, key: str, recorded: str, *, name: str, rules: tuple[ignore.Rule, ...]
    ) -> bool:
        cached = self.health.lookup(appliedrecord.ref_of(key), owner=name)
        if not isinstance(cached, dict):
            return False
        good = self.health.last_good(key, recorded, owner=name)
        fields = applied_fields(good) if good is not None else None
        return ignore.only_ignored(fields, good, live=cached, owner=name, rules=rules)


def author_lines(
    ref: ObjectRef,
    kept: Obj,
    *,
    live: Obj | None,
    why: str,
    writers: list[tuple[str, str]],
) -> list[str]:
    """Who changed what of ``ref``: one line per other field manager that owns fields we
    applied (only the fields we lost: ``kept``'s minus ``live``'s), else ``why``."""
    ours_then = frozenset(restore.fields_of(applied_fields(kept)))
    ours_now = frozenset(restore.fields_of(applied_fields(live) if live is not None else None))
    lost = ours_then - ours_now
    by: dict[str, list[str]] = {}
    for who, path in writers:
        if path in lost or not lost:
            by.setdefault(who, []).append(path)
    if not by:
        return [f"{ref} was {why}" if why in ("deleted",) else f"{ref}: {why}"]
    return [
        f'field manager "{who}" changed {", ".join(sorted(paths))} of {ref}'
        for who, paths in sorted(by.items())
    ]


SNAPSHOT_LIMIT = 500
"""Objects of one revision the manager keeps for a rollback without a run (more: a run)."""


@dataclass(frozen=True)
class Kept:
    """A revision's install record and what it installed, as the manager kept them."""

    record: runs.InstallRecord
    bodies: dict[str, Obj] | None
    """Object key -> our fields as the record's run left them; None when not kept."""


def snapshot(kube: Kube, name: str, record: runs.InstallRecord) -> Kept:
    """Keep our fields of every object ``record`` lists, read afresh (the run that wrote
    it has just finished): what a rollback to that revision re-applies without a run. The
    bodies are None when the record lists more than ``SNAPSHOT_LIMIT`` objects, or some
    object is gone, not ours, no longer as recorded, or cannot be projected."""
    if record.applied is None or len(record.applied) > SNAPSHOT_LIMIT:
        return Kept(record, None)
    bodies: dict[str, Obj] = {}
    for key, recorded in sorted(record.applied.items()):
        live = kube.get(appliedrecord.ref_of(key))
        body = _restore_body(live)
        if body is None or appliedrecord.drift_of(recorded, live, name) is not None:
            return Kept(record, None)
        bodies[key] = body
    return Kept(record, bodies)


def revert_to(
    health: healthwatch.HealthWatch, name: str, kept: Kept, installed: frozenset[ObjectRef]
) -> runs.Revert | None:
    """How BundleDeployment ``name`` goes back to a kept revision without a run: every
    object whose live version (the health watch's cache) differs from what was kept is
    re-applied, and ``installed`` (the inventory's refs now) minus the revision's objects
    is pruned. None when nothing was kept, a kind is not known yet, or a
    CustomResourceDefinition would change (a run checks that the existing custom resources
    still validate): then a run installs it."""
    if kept.bodies is None:
        return None
    bodies: list[tuple[int, Obj]] = []
    for key, body in sorted(kept.bodies.items()):
        ref = appliedrecord.ref_of(key)
        live = health.lookup(ref, owner=name)
        if isinstance(live, appliedrecord.Unknown):
            return None
        if live is not None and owner_of(live) == name and _restore_body(live) == body:
            continue
        if ref.kind == "CustomResourceDefinition":
            return None
        bodies.append((ordering.phase_index(ref), body))
    wanted = [appliedrecord.ref_of(key) for key in kept.bodies]
    prune = tuple(inventory.plan_prune(installed, wanted))
    ordered = tuple(body for _, body in sorted(bodies, key=lambda pair: pair[0]))
    return runs.Revert(kept.record, ordered, prune)


def _restore_body(kept: Obj | None) -> Obj | None:
    """The apply body that restores our fields from ``kept``; None when it cannot."""
    if kept is None:
        return None
    try:
        return restore.ours(kept, applied_fields(kept))
    except restore.Unprojectable as err:
        log.info("msg='cannot restore from the last good version' error=%r", str(err))
        return None
