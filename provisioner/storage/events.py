"""Kubernetes Events about claims and volumes: what ``kubectl describe pvc`` shows.

Where it sits: ``provisioner.storage.controller`` records ``Provisioning``,
``ProvisioningSucceeded``, ``ProvisioningFailed`` (with the CSI error, which
says what to fix) and ``VolumeFailedDelete``, the reasons the external-
provisioner sidecar uses. Like client-go's event recorder, a repeat of the same
event (object, type, reason, message) bumps ``count`` and ``lastTimestamp`` of
the Event already written instead of creating another; Events of cluster-scoped
objects (PVs) go to the ``default`` namespace. Recording never raises: an Event
that cannot be written is logged and dropped.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections import OrderedDict
from datetime import UTC, datetime
from typing import Protocol

from provisioner.engine.objects import Obj, ObjectRef
from rukpak.common import errors

log = logging.getLogger(__name__)

MAX_REMEMBERED = 4096
MAX_MESSAGE = 1024  # the API server refuses longer Event messages


class EventSink(Protocol):
    def create(self, obj: Obj) -> Obj: ...
    def merge_patch(self, ref: ObjectRef, patch: Obj) -> Obj: ...


def _now() -> str:
    return datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


class Recorder:
    """Writes Events through ``sink`` (``provisioner.engine.kube.kube.Kube``); thread-safe."""

    def __init__(self, sink: EventSink, *, component: str, host: str = "") -> None:
        self.sink = sink
        self.component = component
        self.host = host or os.environ.get("NODE_NAME", "")
        self._lock = threading.Lock()
        self._seen: OrderedDict[tuple[str, str, str, str], tuple[str, str, int]] = OrderedDict()

    def event(self, obj: Obj, event_type: str, reason: str, message: str) -> None:
        meta = obj.get("metadata") or {}
        namespace = meta.get("namespace") or "default"
        if len(message) > MAX_MESSAGE:
            message = message[: MAX_MESSAGE - 3] + "..."
        key = (str(meta.get("uid", "")), event_type, reason, message)
        with self._lock:
            seen = self._seen.get(key)
            if seen is not None:
                self._seen.move_to_end(key)
        try:
            if seen is not None:
                name, ns, count = seen
                self.sink.merge_patch(
                    ObjectRef("", "v1", "Event", ns, name),
                    {"count": count + 1, "lastTimestamp": _now()},
                )
                self._remember(key, (name, ns, count + 1))
                return
        except errors.NotFound:
            pass  # expired or deleted: write a new one
        except errors.RukpakError as err:
            log.warning("msg=%r reason=%s error=%r", "cannot update event", reason, err.message)
            return
        name = f"{meta.get('name', 'object')}.{time.time_ns():x}"
        now = _now()
        body: Obj = {
            "apiVersion": "v1",
            "kind": "Event",
            "metadata": {"name": name, "namespace": namespace},
            "involvedObject": {
                "kind": obj.get("kind"),
                "apiVersion": obj.get("apiVersion"),
                "namespace": meta.get("namespace"),
                "name": meta.get("name"),
                "uid": meta.get("uid"),
                "resourceVersion": meta.get("resourceVersion"),
            },
            "type": event_type,
            "reason": reason,
            "message": message,
            "count": 1,
            "firstTimestamp": now,
            "lastTimestamp": now,
            "source": {"component": self.component, **({"host": self.host} if self.host else {})},
            "reportingComponent": self.component,
            "reportingInstance": self.host,
        }
        try:
            self.sink.create(body)
        except errors.RukpakError as err:
            log.warning("msg=%r reason=%s error=%r", "cannot write event", reason, err.message)
            return
        self._remember(key, (name, namespace, 1))

    def _remember(self, key: tuple[str, str, str, str], value: tuple[str, str, int]) -> None:
        with self._lock:
            self._seen[key] = value
            self._seen.move_to_end(key)
            while len(self._seen) > MAX_REMEMBERED:
                self._seen.popitem(last=False)
