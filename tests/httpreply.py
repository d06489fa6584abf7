"""One whole HTTP answer from a ``BaseHTTPRequestHandler``: status, headers, length, body.

Where it sits: the tests' own small HTTP servers (``tests.tokenissuer``,
``tests.source_servers``, the broken registries of ``test_oci_client``) answer through
``reply`` so each sends a correct ``Content-Length`` the same way.
"""

from __future__ import annotations

from collections.abc import Iterable
from http.server import BaseHTTPRequestHandler


def reply(
    handler: BaseHTTPRequestHandler,
    status: int,
    body: bytes = b"",
    *,
    headers: Iterable[tuple[str, str]] = (),
) -> None:
    """Send ``status``, ``headers``, ``Content-Length`` and ``body``."""
    handler.send_response(status)
    for key, value in headers:
        handler.send_header(key, value)
    handler.send_header("Content-Length", str(len(body)))
    handler.end_headers()
    handler.wfile.write(body)
