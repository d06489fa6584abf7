"""Prometheus metrics of a long-running provisioner process, with controller-runtime's names.

Sits beside ``queue`` and ``workers`` (which report into it) in the runtime every
controller runs on; the manager serves ``registry`` at ``/metrics`` (``manager.webhook``,
behind the API server's authorization). The names and labels are the ones
controller-runtime and client-go give every Go operator, so existing dashboards and
alerts work unchanged:

- ``controller_runtime_reconcile_total{controller,result}`` (result: success, error,
  requeue, requeue_after), ``controller_runtime_reconcile_errors_total{controller}``,
  ``controller_runtime_reconcile_time_seconds{controller}``,
  ``controller_runtime_max_concurrent_reconciles{controller}``;
- ``workqueue_depth{name}``, ``workqueue_adds_total{name}``,
  ``workqueue_queue_duration_seconds{name}``, ``workqueue_work_duration_seconds{name}``,
  ``workqueue_retries_total{name}``;
- ``rest_client_requests_total{code,method,host}`` (read from ``Kube.answers`` at scrape);
- ``leader_election_master_status{name}``.

RukPak's own start with ``rukpak_``: drift restores, and BundleDeployments by condition
(read from the controller's cache at scrape). ``object_conditions`` gives the samples of a
per-object family in kube-state-metrics' shape (``kube_deployment_status_condition``): one
series per object and condition type, its status and reason in labels, value 1; the series
leaves with the object (it is read from the cache at scrape, nothing is kept).

The webhook server reports its requests with controller-runtime's webhook names
(``controller_runtime_webhook_requests_total{webhook,code}``,
``controller_runtime_webhook_latency_seconds{webhook}``,
``controller_runtime_webhook_requests_in_flight{webhook}``) and its answers by verdict
(``rukpak_webhook_verdicts_total{webhook,verdict}``); its serving certificate's end of
validity is ``rukpak_webhook_certificate_expiry_timestamp_seconds{certificate}``.
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Mapping
from typing import Any

import prometheus_client
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

from rukpak.common.metrics import OwnRegistry

CONTENT_TYPE = prometheus_client.CONTENT_TYPE_LATEST
RECONCILE_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60)
QUEUE_BUCKETS = (1e-6, 1e-5, 1e-4, 1e-3, 0.01, 0.1, 1, 10, 100, 1000)
"""client-go's workqueue buckets (10^-8 .. 10^3 seconds, the useful part of them)."""
WEBHOOK_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
"""prometheus.DefBuckets, which controller-runtime's webhook latency uses."""


class _Scraped:
    """A collector whose samples a callable produces at scrape time."""

    def __init__(self, produce: Callable[[], Iterable[Metric]]) -> None:
        self._produce = produce

    def collect(self) -> Iterator[Metric]:
        yield from self._produce()

    def describe(self) -> list[Metric]:
        return []


class QueueMetrics:
    """What one work queue reports (``WorkQueue(observer=...)``); thread-safe."""

    def __init__(self, metrics: Metrics, name: str) -> None:
        self._m = metrics
        self.name = name

    def added(self) -> None:
        self._m.adds.labels(self.name).inc()

    def retried(self) -> None:
        self._m.retries.labels(self.name).inc()

    def waited(self, seconds: float) -> None:
        self._m.queue_duration.labels(self.name).observe(seconds)

    def worked(self, seconds: float) -> None:
        self._m.work_duration.labels(self.name).observe(seconds)


