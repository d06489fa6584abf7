"""The PV provisioner's Prometheus metrics and the HTTP port that serves them.

Where it sits: ``provisioner.storage.cli`` makes one ``Metrics`` and serves it with
:func:`serve` on ``--metrics-port``; ``controller.VolumeProvisioner`` reports its
provisions and deletions into it, ``csiclient.CsiClient`` its calls to the plugin. The
names are the ones the components we stand in for export, so their dashboards and alerts
read ours unchanged:

- sig-storage-lib-external-provisioner (the library of kubernetes-csi external-provisioner,
  subsystem ``controller``): ``controller_persistentvolumeclaim_provision_total{class}``,
  ``controller_persistentvolumeclaim_provision_failed_total{class}``,
  ``controller_persistentvolumeclaim_provision_duration_seconds{class}`` (failed attempts
  not observed), ``controller_persistentvolume_delete_total{class}``,
  ``controller_persistentvolume_delete_failed_total{class}``,
  ``controller_persistentvolume_delete_duration_seconds{class}``;
- csi-lib-utils, as a sidecar: ``csi_sidecar_operations_seconds{driver_name,
  grpc_status_code,method_name}`` for each call to the plugin (``/csi.v1.Controller/...``,
  Go's code names);
- and the runtime's (``provisioner.runtime.metrics``): work queue, reconciles, Lease,
  ``process_*``.
"""

from __future__ import annotations

from dataclasses import dataclass
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from prometheus_client import Counter, Histogram

from provisioner.runtime import metrics as runtime_metrics
from rukpak.common import httpanswer

LIB_BUCKETS = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10)
"""prometheus.DefBuckets, which the library's two durations use."""
SIDECAR_BUCKETS = (0.1, 0.25, 0.5, 1, 2.5, 5, 10, 15, 25, 50, 120, 300, 600)
"""csi-lib-utils' buckets for ``csi_sidecar_operations_seconds``."""
CONTROLLER = "volumes"
"""The ``controller`` and work queue ``name`` label of the runtime's metrics."""


def go_code(code: str) -> str:
    """A gRPC code name (``INVALID_ARGUMENT``) as Go writes it (``InvalidArgument``)."""
    return code if code == "OK" else "".join(p.capitalize() for p in code.split("_"))


@dataclass(frozen=True)
class Operation:
    """sig-storage-lib's metrics of one operation (provision, delete) by storage class:
    successes, failed attempts, and the seconds of the successes (failures not observed)."""

    done: Counter
    failed: Counter
    duration: Histogram

    def ended(self, storage_class: str, *, ok: bool, seconds: float) -> None:
        if ok:
            self.done.labels(storage_class).inc()
            self.duration.labels(storage_class).observe(seconds)
        else:
            self.failed.labels(storage_class).inc()


class Metrics(runtime_metrics.Metrics):
    """The provisioner process's metrics; every method is thread-safe."""

    def __init__(self, *, driver_name: str = "csi.rukpak.io") -> None:
        super().__init__()
        self.driver_name = driver_name
        self.provision = self._operation(
            "controller_persistentvolumeclaim_provision",
            done="provisioned",
            verb="provision",
            attempts="provisioning",
        )
        self.delete = self._operation(
            "controller_persistentvolume_delete", done="deleted", verb="delete", attempts="deletion"
        )
        self.operations = self.histogram(
            "csi_sidecar_operations_seconds",
            "Container Storage Interface operation duration with gRPC error code status total",
            ["driver_name", "grpc_status_code", "method_name"],
            buckets=SIDECAR_BUCKETS,
        )

    def csi_call(self, method: str, code: str, seconds: float) -> None:
        """One Controller call to the plugin (``CreateVolume``) ended with gRPC ``code``."""
        self.operations.labels(
            self.driver_name, go_code(code), f"/csi.v1.Controller/{method}"
        ).observe(seconds)

    def provisioned(self, storage_class: str, *, ok: bool, seconds: float) -> None:
        self.provision.ended(storage_class, ok=ok, seconds=seconds)

    def deleted(self, storage_class: str, *, ok: bool, seconds: float) -> None:
        self.delete.ended(storage_class, ok=ok, seconds=seconds)

    def _operation(self, prefix: str, *, done: str, verb: str, attempts: str) -> Operation:
        """The library's three metrics of one operation, named ``prefix`` + ``_total``,
        ``_failed_total`` and ``_duration_seconds``, with its help texts."""
        by_class = "Broken down by storage class name."
        return Operation(
            done=self.counter(
                f"{prefix}_total",
                f"Total number of persistent volumes {done} succesfully. {by_class}",
                ["class"],
            ),
            failed=self.counter(
                f"{prefix}_failed_total",
                f"Total number of persistent volume {verb} failed attempts. {by_class}",
                ["class"],
            ),
            duration=self.histogram(
                f"{prefix}_duration_seconds",
                f"Latency in seconds to {verb} persistent volumes. Failed {attempts} attempts "
                f"are ignored. {by_class}",
                ["class"],
                buckets=LIB_BUCKETS,
            ),
        )


def serve(metrics: Metrics, *, host: str, port: int) -> ThreadingHTTPServer:
    """Serve ``/metrics`` over plain HTTP on a daemon thread (the pod's network only: the
    counts name StorageClasses, nothing secret); returns the server."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path.split("?", 1)[0] == "/metrics":
                httpanswer.answer(self, 200, metrics.exposition(), runtime_metrics.CONTENT_TYPE)
            else:
                httpanswer.answer(self, 404, b"not found: use /metrics\n", "text/plain")

        def log_message(self, format: str, *args: object) -> None:
            pass  # scrapes are not worth a log line

    return httpanswer.serve(host, port, Handler, name="metrics")
