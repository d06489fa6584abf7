"""The helm provisioner's controllers: informers, one work queue, observe, plan, perform.

Where it sits: at the top of the process (``main`` starts it once it leads). Two
informers cache Bundles and BundleDeployments; one worker drains the queue they feed
(the frame is ``api.Reconciler``). Only objects of class
``core-rukpak-io-helm`` are queued (``plan.handles``), so the core manager's objects
are never touched. A Bundle (``bundle:NAME``) is fetched (``content``), its chart
checked (``chart.check``) and its status written once: Unpacked with the pinned
reference, or Failing; a registry that does not answer leaves it Pending with the
reason, retried with backoff. A BundleDeployment (``bd:NAME``) is planned by
``plan.plan`` and performed here: the render (``chart.render``) and install
(``api.install``: inventory, pruning of what the previous render had and this one
lacks) happen in ``_install``; after each successful install an ``api.DriftWatcher``
keeps the applied objects as applied. A failed render changes nothing in the cluster:
the previous install stays, and so does its drift watcher. The watcher stops before an
install starts (it would re-create what the install prunes); after a failed install
drift is not corrected until an install succeeds (the retry, with backoff).
"""

from __future__ import annotations

import logging
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Literal

from provisioner import api
from rukpak_helm import chart, content, inline, plan

log = logging.getLogger("rukpak.helm")

BD_KEY = "bd:"
BUNDLE_KEY = "bundle:"
RESYNC_SECONDS = 60.0


def now_text() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _labels(obj: api.Obj) -> dict[str, str]:
    labels: dict[str, str] = (obj.get("metadata") or {}).get("labels") or {}
    return labels


