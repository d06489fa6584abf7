"""A run without a pod: the record a standing provisioner takes work from, shaped for the
planner as the run pod it replaces.

Where it sits: in the instance package, below both its users: the manager
(``manager.actuate`` writes a run as a ConfigMap instead of creating its pod;
``manager.controller`` reads both through :class:`RunView`) and the standing provisioner
(``standing.worker`` claims, runs and finishes them). Pure: no request is made here.

The planner (``manager.runs``) decides by run pods: their names, labels, annotations,
phase, node and termination message. A run ConfigMap carries the very pod the planner
asked for (``data.pod``, JSON) and the state a kubelet would have reported, in
annotations (:data:`PHASE`, :data:`NODE`, :data:`HOLDER`, :data:`RENEWED`,
:data:`FINISHED`) and ``data.message``; :func:`as_pod` turns it back into that pod, so
the planner, its tests and every rule about runs stay as they are. What may run this way
is :func:`eligible`: runs of the instance (install or preview) and a v1alpha1 Bundle's
unpack check, whose content is one volume: our CSI driver's (an image pinned by digest,
a git commit or an http tarball pinned by digest), which the node store serves through
the store volume by the rules of a pod's volume, or a projected volume of ConfigMaps,
which the provisioner reads from the API; or several of those (v1alpha2 ``spec.sources``).

Claiming: a worker claims a ``Pending`` run, or a ``Running`` one whose holder has not
renewed it for :data:`CLAIM_TTL` seconds (a provisioner killed mid-run), with a merge
patch carrying the ConfigMap's resourceVersion, so two workers never hold one run.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime
from typing import Any, Protocol

from provisioner.engine.objects import Obj, meta_of

RUN_LABEL = "core.rukpak.io/run"
"""On every run ConfigMap (value ``instance`` or ``unpack``, the command it runs): what a
standing provisioner watches."""
OWNER_KIND_LABEL = "core.rukpak.io/owner-kind"
BD_LABEL = "core.rukpak.io/bundle-deployment"
PHASE = "core.rukpak.io/run-phase"
NODE = "core.rukpak.io/run-node"
HOLDER = "core.rukpak.io/run-holder"
RENEWED = "core.rukpak.io/run-renewed"
FINISHED = "core.rukpak.io/run-finished-at"
MOUNT_FAILED = "core.rukpak.io/run-mount-failed"
"""On a Pending Bundle check whose content the node store could not serve: what the store
said, in the words of the FailedMount event kubelet records for a pod's volume."""
RETRY_AFTER = "core.rukpak.io/run-retry-after"
"""Before this time no worker takes the run again (a check whose content was not served)."""
MOUNT_RETRY = 10.0
"""Seconds before a check whose content was not served is tried again (the standing
provisioner's sweep offers it within ``CLAIM_TTL / 2`` after that)."""
POD_KEY = "pod"
MESSAGE_KEY = "message"
VIEW_CACHE = 1024
"""Run ConfigMaps whose pod view ``RunView`` keeps decoded (four times as many at most)."""
CLAIM_TTL = 30.0
"""Seconds a Running run's holder may go without renewing it before another takes it."""
RENEW_EVERY = 10.0
UNTAKEN = (
    "for a standing provisioner to take the run (deployment rukpak-provisioner in the "
    "system namespace; kubectl logs it if this lasts)"
)
CSI_DRIVER = "csi.rukpak.io"


def now_text(now: datetime | None = None) -> str:
    return (now or datetime.now(UTC)).strftime("%Y-%m-%dT%H:%M:%SZ")


def command_of(pod: Obj) -> str:
    """The ``rukpak-provisioner`` subcommand a run pod runs (``instance``, ``unpack``)."""
    containers = (pod.get("spec") or {}).get("containers") or []
    command = (containers[0].get("command") if containers else None) or []
    return str(command[1]) if len(command) > 1 else ""


def eligible(pod: Obj) -> bool:
    """Whether ``pod`` can run standing: an instance run of a BundleDeployment or the unpack
    check of a Bundle, whose one content volume is an image pinned by digest, through the
    CSI driver (several sources keep a pod)."""
    labels = meta_of(pod).get("labels") or {}
    command = command_of(pod)
    if not (
        (command == "instance" and BD_LABEL in labels)
        or (command == "unpack" and labels.get(OWNER_KIND_LABEL) == "Bundle")
    ):
        return False
    volumes = (pod.get("spec") or {}).get("volumes") or []
    if len(volumes) == 1:
        return _content(volumes[0])
    return several_sources(pod)


def _content(volume: Obj) -> bool:
    attributes = csi_attributes(volume)
    if attributes is not None:
        image = attributes.get("image")
        return image is None or "@sha256:" in image  # git and http are pinned by the planner
    return configmap_items(volume) is not None


