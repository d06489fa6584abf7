"""The manager's controller loop: informers, one work queue, observe, plan, perform.

Sits at the top of the manager. Informers (``engine.listwatch.Informer``: list
once, then watch) keep a local cache of everything the manager reads:
BundleDeployments, Bundles, and in the system namespace the instance
Deployments and pods, the unpack pods, the Leases and the Events (for an
unpack pod's FailedMount messages). At rest the manager makes watch requests
only; a reconcile reads the caches, asks a pure planner what to do (``plan``
for a BundleDeployment, ``bundleplan`` for a Bundle) and hands the actions to
``actuate``, the only writer.

Cache events only decide *which* object to look at: a BundleDeployment
(``bd:NAME``) or a Bundle (``bundle:NAME``) is queued when it, or something it
owns, changes; ``healthwatch`` follows the inventories and the objects they
list (by the owner label), so ``Healthy`` changes with them, from the caches.
A periodic resync re-queues every BundleDeployment (cache reads only).
``workers`` drain the queue (the frame, ``workers.Reconciler``, is shared with the
PV provisioner); failures requeue with exponential backoff. ``runwatch`` judges
drift of run-to-completion installs from the same caches and follows CRDs: a CRD
that becomes established restarts failed instances (a BundleDeployment whose
custom resources needed it installs at once) and wakes installs that set aside
optional objects of its API.
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime

from provisioner.engine import listwatch
from provisioner.engine.kube import Kube
from provisioner.engine.objects import Obj
from provisioner.manager import actuate, bundleplan, healthwatch, model, plan, runs, runwatch
from provisioner.manager.model import Settings
from provisioner.runtime import lease
from provisioner.runtime.queue import WorkQueue
from provisioner.runtime.workers import Reconciler

log = logging.getLogger("rukpak.manager")

BD_KEY = "bd:"
BUNDLE_KEY = "bundle:"


def _labels(obj: Obj) -> dict[str, str]:
    labels: dict[str, str] = (obj.get("metadata") or {}).get("labels") or {}
    return labels


def _by_label(obj: Obj) -> str:
    return str(_labels(obj).get(model.BD_LABEL) or "")


def now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


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
    ) -> None:
        super().__init__(
            kube, WorkQueue(), self._reconcile_key, log=log, watch_timeout=watch_timeout
        )
        self.settings = settings
        self.resolve = resolve
        self.resync = resync
        self.read_health = read_health
        ns = settings.system_namespace
        caches = self.caches
        self.bds = caches.add(
            model.API_VERSION, model.BUNDLE_DEPLOYMENT, on_change=self._bd_changed
        )
        self.bundles = caches.add(model.API_VERSION, model.BUNDLE, on_change=self._bundle_changed)
        self.deployments = caches.add(
            "apps/v1",
            "Deployment",
            namespace=ns,
            label_selector=model.BD_LABEL,
            on_change=self._owned,
        )
        self.pods = caches.add(
            "v1", "Pod", namespace=ns, label_selector=model.BD_LABEL, on_change=self._owned
        )
        self.unpack_pods = caches.add(
            "v1",
            "Pod",
            namespace=ns,
            label_selector=f"{model.OWNER_KIND_LABEL}={model.BUNDLE}",
            on_change=self._unpack_pod_changed,
        )
        self.leases = caches.add(
            "coordination.k8s.io/v1",
            "Lease",
            namespace=ns,
            on_change=self._lease_changed,
            on_update=self._lease_updated,  # renewals alone change nothing here
        )
        self.events = caches.add("v1", "Event", namespace=ns, on_change=self._event_seen)
        self.health = healthwatch.HealthWatch(
            kube,
            ns,
            on_change=lambda owner: self.queue.add(BD_KEY + owner),
            stop=self.stopping,
            watch_timeout=watch_timeout,
        )
        self.runwatch = runwatch.RunWatch(
            kube=kube,
            system_namespace=ns,
            health=self.health,
            leases=self.leases,
            pods=self.pods,
            wake=lambda name: self.queue.add(BD_KEY + name),
        )
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

    # -- cache events -> work ---------------------------------------------------------------

    def _bd_changed(self, obj: Obj) -> None:
        self.queue.add(BD_KEY + model.name_of(obj))

    def _bundle_changed(self, obj: Obj) -> None:
        self.queue.add(BUNDLE_KEY + model.name_of(obj))
        labels = _labels(obj)
        if labels.get(model.OWNER_KIND_LABEL) == model.BUNDLE_DEPLOYMENT:
            self.queue.add(BD_KEY + str(labels.get(model.OWNER_NAME_LABEL) or ""))
        elif _by_label(obj):
            self.queue.add(BD_KEY + _by_label(obj))

    def _owned(self, obj: Obj) -> None:
        if _by_label(obj):
            self.queue.add(BD_KEY + _by_label(obj))

    def _unpack_pod_changed(self, obj: Obj) -> None:
        owner = str(_labels(obj).get(model.OWNER_NAME_LABEL) or "")
        if owner:
            self.queue.add(BUNDLE_KEY + owner)

    def _lease_changed(self, obj: Obj) -> None:
        name = model.name_of(obj)
        prefix = lease.lease_name("")
        if name.startswith(prefix):
            self.queue.add(BD_KEY + name[len(prefix) :])

    def _lease_updated(self, old: Obj, new: Obj) -> None:
        def holder(obj: Obj) -> str:
            return str((obj.get("spec") or {}).get("holderIdentity") or "")

        def installed_by(obj: Obj) -> str:
            marks = (obj.get("metadata") or {}).get("annotations") or {}
            return str(marks.get(lease.INSTALLED_BY_ANNOTATION) or "")

        if holder(old) != holder(new) or installed_by(old) != installed_by(new):
            self._lease_changed(new)

    def _event_seen(self, obj: Obj) -> None:
        involved = obj.get("involvedObject") or {}
        if obj.get("reason") == "FailedMount" and involved.get("kind") == "Pod":
            pod_name = str(involved.get("name") or "")
            if self.unpack_pods.get(self.settings.system_namespace, pod_name) is not None:
                self.queue.add(BUNDLE_KEY + pod_name)

    # -- observe, plan, perform: BundleDeployments ----------------------------------------------

    def observe(self, name: str) -> tuple[Obj, plan.Observed] | None:
        """The BD and everything ``plan`` needs about it, from the caches; None when gone."""
        bd = self.bds.get("", name)
        if bd is None:
            return None
        sys_ns = self.settings.system_namespace
        bundles = tuple(
            b
            for b in self.bundles.items()
            if _labels(b).get(model.OWNER_NAME_LABEL) == name
            and _labels(b).get(model.OWNER_KIND_LABEL) == model.BUNDLE_DEPLOYMENT
        )
        instance = self.deployments.get(sys_ns, model.instance_name(name))
        pods = tuple(p for p in self.pods.items() if _by_label(p) == name)
        lease_obj = self.leases.get(sys_ns, lease.lease_name(name))
        holder = str(((lease_obj or {}).get("spec") or {}).get("holderIdentity") or "")
        marks = ((lease_obj or {}).get("metadata") or {}).get("annotations") or {}
        installed_by = str(marks.get(lease.INSTALLED_BY_ANNOTATION) or "")
        record: runs.InstallRecord | None = None
        drift: tuple[str, ...] = ()
        if self.settings.instance_mode == model.RUN_MODE:
            record = runs.InstallRecord.of_lease(lease_obj)
            if record is not None and not any(runs.is_active(p) for p in pods):
                drift = self.runwatch.drift(name, record)
        readable = instance is not None or record is not None
        return bd, plan.Observed(
            bundles=bundles,
            instance=instance,
            pods=pods,
            lease_holder=holder,
            installed_by=installed_by,
            record=record,
            drift=drift,
            health=self._health(name) if readable and self.read_health else None,
            now=now_text(),
        )

    def _health(self, name: str) -> plan.Health | None:
        verdict = self.health.health(name)
        return None if verdict is None else plan.Health(*verdict)

    def reconcile(self, name: str) -> float | None:
        """One pass for BD ``name``; the requeue delay the plan asked for, if any."""
        seen = self.observe(name)
        if seen is None:
            return None
        bd, observed = seen
        actions = plan.plan(bd, observed, settings=self.settings)
        if actions:
            log.info("msg='plan' bd=%s actions=%s", name, plan.Summary.of(actions).counts)
        return actuate.perform(
            self.kube,
            bd,
            actions,
            resolve=self.resolve,
            system_namespace=self.settings.system_namespace,
            now=observed.now,
        )

    # -- observe, plan, perform: Bundles ------------------------------------------------------

    def observe_bundle(self, name: str) -> tuple[Obj, bundleplan.Observed] | None:
        bundle = self.bundles.get("", name)
        if bundle is None or not bundleplan.handles(bundle):
            return None
        sys_ns = self.settings.system_namespace
        pod = self.unpack_pods.get(sys_ns, name)
        failures: list[tuple[str, str]] = []
        if pod is not None:
            uid = str((pod.get("metadata") or {}).get("uid") or "")
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
            self.kube, bundle, actions, resolve=self.resolve, now=observed.now
        )

    # -- workers ---------------------------------------------------------------------------

    def _reconcile_key(self, key: str) -> float | None:
        if key.startswith(BUNDLE_KEY):
            return self.reconcile_bundle(key[len(BUNDLE_KEY) :])
        return self.reconcile(key[len(BD_KEY) :])

    def _resync(self) -> None:
        while not self.stopping.wait(self.resync):
            for bd in self.bds.items():
                self.queue.add(BD_KEY + model.name_of(bd))

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, *, workers: int = 2, sync_timeout: float = 60.0) -> None:
        """Start the informers, wait for their first lists, then the workers."""
        self.caches.start()
        self.health.start()
        for inf in [*self.caches, self.health.inventories]:
            if not inf.wait_synced(sync_timeout):
                log.warning("msg='cache not synced yet' informer=%r", inf.listwatch)
        # ends with its watch, up to watch_timeout after stop: not joined
        self.workers.spawn("watch-crds", self.crds.run, join=False)
        self.workers.spawn("resync", self._resync)
        self.workers.start(workers)

    def stop(self, timeout: float = 5.0) -> None:
        self.workers.stop(timeout)
