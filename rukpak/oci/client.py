"""The registry client: resolve, pull and push images over the distribution API.

The entry point of ``rukpak.oci`` for the node plugin (pull a bundle image by
digest, verified) and for the provisioner (resolve a tag to a digest once).
Each method is one API operation built on ``rukpak.oci.transport`` (timeouts,
retries, auth, error codes); content checks come from ``rukpak.oci.blobio`` and
shapes from ``rukpak.oci.manifest``. Errors are ``rukpak.common.errors`` values:
NotFound, Unauthenticated, PermissionDenied, Unavailable, InvalidArgument
(malformed manifests, unknown media types) and DataLoss (content that does not
match its digest).

One client may be shared by threads; it keeps one connection pool and one
token cache per process. Under a deadline (``rukpak.common.backoff.within``) every
request, every retry of a broken download and every read of a streaming blob stops
when it passes (DeadlineExceeded naming the registry); the deadline in force when a
download or stream starts goes with it, even into the threads that read it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import http.client
import io
import json
import logging
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, BinaryIO, Final, TypeVar, Unpack, cast

import requests
import urllib3

from rukpak.common import backoff, errors
from rukpak.oci import blobio, mediatypes, transport, upload
from rukpak.oci import digest as digests
from rukpak.oci.manifest import (
    Descriptor,
    Index,
    Manifest,
    Platform,
    parse_manifest,
    select_platform,
)
from rukpak.oci.reference import Reference

MANIFEST_MAX: Final[int] = 4 << 20  # bytes; distribution itself refuses larger ones
CHUNK: Final[int] = 1 << 20  # streaming read size
STREAM_BUFFER: Final[int] = 64 << 10
"""The buffer of :meth:`RegistryClient.open_blob`'s stream: a larger read (the image
cache's 1 MiB) goes past it, straight from the socket into the reader's own buffer."""

_MANIFEST_ACCEPT = ", ".join(mediatypes.MANIFEST_ACCEPT)
_T = TypeVar("_T")
log = logging.getLogger(__name__)


class RegistryClient:
    """Talks to OCI/Docker registries. See the module docstring."""

    def __init__(
        self,
        *,
        mirrors: Mapping[str, str] | None = None,
        **options: Unpack[transport.Options],
    ) -> None:
        """``options`` are those of :class:`rukpak.oci.transport.Transport`, which
        defaults them: ``insecure`` hosts (``host`` or ``host:port``) are spoken to over
        plain HTTP, as are loopback hosts; everything else over HTTPS, verified against
        the system trust store or ``ca_bundle``. ``timeout`` bounds each read,
        ``connect_timeout`` (default min(timeout, 5)) each connect; failed
        connections, 429 and 5xx are retried ``retries`` times with exponential
        backoff from ``backoff`` seconds (capped at 4 s), waiting with ``sleep``.

        ``mirrors`` maps a registry host to a mirror (``csi.mirror``) that serves its
        content by digest: manifests and blobs of pinned references are asked of the
        mirror first (``?ns=<registry>``), and of the registry when the mirror fails.
        Content is verified against its digest either way. A registry this client has
        credentials for is never mirrored: private content goes to its registry only."""
        self.mirrors = dict(mirrors or {})
        self.transport = transport.Transport(**options)

    def close(self) -> None:
        self.transport.close()

    def __enter__(self) -> RegistryClient:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def base_url(self, ref: Reference) -> str:
        """``http(s)://host`` this client would use for ``ref``'s registry."""
        return self.transport.base_url(ref.api_host)

    def _mirrored(
        self,
        ref: Reference,
        attempt: Callable[[Reference, dict[str, str] | None], _T],
        *,
        by_digest: bool = True,
    ) -> _T:
        """``attempt(ref, params)`` through the mirror of ``ref``'s registry first, when it
        has one, what is asked for is named by digest (``by_digest``: a blob always is, a
        manifest when ``ref`` is pinned) and this client has no credentials for the
        registry; then, or when the mirror fails, of the registry itself."""
        origin = ref.api_host
        mirror = self.mirrors.get(origin)
        if mirror and by_digest and self.transport.credentials.for_host(origin) is None:
            try:
                return attempt(dataclasses.replace(ref, registry=mirror), {"ns": origin})
            except errors.RukpakError as err:
                log.info(
                    "msg='mirror failed; asking the registry' mirror=%s registry=%s error=%r",
                    mirror, origin, err.message,
                )  # fmt: skip
        return attempt(ref, None)

    # -- manifests -------------------------------------------------------

    def resolve(self, ref: Reference) -> Descriptor:
        """The descriptor (media type, digest, size) ``ref`` points at now.

        Uses HEAD; falls back to GET (and hashing) when the registry sends no
        ``Docker-Content-Digest``. A digest reference is checked, not trusted.
        """
        target = transport.image_target(ref)
        response = self.transport.request(
            "HEAD", target, _manifest_path(ref), headers={"Accept": _MANIFEST_ACCEPT}
        )
        self.transport.check(response, target, ok=(200,))
        response.close()
        sent = response.headers.get("Docker-Content-Digest", "")
        length = response.headers.get("Content-Length", "")
        media_type = _base_type(response.headers.get("Content-Type", ""))
        if (
            not digests.is_valid(sent)
            or not length.isdigit()
            or media_type not in mediatypes.INDEX_TYPES | mediatypes.MANIFEST_TYPES
            or (ref.digest is not None and sent != ref.digest)
        ):
            return self.get_manifest(ref)[0]
        return Descriptor(media_type=media_type, digest=sent, size=int(length))

    def check_manifest_access(self, ref: Reference, digest: str) -> None:
        """Raise unless this client's credentials may read manifest ``digest`` of ``ref``'s
        repository (one HEAD by digest): Unauthenticated, PermissionDenied or NotFound
        as the registry answers. The image cache asks this before it serves a private
        image it already holds to another pod."""
        pinned = ref.with_digest(digests.check(digest, what=str(ref)))
        target = transport.image_target(pinned)
        response = self.transport.request(
            "HEAD", target, _manifest_path(pinned), headers={"Accept": _MANIFEST_ACCEPT}
        )
        self.transport.check(response, target, ok=(200,))
        response.close()

    def get_manifest(self, ref: Reference) -> tuple[Descriptor, bytes]:
        """Fetch the manifest or index ``ref`` names, verified, at most 4 MiB.

        The digest is checked against ``ref.digest`` when there is one, and
        against the registry's ``Docker-Content-Digest`` header when it sends
        one; a mismatch is DataLoss.
        """
        return self._mirrored(ref, self._get_manifest, by_digest=ref.digest is not None)

    def _get_manifest(
        self, ref: Reference, params: dict[str, str] | None
    ) -> tuple[Descriptor, bytes]:
        target = transport.image_target(ref)
        deadline = backoff.current()
        response = self.transport.request(
            "GET",
            target,
            _manifest_path(ref),
            headers={"Accept": _MANIFEST_ACCEPT},
            params=params,
            stream=True,
        )
        self.transport.check(response, target, ok=(200,))
        body = self._read_document(response, target, f"manifest of {ref}", deadline)
        sent = response.headers.get("Docker-Content-Digest", "")
        content_type = _base_type(response.headers.get("Content-Type", ""))
        expected = ref.digest or (sent if digests.is_valid(sent) else "")
        actual = digests.of(body, expected.partition(":")[0] if expected else "sha256")
        if expected and actual != expected:
            raise errors.DataLoss(
                f"manifest of {ref}: digest {expected} does not match: its content hashes to "
                f"{actual}; {blobio.CORRUPT_HINT}"
            )
        if (
            sent
            and digests.is_valid(sent)
            and sent != expected
            and digests.of(body, sent.partition(":")[0]) != sent
        ):
            raise errors.DataLoss(
                f"manifest of {ref}: the registry's Docker-Content-Digest {sent} does not "
                f"match the content; {blobio.CORRUPT_HINT}"
            )
        media_type = _media_type_of(content_type, body)
        return Descriptor(media_type=media_type, digest=actual, size=len(body)), body

    def get_parsed(self, ref: Reference) -> tuple[Descriptor, Manifest | Index]:
        """:meth:`get_manifest`, parsed and shape-checked."""
        desc, body = self.get_manifest(ref)
        return desc, parse_manifest(desc.media_type, body, what=f"manifest of {ref}")

    def resolve_image(
        self, ref: Reference, platform: Platform | None = None
    ) -> tuple[Descriptor, Manifest]:
        """The image manifest for ``platform`` (default: this machine's).

        An index or manifest list is resolved to its entry for the platform;
        the returned descriptor is that of the image manifest (with its
        platform set when it came from an index).
        """
        desc, parsed = self.get_parsed(ref)
        if isinstance(parsed, Manifest):
            return desc, parsed
        wanted = platform or Platform.current()
        entry = select_platform(parsed, wanted, what=f"image {ref}")
        child_ref = ref.with_digest(entry.digest)
        child_desc, child = self.get_parsed(child_ref)
        if isinstance(child, Index):
            raise errors.InvalidArgument(
                f"image {ref}: the index entry for {wanted} is itself an index; nested indexes "
                "are not supported"
            )
        if child_desc.size != entry.size:
            raise errors.DataLoss(
                f"manifest of {child_ref}: {child_desc.size} bytes where the index says "
                f"{entry.size}; {blobio.CORRUPT_HINT}"
            )
        child_desc.platform = entry.platform
        return child_desc, child

    def referrers(
        self, ref: Reference, digest: str, artifact_types: str | frozenset[str]
    ) -> Index | None:
        """The OCI 1.1 referrers of manifest ``digest`` of ``artifact_types`` (one type, or
        a set of them: then unfiltered by the registry), or None when the registry has no
        referrers API (a 404: the caller falls back to the tag schema).

        The answer is checked against the types, as a registry may ignore the filter.
        """
        wanted = {artifact_types} if isinstance(artifact_types, str) else artifact_types
        digests.check(digest, what="subject digest")
        target = transport.image_target(ref)
        response = self.transport.request(
            "GET",
            target,
            f"/v2/{ref.repository}/referrers/{digest}",
            params={"artifactType": artifact_types} if isinstance(artifact_types, str) else None,
            headers={"Accept": mediatypes.OCI_INDEX},
            stream=True,
        )
        if response.status_code in (404, 405):
            response.close()
            return None
        self.transport.check(response, target, ok=(200,))
        body = self._read_document(
            response, target, f"referrers of {ref.name}@{digest}", backoff.current()
        )
        parsed = parse_manifest(mediatypes.OCI_INDEX, body, what=f"referrers of {ref.name}")
        if not isinstance(parsed, Index):
            raise errors.InvalidArgument(f"referrers of {ref.name}@{digest} is not an index")
        parsed.manifests = [m for m in parsed.manifests if m.artifact_type in wanted]
        return parsed

    def _read_document(
        self,
        response: requests.Response,
        target: transport.Target,
        subject: str,
        deadline: backoff.Deadline | None,
    ) -> bytes:
        """A manifest or index body (at most ``MANIFEST_MAX`` bytes) read within ``deadline``;
        the response is closed after (its headers stay readable)."""
        with response:
            return _read_capped(
                response,
                MANIFEST_MAX,
                subject,
                deadline=deadline,
                doing=self.transport.doing(target),
            )

    def blob_size(self, ref: Reference, digest: str) -> int:
        """The size of blob ``digest`` in ``ref``'s repository (a HEAD)."""
        length = (upload.head_blob(self.transport, ref, digest) or {}).get("Content-Length", "")
        if not length.isdigit():
            subject = transport.blob_target(ref, digest).subject
            raise errors.Unavailable(f"{subject}: the registry sent no Content-Length")
        return int(length)

    def push_manifest(self, ref: Reference, body: bytes, media_type: str) -> str:
        """PUT a manifest or index under ``ref``'s tag (or its digest); return its digest."""
        return upload.push_manifest(self.transport, ref, body, media_type)

    # -- blobs -----------------------------------------------------------

    def blob_exists(self, ref: Reference, digest: str) -> bool:
        """True when the repository of ``ref`` holds blob ``digest``."""
        return upload.blob_exists(self.transport, ref, digest)

    def push_blob(
        self, ref: Reference, source: bytes | Path, **options: Unpack[upload.BlobOptions]
    ) -> Descriptor:
        """Upload a blob unless the repository has it (:func:`rukpak.oci.upload.push_blob`,
        whose keyword options ``options`` are)."""
        return upload.push_blob(self.transport, ref, source, **options)

    def fetch_blob(
        self,
        ref: Reference,
        desc: Descriptor,
        dest: Path,
        *,
        progress: blobio.Progress | None = None,
    ) -> None:
        """Download blob ``desc`` to ``dest``, verified, atomically.

        Streams into a temp file in ``dest``'s directory while hashing; on a
        size or digest mismatch raises DataLoss, removes the temp file and
        leaves ``dest`` untouched. Success is fsync + rename. A connection
        that breaks mid-stream is retried from the start (bounded, like every
        request); a registry that keeps breaking it is Unavailable.
        """
        digests.check(desc.digest, what=f"blob of {ref.name}")
        self._mirrored(ref, lambda at, params: self._fetch_blob(at, desc, dest, params, progress))

    def _fetch_blob(
        self,
        ref: Reference,
        desc: Descriptor,
        dest: Path,
        params: dict[str, str] | None,
        progress: blobio.Progress | None,
    ) -> None:
        target = transport.blob_target(ref, desc.digest)
        deadline = backoff.current()
        doing = self.transport.doing(target)

        def download() -> None:
            response = self.transport.request(
                "GET",
                target,
                f"/v2/{ref.repository}/blobs/{desc.digest}",
                params=params,
                stream=True,
            )
            self.transport.check(response, target, ok=(200,))
            with response:
                blobio.write_atomically(
                    _chunks(response, target, deadline, doing),
                    dest,
                    digest=desc.digest,
                    size=desc.size,
                    subject=f"blob {desc.digest} of {ref.name}",
                    progress=progress,
                )

        backoff.retry(
            download,
            attempts=1 + self.transport.retries,
            backoff=self.transport.backoff,
            retryable=lambda err: isinstance(err, _StreamBroken),
            sleep=self.transport.sleep,
            deadline=deadline,
        )

    @contextlib.contextmanager
    def open_blob(self, ref: Reference, desc: Descriptor) -> Iterator[BinaryIO]:
        """A binary stream of blob ``desc`` that verifies as it is read.

        DataLoss is raised when the stream ends with the wrong size or digest;
        leaving the ``with`` block normally reads and checks what was left
        unread, so corrupt content never passes silently.
        """
        digests.check(desc.digest, what=f"blob of {ref.name}")
        deadline = backoff.current()

        def opened(at: Reference, params: dict[str, str] | None) -> tuple[Any, Any]:
            target = transport.blob_target(at, desc.digest)
            answer = self.transport.request(
                "GET", target, f"/v2/{at.repository}/blobs/{desc.digest}", params=params,
                stream=True,
            )  # fmt: skip
            try:
                self.transport.check(answer, target, ok=(200,))
            except errors.RukpakError:
                answer.close()
                raise
            return answer, target

        # the mirror is asked to open the stream; one that breaks later is an error
        response, target = self._mirrored(ref, opened)
        with response:
            reader = blobio.VerifyingReader(
                _NetworkReader(response, target, deadline, self.transport.doing(target)),
                digest=desc.digest,
                size=desc.size,
                subject=f"blob {desc.digest} of {ref.name}",
            )
            with contextlib.closing(reader):  # stops its hashing thread, however it ends
                yield cast(BinaryIO, io.BufferedReader(reader, buffer_size=STREAM_BUFFER))
                reader.verify_rest()


