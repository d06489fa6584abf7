"""The registry mirror: one fetch from a registry per blob, however many nodes ask at once.

Where it sits: beside the node plugins, as a Deployment and Service (``deploy/components/
registry-mirror``). A node plugin started with ``--registry-mirror REGISTRY=MIRROR`` asks
it first for the manifests and blobs of pinned, anonymously pulled images
(``rukpak.oci.client.RegistryClient`` with ``mirrors``): ``GET /v2/<repo>/manifests/<digest>``
and ``GET /v2/<repo>/blobs/<digest>``, each with ``?ns=<registry>``. The mirror fetches each
digest from that registry once (concurrent requests for it wait for the one fetch),
verifies it, keeps it in a content store (``rukpak.image.store``) and serves it from there.
A rollout to N nodes then costs the registry one pull instead of N.

What it will not do: fetch from a registry not named by ``--upstream`` (no open proxy),
serve a tag (content by digest only: what it serves never changes), or use credentials
(it holds public content only; a node with credentials for a registry never asks it).
The store is bounded (``--max-bytes``): the least recently served blobs go first.
"""

from __future__ import annotations

import contextlib
import json
import logging
import re
import shutil
import threading
from collections.abc import Callable, Iterable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlsplit

from rukpak.common import errors, httpanswer
from rukpak.image.locks import KeyedLocks
from rukpak.image.store import ContentStore
from rukpak.oci import client as oci_client
from rukpak.oci import digest as digests
from rukpak.oci import mediatypes
from rukpak.oci.manifest import Descriptor, Index, Manifest, parse_manifest
from rukpak.oci.reference import Reference

log = logging.getLogger("rukpak.mirror")

_PATH = re.compile(r"^/v2/(?P<repo>.+)/(?P<kind>manifests|blobs)/(?P<digest>[^/]+)$")
ClientFactory = Callable[[], oci_client.RegistryClient]
STATUS = {
    "NOT_FOUND": 404,
    "INVALID_ARGUMENT": 400,
    "PERMISSION_DENIED": 403,
    "UNAUTHENTICATED": 404,  # private content is not the mirror's: the node asks the registry
    "DATA_LOSS": 502,
}


class Mirror:
    """The store and the fetches; the HTTP edge is ``serve``."""

    def __init__(
        self,
        root: Path,
        *,
        upstreams: Iterable[str],
        client: ClientFactory = oci_client.RegistryClient,
        max_bytes: int = 20 * 1024**3,
    ) -> None:
        self.store = ContentStore(root)
        self.upstreams = frozenset(upstreams)
        self.max_bytes = max_bytes
        self._client = client()
        self._locks = KeyedLocks()
        self._guard = threading.Lock()
        self._media: dict[str, str] = {}
        """Manifest digest -> its media type (read back from the stored JSON after a restart)."""
        self._sizes: dict[str, int] = {}
        """Blob digest -> size, from the manifests served (a blob is verified by both)."""
        self.fetched = 0
        """Digests fetched from a registry since start (the tests and the benchmark read it)."""

    def close(self) -> None:
        self._client.close()

    def _check(self, registry: str, repo: str, digest: str) -> Reference:
        if registry not in self.upstreams:
            raise errors.PermissionDenied(
                f"registry {registry!r} is not an upstream of this mirror (--upstream)"
            )
        if not digests.is_valid(digest):
            raise errors.NotFound(
                f"{digest!r} is not a digest: this mirror serves content by digest"
            )
        return Reference.parse(f"{registry}/{repo}@{digest}")

    def manifest(self, registry: str, repo: str, digest: str) -> tuple[Path, str]:
        """The stored manifest or index ``digest`` and its media type, fetched once."""
        ref = self._check(registry, repo, digest)
        with self._locks.hold(digest):
            if not self.store.has(digest):
                desc, body = self._client.get_manifest(ref)
                self.store.put_bytes(digest, body)
                self._learn(desc.media_type, body, digest)
                self._count()
        path = self.store.path(digest)
        with self._guard:
            media = self._media.get(digest)
        if media is None:  # stored before a restart: what it declares, read once
            body = path.read_bytes()
            media = _declared(body)
            self._learn(media, body, digest)
        self._touch(path)
        return path, media

    def blob(self, registry: str, repo: str, digest: str) -> Path:
        """The stored blob ``digest``, fetched once (its size from a manifest served, else
        the registry's HEAD)."""
        ref = self._check(registry, repo, digest)
        with self._locks.hold(digest):
            if not self.store.has(digest):
                with self._guard:
                    size = self._sizes.get(digest)
                if size is None:
                    size = self._client.blob_size(ref, digest)
                desc = Descriptor(media_type="application/octet-stream", digest=digest, size=size)
                self.store.put(digest, size, lambda dest: self._client.fetch_blob(ref, desc, dest))
                self._count()
                self._evict()
        path = self.store.path(digest)
        self._touch(path)
        return path

    def _learn(self, media_type: str, body: bytes, digest: str) -> None:
        """Remember the media type of manifest ``digest`` and the sizes it gives its blobs."""
        parsed: Manifest | Index | None
        try:
            parsed = parse_manifest(media_type, body, what=f"manifest {digest}")
        except errors.RukpakError:
            parsed = None
        with self._guard:
            self._media[digest] = media_type
            if isinstance(parsed, Manifest):
                for d in [parsed.config, *parsed.layers]:
                    self._sizes[d.digest] = d.size

    def _count(self) -> None:
        with self._guard:
            self.fetched += 1

    def _touch(self, path: Path) -> None:
        with contextlib.suppress(OSError):  # its atime and mtime: when it was last served
            path.touch(exist_ok=True)

    def _evict(self) -> None:
        """Remove the least recently served blobs while the store is over ``max_bytes``."""
        total = self.store.total_size()
        if total <= self.max_bytes:
            return
        for info in sorted(self.store.blobs(), key=lambda b: b.touched):
            if total <= self.max_bytes:
                break
            total -= self.store.delete(info.digest)


