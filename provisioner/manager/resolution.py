"""Pinning a Bundle's source once: a tag to a digest, a branch or tag to a commit, an http
URL to the digest of its content, a list of ConfigMaps to their checked keys.

Sits under ``actuate.resolve_bundle`` (which records the result as the Bundle's
``status.resolvedSource``, see ``sources``), and over the fetchers of
``rukpak.sources`` and the image resolver. Auth Secrets and ConfigMaps are read from
the system namespace, as upstream RukPak reads them.

Errors are values with a code: ``permanent(err)`` tells the caller whether the
Bundle is Failing (the user must fix the source, a Secret or a ConfigMap; retried
with backoff so a fix is picked up) or stays Pending (the server did not answer).
"""

from __future__ import annotations

import base64
import binascii
from dataclasses import dataclass, field
from typing import Any, Protocol

from provisioner.engine.bundle import words
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef
from provisioner.manager.planning import sources
from rukpak.common import errors
from rukpak.oci import tls as source_tls
from rukpak.oci.auth import Credentials
from rukpak.sources import git as gitsource
from rukpak.sources import http as httpsource
from rukpak.sources.auth import SourceAuth


class ImageResolver(Protocol):
    """Pins an image reference (a tag to ``repository@sha256:...``), with the pull
    credentials of the source's ``pullSecret`` when it names one."""

    def __call__(self, ref: str, /, *, credentials: Credentials | None = None) -> str: ...


PERMANENT = (
    errors.InvalidArgument,
    errors.NotFound,
    errors.PermissionDenied,
    errors.FailedPrecondition,
    errors.ResourceExhausted,
    errors.Unauthenticated,
)


@dataclass(frozen=True)
class Resolution:
    """The pinned ``resolvedSource`` and annotations to record on the Bundle first."""

    resolved: Obj
    annotations: dict[str, str] = field(default_factory=dict)


def permanent(err: errors.RukpakError) -> bool:
    return isinstance(err, PERMANENT)


def _section(obj: Obj, key: str) -> Obj:
    value: Any = obj.get(key)
    return value if isinstance(value, dict) else {}


def _auth(kube: Kube, spec: Obj, namespace: str) -> tuple[SourceAuth | None, bool]:
    auth = _section(spec, "auth")
    insecure = bool(auth.get("insecureSkipVerify"))
    name = str(_section(auth, "secret").get("name") or "")
    if not name:
        return None, insecure
    secret = kube.get(ObjectRef("", "v1", "Secret", namespace, name))
    if secret is None:
        raise errors.NotFound(
            f"auth secret {namespace}/{name} not found: create it in the system namespace"
        )
    return SourceAuth.from_secret(secret, name=f"{namespace}/{name}"), insecure


def fetch_tls(spec: Obj, location: str, *, where: str) -> source_tls.SourceTLS | None:
    """A git or http source's TLS: its ``certificateData`` (ours; upstream v0.24 has no CA
    field for these sources) and upstream's ``auth.insecureSkipVerify``; InvalidArgument
    naming ``where`` when the data is not PEM or the location is not https://."""
    tls = source_tls.SourceTLS.from_fields(
        spec.get("certificateData"),
        _section(spec, "auth").get("insecureSkipVerify"),
        where=where,
        server="server",
    )
    return source_tls.for_url(location, tls, where=where)


def pull_credentials(kube: Kube, name: str, namespace: str) -> Credentials:
    """The pull credentials of an image source's ``pullSecret`` (a Secret of type
    ``kubernetes.io/dockerconfigjson`` in the system namespace, as upstream reads it)."""
    secret = kube.get(ObjectRef("", "v1", "Secret", namespace, name))
    if secret is None:
        raise errors.NotFound(
            f"pull secret {namespace}/{name} not found: create it in the system namespace "
            "(kubectl create secret docker-registry)"
        )
    data = secret.get("data") or {}
    for key in (".dockerconfigjson", ".dockercfg"):
        if isinstance(data.get(key), str):
            try:
                text = base64.b64decode(data[key], validate=True)
            except (binascii.Error, ValueError):
                break
            return Credentials.from_dockerconfigjson(text)
    raise errors.InvalidArgument(
        f"pull secret {namespace}/{name} has no readable '.dockerconfigjson' key: use a "
        "Secret of type kubernetes.io/dockerconfigjson (kubectl create secret docker-registry)"
    )


