"""One whole HTTP answer from a ``BaseHTTPRequestHandler`` (status, type, length, body),
and a server on a daemon thread.

Where it sits: below the processes' small HTTP endpoints: the node plugin's metrics and
``/healthz`` (``csi.plugin.metrics``), the registry mirror (``csi.mirror.server``), the
manager's webhook server (``provisioner.manager.serving.webhook``) and the probe server of
processes without one (``provisioner.runtime.liveness``). Each answer carries its exact
``Content-Length``, so keep-alive clients never wait for a close.
"""

from __future__ import annotations

import json
import socket
import threading
from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any

# how long a connection may take over each read or write (a TLS handshake included), after
# which the server closes it; kubelet probes, scrapes and webhook calls take far less
CONNECTION_TIMEOUT = 30.0


def answer(
    handler: BaseHTTPRequestHandler,
    code: int,
    body: bytes,
    content_type: str,
    *,
    headers: Iterable[tuple[str, str]] = (),
    send_body: bool = True,
) -> None:
    """Send status ``code`` with ``body`` (not its bytes for a HEAD: ``send_body``)."""
    handler.send_response(code)
    handler.send_header("Content-Type", content_type)
    handler.send_header("Content-Length", str(len(body)))
    for name, value in headers:
        handler.send_header(name, value)
    handler.end_headers()
    if send_body:
        handler.wfile.write(body)


def answer_json(handler: BaseHTTPRequestHandler, code: int, doc: Any) -> None:
    """Send status ``code`` with ``doc`` as JSON."""
    answer(handler, code, json.dumps(doc).encode(), "application/json")


class Server(ThreadingHTTPServer):
    """A thread per connection (daemon threads), and each connection's reads and writes
    within ``CONNECTION_TIMEOUT``: a client that connects and says nothing (or stops halfway)
    holds its thread that long, not for ever."""

    daemon_threads = True

    def get_request(self) -> tuple[socket.socket, Any]:
        request, address = super().get_request()
        request.settimeout(CONNECTION_TIMEOUT)
        return request, address


def serve(
    host: str, port: int, handler: type[BaseHTTPRequestHandler], *, name: str
) -> ThreadingHTTPServer:
    """A ``Server`` of ``handler`` on ``host:port``, serving on daemon thread ``name``;
    ``shutdown`` stops it, ``server_address`` has the port."""
    server = Server((host, port), handler)
    threading.Thread(target=server.serve_forever, name=name, daemon=True).start()
    return server
