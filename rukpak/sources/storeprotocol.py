"""The store volume's request protocol: what a pod asks for on the volume's socket, and
the answer, in one place for both ends.

A store volume (volume attribute ``kind: store``, ``csi.node.storevolume``) is one
directory the node plugin mounts read-only into an allowed pod. Content appears in it by
digest, ``<mount>/<digest>/…``, once the pod asked for it with a credential the plugin
checked. It asks on the unix socket ``<mount>/.rukpak-store.sock`` the plugin serves in
the volume, one JSON object per line, one answer line per request, in order, as many
requests per connection as the pod likes:

request, one of two shapes:

- ``{"ref": "registry/repo@sha256:<hex>"}`` plus the credential, either
  ``"dockerconfigjson"`` (a pull Secret's ``.dockerconfigjson`` text) or ``"username"``
  and ``"password"`` (for the ref's registry), neither for an anonymous pull; optionally
  ``"retainFor"`` (the owner key) with ``"retain"`` (a list of pinned refs: the owner's
  kept revisions), as the volume attributes of the same names;
- ``{"volumeAttributes": {…}, "secrets": {…}}``: exactly what a bundle volume of a pod
  carries (``rukpak.sources.volume``: an image pinned by digest with its registry's TLS
  fields, a git commit or an http tarball pinned by digest, ``retainFor``/``retain``),
  and the data of its publish Secret (a ``.dockerconfigjson``, or a git/http source's
  auth), so a standing provisioner is served by the same rules as a pod's volume.

answer: ``{"ok": true, "digest": "sha256:<hex>", "path": "sha256:<hex>"}`` (``path``
relative to the mount; for an image both are its digest, for a git or http tree the
digest is its commit or content digest and the path the tree's key, one per content and
credential) or ``{"ok": false, "code": "<gRPC status code name>", "message": "…"}``.
A line longer than :data:`MAX_LINE` bytes is answered once, then the connection is
closed (the stream cannot be resynchronised).

Where it sits: the node plugin parses requests and writes answers with it
(``csi.node.storevolume``); the provisioner side asks through
``rukpak.sources.storeclient``. Credentials never appear in a repr or a message.
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypedDict, Unpack

from rukpak.common import errors
from rukpak.oci.auth import Credential, Credentials
from rukpak.oci.reference import Reference
from rukpak.sources import volume
from rukpak.sources.volume import VolumeSource

SOCKET_NAME = ".rukpak-store.sock"
"""The socket in the root of every store volume."""
MAX_LINE = 256 * 1024
"""Bytes one request line may hold (a dockerconfigjson with many registries fits)."""
DIGEST_RE = re.compile(r"^sha256:[0-9a-f]{64}$")
FIELDS = (
    "ref",
    "dockerconfigjson",
    "username",
    "password",
    "retainFor",
    "retain",
    "volumeAttributes",
    "secrets",
)
MAX_MAP_ENTRIES = 64
"""Entries ``volumeAttributes`` or ``secrets`` may hold."""
_CODES = {
    cls.code: cls
    for cls in (
        errors.InvalidArgument,
        errors.NotFound,
        errors.AlreadyExists,
        errors.FailedPrecondition,
        errors.ResourceExhausted,
        errors.Unavailable,
        errors.PermissionDenied,
        errors.Unauthenticated,
        errors.DeadlineExceeded,
        errors.Aborted,
        errors.DataLoss,
        errors.Internal,
    )
}


@dataclass(frozen=True)
class StoreRequest:
    """One request: content ``ref`` pinned by ``digest``, what to present for it, and
    what its owner retains; or (``source`` set) a bundle volume's attributes and secret,
    where ``ref`` names the content for logs and ``digest`` is empty."""

    ref: str
    digest: str
    credentials: Credentials | None = field(default=None, repr=False)
    retain_for: str = ""
    retain: tuple[str, ...] = ()
    source: VolumeSource | None = field(default=None, repr=False)


@dataclass(frozen=True)
class StoreAnswer:
    """``digest`` and ``path`` (relative to the mount) when ``ok``; else ``code`` (a
    gRPC status code name) and ``message``."""

    ok: bool
    digest: str = ""
    path: str = ""
    code: str = ""
    message: str = ""

    def error(self) -> errors.RukpakError:
        """The answer's error as the ``rukpak.common.errors`` value of its code."""
        return _CODES.get(self.code, errors.Internal)(self.message)


