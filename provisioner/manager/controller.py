"""The BundleDeployment controller loop: watch, queue, observe, plan, perform.

Sits at the top of the manager: watches BundleDeployments and what they own
(generated Bundles, instance Deployments and pods, all labelled
``core.rukpak.io/bundle-deployment``) only to learn *which* BD to look at;
each reconcile then observes that BD afresh through the API, asks the pure
``plan`` what to do and hands the actions to ``actuate``. Watches re-list
after 410 Gone (and after any broken stream, with a pause); a periodic
resync re-queues every BD so conditions that no watch reports (the instance
Lease, health of installed objects) stay current. Failures requeue the BD
with exponential backoff.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime

from csi.common import errors
from provisioner.engine import lifecycle
from provisioner.engine.errors import Gone
from provisioner.engine.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef
from provisioner.instance import lease
from provisioner.manager import actuate, model, plan
from provisioner.manager.model import Settings
from provisioner.manager.queue import WorkQueue

log = logging.getLogger("rukpak.manager")

Mapper = Callable[[Obj], str]


def _by_label(obj: Obj) -> str:
    return str(((obj.get("metadata") or {}).get("labels") or {}).get(model.BD_LABEL) or "")


def now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Controller:
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
        self.kube = kube
        self.settings = settings
        self.resolve = resolve
        self.resync = resync
        self.watch_timeout = watch_timeout
        self.read_health = read_health
        self.queue = WorkQueue()
        self.stopping = threading.Event()
        self._known: set[str] = set()
        self._known_lock = threading.Lock()
        self._threads: list[threading.Thread] = []

    # -- observe, plan, perform ------------------------------------------------------------

    def observe(self, name: str) -> tuple[Obj, plan.Observed] | None:
        """The BD and everything ``plan`` needs about it; None when the BD is gone."""
        bd = self.kube.get(actuate.bd_ref(name))
        if bd is None:
            return None
        sys_ns = self.settings.system_namespace
        selector = f"{model.BD_LABEL}={name}"
        bundles, _ = self.kube.list(model.API_VERSION, model.BUNDLE, label_selector=selector)
        instance = self.kube.get(
            ObjectRef("apps", "v1", "Deployment", sys_ns, model.instance_name(name))
        )
        pods, _ = self.kube.list("v1", "Pod", namespace=sys_ns, label_selector=selector)
        lease_obj = self.kube.get(
            ObjectRef("coordination.k8s.io", "v1", "Lease", sys_ns, lease.lease_name(name))
        )
        holder = str(((lease_obj or {}).get("spec") or {}).get("holderIdentity") or "")
        return bd, plan.Observed(
            bundles=tuple(bundles),
            instance=instance,
            pods=tuple(pods),
            lease_holder=holder,
            health=self._health(name) if instance is not None and self.read_health else None,
            now=now_text(),
        )

    def _health(self, name: str) -> plan.Health | None:
        try:
            statuses = lifecycle.status(
                self.kube, name, system_namespace=self.settings.system_namespace
            )
        except errors.NotFound:
            return None
        bad = [f"{s.ref}: {s.health.reason or 'not ready'}" for s in statuses if not s.health.ready]
        if bad:
            more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
            return plan.Health(False, "; ".join(bad[:3]) + more)
        return plan.Health(True, f"all {len(statuses)} installed objects are ready")

    def reconcile(self, name: str) -> float | None:
        """One pass for BD ``name``; the requeue delay the plan asked for, if any."""
        seen = self.observe(name)
        if seen is None:
            with self._known_lock:
                self._known.discard(name)
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

    # -- workers ---------------------------------------------------------------------------

    def _work(self) -> None:
        while not self.stopping.is_set():
            key = self.queue.get(timeout=1.0)
            if key is None:
                continue
            try:
                after = self.reconcile(key)
            except errors.RukpakError as err:
                delay = self.queue.retry(key)
                log.warning(
                    "msg='reconcile failed' bd=%s retry_in=%.1fs error=%r", key, delay, err.message
                )
            except Exception:  # a bug: keep the controller alive, retry with backoff
                delay = self.queue.retry(key)
                log.exception("msg='reconcile crashed' bd=%s retry_in=%.1fs", key, delay)
            else:
                self.queue.forget(key)
                if after is not None:
                    self.queue.add_after(key, after)
            finally:
                self.queue.done(key)

    # -- watches ---------------------------------------------------------------------------

    def _enqueue(self, key: str) -> None:
        if key:
            self.queue.add(key)

    def _watch(self, api_version: str, kind: str, selector: str, mapper: Mapper) -> None:
        """List, then watch from that resourceVersion; re-list after 410 or a broken stream."""
        pause = 0.5
        while not self.stopping.is_set():
            try:
                items, rv = self.kube.list(api_version, kind, label_selector=selector)
                for item in items:
                    self._saw(kind, item, mapper)
                pause = 0.5
                while not self.stopping.is_set():
                    for event, obj in self.kube.watch(
                        api_version,
                        kind,
                        resource_version=rv,
                        label_selector=selector,
                        timeout_seconds=self.watch_timeout,
                    ):
                        rv = str((obj.get("metadata") or {}).get("resourceVersion") or rv)
                        if event != "BOOKMARK":
                            self._saw(kind, obj, mapper)
                        if self.stopping.is_set():
                            return
            except Gone:
                log.info("msg='watch expired, re-listing' kind=%s", kind)
            except errors.RukpakError as err:
                log.warning("msg='watch failed' kind=%s error=%r", kind, err.message)
                self.stopping.wait(pause)
                pause = min(pause * 2, 30.0)

    def _saw(self, kind: str, obj: Obj, mapper: Mapper) -> None:
        key = mapper(obj)
        if kind == model.BUNDLE_DEPLOYMENT and key:
            with self._known_lock:
                self._known.add(key)
        self._enqueue(key)

    def _resync(self) -> None:
        while not self.stopping.wait(self.resync):
            with self._known_lock:
                known = sorted(self._known)
            for key in known:
                self.queue.add(key)

    # -- lifecycle -------------------------------------------------------------------------

    def start(self, *, workers: int = 2) -> None:
        selector = model.BD_LABEL
        watches: list[tuple[str, str, str, Mapper]] = [
            (model.API_VERSION, model.BUNDLE_DEPLOYMENT, "", model.name_of),
            (model.API_VERSION, model.BUNDLE, selector, _by_label),
            ("apps/v1", "Deployment", selector, _by_label),
            ("v1", "Pod", selector, _by_label),
        ]
        for api_version, kind, sel, mapper in watches:
            self._spawn(f"watch-{kind}", self._watch, api_version, kind, sel, mapper)
        self._spawn("resync", self._resync)
        for i in range(workers):
            self._spawn(f"worker-{i}", self._work)

    def _spawn(self, name: str, target: Callable[..., None], *args: object) -> None:
        thread = threading.Thread(target=target, args=args, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self, timeout: float = 5.0) -> None:
        self.stopping.set()
        self.queue.shutdown()
        for thread in self._threads:
            if thread.name.startswith("worker") or thread.name == "resync":
                thread.join(timeout=timeout)
