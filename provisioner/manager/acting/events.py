"""Events about RukPak's own objects: what ``kubectl describe bd`` (or ``bundle``) shows.

Where it sits: under ``actuate`` (the manager's writer) and, through
``provisioner.api``, the helm provisioner's controller. ``record`` writes one
core/v1 Event about a Bundle or BundleDeployment, the way the upstream manager
does: cluster-scoped objects have their Events in ``default``, named after the
object with a generated suffix, the message cut at the 1024 characters the API
server accepts. Recording is best effort: an Event that cannot be written is
logged and dropped, never raised. (PVC and PV events, which repeat, go through
``storage.events.Recorder``.)
"""

from __future__ import annotations

import logging

from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj
from provisioner.manager import model
from rukpak.common import errors

log = logging.getLogger("rukpak.events")

MAX_MESSAGE = 1024


def record(
    kube: Kube,
    obj: Obj,
    *,
    kind: str,
    type_: str,
    reason: str,
    message: str,
    component: str,
    now: str,
) -> None:
    """A ``type_`` (Normal, Warning) Event about ``obj``, a ``kind`` of RukPak's API
    group, from ``component`` at ``now``; best effort."""
    meta = obj.get("metadata") or {}
    body = {
        "apiVersion": "v1",
        "kind": "Event",
        "metadata": {"generateName": f"{meta.get('name')}.", "namespace": "default"},
        "involvedObject": {
            "apiVersion": model.API_VERSION,
            "kind": kind,
            "name": meta.get("name"),
            "uid": meta.get("uid"),
            "resourceVersion": meta.get("resourceVersion"),
        },
        "type": type_,
        "reason": reason,
        "message": message[:MAX_MESSAGE],
        "source": {"component": component},
        "reportingComponent": component,
        "firstTimestamp": now,
        "lastTimestamp": now,
        "count": 1,
    }
    try:
        kube.create(body)
    except errors.RukpakError as err:
        log.warning("msg='cannot record event' %s=%s error=%r", kind, meta.get("name"), err.message)
