"""Bundle sources: which ``spec.source`` types the manager handles, how a source is
pinned, and how a pinned one reaches a pod.

Sits under both planners (``bundleplan`` for Bundles, ``plan`` for
BundleDeployments) and ``generate`` (the pods): ``unsupported(source)`` says
why a source cannot be handled (None when it can); ``pinned(bundle)`` is the
Bundle's ``status.resolvedSource`` once the Bundle controller pinned it, None
before; ``volume(resolved)`` is the read-only pod volume named ``bundle`` that
carries that exact content to the unpack pod and the instance pod. Bundle
content never passes through etcd or logs: it reaches pods only as this volume.

Pins, in upstream RukPak's ``resolvedSource`` shapes:

- image: ``{type: image, image: {ref: repo@sha256:...}}``, keeping the source's
  ``pullSecret``, ``certificateData`` and ``insecureSkipTLSVerify`` (the volume presents
  them to the node plugin: the registry's TLS trust travels with that volume only);
- git: ``{type: git, git: {repository, directory, ref: {commit}, auth}}``, the
  branch or tag resolved to its commit once (keeping ``certificateData``, the server's CA,
  which the volume presents as an attribute of the same name);
- http: ``{type: http, http: {url, auth}}`` (and ``certificateData``, as for git) where
  the URL carries the digest of the content fetched when pinning in its fragment
  (``#sha256=<hex>``, see ``rukpak.sources.http``); the node plugin refuses other content;
- configMaps: the list as given (the ConfigMaps are immutable, as upstream
  requires). Their keys, which the projected volume must list to place them
  under each ``path``, are recorded once in the Bundle's annotation
  ``core.rukpak.io/configmap-items``; ``pinned`` hands them on under
  ``ITEMS_KEY``, which ``stored`` removes before a status write.

git and http volumes are our CSI driver's (attributes of ``rukpak.sources.volume``),
with the auth Secret (system namespace) as the volume's ``nodePublishSecretRef``;
configMaps become a projected volume.
"""

from __future__ import annotations

import json
import posixpath
import re
from typing import Any

from provisioner.engine.objects import Obj, json_annotation
from rukpak.sources import http as httpsource

VOLUME_NAME = "bundle"
CSI_DRIVER = "csi.rukpak.io"
SUPPORTED = ("image", "git", "http", "configMaps")
ITEMS_ANNOTATION = "core.rukpak.io/configmap-items"
ITEMS_KEY = "x-rukpak-configmap-items"
"""Where ``pinned`` puts the ConfigMaps' items; never stored in the API."""
MULTI = "x-rukpak-sources"
"""The ``type`` of several pinned sources (``several``), each with its ``destination``:
what a v1alpha2 ``spec.sources`` pins to; never stored in the API as such."""
TLS_FIELDS = ("certificateData", "insecureSkipTLSVerify")
"""An image source's registry TLS fields (upstream's names), kept in its pin and handed to
the node plugin as volume attributes of the same names (``rukpak.sources.volume``)."""
_COMMIT = re.compile(r"^[0-9a-f]{40}$")


def unsupported(source: Obj) -> str | None:
    """Why ``source`` cannot be unpacked here, in upstream's words; None when it can."""
    kind = source.get("type")
    if kind in SUPPORTED:
        return None
    return f'source bundle content: bundle source type "{kind}" not supported'


def _section(resolved: Obj, key: str) -> Obj:
    section: Any = resolved.get(key)
    return section if isinstance(section, dict) else {}


