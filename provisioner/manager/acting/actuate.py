"""Performs the planner's actions against the API: the manager's only writer.

Sits after ``plan``: each action becomes one request through ``Kube``, the
one adapter to the API server.
``write_status`` is the one function that writes a BundleDeployment's status.
Pinning a Bundle's source goes through ``resolution`` (image tags through
``rukpak.oci.client.RegistryClient``, passed in as ``resolve`` so tests and the CLI
choose the client; git and http through ``rukpak.sources``); a server that does not
answer keeps the Bundle ``Pending``, a source the user must fix makes it
``Failing``; both are retried.
``perform`` runs a BundleDeployment's actions, ``perform_bundle`` a Bundle's.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Callable
from datetime import UTC, datetime

from provisioner.engine.apply import deletion, inventory, inventorystore, lifecycle
from provisioner.engine.bundle import words
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef, meta_of
from provisioner.engine.preview import preview
from provisioner.instance import runrecord
from provisioner.manager import model, resolution, signatures
from provisioner.manager.acting import events, prestage
from provisioner.manager.planning import bundleplan, inline, plan, revisions, sources
from provisioner.runtime import lease
from rukpak.common import errors
from rukpak.oci import client as oci_client
from rukpak.oci import reference
from rukpak.oci.auth import Credentials
from rukpak.signing.gate import SignatureDenied

log = logging.getLogger("rukpak.manager")

Resolver = resolution.ImageResolver
"""Image reference -> the same repository pinned by digest (``repo@sha256:...``)."""


class RegistryResolver:
    """Resolves tags with one shared ``RegistryClient`` (not thread-safe: serialised)."""

    def __init__(
        self,
        registry: oci_client.RegistryClient | None = None,
        *,
        with_credentials: Callable[[Credentials], oci_client.RegistryClient] | None = None,
    ) -> None:
        self._client = registry or oci_client.RegistryClient()
        self._with_credentials = with_credentials or (
            lambda creds: oci_client.RegistryClient(credentials=creds)
        )
        self._lock = threading.Lock()

    def __call__(self, ref: str, /, *, credentials: Credentials | None = None) -> str:
        """``ref`` pinned; a tag asked of its registry, with ``credentials`` when given (a
        client of their own, closed after)."""
        if model.is_digest_ref(ref):
            return ref
        parsed = reference.Reference.parse(ref)
        if credentials is not None:
            with self._with_credentials(credentials) as registry:
                desc = registry.resolve(parsed)
        else:
            with self._lock:
                desc = self._client.resolve(parsed)
        return f"{parsed.name}@{desc.digest}"  # the tag is dropped: the digest decides


def bd_ref(name: str, api_version: str = model.API_VERSION) -> ObjectRef:
    """The BundleDeployment ``name`` in ``api_version`` (the version it was read in)."""
    version = api_version.rpartition("/")[2] or model.VERSION
    return ObjectRef(model.GROUP, version, model.BUNDLE_DEPLOYMENT, "", name)


def bundle_ref(name: str) -> ObjectRef:
    return ObjectRef(model.GROUP, model.VERSION, model.BUNDLE, "", name)


def write_status(kube: Kube, name: str, status: Obj, api_version: str = model.API_VERSION) -> None:
    """Replace the BD's status fields we own (conditions are replaced as a whole)."""
    kube.merge_patch_status(bd_ref(name, api_version), {"status": status})


def record_event(kube: Kube, bd: Obj, event: plan.RecordEvent, *, now: str) -> None:
    _event(kube, bd, model.BUNDLE_DEPLOYMENT, event.type, event.reason, event.message, now=now)


def _event(
    kube: Kube, obj: Obj, kind: str, type_: str, reason: str, message: str, *, now: str
) -> None:
    events.record(
        kube,
        obj,
        kind=kind,
        type_=type_,
        reason=reason,
        message=message,
        component="rukpak-manager",
        now=now,
    )


def _set_finalizers(kube: Kube, bd: Obj, finalizers: list[str]) -> Obj:
    """Replace the finalizers if the BD is unchanged since observed (else ``Aborted``)."""
    meta = bd.get("metadata") or {}
    return kube.merge_patch(
        bd_ref(str(meta.get("name")), str(bd.get("apiVersion") or model.API_VERSION)),
        {"metadata": {"finalizers": finalizers, "resourceVersion": meta.get("resourceVersion")}},
    )


