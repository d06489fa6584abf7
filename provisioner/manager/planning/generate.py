"""Builders of the objects the manager generates: Bundles, unpack pods, instance pods.

Sits under ``plan``: pure functions from a BundleDeployment (and the
manager's ``Settings``) to the exact bodies ``actuate`` creates or applies.
The instance runs ``rukpak-provisioner instance`` over the Bundle's pinned
content, mounted read-only at ``/bundle`` (``sources.volume``), with the
``--format`` of the Bundle's provisioner class (``model.CLASS_FORMATS``). It runs
to completion: one pod per run (``instance_run_pod``, restart policy Never),
named after a hash of its body so the same inputs never start two. The
unpack pod (``unpack_pod``) mounts a Bundle's pinned source the same way and
runs ``rukpak-provisioner unpack``.
"""

from __future__ import annotations

import json
from typing import Any

from provisioner.engine.objects import Obj, meta_of
from provisioner.manager import conversion, model
from provisioner.manager.model import Settings
from provisioner.manager.planning import revisions, sources
from rukpak.sources import volume

INSTANCE_CONTAINER = "instance"
BUNDLE_DIR = "/bundle"
RUN_LEASE_TIMEOUT = 300
"""Seconds a run waits for the Lease (held by an older run) before it fails."""
RUN_DEADLINE = 900
"""Seconds a run may take in all before the kubelet stops it (``activeDeadlineSeconds``)."""


NON_ROOT = 65532
POD_SECURITY: Obj = {
    "runAsNonRoot": True,
    "runAsUser": NON_ROOT,
    "runAsGroup": NON_ROOT,
    "seccompProfile": {"type": "RuntimeDefault"},
}
"""Unpack and instance pods run as a non-root user: bundle volumes are world-readable
(files 0444/0555), and nothing else on the pod's filesystem is written."""
CONTAINER_SECURITY: Obj = {
    "allowPrivilegeEscalation": False,
    "capabilities": {"drop": ["ALL"]},
    "readOnlyRootFilesystem": True,
}
INSTANCE_RESOURCES: Obj = {
    "requests": {"cpu": "10m", "memory": "64Mi"},
    "limits": {"memory": "1Gi"},
}


def _format_of(provisioner_class: object) -> str:
    """The loader format for a class; the planners hand only our classes here."""
    bundle_format = model.bundle_format(provisioner_class)
    if bundle_format is None:
        raise ValueError(f"provisioner class {provisioner_class!r} is not one of ours")
    return bundle_format


def owner_reference(bd: Obj) -> Obj:
    return {
        "apiVersion": str(bd.get("apiVersion") or model.API_VERSION),
        "kind": model.BUNDLE_DEPLOYMENT,
        "name": model.name_of(bd),
        "uid": str(meta_of(bd).get("uid") or ""),
        "controller": True,
        "blockOwnerDeletion": True,  # as metav1.NewControllerRef sets it
    }


def desired_bundle(bd: Obj) -> Obj:
    """The Bundle the BD's template describes, named ``<bd>-<hash>``."""
    template = (bd.get("spec") or {}).get("template") or {}
    tmeta = template.get("metadata") or {}
    labels = {
        **(tmeta.get("labels") or {}),
        model.OWNER_KIND_LABEL: model.BUNDLE_DEPLOYMENT,
        model.OWNER_NAME_LABEL: model.name_of(bd),
        model.TEMPLATE_HASH_LABEL: model.template_hash(bd),
        model.BD_LABEL: model.name_of(bd),
    }
    meta: dict[str, Any] = {
        "name": model.bundle_name(bd),
        "labels": labels,
        "ownerReferences": [owner_reference(bd)],
    }
    if tmeta.get("annotations"):
        meta["annotations"] = dict(tmeta["annotations"])
    return {
        "apiVersion": model.API_VERSION,
        "kind": model.BUNDLE,
        "metadata": meta,
        "spec": template.get("spec") or {},
    }


def _instance_meta(bd: Obj, bundle: str, settings: Settings) -> Obj:
    """Metadata of an instance run pod (the name is the caller's)."""
    name = model.name_of(bd)
    labels = {
        "app.kubernetes.io/name": "rukpak-instance",
        "app.kubernetes.io/instance": name,
        "app.kubernetes.io/part-of": "rukpak",
        "app.kubernetes.io/managed-by": "rukpak-manager",
        model.BD_LABEL: name,
    }
    annotations = {model.BUNDLE_ANNOTATION: bundle}
    rollback = revisions.rollback_of(bd)
    if rollback is not None:
        # a rollback reinstalls the kept revision even when the record already names it
        # (a failed run of the newer one may have applied part of it): a new run revision
        annotations[revisions.ROLLBACK_ANNOTATION] = f"{rollback.revision}@{rollback.generation}"
    return {
        "namespace": settings.system_namespace,
        "labels": labels,
        "annotations": annotations,
        "ownerReferences": [owner_reference(bd)],
    }


