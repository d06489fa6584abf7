"""Asking a store volume for content by digest: the client side of
``rukpak.sources.storeprotocol``.

Where it sits: used by a standing provisioner (a pod that mounts the node plugin's
store volume, ``csi.node.storevolume``) to have a BundleDeployment's pinned content
appear at ``<mount>/<digest>`` with that BundleDeployment's pull credential, before it
reads it. One connection, reused for every request, opened again when the plugin
restarted (its socket is made anew); safe to share between threads.
"""

from __future__ import annotations

import os
import socket
import threading
from pathlib import Path
from typing import Unpack

from rukpak.common import errors
from rukpak.sources import storeprotocol as protocol

DEFAULT_TIMEOUT = 120.0
"""Seconds to wait for one answer: a first fetch may take up to the plugin's publish
deadline (90 s by default)."""


class StoreClient:
    """Requests content from the store volume mounted at ``mount``."""

    def __init__(self, mount: Path, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.mount = Path(mount)
        self.timeout = timeout
        self._lock = threading.Lock()
        self._sock: socket.socket | None = None
        self._buffer = b""

    @property
    def socket_path(self) -> Path:
        return self.mount / protocol.SOCKET_NAME

    def fetch(self, ref: str, **options: Unpack[protocol.RequestOptions]) -> Path:
        """The directory where ``ref`` (pinned by digest) appears in the mount, once the
        plugin checked the credential; the plugin's error (a ``rukpak.common.errors``
        value of the code it answered) otherwise."""
        line = protocol.encode_request(ref, **options)
        answer = self.ask(line)
        if not answer.ok:
            raise answer.error()
        return self.mount / answer.path

    def fetch_volume(self, attributes: dict[str, str], secrets: dict[str, str]) -> Path:
        """The directory where a bundle volume's content (its ``volumeAttributes`` and the
        data of its publish Secret, as a pod's volume would name them: an image pinned by
        digest, a git commit, an http tarball) appears in the mount, once the plugin
        fetched or checked it by the rules of a pod's volume; its error otherwise."""
        answer = self.ask(protocol.encode_volume_request(attributes, secrets))
        if not answer.ok:
            raise answer.error()
        return self.mount / answer.path

    def ask(self, line: bytes) -> protocol.StoreAnswer:
        """Send one raw request line and read its answer (reconnecting once when the
        connection was closed, e.g. by a plugin restart)."""
        with self._lock:
            for attempt in (1, 2):
                try:
                    sock = self._connect()
                    sock.sendall(line)
                    return protocol.parse_answer(self._read_line(sock))
                except (OSError, errors.Unavailable) as exc:
                    self._close()
                    if isinstance(exc, TimeoutError):  # never ask twice for a slow answer
                        raise errors.DeadlineExceeded(
                            f"the store volume did not answer within {self.timeout} s"
                        ) from None
                    if attempt == 2:
                        if isinstance(exc, errors.Unavailable):
                            raise
                        raise errors.Unavailable(
                            f"cannot reach the store volume's socket {self.socket_path}: {exc}; "
                            "is the volume a kind: store volume and the node plugin running?"
                        ) from None
            raise AssertionError("unreachable")

    def _connect(self) -> socket.socket:
        if self._sock is None:
            sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
            sock.settimeout(self.timeout)
            fd = -1
            try:
                address, fd = protocol.short_path(self.mount, protocol.SOCKET_NAME)
                sock.connect(address)
            except OSError:
                sock.close()
                raise
            finally:
                if fd >= 0:
                    os.close(fd)
            self._sock, self._buffer = sock, b""
        return self._sock

    def _read_line(self, sock: socket.socket) -> bytes:
        while b"\n" not in self._buffer:
            chunk = sock.recv(65536)
            if not chunk:
                raise ConnectionResetError("the plugin closed the connection")
            self._buffer += chunk
            if len(self._buffer) > protocol.MAX_LINE:
                raise errors.Unavailable("the store volume's answer is longer than a line may be")
        line, _, self._buffer = self._buffer.partition(b"\n")
        return line

    def _close(self) -> None:
        if self._sock is not None:
            self._sock.close()
            self._sock = None
        self._buffer = b""

    def close(self) -> None:
        with self._lock:
            self._close()

    def __enter__(self) -> StoreClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
