"""Pre-staged pivots: before a BundleDeployment moves to a new pin, the nodes fetch it.

Where it sits: in the pivot step of the manager. ``actuate.resolve_source`` has pinned a
v1alpha2 BundleDeployment's sources and, before it writes the pin (after which the
new revision installs and the pods mounting the content roll), asks :meth:`Gate.hold`.
The words are ``rukpak.common.prestage``; the node plugins' side is ``csi.node.prestage``;
the Nodes come from ``watching.nodewatch`` (an informer of the Nodes whose plugin follows
asks, label ``prestage.csi.rukpak.io/enabled``), so deciding costs no request.

``hold`` writes the ask (the BD's ``prestage.rukpak.io/images`` annotation: the pinned
images, the generation, and when) once per generation and pin, then reads the following
Nodes and answers:

The timeout is the BD's annotation ``prestage.rukpak.io/timeout`` (seconds) if set, else
``--prestage-timeout``; 0 asks nothing (the manager pivots at once).

- ``None`` (go on, pivot now): every such node answered each image ``cached``, or
  ``skipped``/``failed`` for this ask; or no node follows asks; or the ask is older than
  the timeout (a ``PrestageTimedOut`` Warning names who
  was still fetching and how far). A failed node does not hold the pivot: its publish
  fetches as it would have without pre-staging;
- a delay (seconds): the time left until the timeout. The reconcile is requeued then (one
  timer, no worker waits); before that, a change of a following Node's answer for one of
  the held images wakes it at once (:func:`woken`, called by ``nodewatch``). Progress
  alone (the bytes of a fetch) wakes nobody: it cannot change the verdict.

Without a synced Node cache (none attached, or its first list not in yet) the gate lists
the Nodes itself and looks again after ``poll`` seconds, as it did before the informer.

Events on the BundleDeployment: ``Prestaging`` when asked, ``Prestaged`` when the pivot
goes on (with who cached it, and who could not). Node plugins add ``PrestageProgress``.
The state is all in the objects (the ask's ``at`` is the clock of the timeout), so a
manager restart or a new leader carries on where the last one was.
"""

from __future__ import annotations

import json
import logging
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import UTC, datetime

from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef, meta_of
from provisioner.manager import model
from provisioner.manager.acting import events
from rukpak.common import errors
from rukpak.common import prestage as words

log = logging.getLogger("rukpak.manager")

POLL_SECONDS = 0.5
"""How soon a held pivot looks at the Nodes again when no Node cache answers (fallback)."""
DEFAULT_TIMEOUT = 120.0
"""The manager's ``--prestage-timeout`` default: the longest a pivot waits for the nodes.
Kubelet gives a volume publish 2 minutes; a fetch that takes longer would have failed the
publish anyway, so waiting longer buys little by default (a BD's annotation may say more)."""
STALE_AFTER = 60.0
"""Seconds past its timeout after which a held BD no longer gets woken (its pivot went
another way: a new spec, deleted while the manager was away)."""

NodeReader = Callable[[], "list[words.NodeView] | None"]
"""The following Nodes from a cache; None while the cache has not listed them yet."""


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


def answering(node: Obj) -> bool:
    """Whether a following Node can answer: not one whose kubelet is known down (its
    ``Ready`` condition there and not ``True``; its plugin cannot answer, and waiting for it
    would hold every pivot until the timeout). A Node with no ``Ready`` condition yet counts."""
    for cond in (node.get("status") or {}).get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == "Ready":
            return cond.get("status") == "True"
    return True


def _answers(
    node: words.NodeView | None, digests: frozenset[str]
) -> tuple[tuple[str, str] | None, ...] | None:
    """What of ``node`` can change a verdict on ``digests``: per digest its answer's state
    and the ask it answers (not the bytes); None for a node that does not follow asks."""
    if node is None or node.labels.get(words.ENABLED_LABEL) != "true":
        return None
    states = words.parse_states(node.annotations.get(words.STATE_ANNOTATION))
    out: list[tuple[str, str] | None] = []
    for digest in sorted(digests):
        answer = states.get(digest)
        out.append(None if answer is None else (answer.state, answer.asked))
    return tuple(out)


