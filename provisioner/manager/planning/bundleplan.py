"""The Bundle planner: ``plan(bundle, observed) -> actions``, pure.

Sits between the Bundle controller (``bundles``, which observes a Bundle,
its unpack pod and the pod's FailedMount events from the informer caches)
and ``actuate`` (which performs the actions). Handles Bundles of our
provisioner classes only (``model.CLASS_FORMATS``); the controller never
hands it others, so their status stays empty.

The flow, with upstream RukPak v0.16's phases and ``Unpacked`` reasons:

1. pin the source once (``status.resolvedSource``, see ``sources`` and
   ``resolution``): an image tag to a digest, a git branch or tag to a commit,
   an http URL to its content's digest, ConfigMaps to their checked keys. Until
   then the Bundle is ``Pending`` (UnpackPending) with the server's answer, or
   ``Failing`` (UnpackFailed) when the user must fix something (a missing
   ConfigMap or branch); both retried with backoff (a fix is picked up);
2. create the unpack pod (named after the Bundle, in the system namespace):
   ``Pending``/UnpackPending, with the image pull or FailedMount messages
   naming the reference and the registry's answer; for git and http sources a
   mount the node plugin refuses for good (bad content, refused credentials, a
   changed tarball) is ``Failing``/UnpackFailed with the plugin's message;
3. the pod runs: ``Unpacking``/Unpacking;
4. the pod ends: its termination message holds the result: ``Unpacked``/
   UnpackSuccessful, or ``Failing``/UnpackFailed with the loader's error;
   the pod is then deleted. Both are final (the content is immutable): no
   pod is made again. Until then a deleted pod is made again.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from provisioner.engine.objects import Obj, meta_of
from provisioner.instance.unpack import Result
from provisioner.manager import model
from provisioner.manager.model import Settings
from provisioner.manager.planning import sources
from provisioner.manager.planning.actions import CreatePod as CreatePod
from provisioner.manager.planning.actions import DeletePod as DeletePod
from provisioner.manager.planning.actions import RecordEvent as RecordEvent
from provisioner.manager.planning.actions import Requeue as Requeue
from provisioner.manager.planning.generate import UNPACK_CONTAINER, unpack_pod

UNPACKED = "Unpacked"
PHASE_PENDING = "Pending"
PHASE_UNPACKING = "Unpacking"
PHASE_UNPACKED = "Unpacked"
PHASE_FAILING = "Failing"
REASON_PENDING = "UnpackPending"
REASON_UNPACKING = "Unpacking"
REASON_SUCCESSFUL = "UnpackSuccessful"
REASON_FAILED = "UnpackFailed"
REASON_SIGNATURE = model.REASON_SIGNATURE
"""A ClusterBundlePolicy refused the image (``signatures``); the Bundle is Failing."""
FINAL_PHASES = frozenset({PHASE_UNPACKED, PHASE_FAILING})
PENDING_POLL = 5.0
"""While a pod pends, look again this often (a stuck mount reports through events)."""


@dataclass(frozen=True)
class Observed:
    pod: Obj | None = None
    """The unpack pod (same name as the Bundle), if any."""
    mount_failures: tuple[str, ...] = ()
    """Messages of the pod's FailedMount events, newest last."""
    now: str = "1970-01-01T00:00:00Z"


@dataclass(frozen=True)
class Resolve:
    """Pin ``source`` (``ref`` names it in messages); record it, or report why not."""

    name: str
    ref: str
    source: Obj
    namespace: str


@dataclass(frozen=True)
class WriteStatus:
    name: str
    status: Obj


# CreatePod, DeletePod, RecordEvent (an Event) and Requeue are the same actions for Bundles
# as for BundleDeployments (``actions``).
Action = Resolve | CreatePod | DeletePod | WriteStatus | RecordEvent | Requeue


def handles(bundle: Obj) -> bool:
    """Whether this provisioner reconciles ``bundle`` (upstream's provisioner filter)."""
    return model.bundle_format((bundle.get("spec") or {}).get("provisionerClassName")) is not None


def resolved_ref(bundle: Obj) -> str:
    """The pinned source in a few words; "" while the Bundle is not pinned."""
    resolved = sources.pinned(bundle)
    return sources.describe(resolved) if resolved is not None else ""


def unpacked_condition(bundle: Obj) -> Obj | None:
    for cond in (bundle.get("status") or {}).get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == UNPACKED:
            return cond
    return None


VERIFIED = "Verified"
"""Which signature policies verified the Bundle's image (``manager.signatures``), written
when the Bundle is pinned and kept by every later status."""


def status_for(
    bundle: Obj, phase: str, reason: str, message: str, now: str, *, resolved: Obj | None = None
) -> Obj:
    """The Bundle's status for a phase; keeps lastTransitionTime when the status holds."""
    old = unpacked_condition(bundle) or {}
    cond_status = "True" if phase == PHASE_UNPACKED else "False"
    same = old.get("status") == cond_status
    generation = int(meta_of(bundle).get("generation") or 0)
    status: Obj = {
        "phase": phase,
        "observedGeneration": generation,
        "conditions": [
            {
                "type": UNPACKED,
                "status": cond_status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": old.get("lastTransitionTime", now) if same else now,
                "observedGeneration": generation,
            }
        ],
    }
    verified = [
        c for c in (bundle.get("status") or {}).get("conditions") or [] if c.get("type") == VERIFIED
    ]
    status["conditions"] += verified  # written with the pin (``actuate.resolve_bundle``): kept
    if resolved is not None:
        status["resolvedSource"] = resolved
    return status


