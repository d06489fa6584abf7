"""Pushing: blobs (monolithic or chunked uploads) and manifests, including indexes.

The write half of ``rukpak.oci``, behind ``RegistryClient.push_blob`` and
``RegistryClient.push_manifest``; the tests use it to publish bundle images
to the real registry, and a ``rukpak`` CLI can push bundles with it. Built on
``rukpak.oci.transport`` like the pull side. Files are streamed from disk, never
read whole; a blob the repository already has is not uploaded again; the
registry checks each blob's digest on the final PUT, and the digest it
reports for a manifest is checked against the bytes sent.
"""

from __future__ import annotations

import os
import urllib.parse
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import BinaryIO, Final, TypedDict

import requests

from rukpak.common import errors
from rukpak.oci import blobio, transport
from rukpak.oci import digest as digests
from rukpak.oci.manifest import Descriptor, parse_manifest
from rukpak.oci.reference import Reference

CHUNK: Final[int] = 1 << 20  # read size when hashing a file
MONOLITHIC_MAX: Final[int] = 16 << 20  # larger uploads go in PATCH chunks of this size


def push_manifest(client: transport.Transport, ref: Reference, body: bytes, media_type: str) -> str:
    """PUT a manifest or index under ``ref``'s tag (or its digest); return its digest."""
    computed = digests.of(body, ref.digest.partition(":")[0] if ref.digest else "sha256")
    if ref.digest is not None and ref.digest != computed:
        raise errors.InvalidArgument(
            f"cannot push to {ref}: the manifest's digest is {computed}, not {ref.digest}"
        )
    parse_manifest(media_type, body, what=f"manifest for {ref}")
    target = transport.image_target(ref, push=True)
    where = ref.tag if ref.tag is not None else computed
    response = client.request(
        "PUT",
        target,
        f"/v2/{ref.repository}/manifests/{where}",
        headers={"Content-Type": media_type},
        body=body,
    )
    client.check(response, target, ok=(200, 201, 202))
    response.close()
    sent = response.headers.get("Docker-Content-Digest", "")
    if sent and digests.is_valid(sent) and sent.startswith("sha256:") and sent != digests.of(body):
        raise errors.DataLoss(
            f"registry {ref.registry} stored the manifest for {ref} as {sent}, "
            f"not {computed}; {blobio.CORRUPT_HINT}"
        )
    return computed


def head_blob(
    client: transport.Transport,
    ref: Reference,
    digest: str,
    *,
    for_push: bool = False,
    missing_ok: bool = False,
) -> Mapping[str, str] | None:
    """The response headers of a HEAD on blob ``digest`` in ``ref``'s repository; None
    when the registry answers 404 and ``missing_ok`` (else the registry's error).

    ``for_push`` asks for a push token up front (saves one token request
    when an upload follows).
    """
    digests.check(digest, what=f"blob of {ref.name}")
    target = transport.blob_target(ref, digest, push=for_push)
    response = client.request("HEAD", target, f"/v2/{ref.repository}/blobs/{digest}")
    response.close()
    if response.status_code == 404 and missing_ok:
        return None
    client.check(response, target, ok=(200,))
    return response.headers


def blob_exists(
    client: transport.Transport, ref: Reference, digest: str, *, for_push: bool = False
) -> bool:
    """True when the repository of ``ref`` holds blob ``digest`` (``for_push``: see
    :func:`head_blob`)."""
    return head_blob(client, ref, digest, for_push=for_push, missing_ok=True) is not None


class BlobOptions(TypedDict, total=False):
    """The keyword options of :func:`push_blob`, for a caller that passes them on
    (``RegistryClient.push_blob``); their defaults and meaning are push_blob's."""

    digest: str | None
    media_type: str
    progress: blobio.Progress | None