def several_sources(pod: Obj) -> bool:
    """Whether ``pod`` holds several sources as the planner lays them out: an empty
    ``bundle`` directory first, then one content volume per source."""
    volumes = (pod.get("spec") or {}).get("volumes") or []
    return (
        len(volumes) > 1
        and set(volumes[0]) == {"name", "emptyDir"}
        and all(_content(v) for v in volumes[1:])
    )


def csi_attributes(volume: Obj) -> dict[str, str] | None:
    """The attributes of a bundle volume of our CSI driver; None for any other volume."""
    csi = volume.get("csi")
    if not isinstance(csi, dict) or csi.get("driver") != CSI_DRIVER:
        return None
    attributes = csi.get("volumeAttributes")
    if not isinstance(attributes, dict):
        return None
    return {str(k): str(v) for k, v in attributes.items()}


def configmap_items(volume: Obj) -> list[tuple[str, str, str]] | None:
    """``(configMap, key, path)`` for every item of a projected volume made only of
    ConfigMaps with listed items (as the planner makes them); None for any other volume."""
    projected = volume.get("projected")
    if not isinstance(projected, dict):
        return None
    out: list[tuple[str, str, str]] = []
    for source in projected.get("sources") or []:
        configmap = source.get("configMap") if isinstance(source, dict) else None
        if not isinstance(configmap, dict) or set(source) != {"configMap"}:
            return None
        for item in configmap.get("items") or []:
            if not isinstance(item, dict):
                return None
            out.append((str(configmap.get("name")), str(item.get("key")), str(item.get("path"))))
    return out or None


def from_pod(pod: Obj) -> Obj:
    """The run ConfigMap of run pod ``pod`` (``Pending``, not claimed)."""
    meta = meta_of(pod)
    labels = {**(meta.get("labels") or {}), RUN_LABEL: command_of(pod) or "instance"}
    annotations = {**(meta.get("annotations") or {}), PHASE: "Pending"}
    body = {k: v for k, v in pod.items() if k != "status"}
    metadata: Obj = {
        "name": meta["name"],
        "namespace": meta["namespace"],
        "labels": labels,
        "annotations": annotations,
    }
    if meta.get("ownerReferences"):  # a Bundle's check goes with the Bundle, as its pod did
        metadata["ownerReferences"] = meta["ownerReferences"]
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": metadata,
        "data": {POD_KEY: json.dumps(body, sort_keys=True, separators=(",", ":"))},
    }


def pod_of(cm: Obj) -> Obj:
    """The pod a run ConfigMap carries (spec as the planner made it); {} when unreadable."""
    try:
        pod: Any = json.loads(str((cm.get("data") or {}).get(POD_KEY) or "{}"))
    except ValueError:
        return {}
    return pod if isinstance(pod, dict) else {}


def phase(cm: Obj) -> str:
    return str((meta_of(cm).get("annotations") or {}).get(PHASE) or "Pending")


def as_pod(cm: Obj) -> Obj:
    """The run pod the planner sees for run ConfigMap ``cm``: its name, labels,
    annotations and deletion from the ConfigMap, its spec from the pod it carries, and
    the status a kubelet would report (phase, node, the container's termination)."""
    meta = meta_of(cm)
    annotations = dict(meta.get("annotations") or {})
    pod = pod_of(cm)
    spec = dict(pod.get("spec") or {})
    if annotations.get(NODE):
        spec["nodeName"] = annotations[NODE]
    state = phase(cm)
    status: Obj = {"phase": state}
    containers = spec.get("containers") or [{}]
    container = str(containers[0].get("name") or "instance")
    if state in ("Succeeded", "Failed"):
        terminated = {
            "exitCode": 0 if state == "Succeeded" else 1,
            "reason": "Completed" if state == "Succeeded" else "Error",
            "message": str((cm.get("data") or {}).get(MESSAGE_KEY) or ""),
            "finishedAt": annotations.get(FINISHED, ""),
        }
        status["containerStatuses"] = [{"name": container, "state": {"terminated": terminated}}]
    elif state == "Running":
        status["containerStatuses"] = [{"name": container, "state": {"running": {}}}]
    else:  # not taken yet: say by whom it should be, as a pod says what it waits for
        waiting = {"reason": "NotTaken", "message": UNTAKEN}
        status["containerStatuses"] = [{"name": container, "state": {"waiting": waiting}}]
    view_meta: Obj = {
        k: meta[k]
        for k in (
            "name",
            "namespace",
            "uid",
            "labels",
            "ownerReferences",
            "creationTimestamp",
            "deletionTimestamp",
        )
        if k in meta
    }
    view_meta["annotations"] = annotations
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": view_meta,
        "spec": spec,
        "status": status,
    }


