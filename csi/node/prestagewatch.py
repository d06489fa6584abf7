"""The node plugin's side of pre-staging in the cluster: follow the asks, answer on the Node.

Where it sits: the Kubernetes adapter of ``csi.node.prestage`` (as ``csi.node.policies`` is
for signature policies), started by ``csi.plugin.main`` with ``--prestage=follow``. The
core's informer (``rukpak.kube.listwatch`` over ``csi.node.apisource``) follows
BundleDeployments and queues each new ask
(``rukpak.common.prestage.REQUEST_ANNOTATION``, keyed by image and the ask's ``at``);
``WORKERS`` threads stage them (``Prestager.stage``); every answer is written to this
node's state annotation, and the advert labels follow the cache (after each answer and
every ``ADVERT_SECONDS``). A fetch under way also shows as metrics
(``rukpak_csi_prestage_fetched_bytes`` / ``rukpak_csi_prestage_total_bytes`` by digest) and
as ``PrestageProgress`` events on the BundleDeployment at each quarter.

It writes only its own Node (``--node-id``), with a merge patch of its own keys: the
``prestage.csi.rukpak.io/enabled`` label at start, the state annotation, and labels under
``cached.csi.rukpak.io/``. A failed write is logged and tried again with the next answer.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import queue
import threading
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from kubernetes import client

from csi.node.apisource import ClientSource
from csi.node.prestage import Prestager
from rukpak.common import prestage as words
from rukpak.common.metrics import OwnRegistry
from rukpak.kube import listwatch

log = logging.getLogger(__name__)

GROUP, VERSION, PLURAL = "core.rukpak.io", "v1alpha2", "bundledeployments"
WORKERS = 2
"""Asks fetched at once on one node."""
ADVERT_SECONDS = 10.0
WATCH_SECONDS = 300
RETRY_SECONDS = 5.0
REQUEST_TIMEOUT = 10.0
SEEN_MAX = 1024
"""Asks remembered as handled (the oldest forgotten first)."""
EVENT_NAMESPACE = "default"
"""Events about a cluster-scoped BundleDeployment live here (as kubectl shows them)."""
EVENT_SOURCE = "csi.rukpak.io"
ADVERT_MAX = 16


class PrestageMetrics:
    """The pre-stage gauges and counter, in the plugin's registry."""

    def __init__(self, registry: OwnRegistry) -> None:
        self.fetched = registry.gauge(
            "rukpak_csi_prestage_fetched_bytes",
            "Bytes of a pre-staged image in the content store (committed or being fetched)",
            ["digest"],
        )
        self.total = registry.gauge(
            "rukpak_csi_prestage_total_bytes",
            "Bytes of a pre-staged image's blobs (config and layers), from its manifest",
            ["digest"],
        )
        self.answers = registry.counter(
            "rukpak_csi_prestage_answers", "Pre-stage asks answered, by answer", ["state"]
        )

    def progress(self, digest: str, answer: words.Answer) -> None:
        if answer.total:
            self.fetched.labels(digest).set(answer.bytes)
            self.total.labels(digest).set(answer.total)

    def forget(self, digest: str) -> None:
        for gauge in (self.fetched, self.total):
            with contextlib.suppress(KeyError):
                gauge.remove(digest)


