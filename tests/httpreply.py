"""One whole HTTP answer from a ``BaseHTTPRequestHandler``: status, headers, length, body;
and one GET as the kubelet's probes make it.

Where it sits: the tests' own small HTTP servers (``tests.tokenissuer``,
``tests.source_servers``, the broken registries of ``test_oci_client``) answer through
``reply`` so each sends a correct ``Content-Length`` the same way; the probe tests and
the footprint bench ask health endpoints through ``probe``.
"""

from __future__ import annotations

import ssl
import urllib.error
import urllib.request
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


def probe(url: str, *, timeout: float = 10) -> tuple[int, bytes]:
    """GET ``url`` as the kubelet's probes do (HTTPS without verifying the certificate):
    (status, body), an error status included; OSError when nothing answers."""
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    try:
        with urllib.request.urlopen(url, timeout=timeout, context=context) as answer:
            return int(answer.status), answer.read()
    except urllib.error.HTTPError as err:
        return int(err.code), err.read()