def resolve_bundle(kube: Kube, bundle: Obj, action: bundleplan.Resolve, resolve: Resolver) -> None:
    """Pin the Bundle's source once (``resolution``): record ``status.resolvedSource``.

    A failure the user must fix (a missing branch, ConfigMap or Secret, a directory
    out of the repository, refused credentials) makes the Bundle ``Failing``
    (UnpackFailed); any other (a registry or server that did not answer, a missing
    image tag) keeps it ``Pending`` with the answer. Both raise ``Unavailable`` so
    the work queue retries with its backoff (0.5 s doubling to 60 s): the tag may be
    pushed, the ConfigMap created, later.
    """
    try:
        pinned = resolution.resolve(
            kube, action.source, namespace=action.namespace, resolve_image=resolve
        )
    except errors.RukpakError as err:
        failing = action.source.get("type") != "image" and resolution.permanent(err)
        if isinstance(err, SignatureDenied):  # retried too: a signature may be pushed
            phase, reason, message = bundleplan.PHASE_FAILING, signatures.REASON, err.message
        elif failing:
            phase, reason, message = (
                bundleplan.PHASE_FAILING,
                bundleplan.REASON_FAILED,
                err.message,
            )
        else:
            phase, reason = bundleplan.PHASE_PENDING, bundleplan.REASON_PENDING
            message = words.unresolved(action.source.get("type"), action.ref, err.message)
        status = bundleplan.status_for(bundle, phase, reason, message, _now())
        if isinstance(err, SignatureDenied):  # Verified says which policy refused it
            status = signatures.with_verified(
                status, signatures.refused(err), now=_now(), generation=_generation(bundle)
            )
        message = status["conditions"][0]["message"]
        if _message(bundle) != message:
            kube.merge_patch_status(bundle_ref(action.name), {"status": status})
            _event(kube, bundle, model.BUNDLE, "Warning", reason, message, now=_now())
        raise errors.Unavailable(message) from None
    if pinned.annotations:
        kube.merge_patch(bundle_ref(action.name), {"metadata": {"annotations": pinned.annotations}})
    status = bundleplan.status_for(
        bundle,
        bundleplan.PHASE_PENDING,
        bundleplan.REASON_PENDING,
        "",
        _now(),
        resolved=pinned.resolved,
    )
    image = (pinned.resolved.get("image") or {}).get("ref") if pinned.resolved else None
    checked = signatures.verified(resolve, [str(image)]) if image else None
    status = signatures.with_verified(status, checked, now=_now(), generation=_generation(bundle))
    kube.merge_patch_status(bundle_ref(action.name), {"status": status})


def _generation(obj: Obj) -> int:
    return int((obj.get("metadata") or {}).get("generation") or 0)


def resolve_source(
    kube: Kube,
    bd: Obj,
    action: plan.ResolveSource,
    resolve: Resolver,
    gate: prestage.Gate | None = None,
) -> float | None:
    """Pin a v1alpha2 BundleDeployment's inline sources (``inline``): record
    ``status.resolvedSource`` (or ``resolvedSources``) with ``Unpacked`` (Unpacking), then
    the pin annotation. With a pre-stage ``gate``, the pin waits until the nodes have the
    pinned images (``prestage``): the seconds to look again are returned, nothing written.

    A failure the user must fix is ``Unpacked`` False/UnpackFailed with upstream's
    ``source bundle content: `` prefix; a server that did not answer keeps it
    UnpackPending with the answer. Both raise ``Unavailable`` (retried with backoff).
    """
    name = model.name_of(bd)
    api_version = str(bd.get("apiVersion") or model.API_VERSION_V2)
    now = _now()
    pins: list[tuple[str, Obj]] = []
    annotations: dict[str, str] = {}
    several = len(action.sources) > 1 or bool(action.sources[0][0])
    for index, (destination, source) in enumerate(action.sources):
        try:
            pinned = resolution.resolve(
                kube, source, namespace=action.namespace, resolve_image=resolve
            )
        except errors.RukpakError as err:
            where = f" (spec.sources[{index}], at {destination})" if several else ""
            if isinstance(err, SignatureDenied):
                verdict = ("False", signatures.REASON, f"{err.message}{where}")
            elif source.get("type") != "image" and resolution.permanent(err):
                message = words.source_refused(err.message, where)
                verdict = ("False", bundleplan.REASON_FAILED, message)
            else:
                ref = sources.ref_of(source)
                message = words.unresolved(source.get("type"), ref, err.message, where)
                verdict = ("False", bundleplan.REASON_PENDING, message)
            if inline.unpacked_condition_message(bd) != verdict[2]:
                status = inline.unpacked_status(bd, verdict, now)
                if isinstance(err, SignatureDenied):  # Verified says which policy refused it
                    status = signatures.with_verified(
                        status, signatures.refused(err), now=now, generation=action.generation
                    )
                write_status(kube, name, status, api_version)
                event = plan.RecordEvent("Warning", verdict[1], verdict[2])
                record_event(kube, bd, event, now=now)
            raise errors.Unavailable(verdict[2]) from None
        for key, value in pinned.annotations.items():
            annotations[inline.items_annotation(index) if several else key] = value
        pins.append((destination, pinned.resolved))
    images = [str(p["image"].get("ref")) for _, p in pins if p.get("type") == "image"]
    if gate is not None:
        wait = gate.hold(kube, bd, images, generation=action.generation)
        if wait is not None:
            return wait
    whole = sources.several(pins) if several else pins[0][1]
    described = sources.describe(whole)
    verdict = (
        "False",
        bundleplan.REASON_UNPACKING,
        f"pinned {described}; waiting for the instance",
    )
    status = inline.unpacked_status(bd, verdict, now, resolved=whole)
    checked = signatures.verified(resolve, images)  # Verified: which policy, key, identity
    status = signatures.with_verified(status, checked, now=now, generation=action.generation)
    write_status(kube, name, status, api_version)
    annotations[inline.PIN_ANNOTATION] = inline.pin_annotation(action.generation, now)
    kube.merge_patch(bd_ref(name, api_version), {"metadata": {"annotations": annotations}})
    record_event(kube, bd, plan.RecordEvent("Normal", "Resolved", f"pinned {described}"), now=now)
    return None