class Metrics(OwnRegistry):
    """The process's registry and metrics (one per process; tests make their own)."""

    def __init__(self) -> None:
        super().__init__()
        self.reconciles = self.counter(
            "controller_runtime_reconcile_total",
            "Total number of reconciliations per controller",
            ["controller", "result"],
        )
        self.reconcile_errors = self.counter(
            "controller_runtime_reconcile_errors_total",
            "Total number of reconciliation errors per controller",
            ["controller"],
        )
        self.reconcile_time = self.histogram(
            "controller_runtime_reconcile_time_seconds",
            "Length of time per reconciliation per controller",
            ["controller"],
            buckets=RECONCILE_BUCKETS,
        )
        self.max_concurrent = self.gauge(
            "controller_runtime_max_concurrent_reconciles",
            "Maximum number of concurrent reconciles per controller",
            ["controller"],
        )
        self.depth = self.gauge("workqueue_depth", "Current depth of workqueue", ["name"])
        self.adds = self.counter(
            "workqueue_adds_total", "Total number of adds handled by workqueue", ["name"]
        )
        # client-go's two workqueue latencies: per queue, in its buckets
        queue_latency = functools.partial(self.histogram, labels=["name"], buckets=QUEUE_BUCKETS)
        self.queue_duration = queue_latency(
            "workqueue_queue_duration_seconds",
            "How long in seconds an item stays in workqueue before being requested",
        )
        self.work_duration = queue_latency(
            "workqueue_work_duration_seconds",
            "How long in seconds processing an item from workqueue takes",
        )
        self.retries = self.counter(
            "workqueue_retries_total", "Total number of retries handled by workqueue", ["name"]
        )
        self.leader = self.gauge(
            "leader_election_master_status",
            "Gauge of if the reporting system is master of the relevant lease, 0 indicates "
            "backup, 1 indicates master. 'name' is the string used to identify the lease.",
            ["name"],
        )
        self.drift_restores = self.counter(
            "rukpak_drift_restores_total",
            "Drifted objects the manager re-applied from their last good version",
        )
        self.installs = self.histogram(
            "rukpak_install_duration_seconds",
            "Seconds from a BundleDeployment revision being asked for to it being installed, "
            "by kind: install (the first), pivot (a later one), rollback",
            ["kind"],
            buckets=(0.5, 1, 2, 3, 5, 10, 20, 30, 60, 120, 300, 600),
        )
        self.rollbacks = self.counter(
            "rukpak_rollbacks_total",
            "Rollbacks the manager started itself, by reason (ProgressDeadlineExceeded)",
            ["reason"],
        )
        self.webhook_requests = self.counter(
            "controller_runtime_webhook_requests_total",
            "Total number of admission requests by HTTP status code.",
            ["webhook", "code"],
        )
        self.webhook_latency = self.histogram(
            "controller_runtime_webhook_latency_seconds",
            "Histogram of the latency of processing admission requests",
            ["webhook"],
            buckets=WEBHOOK_BUCKETS,
        )
        self.webhook_in_flight = self.gauge(
            "controller_runtime_webhook_requests_in_flight",
            "Current number of admission requests being served.",
            ["webhook"],
        )
        self.webhook_verdicts = self.counter(
            "rukpak_webhook_verdicts",
            "Webhook answers by verdict: allowed or denied (admission), converted or failed "
            "(conversion), refused (a request that was not a review: HTTP 400)",
            ["webhook", "verdict"],
        )
        self.certificate_expiry = self.gauge(
            "rukpak_webhook_certificate_expiry_timestamp_seconds",
            "When the webhook's serving certificate (certificate=serving) and its CA "
            "(certificate=ca) stop being valid, in seconds since the epoch",
            ["certificate"],
        )
        self._lock = threading.Lock()

    def webhook_answered(self, webhook: str, *, code: int, verdict: str, seconds: float) -> None:
        """One webhook request ended with HTTP ``code`` and ``verdict``."""
        self.webhook_requests.labels(webhook, str(code)).inc()
        self.webhook_latency.labels(webhook).observe(seconds)
        self.webhook_verdicts.labels(webhook, verdict).inc()

    def queue(self, name: str, depth: Callable[[], int]) -> QueueMetrics:
        """The reporter of the work queue ``name``, whose depth ``depth`` reads at scrape."""
        self.depth.labels(name).set_function(lambda: float(depth()))
        return QueueMetrics(self, name)

    def reconciled(self, controller: str, result: str, seconds: float) -> None:
        """One reconcile ended with ``result`` (success, error, requeue, requeue_after)."""
        self.reconciles.labels(controller, result).inc()
        if result == "error":
            self.reconcile_errors.labels(controller).inc()
        self.reconcile_time.labels(controller).observe(seconds)

    def requests_of(self, answers: Callable[[], dict[tuple[str, str], int]], host: str) -> None:
        """Export client-go's ``rest_client_requests_total`` from ``answers`` at scrape."""

        def produce() -> Iterator[Metric]:
            family = CounterMetricFamily(
                "rest_client_requests",
                "Number of HTTP requests, partitioned by status code, method, and host.",
                labels=["code", "method", "host"],
            )
            for (method, code), count in sorted(answers().items()):
                family.add_metric([code, method, host], count)
            yield family

        self.registry.register(_Scraped(produce))  # type: ignore[arg-type]

    def gauge_of(
        self,
        name: str,
        help_text: str,
        labels: list[str],
        read: Callable[[], dict[tuple[str, ...], float]],
    ) -> None:
        """A gauge family whose samples ``read`` returns at scrape (label values -> value)."""
        self.object_gauge(name, help_text, labels, lambda: read().items())

    def object_gauge(
        self,
        name: str,
        help_text: str,
        labels: list[str],
        read: Callable[[], Iterable[tuple[tuple[str, ...], float]]],
    ) -> None:
        """A gauge family of one series per object (and condition): ``read`` yields (label
        values, value) at scrape, so an object gone from the cache is gone from the scrape."""

        def produce() -> Iterator[Metric]:
            family = GaugeMetricFamily(name, help_text, labels=labels)
            for values, value in sorted(read()):
                family.add_metric(list(values), value)
            yield family

        self.registry.register(_Scraped(produce))  # type: ignore[arg-type]

    def exposition(self) -> bytes:
        return bytes(prometheus_client.generate_latest(self.registry))


def object_conditions(
    objects: Iterable[Mapping[str, Any]], *, namespaced: bool = False
) -> Iterator[tuple[tuple[str, ...], float]]:
    """(name, [namespace,] condition, status, reason) -> 1 for every condition of every
    object: one series per object and condition type (status and reason are labels, not
    series of their own, so a change moves the series instead of adding one). A
    cluster-scoped kind has no namespace label: an empty one would let the scrape's own
    ``namespace`` target label (the manager's) stand in for it."""
    for obj in objects:
        meta = obj.get("metadata") or {}
        who: tuple[str, ...] = (str(meta.get("name") or ""),)
        if namespaced:
            who += (str(meta.get("namespace") or ""),)
        seen: set[str] = set()
        for cond in (obj.get("status") or {}).get("conditions") or []:
            if not isinstance(cond, dict) or not cond.get("type") or cond["type"] in seen:
                continue
            seen.add(str(cond["type"]))
            status = str(cond.get("status") or "Unknown")
            yield (*who, str(cond["type"]), status, str(cond.get("reason") or "")), 1.0


def classify(after: float | None) -> str:
    """controller-runtime's result label for a reconcile that returned ``after``."""
    if after is None:
        return "success"
    return "requeue" if after <= 0 else "requeue_after"


def since(start: float) -> float:
    return max(time.monotonic() - start, 0.0)
