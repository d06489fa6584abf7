"""Prometheus metrics of the node plugin, and its ``/healthz``, on one loopback HTTP port.

Where it sits: one ``Metrics`` object is created in ``csi.plugin.main`` and
handed to the servicers (``rpc_done``, via ``csi.rpc.errors``), the image
caches of both modes (``cache_result``, ``pulled``: ``rukpak.image.cache`` and
``csi.fuse.images``, so a FUSE publish moves the families a bind publish moves; the
cache's bytes are both stores' together) and the registration servicer
(``registration``). :func:`serve` exposes ``/metrics`` (``prometheus_client``,
its own registry so several plugins can live in one test process) and
``/healthz``, whose answer comes from the ``health`` callable ``csi.plugin.health``
builds: it probes the CSI socket and checks kubelet accepted the plugin.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import prometheus_client

from rukpak.common import httpanswer
from rukpak.common.metrics import OwnRegistry

CONTENT_TYPE = prometheus_client.CONTENT_TYPE_LATEST

# Publishes are mostly cache hits (milliseconds); cold pulls take seconds.
RPC_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120)
PULL_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60, 120, 300, 600)

SIDECAR_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 25, 50, 120, 300, 600)
"""kubernetes-csi's csi-lib-utils buckets for its ``csi_*_operations_seconds``."""

PLUGIN_OPERATIONS = "csi_plugin_operations_seconds"
"""csi-lib-utils' name for a driver's own gRPC calls (``SubsystemPlugin``): what this plugin
serves. ``csi_sidecar_operations_seconds`` is the name for a sidecar's calls to a driver."""
DEPRECATED_SIDECAR_OPERATIONS = "csi_sidecar_operations_seconds"
"""The same histogram under the sidecars' name, as earlier releases exported it: deprecated,
kept for one release (docs/operations.md, "Metrics") so dashboards can move over."""
_SERVICES = {
    "GetPluginInfo": "Identity",
    "GetPluginCapabilities": "Identity",
    "Probe": "Identity",
}


def full_method(method: str) -> str:
    """The gRPC method path kubernetes-csi's sidecars label with (``/csi.v1.Node/...``)."""
    if method.startswith("/"):
        return method
    service = _SERVICES.get(method) or ("Node" if method.startswith("Node") else "Controller")
    return f"/csi.v1.{service}/{method}"


def go_code(code: str) -> str:
    """A gRPC status code as Go's ``codes.Code.String`` writes it (``ALREADY_EXISTS`` ->
    ``AlreadyExists``), as the sidecars label it."""
    return code if code == "OK" else "".join(p.capitalize() for p in code.split("_"))


Health = Callable[[], tuple[bool, str]]
"""Whether the plugin is healthy, and a one-line reason."""