def pinned(bundle: Obj) -> Obj | None:
    """The Bundle's ``status.resolvedSource`` when it is pinned, else None."""
    resolved: Any = (bundle.get("status") or {}).get("resolvedSource")
    if not isinstance(resolved, dict):
        return None
    kind = resolved.get("type")
    if kind == "image" and _section(resolved, "image").get("ref"):
        return resolved
    if kind == "git" and _COMMIT.match(
        str(_section(_section(resolved, "git"), "ref").get("commit"))
    ):
        return resolved
    if kind == "http":
        _url, digest = httpsource.split_pinned(str(_section(resolved, "http").get("url") or ""))
        return resolved if digest is not None else None
    if kind == "configMaps" and isinstance(resolved.get("configMaps"), list):
        items = _items(json_annotation(bundle, ITEMS_ANNOTATION))
        return {**resolved, ITEMS_KEY: items} if items is not None else None
    return None


def _items(doc: Any) -> list[list[str]] | None:
    if not isinstance(doc, list) or not all(
        isinstance(i, list) and len(i) == 3 and all(isinstance(s, str) for s in i) for i in doc
    ):
        return None
    return [list(i) for i in doc]


def stored(resolved: Obj) -> Obj:
    """``resolved`` as the API stores it (without what ``pinned`` added)."""
    return {k: v for k, v in resolved.items() if k != ITEMS_KEY}


def several(entries: list[tuple[str, Obj]]) -> Obj:
    """Several pinned sources, each placed at its destination directory."""
    return {"type": MULTI, "sources": [{**r, "destination": d} for d, r in entries]}


def parts(resolved: Obj) -> list[tuple[str, Obj]]:
    """(destination, pinned source) of each source; one at "" for a single source."""
    if resolved.get("type") != MULTI:
        return [("", resolved)]
    out: list[tuple[str, Obj]] = []
    for entry in resolved.get("sources") or []:
        if isinstance(entry, dict):
            out.append(
                (
                    str(entry.get("destination") or ""),
                    {k: v for k, v in entry.items() if k != "destination"},
                )
            )
    return out


def pinned_image(ref: str, *, pull_secret: str = "", tls: Obj | None = None) -> Obj:
    """The ``resolvedSource`` of an image pinned by digest (with the ``pullSecret`` its
    volume presents, when the source names one, and the source's TLS fields ``tls``:
    ``certificateData``, ``insecureSkipTLSVerify``)."""
    image: Obj = {"ref": ref}
    if pull_secret:
        image["pullSecret"] = pull_secret
    for key in TLS_FIELDS:
        if (tls or {}).get(key):
            image[key] = (tls or {})[key]
    return {"type": "image", "image": image}


def pinned_git(git: Obj, commit: str) -> Obj:
    """The ``resolvedSource`` of a git source pinned to ``commit``."""
    out: Obj = {"repository": git.get("repository"), "ref": {"commit": commit}}
    if git.get("directory"):
        out["directory"] = git["directory"]
    if git.get("auth"):
        out["auth"] = git["auth"]
    if git.get("certificateData"):
        out["certificateData"] = git["certificateData"]
    return {"type": "git", "git": out}


def pinned_http(spec: Obj, digest: str) -> Obj:
    """The ``resolvedSource`` of an http source whose content has ``digest``."""
    out: Obj = {"url": httpsource.pin_url(str(spec.get("url") or ""), digest)}
    if spec.get("auth"):
        out["auth"] = spec["auth"]
    if spec.get("certificateData"):
        out["certificateData"] = spec["certificateData"]
    return {"type": "http", "http": out}


def pinned_configmaps(entries: list[Obj]) -> Obj:
    return {"type": "configMaps", "configMaps": entries}


def items_annotation(items: list[list[str]]) -> str:
    """The annotation value recording ``[configMap, key, path in the bundle]`` triples."""
    return json.dumps(items, separators=(",", ":"))


def bundle_path(path: object) -> str:
    """A ConfigMap entry's ``path`` inside the bundle ("" for the root); ValueError when
    it is absolute or climbs out."""
    text = str(path or "").strip()
    clean = posixpath.normpath(text) if text else "."
    if clean.startswith("/") or clean == ".." or clean.startswith("../"):
        raise ValueError(f"path {text!r} is outside the bundle: use a relative path")
    return "" if clean == "." else clean