def _manifest_path(ref: Reference) -> str:
    return f"/v2/{ref.repository}/manifests/{ref.identifier}"


def _base_type(content_type: str) -> str:
    return content_type.split(";", 1)[0].strip()


def _media_type_of(content_type: str, body: bytes) -> str:
    """The manifest's media type: the Content-Type, or the body's own when that is generic."""
    if content_type in mediatypes.INDEX_TYPES | mediatypes.MANIFEST_TYPES:
        return content_type
    try:
        declared = json.loads(body).get("mediaType")
    except (ValueError, AttributeError):
        declared = None
    return declared if isinstance(declared, str) and declared else content_type


def _read_capped(
    response: requests.Response,
    limit: int,
    subject: str,
    *,
    deadline: backoff.Deadline | None = None,
    doing: str = "",
) -> bytes:
    length = response.headers.get("Content-Length", "")
    if length.isdigit() and int(length) > limit:
        raise errors.InvalidArgument(f"{subject} is {length} bytes; the limit is {limit}")
    data = bytearray()
    try:
        for chunk in response.iter_content(64 << 10):
            if deadline is not None:
                deadline.check(doing)
            data += chunk
            if len(data) > limit:
                raise errors.InvalidArgument(f"{subject} is larger than the {limit}-byte limit")
    except requests.RequestException as exc:
        if deadline is not None and deadline.expired():
            raise deadline.exceeded(doing, detail="reading the manifest") from None
        raise errors.Unavailable(f"{subject}: the connection broke while reading: {exc}") from None
    return bytes(data)