def short_path(directory: Path, name: str) -> tuple[str, int]:
    """A path to ``directory / name`` short enough for a unix socket address (at most 107
    bytes, where a kubelet target path alone may take more): through an ``O_PATH``
    descriptor of ``directory`` (``/proc/self/fd/<fd>/<name>``). Returns the path and the
    descriptor, to close once the socket is bound or connected."""
    fd = os.open(directory, os.O_PATH | os.O_DIRECTORY | os.O_CLOEXEC)
    return f"/proc/self/fd/{fd}/{name}", fd


def parse_request(line: bytes) -> StoreRequest:
    """One request line parsed and checked; InvalidArgument naming what is wrong (never
    quoting a credential)."""
    if len(line) > MAX_LINE:
        raise errors.InvalidArgument(f"request line longer than {MAX_LINE} bytes")
    try:
        doc = json.loads(line)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        where = f" at column {exc.colno}" if isinstance(exc, json.JSONDecodeError) else ""
        raise errors.InvalidArgument(
            f"request is not a JSON object on one line{where}: send "
            '{"ref": "registry/repo@sha256:<hex>", ...} followed by a newline'
        ) from None
    if not isinstance(doc, dict):
        raise errors.InvalidArgument("request must be a JSON object")
    unknown = sorted(str(k)[:40] for k in doc if k not in FIELDS)
    if unknown:
        raise errors.InvalidArgument(
            f"unknown request field(s) {', '.join(unknown)}; supported: {', '.join(FIELDS)}"
        )
    if "volumeAttributes" in doc:
        return _volume_request(doc)
    if "secrets" in doc:
        raise errors.InvalidArgument("request field 'secrets' goes with 'volumeAttributes'")
    for key, value in doc.items():
        if key != "retain" and not isinstance(value, str):
            raise errors.InvalidArgument(f"request field {key!r} must be a string")
    text = doc.get("ref", "")
    if not text:
        raise errors.InvalidArgument("request field 'ref' is required: registry/repo@sha256:<hex>")
    ref = Reference.parse(text)
    if ref.digest is None or not DIGEST_RE.match(ref.digest):
        raise errors.InvalidArgument(
            f"ref {text[:300]!r} is not pinned by digest: a store volume serves content by "
            "digest only, write registry/repo@sha256:<64 hex>"
        )
    retain = doc.get("retain", [])
    if not isinstance(retain, list) or not all(isinstance(r, str) for r in retain):
        raise errors.InvalidArgument("request field 'retain' must be a list of strings")
    return StoreRequest(
        ref=text,
        digest=ref.digest,
        credentials=_credentials(doc, ref),
        retain_for=doc.get("retainFor", ""),
        retain=tuple(retain),
    )


def _string_map(doc: dict[str, Any], key: str) -> dict[str, str]:
    value = doc.get(key, {})
    if not isinstance(value, dict) or not all(
        isinstance(k, str) and isinstance(v, str) for k, v in value.items()
    ):
        raise errors.InvalidArgument(f"request field {key!r} must map strings to strings")
    if len(value) > MAX_MAP_ENTRIES:
        raise errors.InvalidArgument(f"request field {key!r} holds more than {MAX_MAP_ENTRIES}")
    return value


