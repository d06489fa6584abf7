"""The node plugin's view of the cluster's ClusterBundlePolicy objects and key Secrets.

Where it sits: the one place the node plugin reads the Kubernetes API (with
``--signature-policies=cluster``, as the DaemonSet runs it). A thread lists and watches
the policies with the core's informer (``rukpak.kube.listwatch`` over the official client,
``csi.node.apisource``), parses them (``rukpak.signing.policy.parse``, lenient: a
broken policy fails closed) and keeps the current set for the publish spine's gate
(``rukpak.signing.gate``, built in ``csi.plugin.main``); :meth:`PolicyWatch.read_secret`
reads a key Secret of the system namespace when a check needs it (never cached, never
logged).

Until the first list has answered, :meth:`PolicyWatch.policies` waits (up to
``SYNC_WAIT`` seconds) and then refuses with UNAVAILABLE: a publish never passes
unchecked because the plugin has not heard from the API server yet. A cluster without the
CRD has no policies (looked for again after the informer's backoff, at most 30 s). A broken
watch is re-listed after a pause; the last known set stays in force meanwhile.

:meth:`PolicyWatch.post_event` posts an event on a pod whose volume's signatures were
checked (``csi.node.publish``): queued (at most ``EVENT_QUEUE``; more are dropped with a
log line) and sent by a thread of its own, so a publish never waits for the API server.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
from collections.abc import Callable
from datetime import UTC, datetime

from kubernetes import client, config
from kubernetes.client.exceptions import ApiException

from csi.node.apisource import ClientSource
from csi.volume.request import PodRef
from rukpak.common import errors
from rukpak.kube import listwatch
from rukpak.signing import policy as signing

log = logging.getLogger(__name__)

SYNC_WAIT = 10.0
"""Seconds a publish waits for the first list of policies before it is refused."""
WATCH_SECONDS = 300
REQUEST_TIMEOUT = 10.0
API_VERSION = f"{signing.GROUP}/{signing.VERSION}"
KIND = "ClusterBundlePolicy"
EVENT_QUEUE = 256
"""Events waiting to be sent at most; more are dropped (a log line says so)."""
EVENT_SOURCE = "csi.rukpak.io"
EVENT_MESSAGE_MAX = 1024


class PolicyWatch:
    """The current ClusterBundlePolicy set, followed from the API server."""

    def __init__(self, api: client.ApiClient, *, namespace: str, node: str = "") -> None:
        self.node = node  # the events' source host
        self._events: queue.Queue[tuple[PodRef, str, str, str]] = queue.Queue(EVENT_QUEUE)
        self._sender: threading.Thread | None = None
        self._stop = threading.Event()
        self._core = client.CoreV1Api(api)
        self.namespace = namespace
        self._lock = threading.Lock()
        self._current: list[signing.Policy] = []
        self._informer = listwatch.Informer(
            ClientSource(api, plurals={KIND: signing.PLURAL}, absent_is_empty=True),
            API_VERSION,
            KIND,
            on_sync=self._refresh,
            on_change=lambda obj: self._refresh(),
            watch_timeout=WATCH_SECONDS,
        )

    @classmethod
    def from_environment(cls, *, namespace: str, node: str = "") -> PolicyWatch:
        """A watch with the pod's in-cluster credentials, or $KUBECONFIG's when set."""
        cfg = client.Configuration()
        loader: Callable[..., None] = (
            config.load_kube_config
            if os.environ.get("KUBECONFIG")
            else config.load_incluster_config
        )
        try:
            loader(client_configuration=cfg)
        except config.ConfigException as exc:
            raise errors.FailedPrecondition(
                f"--signature-policies=cluster needs in-cluster credentials or $KUBECONFIG: {exc}"
            ) from None
        return cls(client.ApiClient(cfg), namespace=namespace, node=node)

    def start(self) -> PolicyWatch:
        self._informer.start()
        return self

    def stop(self) -> None:
        self._stop.set()
        self._informer.stop(timeout=0)

    def post_event(self, pod: PodRef, kind: str, reason: str, message: str) -> None:
        """Queue an event (``kind`` Normal or Warning) on ``pod``; see the module docstring."""
        try:
            self._events.put_nowait((pod, kind, reason, message))
        except queue.Full:
            log.warning("msg=%r pod=%s reason=%s", "event dropped: too many waiting", pod, reason)
            return
        with self._lock:
            if self._sender is None:
                self._sender = threading.Thread(
                    target=self._send_events, name="pod-events", daemon=True
                )
                self._sender.start()

    def _send_events(self) -> None:
        while not self._stop.is_set():
            try:
                pod, kind, reason, message = self._events.get(timeout=1.0)
            except queue.Empty:
                continue
            try:
                self._send(pod, kind, reason, message)
            except Exception as exc:  # an event is a courtesy: log and go on
                log.warning(
                    "msg=%r pod=%s reason=%s error=%r", "cannot post event", pod, reason, str(exc)
                )

    def _send(self, pod: PodRef, kind: str, reason: str, message: str) -> None:
        now = datetime.now(UTC)
        body = client.CoreV1Event(
            metadata=client.V1ObjectMeta(generate_name=f"{pod.name}.", namespace=pod.namespace),
            involved_object=client.V1ObjectReference(
                api_version="v1",
                kind="Pod",
                namespace=pod.namespace,
                name=pod.name,
                uid=pod.uid or None,
            ),
            type=kind,
            reason=reason,
            message=message[:EVENT_MESSAGE_MAX],
            source=client.V1EventSource(component=EVENT_SOURCE, host=self.node or None),
            reporting_component=EVENT_SOURCE,
            reporting_instance=self.node or EVENT_SOURCE,
            first_timestamp=now,
            last_timestamp=now,
            count=1,
        )
        self._core.create_namespaced_event(pod.namespace, body, _request_timeout=REQUEST_TIMEOUT)

    @property
    def synced(self) -> bool:
        return self._informer.synced

    def policies(self) -> list[signing.Policy]:
        """The policies in force; UNAVAILABLE when none could be listed yet."""
        if not self._informer.wait_synced(SYNC_WAIT):
            raise errors.Unavailable(
                "the node plugin has not yet listed the ClusterBundlePolicy objects from the "
                "API server, so it cannot tell whether this image must be signed; retrying"
            )
        with self._lock:
            return self._current

    def read_secret(self, name: str) -> bytes:
        """The PEM in Secret ``name`` of the system namespace: its ``cosign.pub`` entry, or
        its only entry. NotFound or InvalidArgument with what to fix."""
        try:
            secret = self._core.read_namespaced_secret(
                name, self.namespace, _request_timeout=REQUEST_TIMEOUT
            )
        except ApiException as exc:
            if exc.status == 404:
                raise errors.NotFound(
                    f"Secret {self.namespace}/{name} not found: create it in the system "
                    f"namespace with the public key as {signing.SECRET_KEY}"
                ) from None
            raise errors.Unavailable(
                f"cannot read Secret {self.namespace}/{name}: {exc.status} {exc.reason}"
            ) from None
        return signing.key_from_secret(secret.data or {}, f"{self.namespace}/{name}")

    def _refresh(self) -> None:
        """Parse the informer's objects again (a handful; a change is rare)."""
        current = sorted(
            (signing.parse(obj, strict=False) for obj in self._informer.items()),
            key=lambda p: p.name,
        )
        with self._lock:
            changed = [(p.name, p.generation) for p in current] != [
                (p.name, p.generation) for p in self._current
            ]
            self._current = current
        if changed:
            log.info(
                "msg=%r policies=%s",
                "signature policies loaded",
                ",".join(f"{p.name}@{p.generation}" for p in current) or "-",
            )