def resolve(kube: Kube, source: Obj, *, namespace: str, resolve_image: ImageResolver) -> Resolution:
    """Pin ``source`` (a Bundle's ``spec.source``); raises a ``RukpakError`` if it cannot."""
    kind = source.get("type")
    if kind == "image":
        spec = _section(source, "image")
        ref = str(spec.get("ref") or "")
        secret = str(spec.get("pullSecret") or "")
        tls = source_tls.SourceTLS.from_fields(
            spec.get("certificateData"),
            spec.get("insecureSkipTLSVerify"),
            where="source.image.certificateData",
        )
        if not secret and tls is None:
            return Resolution(sources.pinned_image(resolve_image(ref)))
        # With the source's own TLS, a client of its own (as for a pull secret) made
        # under that trust: the shared one never sees it.
        credentials = pull_credentials(kube, secret, namespace) if secret else Credentials()
        with source_tls.using(tls):
            pinned = resolve_image(ref, credentials=credentials)
        return Resolution(sources.pinned_image(pinned, pull_secret=secret, tls=spec))
    if kind == "git":
        spec = _section(source, "git")
        repository = str(spec.get("repository") or "")
        gitsource.check_directory(str(spec.get("directory") or ""), repository)
        tls = fetch_tls(spec, repository, where="source.git.certificateData")
        auth, insecure = _auth(kube, spec, namespace)
        commit = gitsource.resolve(
            repository, _section(spec, "ref"), auth=auth, insecure=insecure, tls=tls
        )
        return Resolution(sources.pinned_git(spec, commit))
    if kind == "http":
        spec = _section(source, "http")
        url, _pin = httpsource.split_pinned(str(spec.get("url") or ""))
        tls = fetch_tls(spec, url, where="source.http.certificateData")
        auth, insecure = _auth(kube, spec, namespace)
        digest = httpsource.fetch(url, auth=auth, insecure=insecure, tls=tls)
        return Resolution(sources.pinned_http({**spec, "url": url}, digest))
    if kind == "configMaps":
        entries = [e for e in source.get("configMaps") or [] if isinstance(e, dict)]
        items = configmap_items(kube, entries, namespace=namespace)
        return Resolution(
            sources.pinned_configmaps(entries),
            {sources.ITEMS_ANNOTATION: sources.items_annotation(items)},
        )
    raise errors.InvalidArgument(f'bundle source type "{kind}" not supported')


def configmap_items(kube: Kube, entries: list[Obj], *, namespace: str) -> list[list[str]]:
    """``[configMap, key, path in the bundle]`` for every file, after upstream's checks:
    each ConfigMap exists and is immutable; no two put a file at the same path."""
    if not entries:
        raise errors.InvalidArgument("source.configMaps lists no ConfigMap")
    problems: list[str] = []
    seen: dict[str, str] = {}
    items: list[list[str]] = []
    for entry in entries:
        name = str(_section(entry, "configMap").get("name") or "")
        try:
            directory = sources.bundle_path(entry.get("path"))
        except ValueError as exc:
            problems.append(f"configmap {namespace}/{name}: {exc}")
            continue
        cm = kube.get(ObjectRef("", "v1", "ConfigMap", namespace, name))
        if cm is None:
            problems.append(f'get configmap {namespace}/{name}: ConfigMap "{name}" not found')
            continue
        if cm.get("immutable") is not True:
            problems.append(
                f"configmap {namespace}/{name} is mutable: all bundle configmaps must be immutable"
            )
            continue
        keys = sorted({*(cm.get("data") or {}), *(cm.get("binaryData") or {})})
        for key in keys:
            path = f"{directory}/{key}" if directory else key
            if path in seen:
                problems.append(
                    f"configmap {namespace}/{name} contains path {_quote(path)} which is already "
                    f"referenced by configmap {namespace}/{seen[path]}"
                )
                continue
            seen[path] = name
            items.append([name, key, path])
    if problems:  # in upstream's words (its unpacker's prefix, the cache client's NotFound)
        raise errors.FailedPrecondition(words.source_refused("; ".join(problems)))
    return items


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