class PrestageWatch:
    """Follows the cluster's pre-stage asks for one node."""

    def __init__(
        self,
        api: client.ApiClient,
        *,
        node: str,
        prestager: Prestager,
        advertise_max: int = ADVERT_MAX,
        metrics: PrestageMetrics | None = None,
    ) -> None:
        self.node = node
        self.prestager = prestager
        self.advertise_max = advertise_max
        self.metrics = metrics
        self._core = client.CoreV1Api(api)
        self._informer = listwatch.Informer(
            ClientSource(api, plurals={"BundleDeployment": PLURAL}),
            f"{GROUP}/{VERSION}",
            "BundleDeployment",
            on_add=self.consider,
            on_update=lambda old, new: self.consider(new),
            watch_timeout=WATCH_SECONDS,
        )
        self._asks: queue.Queue[tuple[str, str, str]] = queue.Queue()
        self._seen: dict[tuple[str, str], None] = {}
        self._states: dict[str, words.Answer] = {}
        self._labels: dict[str, str] = {}
        self._quarters: dict[tuple[str, str], int] = {}
        self._lock = threading.Lock()
        self._write_lock = threading.Lock()
        self._stop = threading.Event()
        self._threads: list[threading.Thread] = []

    # --- lifecycle ----------------------------------------------------------------------

    def start(self) -> PrestageWatch:
        self._informer.start()
        for i in range(WORKERS):
            self._add_thread(self._run_worker, f"prestage-{i}")
        self._add_thread(self._run_advert, "prestage-advert")
        return self

    def _add_thread(self, target: Callable[[], None], name: str) -> None:
        thread = threading.Thread(target=target, name=name, daemon=True)
        thread.start()
        self._threads.append(thread)

    def stop(self) -> None:
        """Stop following asks, and take the Node's ``enabled`` label back when this plugin
        set it: a plugin that is gone for good (its DaemonSet pod deleted, the node left
        out of it) must not hold every pivot until the manager's timeout. A restarted
        plugin labels its Node again at start."""
        self._stop.set()
        self._informer.stop(timeout=0)
        with self._lock:
            labelled = self._labels.get(words.ENABLED_LABEL) == "true"
        if not labelled:
            return
        try:
            self._patch({words.ENABLED_LABEL: None}, {})
        except Exception as exc:  # the manager then waits for this node until its timeout
            log.warning("msg=%r node=%s error=%r", "cannot unlabel node", self.node, str(exc)[:300])

    # --- the Node ---------------------------------------------------------------------

    def _read_node(self) -> None:
        node = self._core.read_node(self.node, _request_timeout=REQUEST_TIMEOUT)
        meta = node.metadata or client.V1ObjectMeta()
        with self._lock:
            self._labels = dict(meta.labels or {})
            if not self._states:  # what an earlier process of this plugin answered
                self._states = words.parse_states(
                    (meta.annotations or {}).get(words.STATE_ANNOTATION)
                )

    def _patch(self, labels: dict[str, str | None], annotations: dict[str, str]) -> None:
        body: dict[str, Any] = {"metadata": {}}
        if labels:
            body["metadata"]["labels"] = labels
        if annotations:
            body["metadata"]["annotations"] = annotations
        if not body["metadata"]:
            return
        with self._write_lock:
            node = self._core.patch_node(self.node, body, _request_timeout=REQUEST_TIMEOUT)
        with self._lock:
            self._labels = dict((node.metadata or client.V1ObjectMeta()).labels or {})

    def _answered(self, bd: str, digest: str, answer: words.Answer) -> None:
        with self._lock:
            self._states[digest] = answer
            text = words.dump_states(self._states)
            kept = words.parse_states(text)
            for gone in set(self._states) - set(kept):
                if self.metrics is not None:
                    self.metrics.forget(gone)
            self._states = dict(kept)
        if self.metrics is not None:
            self.metrics.progress(digest, answer)
            if answer.state != words.FETCHING:
                self.metrics.answers.labels(answer.state).inc()
        # the event first: whoever acts on the answer (the manager's pivot) finds it posted
        self._progress_event(bd, digest, answer)
        try:
            self._patch({}, {words.STATE_ANNOTATION: text})
        except Exception as exc:  # the next answer writes again
            log.warning("msg=%r node=%s error=%r", "cannot write answer", self.node, str(exc)[:300])

    def advertise(self) -> None:
        """Make the advert labels match the cache now."""
        with self._lock:
            labels = dict(self._labels)
        patch = words.advert_patch(
            labels, self.prestager.cached_newest_first(), limit=self.advertise_max
        )
        if patch:
            self._patch(patch, {})

    # --- the threads ------------------------------------------------------------------

    def _run_advert(self) -> None:
        while not self._stop.is_set():
            try:
                self._read_node()
                self._patch({words.ENABLED_LABEL: "true"}, {})
                break
            except Exception as exc:
                log.warning("msg=%r node=%s error=%r", "cannot read node", self.node, str(exc))
                self._stop.wait(RETRY_SECONDS)
        while not self._stop.is_set():
            try:
                self.advertise()
            except Exception as exc:
                log.warning("msg=%r error=%r", "cannot advertise", str(exc)[:300])
            self._stop.wait(ADVERT_SECONDS)

    def _run_worker(self) -> None:
        while not self._stop.is_set():
            try:
                bd, image, asked = self._asks.get(timeout=1.0)
            except queue.Empty:
                continue
            digest = words.digest_of(image) if words.is_pinned(image) else ""
            report = functools.partial(self._answered, bd, digest) if digest else None
            try:
                answer = self.prestager.stage(image, asked=asked, report=report)
            except Exception as exc:  # never let one ask stop the worker
                log.exception("msg=%r image=%s", "pre-stage failed", image)
                answer = words.Answer(words.FAILED, message=str(exc)[:200], asked=asked)
            if digest:
                self._answered(bd, digest, answer)
                try:
                    self.advertise()
                except Exception as exc:
                    log.warning("msg=%r error=%r", "cannot advertise", str(exc)[:300])

    def consider(self, bd: dict[str, Any]) -> int:
        """Queue the asks of ``bd`` not seen before; how many were queued."""
        meta = bd.get("metadata") or {}
        text = (meta.get("annotations") or {}).get(words.REQUEST_ANNOTATION)
        images = words.parse_request(text)
        if not images:
            return 0
        asked = words.asked_at(text)
        queued = 0
        with self._lock:
            for image in images:
                key = (image, asked)
                if key in self._seen:
                    continue
                self._seen[key] = None
                while len(self._seen) > SEEN_MAX:
                    del self._seen[next(iter(self._seen))]
                self._asks.put((str(meta.get("name") or ""), image, asked))
                queued += 1
        return queued

    # --- events -----------------------------------------------------------------------

    def _progress_event(self, bd: str, digest: str, answer: words.Answer) -> None:
        """``PrestageProgress`` on the BundleDeployment at 0, 25, 50, 75 and 100 percent of
        a fetch (a cached-at-once or skipped answer makes none)."""
        if not bd or not answer.total:
            return
        quarter = 4 if answer.state == words.CACHED else answer.percent // 25
        key = (bd, digest)
        with self._lock:
            if self._quarters.get(key, -1) >= quarter:
                return
            self._quarters[key] = quarter
            while len(self._quarters) > SEEN_MAX:
                del self._quarters[next(iter(self._quarters))]
        mib = f"{answer.bytes / 2**20:.1f}/{answer.total / 2**20:.1f} MiB"
        message = f"node {self.node}: {answer.state} {digest} {mib} ({answer.percent}%)"
        try:
            self._event(bd, "PrestageProgress", message)
        except Exception as exc:  # an event is a courtesy
            log.warning("msg=%r bd=%s error=%r", "cannot post event", bd, str(exc)[:200])

    def _event(self, bd: str, reason: str, message: str) -> None:
        now = datetime.now(UTC)
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{bd}.", namespace=EVENT_NAMESPACE),
            involved_object=client.V1ObjectReference(
                api_version=f"{GROUP}/{VERSION}", kind="BundleDeployment", name=bd
            ),
            type="Normal",
            reason=reason,
            message=message,
            source=client.V1EventSource(component=EVENT_SOURCE, host=self.node),
            reporting_component=EVENT_SOURCE,
            reporting_instance=self.node,
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        self._core.create_namespaced_event(EVENT_NAMESPACE, body, _request_timeout=REQUEST_TIMEOUT)