class Controller(api.Reconciler):
    def __init__(
        self,
        kube: api.Kube,
        *,
        helm: Path,
        store: content.Store,
        system_namespace: str = api.DEFAULT_SYSTEM_NAMESPACE,
        default_namespace: str = "default",
        watch_timeout: int = 60,
    ) -> None:
        # reconcile asks for its own retries (queue.retry) while an install is not final
        super().__init__(
            kube,
            api.WorkQueue(base=1.0, cap=60.0),
            self._reconcile_key,
            log=log,
            watch_timeout=watch_timeout,
            keep_failures_on_requeue=True,
        )
        self.helm = helm
        self.store = store
        self.system_namespace = system_namespace
        self.default_namespace = default_namespace
        self.outcomes: dict[str, plan.Outcome] = {}
        self.watchers: dict[str, api.DriftWatcher] = {}
        self.bundles = self.caches.add(api.API_VERSION, "Bundle", on_change=self._bundle_changed)
        self.bds = self.caches.add(api.API_VERSION, "BundleDeployment", on_change=self._bd_changed)

    # -- cache events -> work -------------------------------------------------------------

    def _bd_changed(self, obj: api.Obj) -> None:
        # a deleted BD arrives here too: queue it so its drift watcher stops
        if plan.handles(obj):
            self.queue.add(BD_KEY + plan.name_of(obj))

    def _bundle_changed(self, obj: api.Obj) -> None:
        if not plan.handles(obj):
            return
        self.queue.add(BUNDLE_KEY + plan.name_of(obj))
        labels = _labels(obj)
        if labels.get(plan.OWNER_KIND_LABEL) == "BundleDeployment":
            self.queue.add(BD_KEY + str(labels.get(plan.OWNER_NAME_LABEL) or ""))

    # -- Bundles --------------------------------------------------------------------------

    def reconcile_bundle(self, name: str) -> None:
        bundle = self.bundles.get("", name)
        if bundle is None or not plan.handles(bundle) or plan.is_final(bundle):
            return
        now = now_text()
        problem = plan.source_problem(bundle)
        if problem is not None:
            failing = plan.bundle_status(phase="Failing", message=problem, now=now)
            self._bundle_status(bundle, failing)
            return
        ref = plan.image_ref(bundle) or ""
        try:
            pinned, root = self.store.fetch(ref)
        except api.RukpakError as err:
            message = f"cannot fetch {ref}: {err.message}"
            pending = plan.bundle_status(phase="Pending", message=message, now=now)
            self._bundle_status(bundle, pending)
            raise  # retried with backoff: a tag may be pushed later, a registry come back
        try:
            meta = chart.check(self.helm, chart.find_chart(root))
        except chart.ChartError as err:
            status = plan.bundle_status(phase="Failing", message=str(err), now=now, pinned=pinned)
            self._bundle_status(bundle, status)
            return
        message = (
            f"Successfully unpacked the {name} Bundle: chart {meta.get('name')} "
            f"{meta.get('version')} from {pinned}"
        )
        status = plan.bundle_status(phase="Unpacked", message=message, now=now, pinned=pinned)
        self._bundle_status(bundle, status)

    def _bundle_status(self, bundle: api.Obj, status: api.Obj) -> None:
        old = bundle.get("status") or {}

        def gist(s: api.Obj) -> Any:
            conds = [(c.get("status"), c.get("reason"), c.get("message")) for c in s["conditions"]]
            return (s.get("phase"), conds, s.get("resolvedSource"))

        if old.get("conditions") and gist(old) == gist(status):
            return
        name = plan.name_of(bundle)
        log.info("msg='bundle status' bundle=%s phase=%s", name, status["phase"])
        self.kube.merge_patch_status(api.bundle_ref(name), {"status": status})
        if status["phase"] != "Pending":
            cond = status["conditions"][0]
            level: Literal["Normal", "Warning"] = (
                "Warning" if status["phase"] == "Failing" else "Normal"
            )
            self._event(bundle, "Bundle", plan.Event(level, cond["reason"], cond["message"]))

    # -- BundleDeployments ----------------------------------------------------------------

    def owned_bundles(self, name: str) -> tuple[api.Obj, ...]:
        return tuple(
            b
            for b in self.bundles.items()
            if _labels(b).get(plan.OWNER_KIND_LABEL) == "BundleDeployment"
            and _labels(b).get(plan.OWNER_NAME_LABEL) == name
        )

    def reconcile(self, name: str) -> float | None:
        """One pass for BundleDeployment ``name``; a delay to look again, if any."""
        bd = self.bds.get("", name)
        if bd is None or not plan.handles(bd):
            self._stop_watcher(name)
            self.outcomes.pop(name, None)
            return None
        if api.created_in(bd) == "v1alpha2":
            return self.reconcile_inline(api.as_v1alpha2(bd))
        observed = plan.Observed(self.owned_bundles(name), self.outcomes.get(name), now_text())
        decided = plan.plan(bd, observed, default_namespace=self.default_namespace)
        again: float | None = None
        for action in decided.actions:
            again = self._perform(bd, action) or again
        if decided.valid is None:
            return again
        self._write_status(bd, {plan.HAS_VALID_BUNDLE: decided.valid}, now=observed.now)
        return self._retry_install(name) or again

    def reconcile_inline(self, bd: api.Obj) -> float | None:
        """One pass for a BundleDeployment created as v1alpha2 (``bd`` is its v1alpha2 view):
        no Bundle object; its image is pinned into ``status.resolvedSource``."""
        name = plan.name_of(bd)
        observed = plan.Observed((), self.outcomes.get(name), now_text())
        decided = inline.plan_inline(bd, observed, default_namespace=self.default_namespace)
        again: float | None = None
        valid, pinned, failure = decided.valid, inline.pin_of(bd), None
        for action in decided.actions:
            if isinstance(action, plan.Resolve):
                valid, pinned, failure = self._resolve(action.ref)
            else:
                again = self._perform(bd, action) or again
        if valid is None:
            return again
        resolved = inline.resolved_status(pinned) if pinned else None
        verdicts = {inline.UNPACKED: valid, plan.HAS_VALID_BUNDLE: valid}
        self._write_status(bd, verdicts, now=observed.now, extra={"resolvedSource": resolved})
        if failure is not None:
            raise failure  # retried with backoff: a tag may be pushed, a registry come back
        return self._retry_install(name) or again

    def _resolve(self, ref: str) -> tuple[plan.Verdict, str | None, api.RukpakError | None]:
        """Pin an image or URL and check its chart: (``Unpacked``, the pinned reference or
        URL, the error to retry on)."""
        try:
            pinned, root = self.store.fetch(ref)
        except api.RukpakError as err:
            why = f"{inline.SOURCE_PREFIX}cannot fetch {ref}: {err.message}"
            return ("False", "UnpackFailed", why), None, err
        try:
            meta = chart.check(self.helm, chart.find_chart(root))
        except chart.ChartError as err:
            return ("False", "UnpackFailed", str(err)), pinned, None
        message = (
            f"Successfully unpacked chart {meta.get('name')} {meta.get('version')} from {pinned}"
        )
        return ("True", "UnpackSuccessful", message), pinned, None

    def _write_status(
        self,
        bd: api.Obj,
        verdicts: dict[str, plan.Verdict],
        *,
        now: str,
        extra: api.Obj | None = None,
    ) -> None:
        """``verdicts`` plus ``Installed`` (what the last install in this process said) and
        ``activeBundle``, written when they changed, with an event per transition."""
        name = plan.name_of(bd)
        last = self.outcomes.get(name)
        active = plan.active_bundle(bd)
        if last is not None and last.installed[0] == "True":
            active = last.key[0]
        verdicts = {**verdicts, plan.INSTALLED: plan.installed_verdict(bd, last)}
        new, events = plan.status(bd, verdicts, active=active, now=now, extra=extra)
        if new is not None:
            self.kube.merge_patch_status(api.bundle_deployment_ref(name), {"status": new})
            for event in events:
                self._event(bd, "BundleDeployment", event)

    def _retry_install(self, name: str) -> float | None:
        """The delay before another try when the last install failed in a way worth one."""
        last = self.outcomes.get(name)
        if last is not None and not last.final:
            return self.queue.retry(BD_KEY + name)
        return None

    def _perform(self, bd: api.Obj, action: plan.Action) -> float | None:
        name = plan.name_of(bd)
        ref = api.bundle_deployment_ref(name)
        finalizers = list((bd.get("metadata") or {}).get("finalizers") or [])
        if isinstance(action, plan.AddFinalizer):
            patch = {"metadata": {"finalizers": [*finalizers, plan.FINALIZER]}}
            self.kube.merge_patch(ref, patch)
        elif isinstance(action, plan.RemoveFinalizer):
            kept = [f for f in finalizers if f != plan.FINALIZER]
            self.kube.merge_patch(ref, {"metadata": {"finalizers": kept}})
            self.outcomes.pop(name, None)
        elif isinstance(action, plan.CreateBundle):
            try:
                self.kube.create(action.bundle)
            except api.RukpakError as err:
                if err.code != "ALREADY_EXISTS":
                    raise
        elif isinstance(action, plan.DeleteBundle):
            self.kube.delete(api.bundle_ref(action.name))
        elif isinstance(action, plan.Uninstall):
            self._stop_watcher(name)
            try:
                api.uninstall(
                    self.kube, name, policy=action.policy, system_namespace=self.system_namespace
                )
            except api.RukpakError as err:
                if err.code != "NOT_FOUND":  # nothing was ever installed
                    raise
            log.info("msg='uninstalled' bd=%s policy=%s", name, action.policy)
        elif isinstance(action, plan.Install):
            self.outcomes[name] = self._install(bd, action.desired)
        return None

    def _install(self, bd: api.Obj, desired: plan.Desired) -> plan.Outcome:
        """Render and install ``desired``; what came of it. Never raises for a bad chart
        or a failed apply: those become ``Installed=False`` and the cluster keeps the
        previous install."""
        name = plan.name_of(bd)
        kept = plan.active_bundle(bd)
        try:
            _, root = self.store.fetch(desired.pinned)
        except api.RukpakError as err:
            why = f"cannot fetch {desired.pinned}: {err.message}"
            return plan.Outcome(desired.key, plan.failed(desired.bundle, why, kept=kept), False)
        try:
            rendered = chart.render(
                self.helm,
                chart.find_chart(root),
                release=name,
                namespace=desired.namespace,
                values=chart.values_of(bd),
            )
        except chart.ChartError as err:
            log.warning("msg='render failed' bd=%s error=%r", name, str(err))
            return plan.Outcome(desired.key, plan.failed(desired.bundle, str(err), kept=kept))
        options = api.Options(
            name=name, namespace=desired.namespace, system_namespace=self.system_namespace
        )
        # the previous install's watcher would re-create what this install prunes
        self._stop_watcher(name)
        try:
            result = api.install(self.kube, rendered.bundle, options)
        except api.RukpakError as err:
            log.warning("msg='install failed' bd=%s error=%r", name, err.message)
            verdict = plan.failed(desired.bundle, err.message, kept=kept)
            return plan.Outcome(desired.key, verdict, final=False)
        log.info(
            "msg='installed' bd=%s bundle=%s objects=%d pruned=%d",
            name,
            desired.bundle,
            len(result.applied),
            len(result.pruned),
        )
        watcher = api.DriftWatcher(self.kube, name, result.applied)
        watcher.start()
        self.watchers[name] = watcher
        return plan.Outcome(desired.key, plan.succeeded(desired.bundle))

    def _stop_watcher(self, name: str) -> None:
        watcher = self.watchers.pop(name, None)
        if watcher is not None:
            watcher.stop()

    def _event(self, obj: api.Obj, kind: str, event: plan.Event) -> None:
        """A core/v1 Event about ``obj`` (cluster-scoped: in ``default``); best effort."""
        api.record_event(
            self.kube,
            obj,
            kind=kind,
            type_=event.type,
            reason=event.reason,
            message=event.message,
            component="rukpak-helm-provisioner",
            now=now_text(),
        )

    # -- workers and lifecycle ------------------------------------------------------------

    def _reconcile_key(self, key: str) -> float | None:
        if key.startswith(BUNDLE_KEY):
            self.reconcile_bundle(key[len(BUNDLE_KEY) :])
            return None
        return self.reconcile(key[len(BD_KEY) :])

    def _resync(self) -> None:
        while not self.stopping.wait(RESYNC_SECONDS):
            for bd in self.bds.items():
                self._bd_changed(bd)
            pinned = [ref for b in self.bundles.items() if (ref := plan.pinned_ref(b))]
            pinned += [ref for bd in self.bds.items() if (ref := self._inline_pin(bd))]
            for gone in self.store.forget(pinned):
                log.info("msg='removed content no Bundle pins' path=%s", gone)

    @staticmethod
    def _inline_pin(bd: api.Obj) -> str | None:
        """The image a BundleDeployment created as v1alpha2 has pinned, if any."""
        if not plan.handles(bd) or api.created_in(bd) != "v1alpha2":
            return None
        return inline.pin_of(api.as_v1alpha2(bd))

    def start(self, *, sync_timeout: float = 60.0) -> None:
        """Start the informers, wait for their first lists, then one worker and the resync.

        One worker: renders and installs of different BundleDeployments never overlap,
        which keeps memory flat (helm and the engine each hold a whole release)."""
        self.caches.start()
        for informer in self.caches.wait_synced(sync_timeout):
            log.warning("msg='cache not synced yet' kind=%s", informer)
        self.workers.spawn("worker", self.workers.work)
        self.workers.spawn("resync", self._resync)

    def stop(self, timeout: float = 5.0) -> None:
        self.workers.stop(timeout)
        for name in list(self.watchers):
            self._stop_watcher(name)
        self.caches.stop()
