"""Prometheus metrics of the node plugin, in the text exposition format.

Where it sits: one ``Metrics`` object is created in ``csi.plugin.main`` and
handed to the servicers (``rpc_done``, via ``csi.common.grpcerrors``) and the image
cache (``cache_result``, ``pulled``); :func:`serve` exposes it on a loopback
HTTP port with the standard library's ``http.server``. Hand-written to avoid a
dependency: counters and sums only, labels escaped per the format.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CONTENT_TYPE = "text/plain; version=0.0.4; charset=utf-8"


def _label(value: str) -> str:
    return value.replace("\\", "\\\\").replace('"', '\\"').replace("\n", "\\n")


class Metrics:
    """Thread-safe counters; ``published`` is read at scrape time."""

    def __init__(self, published: Callable[[], int] = lambda: 0) -> None:
        self._lock = threading.Lock()
        self.published = published
        self.rpcs: dict[tuple[str, str], int] = {}
        self.rpc_seconds: dict[str, float] = {}
        self.cache = {"hit": 0, "miss": 0}
        self.pulls = 0
        self.pull_seconds = 0.0
        self.pull_bytes = 0

    def rpc_done(self, *, method: str, code: str, seconds: float) -> None:
        with self._lock:
            self.rpcs[(method, code)] = self.rpcs.get((method, code), 0) + 1
            self.rpc_seconds[method] = self.rpc_seconds.get(method, 0.0) + seconds

    def cache_result(self, *, hit: bool) -> None:
        with self._lock:
            self.cache["hit" if hit else "miss"] += 1

    def pulled(self, *, seconds: float, nbytes: int) -> None:
        with self._lock:
            self.pulls += 1
            self.pull_seconds += seconds
            self.pull_bytes += nbytes

    def render(self) -> str:
        with self._lock:
            lines = [
                "# HELP rukpak_csi_rpc_total CSI calls by method and gRPC code.",
                "# TYPE rukpak_csi_rpc_total counter",
            ]
            for (method, code), n in sorted(self.rpcs.items()):
                lines.append(
                    f'rukpak_csi_rpc_total{{method="{_label(method)}",code="{_label(code)}"}} {n}'
                )
            lines += [
                "# HELP rukpak_csi_rpc_seconds_total Time spent in CSI calls by method.",
                "# TYPE rukpak_csi_rpc_seconds_total counter",
            ]
            for method, s in sorted(self.rpc_seconds.items()):
                lines.append(f'rukpak_csi_rpc_seconds_total{{method="{_label(method)}"}} {s:.6f}')
            lines += [
                "# HELP rukpak_csi_image_cache_total Image lookups by result.",
                "# TYPE rukpak_csi_image_cache_total counter",
                f'rukpak_csi_image_cache_total{{result="hit"}} {self.cache["hit"]}',
                f'rukpak_csi_image_cache_total{{result="miss"}} {self.cache["miss"]}',
                "# HELP rukpak_csi_image_pulls_total Images pulled and unpacked.",
                "# TYPE rukpak_csi_image_pulls_total counter",
                f"rukpak_csi_image_pulls_total {self.pulls}",
                "# HELP rukpak_csi_image_pull_seconds_total Time spent pulling and unpacking.",
                "# TYPE rukpak_csi_image_pull_seconds_total counter",
                f"rukpak_csi_image_pull_seconds_total {self.pull_seconds:.6f}",
                "# HELP rukpak_csi_image_pull_bytes_total Blob bytes fetched from registries.",
                "# TYPE rukpak_csi_image_pull_bytes_total counter",
                f"rukpak_csi_image_pull_bytes_total {self.pull_bytes}",
            ]
        lines += [
            "# HELP rukpak_csi_published_volumes Volumes currently published on this node.",
            "# TYPE rukpak_csi_published_volumes gauge",
            f"rukpak_csi_published_volumes {self.published()}",
        ]
        return "\n".join(lines) + "\n"


def serve(metrics: Metrics, *, port: int, host: str = "127.0.0.1") -> ThreadingHTTPServer:
    """Serve ``/metrics`` (and ``/healthz``) in a daemon thread; returns the server."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            if self.path == "/metrics":
                body = metrics.render().encode()
                self.send_response(200)
                self.send_header("Content-Type", CONTENT_TYPE)
            elif self.path == "/healthz":
                body = b"ok\n"
                self.send_response(200)
                self.send_header("Content-Type", "text/plain")
            else:
                body = b"not found\n"
                self.send_response(404)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass  # scrapes are not worth a log line

    server = ThreadingHTTPServer((host, port), Handler)
    threading.Thread(target=server.serve_forever, name="metrics", daemon=True).start()
    return server