def _instance_pod_spec(bd: Obj, bundle: str, resolved: Obj, settings: Settings) -> dict[str, Any]:
    """The instance pod: ``rukpak-provisioner instance`` over the pinned content at /bundle."""
    name = model.name_of(bd)
    spec = bd.get("spec") or {}
    install_ns = spec.get("installNamespace") or settings.default_install_namespace
    template_spec = (spec.get("template") or {}).get("spec") or {}
    bundle_format = _format_of(
        template_spec.get("provisionerClassName") or conversion.class_of(spec)
    )
    command = [model.INSTANCE_BINARY, "instance", "--bundle-dir", "/bundle"]
    command += ["--format", bundle_format]
    command += ["--name", name, "--namespace", install_ns]
    command += ["--system-namespace", settings.system_namespace]
    command += ["--bundle", bundle, "--lease-timeout", str(RUN_LEASE_TIMEOUT)]
    volumes, mounts = _bundle_volumes(resolved)
    for mount in mounts[1:]:
        command += ["--source-dir", str(mount["mountPath"])]
    if spec.get("ignore"):  # (v1alpha2's spec.ignore: fields left to other writers)
        command += ["--ignore", json.dumps(spec["ignore"], sort_keys=True, separators=(",", ":"))]
    env: list[Obj] = [{"name": k, "value": v} for k, v in settings.env]
    env.append({"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}})
    # the run names its node in the install record: that node's cache holds the content
    env.append({"name": "NODE_NAME", "valueFrom": {"fieldRef": {"fieldPath": "spec.nodeName"}}})
    pod_spec: dict[str, Any] = {
        "serviceAccountName": spec.get("serviceAccountName") or settings.service_account,
        "terminationGracePeriodSeconds": 30,
        "securityContext": POD_SECURITY,
        "containers": [
            {
                "name": INSTANCE_CONTAINER,
                "image": settings.image,
                "command": command,
                "env": env,
                "terminationMessagePolicy": "FallbackToLogsOnError",
                "securityContext": CONTAINER_SECURITY,
                "resources": INSTANCE_RESOURCES,
                "volumeMounts": mounts,
            }
        ],
        "volumes": volumes,
    }
    pod_spec["restartPolicy"] = "Never"
    pod_spec["activeDeadlineSeconds"] = RUN_DEADLINE
    if settings.host_network:
        pod_spec["hostNetwork"] = True
        pod_spec["dnsPolicy"] = "ClusterFirstWithHostNet"
    return pod_spec


def _bundle_volumes(resolved: Obj) -> tuple[list[Obj], list[Obj]]:
    """(volumes, mounts) that put the pinned content at /bundle: one read-only volume, or
    with several sources an empty directory with each source's volume at its destination
    (``/bundle/<destination>``, read-only)."""
    if resolved.get("type") != sources.MULTI:
        mount = {"name": sources.VOLUME_NAME, "mountPath": BUNDLE_DIR, "readOnly": True}
        return [sources.volume(resolved)], [mount]
    volumes: list[Obj] = [{"name": sources.VOLUME_NAME, "emptyDir": {"sizeLimit": "1Mi"}}]
    mounts: list[Obj] = [{"name": sources.VOLUME_NAME, "mountPath": BUNDLE_DIR}]
    for index, (destination, part) in enumerate(sources.parts(resolved)):
        name = f"source-{index}"
        volumes.append(sources.volume(part, name=name))
        path = f"{BUNDLE_DIR}/{destination.strip('/')}"
        mounts.append({"name": name, "mountPath": path, "readOnly": True})
    return volumes, mounts


PREVIEW_ANNOTATION = "core.rukpak.io/preview"
"""On a preview run pod (``instance --preview``): applies nothing."""


def instance_run_pod(
    bd: Obj,
    bundle: str,
    resolved: Obj,
    settings: Settings,
    run: int,
    *,
    preview: bool = False,
    prefer: tuple[str, ...] = (),
) -> Obj:
    """Run ``run`` of the run-to-completion instance of ``bd``.

    Named ``rukpak-instance-<bd>-<revision>-<run>``: the revision is a hash of the pod's
    body, so the same inputs give the same name (a repeated create is a no-op) and a new
    Bundle, image or setting gives a new one; ``run`` counts the runs of one revision
    (drift corrections, retries). A ``preview`` run applies nothing: it reports what the
    install would do (``instance.preview``). ``prefer`` names nodes the scheduler should
    pick when it can (an offline rollback's: their caches hold the kept content); like
    the retention attributes it is not part of the revision.
    """
    body: Obj = {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": _instance_meta(bd, bundle, settings),
        "spec": _instance_pod_spec(bd, bundle, resolved, settings),
    }
    if preview:  # what the install would do, nothing applied: its own revision
        body["metadata"]["annotations"][PREVIEW_ANNOTATION] = "true"
        container = body["spec"]["containers"][0]
        container["command"].append("--preview")
        container["terminationMessagePolicy"] = "File"
    revision = model.stable_hash(body, 8)
    body["metadata"]["name"] = model.run_pod_name(model.name_of(bd), revision, run)
    body["metadata"]["annotations"][model.SPEC_HASH_ANNOTATION] = revision
    _retain(body, bd)  # (outside the hash: the kept set moving is no reason for a new run)
    if prefer:
        body["spec"]["affinity"] = {
            "nodeAffinity": {
                "preferredDuringSchedulingIgnoredDuringExecution": [
                    {
                        "weight": 100,
                        "preference": {
                            "matchFields": [
                                {"key": "metadata.name", "operator": "In", "values": list(prefer)}
                            ]
                        },
                    }
                ]
            }
        }
    return body


def retained_content(bd: Obj) -> list[str]:
    """What the node caches must keep for a rollback of ``bd``: the ``retain`` entries
    (``rukpak.sources.volume.retain_entry``: images pinned by digest, git commits, http
    tarballs by digest) of its kept revisions (``status.revisions``), sorted, at most
    ``volume.RETAIN_MAX``. ConfigMaps sources live in the API server: nothing to keep."""
    entries: set[str] = set()
    for rev in revisions.of_status(bd):
        parts = rev.source.get("sources")
        for part in parts if isinstance(parts, list) else [rev.source]:
            if not isinstance(part, dict) or part.get("type") not in ("image", "git", "http"):
                continue
            entry = volume.retain_entry(sources.volume(part)["csi"]["volumeAttributes"])
            if entry is not None:
                entries.add(entry)
    return sorted(entries)[-volume.RETAIN_MAX :]


def _retain(pod: Obj, bd: Obj) -> None:
    """Ask the node to keep the kept revisions' content on the pod's bundle volumes
    (``retainFor``/``retain``): a rollback then needs no registry, git or http server."""
    kept = retained_content(bd)
    if not kept:
        return
    owner = f"bundledeployment/{model.name_of(bd)}/{meta_of(bd).get('uid') or ''}".rstrip("/")
    for vol in pod["spec"].get("volumes") or []:
        attributes = (vol.get("csi") or {}).get("volumeAttributes")
        if not isinstance(attributes, dict):
            continue
        current = volume.retain_entry(attributes)
        if current is None:
            continue
        others = [r for r in kept if r != current][-(volume.RETAIN_MAX - 1) :]
        attributes[volume.ATTR_RETAIN_FOR] = owner
        attributes[volume.ATTR_RETAIN] = " ".join([*others, current])


UNPACK_CONTAINER = "unpack"


def unpack_pod(bundle: Obj, resolved: Obj, settings: Settings) -> Obj:
    """The run-once pod (named after the Bundle, owned by it) that validates its content.

    Labelled as upstream labels its unpack pods (owner-kind Bundle, owner-name); no
    API token is mounted: the result leaves through the termination message.
    """
    name = model.name_of(bundle)
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": settings.system_namespace,
            "labels": {
                "app.kubernetes.io/name": "rukpak-unpack",
                "app.kubernetes.io/part-of": "rukpak",
                "app.kubernetes.io/managed-by": "rukpak-manager",
                model.OWNER_KIND_LABEL: model.BUNDLE,
                model.OWNER_NAME_LABEL: name,
            },
            "ownerReferences": [
                {
                    "apiVersion": model.API_VERSION,
                    "kind": model.BUNDLE,
                    "name": name,
                    "uid": str(meta_of(bundle).get("uid") or ""),
                    "controller": True,
                    "blockOwnerDeletion": True,
                }
            ],
        },
        "spec": {
            "restartPolicy": "Never",
            "automountServiceAccountToken": False,
            "serviceAccountName": settings.unpack_service_account,
            "terminationGracePeriodSeconds": 5,
            "securityContext": POD_SECURITY,
            "containers": [
                {
                    "name": UNPACK_CONTAINER,
                    "image": settings.image,
                    "imagePullPolicy": "IfNotPresent",
                    "command": [
                        model.INSTANCE_BINARY,
                        "unpack",
                        "--bundle-dir",
                        "/bundle",
                        "--format",
                        _format_of((bundle.get("spec") or {}).get("provisionerClassName")),
                    ],
                    "terminationMessagePolicy": "FallbackToLogsOnError",
                    "securityContext": CONTAINER_SECURITY,
                    "volumeMounts": [{"name": "bundle", "mountPath": "/bundle", "readOnly": True}],
                }
            ],
            "volumes": [sources.volume(resolved)],
        },
    }
