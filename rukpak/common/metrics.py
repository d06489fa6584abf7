"""A process's own Prometheus registry, and the metric types bound to it.

Where it sits: the base of the node plugin's ``csi.plugin.metrics.Metrics`` and of a
provisioner process's ``provisioner.runtime.metrics.Metrics``. Each of those owns a
registry (several can live in one test process), and a metric declared through
``counter``, ``gauge`` or ``histogram`` cannot fall into prometheus_client's
process-wide default registry by mistake. Each registry also holds prometheus_client's
``ProcessCollector`` (``process_cpu_seconds_total``, ``process_resident_memory_bytes``,
``process_open_fds``, ``process_start_time_seconds``...), read from ``/proc/self`` at scrape,
as every Go component reports them.
"""

from __future__ import annotations

from collections.abc import Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram, ProcessCollector


class OwnRegistry:
    """``registry`` and constructors of metrics registered in it (name, help, label names)."""

    def __init__(self) -> None:
        self.registry = CollectorRegistry(auto_describe=True)
        ProcessCollector(registry=self.registry)

    def counter(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Counter:
        return Counter(name, documentation, labels, registry=self.registry)

    def gauge(self, name: str, documentation: str, labels: Sequence[str] = ()) -> Gauge:
        return Gauge(name, documentation, labels, registry=self.registry)

    def histogram(
        self,
        name: str,
        documentation: str,
        labels: Sequence[str] = (),
        *,
        buckets: Sequence[float] = Histogram.DEFAULT_BUCKETS,
    ) -> Histogram:
        return Histogram(name, documentation, labels, registry=self.registry, buckets=buckets)