def _volume_request(doc: dict[str, Any]) -> StoreRequest:
    """A request in a bundle volume's terms, parsed by the rules of a pod's volume."""
    others = sorted(k for k in doc if k not in ("volumeAttributes", "secrets"))
    if others:
        raise errors.InvalidArgument(
            f"request field(s) {', '.join(others)} do not go with 'volumeAttributes' "
            "(retainFor and retain are volume attributes there)"
        )
    attributes = _string_map(doc, "volumeAttributes")
    secrets = _string_map(doc, "secrets")
    kubelets = sorted(k for k in attributes if k.startswith(volume.K8S_ATTRIBUTE_PREFIX))
    if kubelets:
        raise errors.InvalidArgument(
            f"volume attribute(s) {', '.join(kubelets)[:200]} are kubelet's to set, not a request's"
        )
    if volume.volume_kind(attributes) != volume.KIND_BUNDLE:
        raise errors.InvalidArgument("a store volume serves bundle content, not another store")
    mode = attributes.get(volume.ATTR_PUBLISH_MODE, "bind")
    if mode != "bind":
        raise errors.InvalidArgument(
            f"publishMode {mode[:20]!r}: a store volume shows content as bind mounts only"
        )
    source = volume.VolumeSource.from_attributes(attributes).with_secrets(secrets)
    if source.fetch is None:
        ref = Reference.parse(source.image)
        if ref.digest is None or not DIGEST_RE.match(ref.digest):
            raise errors.InvalidArgument(
                f"image {source.image[:300]!r} is not pinned by digest: a store volume serves "
                "content by digest only, write registry/repo@sha256:<64 hex>"
            )
        label, digest = source.image, ref.digest
    else:
        label, digest = source.fetch.label(), ""
    return StoreRequest(
        ref=label,
        digest=digest,
        credentials=volume.credentials_from_secrets(secrets, source),
        source=source,
    )


def _credentials(doc: dict[str, Any], ref: Reference) -> Credentials | None:
    if "dockerconfigjson" in doc and ("username" in doc or "password" in doc):
        raise errors.InvalidArgument(
            "request fields 'dockerconfigjson' and 'username'/'password' are exclusive"
        )
    if "dockerconfigjson" in doc:
        return Credentials.from_dockerconfigjson(doc["dockerconfigjson"])
    if "username" in doc or "password" in doc:
        if not doc.get("username") or not doc.get("password"):
            raise errors.InvalidArgument("request fields 'username' and 'password' go together")
        return Credentials({ref.api_host: Credential(doc["username"], doc["password"])})
    return None


class RequestOptions(TypedDict, total=False):
    """What a request may carry beside its ``ref``: a pull credential (a
    ``.dockerconfigjson``, or a user name and password, not both) and, with ``retain_for``
    (a holder's name), the refs that holder keeps (``retain``)."""

    dockerconfigjson: str | None
    username: str | None
    password: str | None
    retain_for: str
    retain: Sequence[str]


def encode_request(ref: str, **options: Unpack[RequestOptions]) -> bytes:
    """One request line (newline-terminated)."""
    doc: dict[str, Any] = {"ref": ref}
    dockerconfigjson = options.get("dockerconfigjson")
    if dockerconfigjson is not None:
        doc["dockerconfigjson"] = dockerconfigjson
    username, password = options.get("username"), options.get("password")
    if username is not None or password is not None:
        doc["username"], doc["password"] = username or "", password or ""
    retain_for = options.get("retain_for", "")
    if retain_for:
        doc["retainFor"], doc["retain"] = retain_for, list(options.get("retain", ()))
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


def encode_volume_request(attributes: dict[str, str], secrets: dict[str, str]) -> bytes:
    """One request line in a bundle volume's terms (newline-terminated)."""
    doc = {"volumeAttributes": attributes, "secrets": secrets}
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


def encode_answer(answer: StoreAnswer) -> bytes:
    """One answer line (newline-terminated)."""
    if answer.ok:
        doc: dict[str, Any] = {"ok": True, "digest": answer.digest, "path": answer.path}
    else:
        doc = {"ok": False, "code": answer.code, "message": answer.message}
    return json.dumps(doc, separators=(",", ":")).encode() + b"\n"


def failure(exc: errors.RukpakError) -> StoreAnswer:
    return StoreAnswer(ok=False, code=exc.code, message=exc.message)


def parse_answer(line: bytes) -> StoreAnswer:
    """An answer line; Unavailable when it is not one (the plugin went away mid-line)."""
    try:
        doc = json.loads(line)
        if not isinstance(doc, dict) or not isinstance(doc.get("ok"), bool):
            raise ValueError("no 'ok'")
        if doc["ok"]:
            return StoreAnswer(ok=True, digest=str(doc["digest"]), path=str(doc["path"]))
        return StoreAnswer(ok=False, code=str(doc["code"]), message=str(doc["message"]))
    except (ValueError, KeyError):
        raise errors.Unavailable(
            f"the store volume's socket answered {line[:200]!r}, not an answer line"
        ) from None