class _StreamBroken(errors.Unavailable):
    """The connection broke while content was streaming (worth retrying)."""


def _chunks(
    response: requests.Response,
    target: transport.Target,
    deadline: backoff.Deadline | None,
    doing: str,
) -> Iterator[bytes]:
    try:
        for chunk in response.raw.stream(CHUNK, decode_content=False):
            if deadline is not None:
                deadline.check(doing)
            yield chunk
    except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
        raise _broken(target, exc, deadline, doing) from None


class _NetworkReader:
    """``response.raw`` whose network failures become :class:`_StreamBroken`, read until
    ``deadline`` (captured where the stream opened: the reader may be another thread).

    :meth:`readinto` fills the caller's buffer straight from the socket through
    ``http.client``'s own ``readinto`` under urllib3's response (one copy, no allocation
    per chunk), which urllib3's ``read`` and ``readinto`` do not (a new ``bytes`` per
    chunk, copied again into the buffer). That reaches into urllib3's ``_fp``: when it
    is not an ``http.client`` response, or urllib3 already holds part of the body, the
    reader falls back to ``read``. Either way the bytes are the body as sent (no content
    decoding), and a connection that closes before the promised length is broken, not
    short content.
    """

    def __init__(
        self,
        response: requests.Response,
        target: transport.Target,
        deadline: backoff.Deadline | None = None,
        doing: str = "",
    ) -> None:
        self._raw = response.raw
        self._target = target
        self._deadline = deadline
        self._doing = doing
        fp = getattr(self._raw, "_fp", None)
        buffered = getattr(self._raw, "_decoded_buffer", None)
        direct = isinstance(fp, http.client.HTTPResponse) and not (buffered and len(buffered))
        self._direct: http.client.HTTPResponse | None = fp if direct else None

    def read(self, size: int = -1, /) -> bytes:
        if self._deadline is not None:
            self._deadline.check(self._doing)
        try:
            return cast(bytes, self._raw.read(size, decode_content=False))
        except (requests.RequestException, urllib3.exceptions.HTTPError, OSError) as exc:
            raise _broken(self._target, exc, self._deadline, self._doing) from None

    def readinto(self, buffer: memoryview) -> int:
        fp = self._direct
        if fp is None:
            data = self.read(len(buffer))
            buffer[: len(data)] = data
            return len(data)
        if self._deadline is not None:
            self._deadline.check(self._doing)
        try:
            n = fp.readinto(buffer)
        except (http.client.HTTPException, OSError) as exc:
            raise _broken(self._target, exc, self._deadline, self._doing) from None
        if not n and len(buffer) and fp.length:  # closed before Content-Length was reached
            raise _broken(
                self._target, ConnectionError("closed early"), self._deadline, self._doing
            )
        return n


def _broken(
    target: transport.Target,
    exc: BaseException,
    deadline: backoff.Deadline | None = None,
    doing: str = "",
) -> errors.RukpakError:
    if deadline is not None and deadline.expired():
        return deadline.exceeded(doing, detail="the download stalled")
    return _StreamBroken(
        f"{target.subject}: the connection to registry {target.host} broke during the "
        f"download ({type(exc).__name__}); retry later"
    )