def woken(
    held: Mapping[str, frozenset[str]],
    old: words.NodeView | None,
    new: words.NodeView | None,
) -> list[str]:
    """The held BundleDeployments (name -> the digests they wait for) a Node change from
    ``old`` to ``new`` (None: absent, or not following asks) may release: those for whose
    digests the Node's answers changed, or which it started or stopped following asks.
    A fetch's progress changes nothing here."""
    return sorted(
        name for name, digests in held.items() if _answers(old, digests) != _answers(new, digests)
    )


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
        self._read: NodeReader | None = None
        self._lock = threading.Lock()
        self._held: dict[str, tuple[frozenset[str], float]] = {}
        """BD -> (the digests its pivot waits for, when its timeout falls due)."""

    def follow(self, read: NodeReader) -> None:
        """Read the following Nodes from ``read`` (a cache) instead of listing them."""
        self._read = read

    def held(self) -> dict[str, frozenset[str]]:
        """The BundleDeployments whose pivot is held, with the digests each waits for."""
        with self._lock:
            return {name: digests for name, (digests, _) in self._held.items()}

    def woken(self, old: words.NodeView | None, new: words.NodeView | None) -> list[str]:
        """The held BundleDeployments a Node change may release (:func:`woken`); those long
        past their timeout are forgotten."""
        now = self.clock()
        with self._lock:
            for name in [n for n, (_, due) in self._held.items() if due + STALE_AFTER < now]:
                del self._held[name]
            held = {name: digests for name, (digests, _) in self._held.items()}
        return woken(held, old, new)

    def forget(self, name: str) -> None:
        """BD ``name`` no longer waits (gone, or its pivot went on)."""
        with self._lock:
            self._held.pop(name, None)

    def nodes(self, kube: Kube) -> tuple[list[words.NodeView], bool]:
        """The following Nodes, and whether they came from the cache (no request)."""
        if self._read is not None:
            cached = self._read()
            if cached is not None:
                return cached, True
        items, _ = kube.list("v1", "Node", label_selector=f"{words.ENABLED_LABEL}=true")
        return [words.NodeView.of(item) for item in items if answering(item)], False

    def hold(self, kube: Kube, bd: Obj, images: Sequence[str], *, generation: int) -> float | None:
        """None to pivot now; else the seconds after which to ask again."""
        name = model.name_of(bd)
        wait = self._hold(kube, bd, images, generation=generation)
        if wait is None:
            self.forget(name)
        return wait

    def _hold(self, kube: Kube, bd: Obj, images: Sequence[str], *, generation: int) -> float | None:
        name = model.name_of(bd)
        pinned = sorted({i for i in images if words.is_pinned(i)})
        timeout = timeout_of(bd, self.timeout)
        if not pinned or timeout <= 0:
            return None
        if len(pinned) > words.MAX_IMAGES:
            log.info("msg='too many images to pre-stage' bd=%s images=%d", name, len(pinned))
            return None
        asked_images, asked_generation, at = ask_of(bd)
        fresh = asked_images != pinned or asked_generation != generation or not at
        started = None if fresh else _at(at)
        due = (self.clock() if started is None else started) + timeout
        with self._lock:  # before the Nodes are read: an answer after the read wakes it
            self._held[name] = (frozenset(words.digest_of(i) for i in pinned), due)
        try:
            nodes, cached = self.nodes(kube)
        except errors.RukpakError as exc:  # not allowed to read Nodes, say: pivot as before
            log.warning("msg='cannot read nodes; not pre-staging' error=%r", exc.message)
            return None
        if not nodes:
            return None
        if fresh:
            self._ask(kube, bd, pinned, generation, nodes, timeout)
            return timeout if cached else self.poll
        verdict = words.judge(nodes, [words.digest_of(i) for i in pinned], asked=at)
        if verdict.ready:
            self._event(
                kube, bd, "Normal", "Prestaged", f"{', '.join(pinned)}: {verdict.summary()}"
            )
            return None
        left = due - self.clock()
        if started is not None and left <= 0:
            message = (
                f"pivoting without waiting longer than {timeout:g}s for "
                f"{', '.join(pinned)}: {verdict.summary()}"
            )
            self._event(kube, bd, "Warning", "PrestageTimedOut", message)
            return None
        if not cached:
            return self.poll
        return min(timeout, max(left, 0.01))

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