class Metrics(OwnRegistry):
    """The plugin's metrics; every method is thread-safe. ``published`` is read at scrape."""

    def __init__(
        self, published: Callable[[], int] = lambda: 0, *, driver_name: str = "csi.rukpak.io"
    ) -> None:
        super().__init__()
        self.driver_name = driver_name
        operation_labels = ["driver_name", "grpc_status_code", "method_name"]
        self.plugin_operations = self.histogram(
            PLUGIN_OPERATIONS,
            "Container Storage Interface operation duration with gRPC error code status total",
            operation_labels,
            buckets=SIDECAR_BUCKETS,
        )
        self.sidecar_operations = self.histogram(
            DEPRECATED_SIDECAR_OPERATIONS,
            f"Deprecated: use {PLUGIN_OPERATIONS}, the same histogram; this name goes in the "
            "next release.",
            operation_labels,
            buckets=SIDECAR_BUCKETS,
        )
        self.rpcs = self.counter(
            "rukpak_csi_rpc", "CSI calls by method and gRPC code.", ["method", "code"]
        )
        self.rpc_seconds = self.counter(
            "rukpak_csi_rpc_seconds", "Time spent in CSI calls by method.", ["method"]
        )
        self.rpc_latency = self.histogram(
            "rukpak_csi_rpc_duration_seconds",
            "Latency of CSI calls by method.",
            ["method"],
            buckets=RPC_BUCKETS,
        )
        self.cache = self.counter("rukpak_csi_image_cache", "Image lookups by result.", ["result"])
        self.pulls = self.counter("rukpak_csi_image_pulls", "Images pulled and unpacked.")
        self.pull_seconds = self.counter(
            "rukpak_csi_image_pull_seconds", "Time spent pulling and unpacking."
        )
        self.pull_duration = self.histogram(
            "rukpak_csi_image_pull_duration_seconds",
            "Time to pull and unpack one image.",
            buckets=PULL_BUCKETS,
        )
        self.pull_bytes = self.counter(
            "rukpak_csi_image_pull_bytes", "Blob bytes fetched from registries."
        )
        self.published_volumes = self.gauge(
            "rukpak_csi_published_volumes", "Volumes currently published on this node."
        )
        self.published_volumes.set_function(lambda: float(published()))
        self.cache_bytes = self.gauge(
            "rukpak_csi_cache_bytes", "Bytes the node cache holds (blobs and trees)."
        )
        self.cache_budget = self.gauge(
            "rukpak_csi_cache_budget_bytes",
            "The node cache's budget (--cache-budget): eviction keeps it under.",
        )
        self.registered = self.gauge(
            "rukpak_csi_registered",
            "1 once kubelet accepted the plugin's registration, 0 while it has not.",
        )
        self.registration_failures = self.counter(
            "rukpak_csi_registration_failures", "Registrations kubelet reported as failed."
        )
        self.signature_checks = self.counter(
            "rukpak_csi_signature_checks",
            "Publishes of images a ClusterBundlePolicy selects, by outcome: verified (checked "
            "now), remembered (a verdict kept), warned (a warn-mode policy not satisfied), "
            "refused.",
            ["result"],
        )
        self.refreshes = self.counter(
            "rukpak_csi_volume_refreshes",
            "Refresh volumes (volume attribute refresh) whose tag moved, now presenting the "
            "new digest.",
        )
        self.volume_content = self.gauge(
            "rukpak_csi_volume_content_info",
            "The digest a refresh volume presents now (value 1; one series per volume).",
            ["volume_id", "digest"],
        )
        self._presented: dict[str, str] = {}
        self._presented_lock = threading.Lock()
        for result in ("hit", "miss"):
            self.cache.labels(result=result)
        for outcome in ("verified", "remembered", "warned", "refused"):
            self.signature_checks.labels(result=outcome)

    def track_cache(self, usage: Callable[[], int], budget: int) -> None:
        """Read the node cache's size from ``usage`` at scrape; ``budget`` is its limit."""
        self.cache_bytes.set_function(lambda: float(usage()))
        self.cache_budget.set(budget)

    def rpc_done(self, *, method: str, code: str, seconds: float) -> None:
        self.rpcs.labels(method=method, code=code).inc()
        self.rpc_seconds.labels(method=method).inc(seconds)
        self.rpc_latency.labels(method=method).observe(seconds)
        labels = {
            "driver_name": self.driver_name,
            "method_name": full_method(method),
            "grpc_status_code": go_code(code),
        }
        self.plugin_operations.labels(**labels).observe(seconds)
        self.sidecar_operations.labels(**labels).observe(seconds)

    def cache_result(self, *, hit: bool) -> None:
        self.cache.labels(result="hit" if hit else "miss").inc()

    def pulled(self, *, seconds: float, nbytes: int) -> None:
        self.pulls.inc()
        self.pull_seconds.inc(seconds)
        self.pull_duration.observe(seconds)
        self.pull_bytes.inc(nbytes)

    def presented(self, volume_id: str, digest: str) -> None:
        """A refresh volume presents ``digest`` now (empty: it is gone)."""
        with self._presented_lock:
            before = self._presented.pop(volume_id, "")
            if before:
                self.volume_content.remove(volume_id, before)
                if digest:
                    self.refreshes.inc()
            if digest:
                self._presented[volume_id] = digest
                self.volume_content.labels(volume_id=volume_id, digest=digest).set(1)

    def signature_check(self, result: str) -> None:
        self.signature_checks.labels(result=result).inc()

    def registration(self, *, accepted: bool) -> None:
        self.registered.set(1 if accepted else 0)
        if not accepted:
            self.registration_failures.inc()

    def render(self) -> str:
        return prometheus_client.generate_latest(self.registry).decode()


def serve(
    metrics: Metrics,
    *,
    port: int,
    host: str = "127.0.0.1",
    health: Health = lambda: (True, "ok"),
) -> ThreadingHTTPServer:
    """Serve ``/metrics`` and ``/healthz`` in a daemon thread; returns the server.

    ``/healthz`` answers 200 with ``ok`` when ``health()`` says so, else 503 with
    its reason (what the kubelet's liveness probe and a human see).
    """

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                httpanswer.answer(self, 200, metrics.render().encode(), CONTENT_TYPE)
            elif self.path == "/healthz":
                healthy, reason = health()
                body = f"{'ok' if healthy else reason}\n".encode()
                httpanswer.answer(self, 200 if healthy else 503, body, "text/plain")
            else:
                httpanswer.answer(self, 404, b"not found\n", "text/plain")

        def log_message(self, format: str, *args: object) -> None:
            pass  # scrapes are not worth a log line

    return httpanswer.serve(host, port, Handler, name="metrics")
