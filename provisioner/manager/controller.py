"""The manager's controller loop: informers, one work queue, observe, plan, perform.

Sits at the top of the manager. Informers (``engine.listwatch.Informer``: list
once, then watch) keep a local cache of everything the manager reads:
BundleDeployments, Bundles, and in the system namespace the instance run
pods, the unpack pods and the Events (for an unpack pod's FailedMount
messages); ``healthwatch`` the inventory ConfigMaps (with the install records)
and the installed objects; ``nodewatch`` the Nodes that answer pre-stage asks
(an answer wakes the BundleDeployment whose pivot it holds). At rest the manager
makes watch requests only; a reconcile reads the caches, asks a pure planner what
to do (``plan`` for a BundleDeployment, ``bundleplan`` for a Bundle) and hands the actions to
``actuate``, the only writer.

Cache events only decide *which* object to look at: a BundleDeployment
(``bd:NAME``) or a Bundle (``bundle:NAME``) is queued when it, or something it
owns, changes; ``healthwatch`` follows the inventories and the objects they
list (by the owner label), so ``Healthy`` changes with them, from the caches.
A periodic resync re-queues every BundleDeployment (cache reads only).
``workers`` drain the queue (the frame, ``workers.Reconciler``, is shared with the
PV provisioner); failures requeue with exponential backoff. ``runwatch`` judges
drift of run-to-completion installs from the same caches; what it can restore
from a last good version is re-applied at once (``RestoreDrift``), through a
per-BundleDeployment ``engine.restore.Damper`` so a writer that keeps taking our
fields back meets exponential backoff and a ``FieldConflict`` condition, not a
loop; who changed what of the last restored drift becomes the ``Drifted`` condition's
message (``plan.drifted``), kept while the damper remembers re-applies; the BD's
``spec.ignore`` rules go to ``runwatch`` (a change only to ignored fields is no drift);
a restore that fails falls back to a run. It also follows CRDs: a CRD
that becomes established restarts failed instances (a BundleDeployment whose
custom resources needed it installs at once) and wakes installs that set aside
optional objects of its API.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Literal

from provisioner.engine.apply import ignore, inventory, restore
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, meta_of, owner_of
from provisioner.engine.objects import labels_of as _labels
from provisioner.instance import runrecord
from provisioner.manager import conversion, model, signatures
from provisioner.manager.acting import actuate, prestage
from provisioner.manager.model import Settings
from provisioner.manager.planning import bundleplan, dependencies, inline, plan, revisions, runs
from provisioner.manager.watching import healthwatch, nodewatch, probes, runwatch
from provisioner.runtime.metrics import Metrics
from provisioner.runtime.queue import WorkQueue
from provisioner.runtime.workers import Reconciler
from rukpak.common import errors
from rukpak.kube import listwatch
from rukpak.signing import policy as signing_policy
from rukpak.signing.gate import ClientFactory

log = logging.getLogger("rukpak.manager")

BD_KEY = "bd:"
BUNDLE_KEY = "bundle:"
POLICY_KEY = "policy:"
"""The one work queue's keys are a prefix and a name: ``bd:web`` reconciles BundleDeployment
``web``, ``bundle:web-1a2b`` a Bundle, ``policy:signed`` a ClusterBundlePolicy's status."""
BD_CONTROLLER = "bundledeployment"
BUNDLE_CONTROLLER = "bundle"
QUEUE_NAME = "rukpak-manager"


def controller_of(key: str) -> str:
    """The ``controller`` label of a queue key (controller-runtime's controller names)."""
    return BUNDLE_CONTROLLER if key.startswith(BUNDLE_KEY) else BD_CONTROLLER


def _by_label(obj: Obj) -> str:
    return str(_labels(obj).get(model.BD_LABEL) or "")


SLOT_WAKES = 2
"""BundleDeployments waiting for a run slot woken per finished run (a run is seen over
twice: finished, then deleted), oldest first; the others look again after
``runs.RUN_SLOT_WAIT``."""