def _message(bundle: Obj) -> str:
    return str((bundleplan.unpacked_condition(bundle) or {}).get("message") or "")


def record_bundle_event(
    kube: Kube, bundle: Obj, event: bundleplan.RecordEvent, *, now: str
) -> None:
    _event(kube, bundle, model.BUNDLE, event.type, event.reason, event.message, now=now)


def _moved_on(kube: Kube, bundle: Obj, *, resolved: bool) -> bool:
    """Whether the live Bundle is past what a cached copy showed (one GET, before a step
    that must happen once: resolving the tag, or starting an unpack pod)."""
    live = kube.get(bundle_ref(model.name_of(bundle)))
    if live is None:
        return True
    if resolved:
        return bool(bundleplan.resolved_ref(live))
    return (live.get("status") or {}).get("phase") in bundleplan.FINAL_PHASES


def perform_bundle(
    kube: Kube,
    bundle: Obj,
    actions: list[bundleplan.Action],
    *,
    resolve: Resolver,
    now: str,
    run_mode: str = "pod",
) -> float | None:
    """Perform a Bundle's actions; the requeue delay, if any. Raises on a failed resolve.
    With ``run_mode`` ``standing`` an unpack check of one pinned image is a run ConfigMap
    the standing provisioner takes, not a pod (as for BundleDeployments' runs)."""
    requeue: float | None = None
    for action in actions:
        match action:
            case bundleplan.Resolve():
                if _moved_on(kube, bundle, resolved=True):
                    return None  # the cache was behind: resolved once already
                resolve_bundle(kube, bundle, action, resolve)
            case bundleplan.CreatePod(pod=pod):
                if _moved_on(kube, bundle, resolved=False):
                    return None  # the cache was behind: unpacked (or gone) already
                if run_mode == "standing" and runrecord.eligible(pod):
                    pod = runrecord.from_pod(pod)
                with contextlib.suppress(errors.AlreadyExists):
                    kube.create(pod)
            case bundleplan.DeletePod(namespace=ns, name=name):
                kube.delete(ObjectRef("", "v1", "Pod", ns, name))
                if run_mode == "standing":
                    kube.delete(ObjectRef("", "v1", "ConfigMap", ns, name))
            case bundleplan.WriteStatus(name=name, status=status):
                kube.merge_patch_status(bundle_ref(name), {"status": status})
            case bundleplan.RecordEvent():
                record_bundle_event(kube, bundle, action, now=now)
            case bundleplan.Requeue(after=after):
                requeue = after if requeue is None else min(requeue, after)
    return requeue


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def perform(
    kube: Kube,
    bd: Obj,
    actions: list[plan.Action],
    *,
    resolve: Resolver,
    system_namespace: str,
    now: str,
    run_mode: str = "pod",
    prestage_gate: prestage.Gate | None = None,
) -> float | None:
    """Perform ``actions`` in order; the requeue delay a ``Requeue`` asked for, if any.
    With ``run_mode`` ``standing``, a run the standing provisioner can take is written as
    its run ConfigMap (``instance.runrecord``) instead of created as a pod.

    Raises the first failure (the work queue retries the whole reconcile with backoff).
    """
    name = model.name_of(bd)
    api_version = str(bd.get("apiVersion") or model.API_VERSION)
    requeue: float | None = None
    for action in actions:
        log.debug("msg='action' bd=%s action=%s", name, type(action).__name__)
        match action:
            case plan.AddFinalizer():
                finalizers = list(meta_of(bd).get("finalizers") or [])
                bd = _set_finalizers(kube, bd, [*finalizers, model.FINALIZER])
            case plan.RemoveFinalizer():
                finalizers = list(meta_of(bd).get("finalizers") or [])
                _set_finalizers(kube, bd, [f for f in finalizers if f != model.FINALIZER])
            case plan.CreateBundle(bundle=bundle):
                with contextlib.suppress(errors.AlreadyExists):
                    kube.create(bundle)
            case plan.RestoreDrift(bodies=bodies, user=user):
                as_instance = kube.impersonating(user)
                for body in bodies:
                    as_instance.apply(body)
            case plan.CreatePod(pod=pod):
                _ensure_namespace(kube, system_namespace)
                if run_mode == "standing" and runrecord.eligible(pod):
                    pod = runrecord.from_pod(pod)  # taken by a standing provisioner
                with contextlib.suppress(errors.AlreadyExists):  # the same run, made already
                    kube.create(pod)
            case plan.DeletePod(namespace=ns, name=pod_name):
                kube.delete(ObjectRef("", "v1", "Pod", ns, pod_name))
                if run_mode == "standing":
                    kube.delete(ObjectRef("", "v1", "ConfigMap", ns, pod_name))
            case plan.DeleteLease():
                kube.delete(
                    ObjectRef(
                        "coordination.k8s.io",
                        "v1",
                        "Lease",
                        system_namespace,
                        lease.lease_name(name),
                    )
                )
            case plan.DeleteBundle(name=bundle_name):
                kube.delete(bundle_ref(bundle_name))
            case plan.Revert():
                revert(kube, name, action, system_namespace=system_namespace)
            case plan.MarkUninstall(policy=policy, depends_on=depends_on, user=user):
                mark = inventory.UninstallMark(policy, depends_on, user)
                inventorystore.mark_uninstall(kube, name, mark, system_namespace=system_namespace)
            case plan.Uninstall(policy=policy, user=user):
                # as the instance: what it installed it may delete, and nothing else
                with contextlib.suppress(errors.NotFound):  # nothing was ever installed
                    lifecycle.uninstall(
                        kube.impersonating(user) if user else kube,
                        name,
                        policy=policy,
                        system_namespace=system_namespace,
                    )
                kube.delete(
                    ObjectRef("", "v1", "ConfigMap", system_namespace, preview.configmap_name(name))
                )
            case plan.WriteStatus(status=status):
                write_status(kube, name, status, api_version)
            case plan.ResolveSource():
                after = resolve_source(kube, bd, action, resolve, prestage_gate)
                if after is not None:  # held for pre-staging: look again then
                    requeue = after if requeue is None else min(requeue, after)
            case plan.SetRollback(revision=revision, generation=generation, reason=reason):
                value = revisions.rollback_annotation(revision, generation, reason)
                patch = {"metadata": {"annotations": {revisions.ROLLBACK_ANNOTATION: value}}}
                bd = kube.merge_patch(bd_ref(name, api_version), patch)
            case plan.RecordEvent():
                record_event(kube, bd, action, now=now)
            case plan.Requeue(after=after):
                requeue = after if requeue is None else min(requeue, after)
    return requeue