def _declared(body: bytes) -> str:
    try:
        declared = json.loads(body).get("mediaType")
    except (ValueError, AttributeError):
        declared = None
    return declared if isinstance(declared, str) and declared else mediatypes.OCI_MANIFEST


def serve(mirror: Mirror, address: tuple[str, int]) -> ThreadingHTTPServer:
    """An HTTP server for ``mirror`` on ``address`` (port 0: a free one); not started."""

    class Handler(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: object) -> None:
            log.debug("msg='request' %s", format % args)

        def do_HEAD(self) -> None:
            self._answer(body=False)

        def do_GET(self) -> None:
            self._answer(body=True)

        def _answer(self, *, body: bool) -> None:
            url = urlsplit(self.path)
            if url.path in ("/v2", "/v2/"):
                self._send(200, b"{}", "application/json", body=body)
                return
            match = _PATH.match(url.path)
            registry = (parse_qs(url.query).get("ns") or [""])[0]
            if match is None or not registry:
                self._send(404, b'{"errors":[{"code":"NAME_UNKNOWN"}]}', "application/json")
                return
            repo, kind, digest = match.group("repo", "kind", "digest")
            try:
                if kind == "manifests":
                    path, media = mirror.manifest(registry, repo, digest)
                else:
                    path, media = mirror.blob(registry, repo, digest), "application/octet-stream"
            except errors.RukpakError as err:
                log.info("msg='not served' registry=%s repo=%s digest=%s error=%r",
                         registry, repo, digest, err.message)  # fmt: skip
                detail = json.dumps({"errors": [{"code": err.code, "message": err.message}]})
                self._send(STATUS.get(err.code, 503), detail.encode(), "application/json")
                return
            self.send_response(200)
            self.send_header("Content-Type", media)
            self.send_header("Content-Length", str(path.stat().st_size))
            self.send_header("Docker-Content-Digest", digest)
            self.end_headers()
            if body:
                with path.open("rb") as f:
                    shutil.copyfileobj(f, self.wfile, 1 << 16)

        def _send(self, code: int, data: bytes, media: str, *, body: bool = True) -> None:
            httpanswer.answer(self, code, data, media, send_body=body)

    return httpanswer.Server(address, Handler)
