"""The provisioner role's loop: caches of claims, PVs and classes; one sync per key.

Where it sits: started by ``provisioner.storage.cli``. Three informers
(``rukpak.kube.listwatch``: list+watch, re-list after 410 Gone, bounded
backoff) keep PersistentVolumeClaims, PersistentVolumes and StorageClasses and
queue keys (``claim:<namespace>/<name>``, ``pv:<name>``) into a work queue; a
changed StorageClass re-queues the claims that use it (StorageClass parameters
are immutable, so a "fix" is a new class of the same name). Workers run:

- ``sync_claim``: ``plan.should_provision`` → ``plan.create_request`` →
  CreateVolume over the CSI socket (``csiclient``) → ``plan.persistent_volume``
  → create the PV (AlreadyExists counts as done). The PV controller of
  kube-controller-manager then binds the claim to it.
- ``sync_volume``: for PVs of our driver, keep our finalizer as
  ``plan.finalizers_wanted`` says; when ``plan.should_delete`` (Released,
  reclaim Delete) call DeleteVolume, delete the PV, then drop our finalizer.

A failed sync is retried by ``manager.workers`` with exponential backoff
(``rukpak.common.backoff``: 1 s doubling to 5 min, as the sidecar's
``--retry-interval-start/max``); a claim's failure is also a
``ProvisioningFailed`` Warning event saying what to fix. Secrets named by the
StorageClass are read when needed and never logged. With ``metrics``
(``provisioner.storage.metrics``) each provision and deletion is counted and timed by
StorageClass, each CSI call by method and code, and the queue as the runtime's.
"""

from __future__ import annotations

import base64
import contextlib
import logging
import time

from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef
from provisioner.runtime.queue import WorkQueue
from provisioner.runtime.workers import Reconciler
from provisioner.storage import metrics as storage_metrics
from provisioner.storage import plan
from provisioner.storage.csiclient import CsiClient
from provisioner.storage.events import Recorder
from rukpak.common import errors
from rukpak.common.backoff import Backoff

log = logging.getLogger(__name__)

RETRY = Backoff(base=1.0, cap=300.0, jitter=0.1)


