"""Pre-staged pivots: before a BundleDeployment moves to a new pin, the nodes fetch it.

Where it sits: in the pivot step of the manager. ``actuate.resolve_source`` has pinned a
v1alpha2 BundleDeployment's sources and, before it writes the pin (after which the
new revision installs and the pods mounting the content roll), asks :meth:`Gate.hold`.
The words are ``rukpak.common.prestage``; the node plugins' side is ``csi.node.prestage``.

``hold`` writes the ask (the BD's ``prestage.rukpak.io/images`` annotation: the pinned
images, the generation, and when) once per generation and pin, then reads the Nodes whose
plugin follows asks (label ``prestage.csi.rukpak.io/enabled``) and answers:

The timeout is the BD's annotation ``prestage.rukpak.io/timeout`` (seconds) if set, else
``--prestage-timeout``; 0 asks nothing (the default: the manager pivots at once).

- ``None`` (go on, pivot now): every such node answered each image ``cached``, or
  ``skipped``/``failed`` for this ask; or no node follows asks; or the ask is older than
  the timeout (a ``PrestageTimedOut`` Warning names who
  was still fetching and how far). A failed node does not hold the pivot: its publish
  fetches as it would have without pre-staging;
- a delay (seconds) to look again: some node is fetching, or has not answered yet. The
  reconcile is requeued, no worker waits.

Events on the BundleDeployment: ``Prestaging`` when asked, ``Prestaged`` when the pivot
goes on (with who cached it, and who could not). Node plugins add ``PrestageProgress``.
The state is all in the objects (the ask's ``at`` is the clock of the timeout), so a
manager restart or a new leader carries on where the last one was.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable, Sequence
from datetime import UTC, datetime

from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef, meta_of
from provisioner.manager import model
from provisioner.manager.acting import events
from rukpak.common import errors
from rukpak.common import prestage as words

log = logging.getLogger("rukpak.manager")

POLL_SECONDS = 0.5
"""How soon a held pivot looks at the Nodes again."""
DEFAULT_TIMEOUT = 300.0


def ask_of(bd: Obj) -> tuple[list[str], int | None, str]:
    """The images, generation and ``at`` of the BD's current ask (``[]`` if none)."""
    text = (meta_of(bd).get("annotations") or {}).get(words.REQUEST_ANNOTATION)
    try:
        doc = json.loads(text) if text else {}
    except ValueError:
        doc = {}
    generation = doc.get("generation") if isinstance(doc, dict) else None
    return (
        words.parse_request(text),
        generation if isinstance(generation, int) else None,
        words.asked_at(text),
    )


def ask_value(images: Sequence[str], generation: int, at: str) -> str:
    doc = json.loads(words.request_value(images, at))
    doc["generation"] = generation
    return json.dumps(doc, sort_keys=True)


def timeout_of(bd: Obj, default: float) -> float:
    """The BD's own timeout (:data:`words.TIMEOUT_ANNOTATION`) or ``default``; a value
    that is not a number of seconds from 0 to a day is ignored."""
    text = (meta_of(bd).get("annotations") or {}).get(words.TIMEOUT_ANNOTATION)
    try:
        value = float(text) if text is not None else default
    except ValueError:
        return default
    return value if 0 <= value <= 86400 else default


def _at(text: str) -> float | None:
    try:
        return datetime.fromisoformat(text.replace("Z", "+00:00")).timestamp()
    except ValueError:
        return None


class Gate:
    """Holds a pivot until its images are pre-staged (see the module docstring)."""

    def __init__(
        self,
        *,
        timeout: float = DEFAULT_TIMEOUT,
        clock: Callable[[], float] = time.time,
        poll: float = POLL_SECONDS,
    ) -> None:
        self.timeout = timeout
        self.clock = clock
        self.poll = poll

    def nodes(self, kube: Kube) -> list[words.NodeView]:
        items, _ = kube.list("v1", "Node", label_selector=f"{words.ENABLED_LABEL}=true")
        return [words.NodeView.of(item) for item in items]

    def hold(self, kube: Kube, bd: Obj, images: Sequence[str], *, generation: int) -> float | None:
        """None to pivot now; else the seconds after which to ask again."""
        pinned = sorted({i for i in images if words.is_pinned(i)})
        timeout = timeout_of(bd, self.timeout)
        if not pinned or timeout <= 0:
            return None
        if len(pinned) > words.MAX_IMAGES:
            log.info(
                "msg='too many images to pre-stage' bd=%s images=%d", model.name_of(bd), len(pinned)
            )
            return None
        try:
            nodes = self.nodes(kube)
        except errors.RukpakError as exc:  # not allowed to read Nodes, say: pivot as before
            log.warning("msg='cannot read nodes; not pre-staging' error=%r", exc.message)
            return None
        if not nodes:
            return None
        asked_images, asked_generation, at = ask_of(bd)
        if asked_images != pinned or asked_generation != generation or not at:
            self._ask(kube, bd, pinned, generation, nodes, timeout)
            return self.poll
        verdict = words.judge(nodes, [words.digest_of(i) for i in pinned], asked=at)
        started = _at(at)
        if verdict.ready:
            self._event(
                kube, bd, "Normal", "Prestaged", f"{', '.join(pinned)}: {verdict.summary()}"
            )
            return None
        if started is not None and self.clock() - started >= timeout:
            message = (
                f"pivoting without waiting longer than {timeout:g}s for "
                f"{', '.join(pinned)}: {verdict.summary()}"
            )
            self._event(kube, bd, "Warning", "PrestageTimedOut", message)
            return None
        return self.poll

    def _ask(
        self,
        kube: Kube,
        bd: Obj,
        images: list[str],
        generation: int,
        nodes: list[words.NodeView],
        timeout: float,
    ) -> None:
        at = datetime.fromtimestamp(self.clock(), UTC).isoformat(timespec="milliseconds")
        at = at.replace("+00:00", "Z")
        value = ask_value(images, generation, at)
        name = model.name_of(bd)
        version = str(bd.get("apiVersion") or model.API_VERSION_V2).rpartition("/")[2]
        ref = ObjectRef(model.GROUP, version, model.BUNDLE_DEPLOYMENT, "", name)
        kube.merge_patch(ref, {"metadata": {"annotations": {words.REQUEST_ANNOTATION: value}}})
        log.info("msg='pre-stage asked' bd=%s images=%s nodes=%d", name, images, len(nodes))
        self._event(
            kube,
            bd,
            "Normal",
            "Prestaging",
            f"asked {len(nodes)} node(s) to fetch {', '.join(images)} before the pivot "
            f"(at most {timeout:g}s)",
        )

    @staticmethod
    def _event(kube: Kube, bd: Obj, type_: str, reason: str, message: str) -> None:
        now = datetime.now(UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
        events.record(
            kube,
            bd,
            kind=model.BUNDLE_DEPLOYMENT,
            type_=type_,
            reason=reason,
            message=message,
            component="rukpak-manager",
            now=now,
        )