def claimable(cm: Obj, now: datetime) -> bool:
    """Whether a worker may take ``cm``: Pending, or Running with a holder gone silent."""
    state = phase(cm)
    if meta_of(cm).get("deletionTimestamp"):
        return False
    if state == "Pending":
        retry = _parse((meta_of(cm).get("annotations") or {}).get(RETRY_AFTER, ""))
        return retry is None or now >= retry
    if state != "Running":
        return False
    at = _parse((meta_of(cm).get("annotations") or {}).get(RENEWED, ""))
    return at is None or (now - at).total_seconds() > CLAIM_TTL


def _parse(text: str) -> datetime | None:
    try:
        return datetime.strptime(text, "%Y-%m-%dT%H:%M:%SZ").replace(tzinfo=UTC)
    except ValueError:
        return None


def mount_message(volume: str, code: str, message: str) -> str:
    """A FailedMount event's message as kubelet writes it for ``volume``, from an error's
    gRPC ``code`` (``NOT_FOUND``) and message."""
    name = "".join(part.title() for part in code.split("_"))
    return (
        f'MountVolume.SetUp failed for volume "{volume}" : '
        f"rpc error: code = {name} desc = {message}"
    )


def mount_failed_patch(message: str, *, now: datetime) -> Obj:
    """The merge patch that gives a claimed Bundle check back because its content could not
    be served: ``Pending`` with the store's answer (``MOUNT_FAILED``), not taken again
    before ``MOUNT_RETRY`` seconds, as kubelet retries a volume that failed to mount."""
    retry = datetime.fromtimestamp(now.timestamp() + MOUNT_RETRY, UTC)
    patch = release_patch()
    patch["metadata"]["annotations"] |= {MOUNT_FAILED: message, RETRY_AFTER: now_text(retry)}
    return patch


def mount_failure(pod: Obj) -> str:
    """The store's answer on a run's pod view (``as_pod``) whose content was not served
    ("" for a pod, or a run that is not waiting for its content)."""
    annotations = meta_of(pod).get("annotations") or {}
    if (pod.get("status") or {}).get("phase") != "Pending":
        return ""
    return str(annotations.get(MOUNT_FAILED) or "")


def claim_patch(cm: Obj, *, holder: str, node: str, now: datetime) -> Obj:
    """The merge patch that claims ``cm`` for ``holder`` on ``node`` (conditional on the
    resourceVersion the worker saw: a second claimant gets a conflict)."""
    return {
        "metadata": {
            "resourceVersion": meta_of(cm).get("resourceVersion"),
            "annotations": {
                PHASE: "Running",
                HOLDER: holder,
                NODE: node,
                RENEWED: now_text(now),
            },
        }
    }


def release_patch() -> Obj:
    """The merge patch that gives a claimed run back, unfinished (its holder is stopping):
    ``Pending`` again, so the next worker takes it at once instead of after the claim's
    expiry."""
    return {
        "metadata": {
            "annotations": {
                PHASE: "Pending",
                HOLDER: None,
                NODE: None,
                RENEWED: None,
                MOUNT_FAILED: None,
                RETRY_AFTER: None,
            },
        }
    }


def finish_patch(*, succeeded: bool, message: str, now: datetime) -> Obj:
    return {
        "metadata": {
            "annotations": {PHASE: "Succeeded" if succeeded else "Failed", FINISHED: now_text(now)}
        },
        "data": {MESSAGE_KEY: message},
    }


class Runs(Protocol):
    """What the planner reads runs from: an informer's cache of pods, or a :class:`RunView`."""

    def items(self) -> list[Obj]: ...

    def get(self, namespace: str, name: str) -> Obj | None: ...


class RunView:
    """Run pods and run ConfigMaps as one cache of pods, for the planner: the cache
    interface (``items``, ``get``) of the pod informer it replaces."""

    def __init__(self, pods: Runs, runs: Runs) -> None:
        self._pods = pods
        self._runs = runs
        self._seen: dict[tuple[str, str], tuple[str, Obj]] = {}
        """(namespace, name) -> (resourceVersion, its pod view): each version of a run
        ConfigMap is decoded once, not on every read (the planner reads them all for each
        BundleDeployment it looks at)."""

    def _view(self, cm: Obj) -> Obj:
        meta = meta_of(cm)
        key = (str(meta.get("namespace") or ""), str(meta.get("name") or ""))
        version = str(meta.get("resourceVersion") or "")
        seen = self._seen.get(key)
        if seen is not None and version and seen[0] == version:
            return seen[1]
        pod = as_pod(cm)
        if version:
            if len(self._seen) > 4 * VIEW_CACHE:  # keep it bounded: drop the oldest half
                for old in list(self._seen)[: len(self._seen) // 2]:
                    self._seen.pop(old, None)
            self._seen[key] = (version, pod)
        return pod

    def items(self) -> list[Obj]:
        return [*self._pods.items(), *(self._view(cm) for cm in self._runs.items())]

    def get(self, namespace: str, name: str) -> Obj | None:
        found = self._pods.get(namespace, name)
        if found is not None:
            return found
        cm = self._runs.get(namespace, name)
        return self._view(cm) if cm is not None else None