def _run_over(obj: Obj) -> bool:
    """Whether a run pod or run ConfigMap no longer holds a run slot."""
    if meta_of(obj).get("deletionTimestamp"):
        return True
    if obj.get("kind") == "ConfigMap":
        return runrecord.phase(obj) in ("Succeeded", "Failed")
    return str((obj.get("status") or {}).get("phase") or "") in ("Succeeded", "Failed")


def now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def rolled_back(bd: Obj) -> bool:
    """Whether ``bd`` runs an older revision than its newest kept one (a rollback in force)."""
    kept = revisions.of_status(bd)
    installed = (bd.get("status") or {}).get("installedRevision")
    return bool(kept) and isinstance(installed, int) and installed < kept[-1].number


class Controller(Reconciler):
    def __init__(
        self,
        kube: Kube,
        settings: Settings,
        *,
        resolve: actuate.Resolver,
        resync: float = 30.0,
        watch_timeout: int = 60,
        read_health: bool = True,
        metrics: Metrics | None = None,
        signature_client: ClientFactory | None = None,
        prestage_gate: prestage.Gate | None = None,
    ) -> None:
        super().__init__(
            kube,
            WorkQueue(),
            self._reconcile_key,
            log=log,
            watch_timeout=watch_timeout,
            metrics=metrics,
            controller_of=controller_of,
            controllers=(BD_CONTROLLER, BUNDLE_CONTROLLER),
            queue_name=QUEUE_NAME,
        )
        self.settings = settings
        self.resolve = resolve
        self.prestage_gate = prestage_gate
        """Holds a v1alpha2 pivot until the nodes pre-staged its images (``prestage``)."""
        self.resync = resync
        self.read_health = read_health
        ns = settings.system_namespace
        caches = self.caches
        # the storage version: no conversion on the watch of objects stored as v1alpha2
        self.bds = caches.add(
            model.API_VERSION_V2, model.BUNDLE_DEPLOYMENT, on_change=self._bd_changed
        )
        self.bundles = caches.add(model.API_VERSION, model.BUNDLE, on_change=self._bundle_changed)
        self.pods = self._runs(model.BD_LABEL, on_change=self._owned)
        self.unpack_pods = self._runs(  # a Bundle's checks
            f"{model.OWNER_KIND_LABEL}={model.BUNDLE}", on_change=self._unpack_pod_changed
        )
        self.events = caches.add("v1", "Event", namespace=ns, on_change=self._event_seen)
        # signature policies: their status here, their check before an image is pinned
        self.policies = caches.add(
            signatures.API_VERSION,
            signing_policy.KIND,
            on_change=lambda obj: self.queue.add(POLICY_KEY + model.name_of(obj)),
        )
        if signature_client is not None:
            self.resolve = signatures.SignedResolver(
                resolve,
                signatures.gate(kube, self.policies.items, namespace=ns, client=signature_client),
            )
        self.health = healthwatch.HealthWatch(
            kube,
            system_namespace=ns,
            on_change=self._wake,
            stop=self.stopping,
            watch_timeout=watch_timeout,
            user_of=self._instance_user,
            wide_user=plan.instance_user({}, settings),
        )
        self.nodes: nodewatch.NodeWatch | None = None
        """The Nodes that answer pre-stage asks; a change of an answer wakes the held BDs."""
        if prestage_gate is not None:
            self.nodes = nodewatch.NodeWatch(
                kube,
                prestage_gate,
                wake=self._wake,
                stop=self.stopping,
                watch_timeout=watch_timeout,
            )
        self.runwatch = runwatch.RunWatch(
            kube=kube,
            system_namespace=ns,
            health=self.health,
            pods=self.pods,
            wake=self._wake,
            as_instance=self._as_instance,
        )
        self.damper = restore.Damper()
        self.probes = probes.Probes()
        self._probe_waits: dict[str, float] = {}
        self._repairs = threading.Lock()
        self._restore_failed: dict[str, str] = {}
        """BD -> the record (its writer) whose restore failed: that record gets a run."""
        self._conflicts: dict[str, str] = {}
        self._drifts: dict[str, str] = {}
        """BD -> who changed what in its last restored drift (the ``Drifted`` message)."""
        self._slot_waiters: dict[str, None] = {}
        """BDs whose last plan waited for a run slot, oldest first (an ordered set)."""
        self._kept_records: dict[str, dict[str, runwatch.Kept]] = {}
        """BD -> revision -> its install record and what it installed: what a rollback goes
        back to without a run (this process's memory; after a restart a run does it)."""
        # CRDs are followed for what they serve; no cache (their schemas are large)
        self.crds = listwatch.ListWatch(
            kube,
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            on_list=self.runwatch.crds_listed,
            on_event=self.runwatch.crd_event,
            stop=self.stopping,
            watch_timeout=watch_timeout,
        )

    def _runs(self, label_selector: str, *, on_change: Callable[[Obj], None]) -> runrecord.Runs:
        """The cache of the run pods ``label_selector`` selects in the system namespace; in
        standing mode with the run ConfigMaps that stand in for pods, read as the pods."""
        ns = self.settings.system_namespace
        pods = self.caches.add(
            "v1", "Pod", namespace=ns, label_selector=label_selector, on_change=on_change
        )
        if self.settings.run_mode != "standing":
            return pods
        run_maps = self.caches.add(
            "v1",
            "ConfigMap",
            namespace=ns,
            label_selector=f"{label_selector},{runrecord.RUN_LABEL}",
            on_change=on_change,
        )
        return runrecord.RunView(pods, run_maps)

    # -- cache events -> work ---------------------------------------------------------------

    def _wake(self, name: str) -> None:
        """Queue BundleDeployment ``name`` for a reconcile."""
        self.queue.add(BD_KEY + name)

    def _bd_changed(self, obj: Obj) -> None:
        name = model.name_of(obj)
        self._wake(name)
        # what depends on it may install now; what it depends on may be deleted now
        for other in dependencies.dependents(name, self.bds.items()):
            self._wake(other)
        for other in dependencies.depends_on(obj):
            self._wake(other)

    def _bundle_changed(self, obj: Obj) -> None:
        self.queue.add(BUNDLE_KEY + model.name_of(obj))
        labels = _labels(obj)
        if labels.get(model.OWNER_KIND_LABEL) == model.BUNDLE_DEPLOYMENT:
            self._wake(str(labels.get(model.OWNER_NAME_LABEL) or ""))
        elif _by_label(obj):
            self._wake(_by_label(obj))

    def _owned(self, obj: Obj) -> None:
        if _by_label(obj):
            self._wake(_by_label(obj))
        if _run_over(obj):  # a slot may be free: the BundleDeployments waiting for one
            self._wake_slot_waiters(SLOT_WAKES)

    def _wake_slot_waiters(self, count: int) -> None:
        with self._repairs:
            names = list(self._slot_waiters)[:count]
            for name in names:
                del self._slot_waiters[name]
        for name in names:
            self._wake(name)

    def _wait_for_slot(self, name: str, actions: list[plan.Action]) -> None:
        """Remember ``name`` while its plan waits for a free run slot (a finished run wakes
        it, oldest first) and forget it once it does not."""
        waiting = any(isinstance(a, plan.Requeue) and a.why == runs.SLOT_WAIT_WHY for a in actions)
        with self._repairs:
            if waiting:
                self._slot_waiters.setdefault(name, None)
            else:
                self._slot_waiters.pop(name, None)

    def _unpack_pod_changed(self, obj: Obj) -> None:
        owner = str(_labels(obj).get(model.OWNER_NAME_LABEL) or "")
        if owner:
            self.queue.add(BUNDLE_KEY + owner)

    def _event_seen(self, obj: Obj) -> None:
        involved = obj.get("involvedObject") or {}
        if obj.get("reason") == "FailedMount" and involved.get("kind") == "Pod":
            pod_name = str(involved.get("name") or "")
            if self.unpack_pods.get(self.settings.system_namespace, pod_name) is not None:
                self.queue.add(BUNDLE_KEY + pod_name)

    # -- observe, plan, perform: BundleDeployments ----------------------------------------------

    def observe(self, name: str) -> tuple[Obj, plan.Observed] | None:
        """The BD and everything ``plan`` needs about it, from the caches; None when gone.

        The BD comes in the version it was created in (``conversion.origin``): one created
        as v1alpha1 is planned by ``plan`` from its v1alpha1 form, one created as v1alpha2
        by ``inline``."""
        stored = self.bds.get("", name)
        if stored is None:
            return None
        bd = conversion.to_v1alpha1(stored) if conversion.origin(stored) == "v1alpha1" else stored
        bundles = tuple(
            b
            for b in self.bundles.items()
            if _labels(b).get(model.OWNER_NAME_LABEL) == name
            and _labels(b).get(model.OWNER_KIND_LABEL) == model.BUNDLE_DEPLOYMENT
        )
        pods: list[Obj] = []
        other_runs = 0
        for pod in self.pods.items():
            if _by_label(pod) == name:
                pods.append(pod)
            elif runs.is_active(pod):
                other_runs += 1
        record = self.runwatch.record(name)
        drift: tuple[str, ...] = ()
        repair: plan.Repair | None = None
        clock = time.monotonic()
        if record is not None and not any(runs.is_active(p) for p in pods):
            with self._repairs:
                failed = self._restore_failed.get(name) == record.by
            found = self.runwatch.drift(
                name, record, restorable=not failed, rules=self._ignore_rules(stored)
            )
            drift = found.reasons
            if found.restore:
                repair = plan.Repair(
                    found.restore, found.restored, wait=self.damper.wait(name, clock)
                )
                with self._repairs:
                    self._drifts[name] = plan.drift_message(found.authors)
                if found.taken:
                    with self._repairs:
                        more = len(found.taken) - 2
                        self._conflicts[name] = (
                            "another writer took "
                            + ", ".join(found.taken[:2])
                            + (f" and {more} more" if more > 0 else "")
                        )
        with self._repairs:
            conflict = self._conflicts.get(name, "")
            drifted = self._drifts.get(name, "")
        lookup = self._lookup_bd
        cycle = dependencies.cycle(stored, lookup) if dependencies.depends_on(stored) else ""
        dependents: tuple[str, ...] = ()
        if meta_of(stored).get("deletionTimestamp") and not cycle:
            # (on a cycle nobody could go first: its members are deleted without waiting)
            # a dependent counts until its uninstall is done, not only until it is gone
            dependents = tuple(
                sorted(
                    {*dependencies.dependents(name, self.bds.items()), *self._uninstalling(name)}
                )
            )
        health = self._probed(name, stored, record) if self.read_health else None
        return bd, plan.Observed(
            revert=self._revert(name, stored, record, tuple(pods)),
            dependencies=dependencies.unmet(stored, lookup) if not cycle else (),
            cycle=cycle,
            dependents=dependents,
            bundles=bundles,
            pods=tuple(pods),
            record=record,
            drift=drift,
            repair=repair,
            fights=self.damper.fights(name, clock),
            conflict=conflict,
            drifted=drifted,
            other_runs=other_runs,
            health=health,
            health_unreadable=(
                self.health.unknown_why(name) if self.read_health and health is None else ""
            ),
            now=now_text(),
        )

    @staticmethod
    def _ignore_rules(stored: Obj) -> tuple[ignore.Rule, ...]:
        """The BD's ``spec.ignore`` (its stored v1alpha2 form); none when a rule is invalid
        (admission refuses a bad pointer; the instance run reports any other mistake)."""
        try:
            return ignore.parse_rules((stored.get("spec") or {}).get("ignore"))
        except ignore.InvalidRule as err:
            log.info("msg='ignore rules not honoured' bd=%s error=%r", model.name_of(stored), err)
            return ()

    def _revert(
        self, name: str, stored: Obj, record: runs.InstallRecord | None, pods: tuple[Obj, ...]
    ) -> runs.Revert | None:
        """Keep what ``record``'s revision installed the first time it is seen (the kept
        revisions of the BD's status only), and when a rollback is in force to a revision
        other than the recorded one and no run is active: how to go back without a run
        (``runwatch.revert_to``)."""
        kept_revisions = revisions.of_status(stored)
        names = {r.name for r in kept_revisions}
        limit = revisions.limit_of(stored.get("spec") or {})
        if record is not None and record.applied is not None and names and limit > 1:
            with self._repairs:
                have = self._kept_records.get(name, {}).get(record.bundle)
            if have is None or have.record.by != record.by:
                taken = runwatch.snapshot(self._as_instance(name), name, record)
                with self._repairs:
                    self._kept_records.setdefault(name, {})[record.bundle] = taken
        with self._repairs:
            kept = self._kept_records.setdefault(name, {})
            current = record.bundle if record is not None else ""
            for stale in [b for b in kept if b not in names and b != current]:
                del kept[stale]
        rollback = revisions.rollback_of(stored)
        if rollback is None or record is None or any(runs.is_active(p) for p in pods):
            return None
        to = revisions.find(kept_revisions, rollback.revision)
        with self._repairs:
            target = kept.get(to.name) if to is not None and to.name != record.bundle else None
        if target is None:
            return None
        cm = self.health.inventories.get(
            self.settings.system_namespace, inventory.configmap_name(name)
        )
        try:
            installed = inventory.from_configmap(cm).refs if cm is not None else frozenset()
        except (KeyError, ValueError, TypeError, errors.RukpakError):
            return None
        return runwatch.revert_to(self.health, name, target, installed)

    def _uninstalling(self, dependency: str) -> list[str]:
        """Deployments gone but not yet uninstalled (a marked inventory) that depended on
        ``dependency``."""
        out = []
        for cm in self.health.inventories.items():
            mark = inventory.uninstall_mark(cm)
            owner = owner_of(cm)
            if mark is not None and owner and dependency in mark.depends_on:
                out.append(owner)
        return out

    def _finish_uninstall(self, name: str) -> None:
        """The uninstall of BD ``name``, gone, that its marked inventory asks for (one cut
        short after the finalizer went; the normal pass already did it, and then this finds
        nothing); then the deployments it depended on look again."""
        cm = self.health.inventories.get(
            self.settings.system_namespace, inventory.configmap_name(name)
        )
        mark = inventory.uninstall_mark(cm)
        if mark is None:
            return
        policy: Literal["Delete", "Orphan"] = "Orphan" if mark.policy == "Orphan" else "Delete"
        log.info("msg='finishing an uninstall' bd=%s policy=%s", name, policy)
        user = mark.user or plan.instance_user({}, self.settings)
        actuate.perform(
            self.kube,
            {"apiVersion": model.API_VERSION_V2, "metadata": {"name": name}},
            [plan.Uninstall(policy, user), plan.DeleteLease()],
            resolve=self.resolve,
            system_namespace=self.settings.system_namespace,
            now=now_text(),
        )
        for other in mark.depends_on:
            self._wake(other)

    def _lookup_bd(self, name: str) -> Obj | None:
        return self.bds.get("", name)

    def _instance_user(self, name: str) -> str:
        """The user BundleDeployment ``name``'s installed objects are read and deleted as:
        its instance's ServiceAccount (the default one while the BundleDeployment is not
        in the cache). The manager's own identity may not read arbitrary kinds."""
        return plan.instance_user(self.bds.get("", name) or {}, self.settings)

    def _as_instance(self, name: str) -> Kube:
        return self.kube.impersonating(self._instance_user(name))

    def _health(self, name: str) -> plan.Health | None:
        verdict = self.health.health(name)
        return None if verdict is None else plan.Health(*verdict)

    def _probed(
        self, name: str, stored: Obj, record: runs.InstallRecord | None
    ) -> plan.Health | None:
        """``Healthy`` of what is installed: per kind, then ``spec.healthChecks``."""
        if record is None:
            return None
        spec = stored.get("spec") or {}
        base = self._health(name)
        if not spec.get("healthChecks"):
            return base
        judged, wait = self.probes.judge(
            name,
            spec,
            generation=int(meta_of(stored).get("generation") or 0),
            install=record.by,
            objects=self.health.objects(name),
            base=base,
        )
        with self._repairs:
            if wait is None:
                self._probe_waits.pop(name, None)
            else:
                self._probe_waits[name] = wait
        return judged

    def reconcile(self, name: str) -> float | None:
        """One pass for BD ``name``; the requeue delay the plan asked for, if any."""
        seen = self.observe(name)
        if seen is None:  # gone: so is what we remembered of its fights and probes
            self.probes.drop(name)
            with self._repairs:
                self._probe_waits.pop(name, None)
                self._restore_failed.pop(name, None)
                self._conflicts.pop(name, None)
                self._drifts.pop(name, None)
                self._kept_records.pop(name, None)
                self._slot_waiters.pop(name, None)
                self.damper.drop(name)
            if self.prestage_gate is not None:
                self.prestage_gate.forget(name)
            self._finish_uninstall(name)
            return None
        bd, observed = seen
        if bd.get("apiVersion") == model.API_VERSION_V2:
            actions = inline.plan_inline(bd, observed, settings=self.settings)
        else:
            actions = plan.plan(bd, observed, settings=self.settings)
        if actions:
            log.info("msg='plan' bd=%s actions=%s", name, plan.Summary.of(actions).counts)
        restoring = any(isinstance(a, plan.RestoreDrift) for a in actions)
        try:
            requeue = actuate.perform(
                self.kube,
                bd,
                actions,
                resolve=self.resolve,
                system_namespace=self.settings.system_namespace,
                now=observed.now,
                run_mode=self.settings.run_mode,
                prestage_gate=self.prestage_gate,
            )
        except errors.RukpakError as err:
            if restoring and observed.record is not None:
                log.warning("msg='restore failed; a run will' bd=%s error=%r", name, err.message)
                with self._repairs:
                    self._restore_failed[name] = observed.record.by
                return 0.0
            raise
        self._wait_for_slot(name, actions)
        for action in actions:
            if isinstance(action, plan.MarkUninstall):  # uninstalled: they may go now
                for other in action.depends_on:
                    self._wake(other)
        if self.metrics is not None:
            self._count(bd, actions, observed.now)
        if restoring:
            self.damper.record(name, time.monotonic())
            if self.metrics is not None:
                restored = sum(len(a.bodies) for a in actions if isinstance(a, plan.RestoreDrift))
                self.metrics.drift_restores.inc(restored)
        elif not observed.fights:
            with self._repairs:
                self._conflicts.pop(name, None)
                self._drifts.pop(name, None)
        with self._repairs:
            probe = self._probe_waits.pop(name, None)
        if probe is not None:  # the next health probe is due then
            requeue = probe if requeue is None else min(requeue, probe)
        return requeue

    def _count(self, bd: Obj, actions: list[plan.Action], now: str) -> None:
        """Installs, pivots and rollbacks the performed ``actions`` made, for the metrics."""
        assert self.metrics is not None
        for action in actions:
            if isinstance(action, plan.WriteStatus):
                found = revisions.newly_installed(bd, action.status, now)
                if found is not None:
                    self.metrics.installs.labels(found[0]).observe(found[1])
            elif isinstance(action, plan.SetRollback):
                self.metrics.rollbacks.labels(action.reason).inc()

    # -- observe, plan, perform: Bundles ------------------------------------------------------

    def observe_bundle(self, name: str) -> tuple[Obj, bundleplan.Observed] | None:
        bundle = self.bundles.get("", name)
        if bundle is None or not bundleplan.handles(bundle):
            return None
        sys_ns = self.settings.system_namespace
        pod = self.unpack_pods.get(sys_ns, name)
        failures: list[tuple[str, str]] = []
        if pod is not None:
            uid = str(meta_of(pod).get("uid") or "")
            for event in self.events.items():
                involved = event.get("involvedObject") or {}
                if (
                    event.get("reason") == "FailedMount"
                    and involved.get("kind") == "Pod"
                    and involved.get("name") == name
                    and involved.get("uid") == uid
                ):
                    when = str(event.get("lastTimestamp") or event.get("eventTime") or "")
                    failures.append((when, str(event.get("message") or "")))
            if served := runrecord.mount_failure(pod):  # a run the store could not serve
                failures.append(("~", served))
        return bundle, bundleplan.Observed(
            pod=pod,
            mount_failures=tuple(m for _, m in sorted(failures)),
            now=now_text(),
        )

    def reconcile_bundle(self, name: str) -> float | None:
        seen = self.observe_bundle(name)
        if seen is None:
            return None
        bundle, observed = seen
        actions = bundleplan.plan(bundle, observed, settings=self.settings)
        if actions:
            log.info("msg='plan' bundle=%s actions=%s", name, [type(a).__name__ for a in actions])
        return actuate.perform_bundle(
            self.kube,
            bundle,
            actions,
            resolve=self.resolve,
            now=observed.now,
            run_mode=self.settings.run_mode,
        )

    # -- workers ---------------------------------------------------------------------------

    def _reconcile_key(self, key: str) -> float | None:
        if key.startswith(POLICY_KEY):
            policy = self.policies.get("", key[len(POLICY_KEY) :])
            if policy is not None:
                signatures.reconcile_policy(
                    self.kube, policy, namespace=self.settings.system_namespace, now=now_text()
                )
            return None
        if key.startswith(BUNDLE_KEY):
            return self.reconcile_bundle(key[len(BUNDLE_KEY) :])
        return self.reconcile(key[len(BD_KEY) :])

    def _resync(self) -> None:
        while not self.stopping.wait(self.resync):
            for bd in self.bds.items():
                self._wake(model.name_of(bd))

    def by_condition(self) -> dict[tuple[str, ...], float]:
        """BundleDeployments by (condition type, status), from the cache: the samples of
        ``rukpak_bundledeployments``."""
        counts: dict[tuple[str, ...], float] = {}
        for bd in self.bds.items():
            for cond in (bd.get("status") or {}).get("conditions") or []:
                if isinstance(cond, dict) and cond.get("type"):
                    key = (str(cond["type"]), str(cond.get("status") or "Unknown"))
                    counts[key] = counts.get(key, 0.0) + 1.0
        return counts

    def by_revision_outcome(self) -> dict[tuple[str, ...], float]:
        """Kept revisions of every BundleDeployment by (outcome,), from the cache: the
        samples of ``rukpak_revisions``."""
        counts: dict[tuple[str, ...], float] = {}
        for bd in self.bds.items():
            for rev in revisions.of_status(bd):
                counts[(rev.outcome,)] = counts.get((rev.outcome,), 0.0) + 1.0
        return counts

    def rolled_back(self) -> dict[tuple[str, ...], float]:
        """BundleDeployments whose installed revision is older than their newest kept one
        (a rollback in force), from the cache: ``rukpak_bundledeployments_rolled_back``."""
        return {(): float(sum(rolled_back(bd) for bd in self.bds.items()))}

    def rolled_back_by_name(self) -> dict[tuple[str, ...], float]:
        """(name,) -> 1 for a BundleDeployment running an older revision than its newest
        kept one, 0 for the others, from the cache: ``rukpak_bundledeployment_rolled_back``
        (one series per BundleDeployment, gone with it)."""
        return {(model.name_of(bd),): float(rolled_back(bd)) for bd in self.bds.items()}

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, *, workers: int = 2, sync_timeout: float = 60.0) -> None:
        """Start the informers, wait for their first lists, then the workers."""
        self.caches.start()
        self.health.start()
        if self.nodes is not None:  # not waited for: the gate lists Nodes until it syncs
            self.nodes.start()
        for inf in [*self.caches, self.health.inventories]:
            if not inf.wait_synced(sync_timeout):
                log.warning("msg='cache not synced yet' informer=%r", inf.listwatch)
        # ends with its watch, up to watch_timeout after stop: not joined
        self.workers.spawn("watch-crds", self.crds.run, join=False)
        self.workers.spawn("resync", self._resync)
        self.workers.start(workers)

    def stop(self, timeout: float = 5.0) -> None:
        self.workers.stop(timeout)