def _write(bundle: Obj, status: Obj) -> list[Action]:
    old = bundle.get("status") or {}
    if all(old.get(k) == v for k, v in status.items()):
        return []
    actions: list[Action] = [WriteStatus(model.name_of(bundle), status)]
    cond = status["conditions"][0]
    before = unpacked_condition(bundle) or {}
    if before.get("reason") != cond["reason"]:
        kind: Literal["Normal", "Warning"] = (
            "Warning" if cond["reason"] in (REASON_FAILED, REASON_SIGNATURE) else "Normal"
        )
        actions.append(RecordEvent(kind, cond["reason"], cond["message"] or status["phase"]))
    return actions


def _pending_message(pod: Obj, mount_failures: tuple[str, ...]) -> str:
    messages: list[str] = []
    statuses = (pod.get("status") or {}).get("containerStatuses") or []
    for cs in statuses:
        waiting = (cs.get("state") or {}).get("waiting") or {}
        if waiting.get("reason") in ("ErrImagePull", "ImagePullBackOff") and waiting.get("message"):
            messages.append(str(waiting["message"]))
    if mount_failures:
        messages.append(mount_failures[-1])
    return "; ".join(messages)


def _terminated(pod: Obj) -> Obj:
    for cs in (pod.get("status") or {}).get("containerStatuses") or []:
        if cs.get("name") == UNPACK_CONTAINER:
            terminated: Obj = (cs.get("state") or {}).get("terminated") or {}
            return terminated
    return {}


PERMANENT_MOUNT_CODES = (
    "code = InvalidArgument",
    "code = NotFound",
    "code = PermissionDenied",
    "code = FailedPrecondition",
    "code = ResourceExhausted",
)
"""gRPC codes in a FailedMount message that no retry of the same git or http pin cures."""


def _refused_mount(resolved: Obj, mount_failures: tuple[str, ...]) -> str:
    """The plugin's final refusal of a git or http volume, "" if none (images and
    ConfigMaps stay Pending: a pushed image or a restored ConfigMap heals them)."""
    if resolved.get("type") not in ("git", "http") or not mount_failures:
        return ""
    last = mount_failures[-1]
    if any(code in last for code in PERMANENT_MOUNT_CODES):
        _, _, desc = last.partition(" desc = ")
        return f"unpack failed: {desc or last}"
    return ""


def plan(bundle: Obj, observed: Observed, *, settings: Settings) -> list[Action]:
    """Everything to do, in order, for one Bundle of our class (see the module doc)."""
    meta = meta_of(bundle)
    name = model.name_of(bundle)
    pod = observed.pod
    status = bundle.get("status") or {}
    if meta.get("deletionTimestamp"):
        return []  # the pod goes with the Bundle (owner reference)
    delete_pod = DeletePod(settings.system_namespace, name)
    source = (bundle.get("spec") or {}).get("source") or {}
    refusal = sources.unsupported(source)
    pinned = sources.pinned(bundle)
    final = status.get("phase") == PHASE_UNPACKED or pinned is not None or refusal is not None
    if status.get("phase") in FINAL_PHASES and unpacked_condition(bundle) is not None and final:
        return [delete_pod] if pod is not None else []

    if refusal is not None:
        return _write(
            bundle, status_for(bundle, PHASE_FAILING, REASON_FAILED, refusal, observed.now)
        )

    if pinned is None:
        return [Resolve(name, sources.ref_of(source), source, settings.system_namespace)]
    stored = sources.stored(pinned)

    def write(phase: str, reason: str, message: str) -> list[Action]:
        return _write(
            bundle, status_for(bundle, phase, reason, message, observed.now, resolved=stored)
        )

    if pod is None:
        actions: list[Action] = [CreatePod(unpack_pod(bundle, pinned, settings))]
        return actions + write(PHASE_PENDING, REASON_PENDING, "")
    if meta_of(pod).get("deletionTimestamp"):
        return write(PHASE_PENDING, REASON_PENDING, "")
    phase = (pod.get("status") or {}).get("phase") or "Pending"
    if phase == "Pending":
        message = _pending_message(pod, observed.mount_failures)
        refused = _refused_mount(stored, observed.mount_failures)
        if refused:
            return [*write(PHASE_FAILING, REASON_FAILED, refused), delete_pod]
        return [
            *write(PHASE_PENDING, REASON_PENDING, message),
            Requeue(PENDING_POLL, "waiting for the unpack pod"),
        ]
    if phase == "Running":
        return write(PHASE_UNPACKING, REASON_UNPACKING, "")
    terminated = _terminated(pod)
    text = str(terminated.get("message") or "")
    result = Result.from_json(text.strip())
    if phase == "Succeeded" and result is not None and result.ok:
        kind = stored.get("type")
        message = f"Successfully unpacked the {kind} Bundle: {result.summary()}"
        unpacked = status_for(
            bundle, PHASE_UNPACKED, REASON_SUCCESSFUL, message, observed.now, resolved=stored
        )
        address = model.content_url(settings.content_base_url, name)
        if address:
            unpacked["contentURL"] = address
        return [*_write(bundle, unpacked), delete_pod]
    if result is not None and not result.ok:
        error = result.error
    else:
        why = text.strip() or str(terminated.get("reason") or f"pod phase {phase}")
        error = f"unpack failed: {why}"
    return [*write(PHASE_FAILING, REASON_FAILED, error), delete_pod]