def ref_of(source: Obj) -> str:
    """A source in a few words for messages: the image reference, repository or URL."""
    kind = source.get("type")
    spec = source.get(kind) if isinstance(kind, str) else None
    if isinstance(spec, dict):
        for key in ("repository", "url", "ref"):
            if isinstance(spec.get(key), str):
                return str(spec[key])
    return str(kind or "")


def describe(resolved: Obj) -> str:
    """The pinned content in a few words (logs, messages)."""
    kind = resolved.get("type")
    if kind == MULTI:
        return "; ".join(f"{describe(r)} at {d}" for d, r in parts(resolved))
    if kind == "image":
        return str(_section(resolved, "image").get("ref") or "")
    if kind == "git":
        git = _section(resolved, "git")
        return f"{git.get('repository')}@{_section(git, 'ref').get('commit')}"
    if kind == "http":
        return str(_section(resolved, "http").get("url") or "")
    if kind == "configMaps":
        names = [
            str(_section(e, "configMap").get("name"))
            for e in resolved.get("configMaps") or []
            if isinstance(e, dict)
        ]
        return "configMaps " + ",".join(names)
    return str(kind or "")


def _csi(attributes: dict[str, str], spec: Obj, name: str) -> Obj:
    auth = _section(spec, "auth")
    csi: Obj = {"driver": CSI_DRIVER, "readOnly": True, "volumeAttributes": attributes}
    secret = _section(auth, "secret").get("name")
    if secret:
        csi["nodePublishSecretRef"] = {"name": str(secret)}
    if auth.get("insecureSkipVerify"):
        attributes["insecureSkipVerify"] = "true"
    if spec.get("certificateData"):  # the server's CA, trusted for this volume only
        attributes["certificateData"] = str(spec["certificateData"])
    return {"name": name, "csi": csi}


def volume(resolved: Obj, name: str = VOLUME_NAME) -> Obj:
    """The read-only pod volume ``name`` (``bundle``) holding the pinned content."""
    kind = resolved.get("type")
    if kind == "image":
        image = _section(resolved, "image")
        csi: Obj = {
            "driver": CSI_DRIVER,
            "readOnly": True,
            "volumeAttributes": {
                "image": str(image.get("ref") or ""),
                "pullPolicy": "IfNotPresent",
            },
        }
        if image.get("pullSecret"):  # the node plugin pulls with it (kubelet hands it over)
            csi["nodePublishSecretRef"] = {"name": str(image["pullSecret"])}
        if image.get("certificateData"):  # trusted for this volume only
            csi["volumeAttributes"]["certificateData"] = str(image["certificateData"])
        if image.get("insecureSkipTLSVerify") is True:
            csi["volumeAttributes"]["insecureSkipTLSVerify"] = "true"
        return {"name": name, "csi": csi}
    if kind == "git":
        git = _section(resolved, "git")
        attributes = {
            "git": str(git.get("repository") or ""),
            "commit": str(_section(git, "ref").get("commit") or ""),
        }
        if git.get("directory"):
            attributes["directory"] = str(git["directory"])
        return _csi(attributes, git, name)
    if kind == "http":
        spec = _section(resolved, "http")
        url, digest = httpsource.split_pinned(str(spec.get("url") or ""))
        return _csi({"url": url, "digest": digest or ""}, spec, name)
    if kind == "configMaps" and isinstance(resolved.get(ITEMS_KEY), list):
        by_map: dict[str, list[Obj]] = {}
        for configmap, key, path in resolved[ITEMS_KEY]:
            by_map.setdefault(configmap, []).append({"key": key, "path": path})
        return {
            "name": name,
            "projected": {
                "sources": [
                    {"configMap": {"name": configmap, "items": items}}
                    for configmap, items in by_map.items()
                ]
            },
        }
    raise ValueError(f"no volume for source type {kind!r}")