def revert(kube: Kube, name: str, action: plan.Revert, *, system_namespace: str) -> None:
    """Go back to a kept revision without a run (``plan.Revert``). The inventory lists
    both installs while objects change, so an uninstall meanwhile misses none; the record
    is written last: until then the previous one stands and this is tried again."""
    stored = inventorystore.read_inventory(kube, name, system_namespace=system_namespace)
    refs = frozenset(action.refs)
    both = inventory.merged(stored.refs if stored is not None else (), refs)
    inventorystore.write_inventory(
        kube,
        inventory.Inventory(name, action.namespace, both),
        system_namespace=system_namespace,
        stored=stored,
    )
    as_instance = kube.impersonating(action.user)
    for body in action.bodies:
        as_instance.apply(body)
    gone = deletion.delete_owned(as_instance, action.prune, name, policy="Delete", concurrency=8)
    if gone.skipped:
        log.info("msg='revert left objects alone' bd=%s skipped=%s", name, gone.skipped[:5])
    inventorystore.write_inventory(
        kube, inventory.Inventory(name, action.namespace, refs), system_namespace=system_namespace
    )
    record = inventory.record_configmap(name, action.record, system_namespace=system_namespace)
    kube.apply(record, manager=inventory.RECORD_MANAGER)


def _ensure_namespace(kube: Kube, namespace: str) -> None:
    if kube.get(ObjectRef("", "v1", "Namespace", "", namespace)) is None:
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