def push_blob(
    client: transport.Transport,
    ref: Reference,
    source: bytes | Path,
    *,
    digest: str | None = None,
    media_type: str = "application/octet-stream",
    progress: blobio.Progress | None = None,
) -> Descriptor:
    """Upload a blob to ``ref``'s repository unless it is already there.

    ``source`` is bytes or a file streamed from disk (never read whole).
    Small content goes in one POST + PUT; files over 16 MiB in PATCH chunks.
    The registry checks the digest on the final PUT.
    """
    if isinstance(source, bytes):
        size = len(source)
        digest = digest or digests.of(source)
    else:
        size = source.stat().st_size
        digest = digest or _file_digest(source)
    digests.check(digest, what=f"blob for {ref.name}")
    desc = Descriptor(media_type=media_type, digest=digest, size=size)
    target = transport.blob_target(ref, digest, push=True)
    if blob_exists(client, ref, digest, for_push=True):
        if progress is not None:
            progress(size, size)
        return desc
    response = client.request("POST", target, f"/v2/{ref.repository}/blobs/uploads/", body=b"")
    client.check(response, target, ok=(202,))
    response.close()
    location = _location(client, ref, response)
    if size <= MONOLITHIC_MAX:
        body: transport.Body = source if isinstance(source, bytes) else _opener(source, 0, size)
        final = client.request(
            "PUT",
            target,
            _with_query(location, digest=digest),
            headers={"Content-Type": "application/octet-stream", "Content-Length": str(size)},
            body=body,
        )
    else:
        offset = 0
        while offset < size:
            length = min(MONOLITHIC_MAX, size - offset)
            chunk_body: transport.Body = (
                source[offset : offset + length]
                if isinstance(source, bytes)
                else _opener(source, offset, length)
            )
            response = client.request(
                "PATCH",
                target,
                location,
                headers={
                    "Content-Type": "application/octet-stream",
                    "Content-Length": str(length),
                    "Content-Range": f"{offset}-{offset + length - 1}",
                },
                body=chunk_body,
                retry=False,
            )
            client.check(response, target, ok=(202,))
            response.close()
            location = _location(client, ref, response)
            offset += length
            if progress is not None:
                progress(offset, size)
        final = client.request("PUT", target, _with_query(location, digest=digest), body=b"")
    if final.status_code == 400:
        codes = final.text
        final.close()
        if "DIGEST_INVALID" in codes or "SIZE_INVALID" in codes:
            raise errors.InvalidArgument(
                f"registry {ref.registry} refused blob {digest} for {ref.name}: the content "
                "does not match the digest given"
            )
    client.check(final, target, ok=(201,))
    final.close()
    if progress is not None:
        progress(size, size)
    return desc


def _location(client: transport.Transport, ref: Reference, response: requests.Response) -> str:
    location = response.headers.get("Location", "")
    if not location:
        raise errors.Unavailable(
            f"registry {ref.registry} started an upload for {ref.name} without a Location"
        )
    return urllib.parse.urljoin(client.base_url(ref.api_host) + "/", location)


def _file_digest(path: Path) -> str:
    digester = digests.Digester()
    with path.open("rb") as handle:
        while chunk := handle.read(CHUNK):
            digester.update(chunk)
    return digester.digest()


def _opener(path: Path, offset: int, length: int) -> Callable[[], transport.Readable]:
    """A factory of streams over ``length`` bytes of ``path`` from ``offset``."""

    def open_range() -> transport.Readable:
        handle = path.open("rb")
        if offset == 0 and length == os.fstat(handle.fileno()).st_size:
            return handle
        handle.seek(offset)
        return _Window(handle, length)

    return open_range


class _Window:
    """At most ``length`` bytes of an open file, then EOF.

    Deliberately not an ``io`` class: requests sizes it with ``len()`` and
    sends it with the Content-Length it gives, never chunked.
    """

    def __init__(self, handle: BinaryIO, length: int) -> None:
        self._handle = handle
        self._left = length

    def __len__(self) -> int:
        return self._left

    def read(self, size: int = -1, /) -> bytes:
        if self._left <= 0:
            return b""
        data = self._handle.read(self._left if size < 0 else min(size, self._left))
        self._left -= len(data)
        return data

    def close(self) -> None:
        self._handle.close()


def _with_query(url: str, **params: str) -> str:
    parts = urllib.parse.urlsplit(url)
    query = urllib.parse.parse_qsl(parts.query, keep_blank_values=True)
    query.extend(params.items())
    return urllib.parse.urlunsplit(parts._replace(query=urllib.parse.urlencode(query)))