class VolumeProvisioner(Reconciler):
    def __init__(
        self,
        kube: Kube,
        csi: CsiClient,
        *,
        driver: str,
        recorder: Recorder,
        backoff: Backoff = RETRY,
        watch_timeout: int = 60,
        metrics: storage_metrics.Metrics | None = None,
    ) -> None:
        queue = WorkQueue(backoff=backoff)
        super().__init__(
            kube,
            queue,
            self.sync,
            log=log,
            watch_timeout=watch_timeout,
            what="sync",
            metrics=metrics,
            controller_of=lambda key: storage_metrics.CONTROLLER,
            controllers=(storage_metrics.CONTROLLER,),
            queue_name=storage_metrics.CONTROLLER,
        )
        self.csi = csi
        self.volume_metrics = metrics
        if metrics is not None:
            csi.observe = metrics.csi_call
        self.driver = driver
        self.recorder = recorder
        self.classes = self.caches.add(
            "storage.k8s.io/v1",
            "StorageClass",
            on_change=self._class_changed,
            on_delete=lambda obj: None,  # a deleted class changes no claim's fate
        )
        self.volumes = self.caches.add(
            "v1",
            "PersistentVolume",
            on_change=lambda v: self.queue.add(f"pv:{plan.meta(v).get('name', '')}"),
        )
        self.claims = self.caches.add(
            "v1",
            "PersistentVolumeClaim",
            on_change=lambda c: self.queue.add(f"claim:{plan.claim_key(c)}"),
        )

    # -- lifecycle ---------------------------------------------------------------------

    def start(self, *, workers: int = 2, sync_timeout: float = 60.0) -> None:
        """Start the informers, wait for their first lists, then the workers."""
        self.caches.start()
        late = self.caches.wait_synced(sync_timeout)
        if late:
            raise errors.Unavailable(
                f"{late[0].listwatch!r} did not complete its first list in {sync_timeout}s"
            )
        self.workers.start(workers)

    def stop(self, timeout: float = 5.0) -> None:
        self.workers.stop(timeout)
        self.caches.stop(timeout=0.1)

    def _class_changed(self, storage_class: Obj) -> None:
        name = plan.meta(storage_class).get("name")
        if storage_class.get("provisioner") != self.driver:
            return
        for claim in self.claims.items():
            if plan.claim_class(claim) == name and not (claim.get("spec") or {}).get("volumeName"):
                self.queue.forget(f"claim:{plan.claim_key(claim)}")
                self.queue.add(f"claim:{plan.claim_key(claim)}")

    # -- the work queue ----------------------------------------------------------------

    def sync(self, key: str) -> None:
        """One pass over a queued key (``Workers`` retries it with backoff if it raises)."""
        kind, _, rest = key.partition(":")
        if kind == "claim":
            namespace, _, name = rest.partition("/")
            self.sync_claim(namespace, name)
        elif kind == "pv":
            self.sync_volume(rest)

    # -- claims ------------------------------------------------------------------------

    def sync_claim(self, namespace: str, name: str) -> None:
        claim = self.claims.get(namespace, name)
        if claim is None:
            return
        class_name = plan.claim_class(claim)
        storage_class = self.classes.get("", class_name) if class_name else None
        if not plan.should_provision(claim, storage_class, self.driver):
            return
        pv_name = plan.pv_name(claim)
        if self.volumes.get("", pv_name) is not None:
            return  # provisioned already; the PV controller binds it
        if storage_class is None:
            raise errors.NotFound(
                f"claim {namespace}/{name}: StorageClass {class_name!r} not found; "
                "create it (provisioner csi.rukpak.io) or fix spec.storageClassName"
            )
        if storage_class.get("provisioner") != self.driver:
            return
        self.recorder.event(
            claim,
            "Normal",
            "Provisioning",
            f'External provisioner is provisioning volume for claim "{namespace}/{name}"',
        )
        start = time.monotonic()
        try:
            pv = self._provision(claim, storage_class)
        except errors.RukpakError as err:
            self._count_provision(class_name, ok=False, start=start)
            self.recorder.event(
                claim,
                "Warning",
                "ProvisioningFailed",
                f'failed to provision volume with StorageClass "{class_name}": {err.message}',
            )
            raise
        try:
            self.kube.create(pv)
        except errors.AlreadyExists:
            pass
        except errors.RukpakError as err:
            self._count_provision(class_name, ok=False, start=start)
            raise type(err)(f"error saving volume {pv_name}: {err.message}") from None
        self._count_provision(class_name, ok=True, start=start)
        log.info("msg=%r claim=%s/%s pv=%s image=%s", "provisioned", namespace, name, pv_name,
                 pv["spec"]["csi"]["volumeAttributes"].get("image", ""))  # fmt: skip
        self.recorder.event(
            claim, "Normal", "ProvisioningSucceeded", f"Successfully provisioned volume {pv_name}"
        )

    def _count_provision(self, class_name: str | None, *, ok: bool, start: float) -> None:
        if self.volume_metrics is not None:
            seconds = time.monotonic() - start
            self.volume_metrics.provisioned(class_name or "", ok=ok, seconds=seconds)

    def _provision(self, claim: Obj, storage_class: Obj) -> Obj:
        request = plan.create_request(claim, storage_class, self.driver)
        secrets = self._secret_data(request.provisioner_secret)
        created = self.csi.create_volume(request, secrets)
        try:
            return plan.persistent_volume(claim, storage_class, request, created)
        except errors.RukpakError as err:  # too small: give the volume back, then retry
            try:
                self.csi.delete_volume(created.volume_id, secrets)
            except errors.RukpakError as cleanup:
                raise type(err)(
                    f"{err.message}. Cleanup of volume {request.name} failed, volume is "
                    f"orphaned: {cleanup.message}"
                ) from None
            raise

    def _secret_data(self, ref: plan.SecretRef | None) -> dict[str, str]:
        """The Secret's data, decoded; empty when ``ref`` is None."""
        if ref is None:
            return {}
        secret = self.kube.get(ObjectRef("", "v1", "Secret", ref.namespace, ref.name))
        if secret is None:
            raise errors.NotFound(
                f"secret {ref.namespace}/{ref.name} named by the StorageClass does not exist; "
                "create it (kubectl create secret docker-registry) or fix the class parameters"
            )
        data = secret.get("data") or {}
        try:
            return {str(k): base64.b64decode(v).decode() for k, v in data.items()}
        except (ValueError, UnicodeDecodeError):
            raise errors.InvalidArgument(
                f"secret {ref.namespace}/{ref.name} holds data that is not UTF-8 text"
            ) from None

    # -- volumes -----------------------------------------------------------------------

    def sync_volume(self, name: str) -> None:
        pv = self.volumes.get("", name)
        if pv is None or not plan.is_ours(pv, self.driver):
            return
        ref = ObjectRef("", "v1", "PersistentVolume", "", name)
        finalizers = plan.finalizers_wanted(pv)
        if finalizers is not None:
            pv = self._set_finalizers(ref, pv, finalizers)
        if not plan.should_delete(pv):
            return
        volume_id = ((pv.get("spec") or {}).get("csi") or {}).get("volumeHandle", "")
        class_name = str((pv.get("spec") or {}).get("storageClassName") or "")
        start = time.monotonic()
        try:
            self.csi.delete_volume(volume_id, self._secret_data(plan.deletion_secret(pv)))
        except errors.RukpakError as err:
            self._count_delete(class_name, ok=False, start=start)
            self.recorder.event(pv, "Warning", "VolumeFailedDelete", err.message)
            raise
        try:
            self.kube.delete(ref)
        except errors.RukpakError:
            self._count_delete(class_name, ok=False, start=start)
            raise
        self._count_delete(class_name, ok=True, start=start)
        log.info("msg=%r pv=%s volume_id=%s", "deleted", name, volume_id)
        live = self.kube.get(ref)
        if live is not None and plan.FINALIZER in (plan.meta(live).get("finalizers") or []):
            rest = [f for f in plan.meta(live)["finalizers"] if f != plan.FINALIZER]
            with contextlib.suppress(errors.NotFound):
                self._set_finalizers(ref, live, rest)

    def _count_delete(self, class_name: str, *, ok: bool, start: float) -> None:
        if self.volume_metrics is not None:
            seconds = time.monotonic() - start
            self.volume_metrics.deleted(class_name, ok=ok, seconds=seconds)

    def _set_finalizers(self, ref: ObjectRef, pv: Obj, finalizers: list[str]) -> Obj:
        """Merge-patch the finalizer list, guarded by the resourceVersion it was computed
        from (a Conflict is retried by the queue with the fresh object)."""
        patch = {
            "metadata": {
                "finalizers": finalizers or None,
                "resourceVersion": plan.meta(pv).get("resourceVersion"),
            }
        }
        return self.kube.merge_patch(ref, patch)
