"""API discovery: which resource serves a kind, its plural and whether it is namespaced.

Used by ``engine.kube`` to build the REST path of every request. The answer
for a group/version is cached and fetched again once when a kind is missing
from it, which is how CRDs applied earlier in the same run become usable
without restarting anything.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import quote

from provisioner.engine.errors import UnknownKind
from provisioner.engine.objects import split_api_version
from rukpak.common import errors

Get = Callable[[str, str], Any]
"""``get(path, what)``: the decoded JSON of a GET, ``errors.NotFound`` on 404."""


@dataclass(frozen=True)
class Resource:
    group: str
    version: str
    kind: str
    plural: str
    namespaced: bool

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    def path(self, namespace: str = "", name: str = "") -> str:
        base = f"/apis/{self.api_version}" if self.group else f"/api/{self.version}"
        if self.namespaced and namespace:
            base += f"/namespaces/{quote(namespace, safe='')}"
        base += f"/{self.plural}"
        return f"{base}/{quote(name, safe='')}" if name else base


class Discovery:
    """The per group/version cache; safe to share between threads."""

    def __init__(self, get: Get) -> None:
        self._get = get
        self._lock = threading.Lock()
        self._cache: dict[str, dict[str, Resource]] = {}

    def _fetch_group_version(self, api_version: str) -> dict[str, Resource]:
        group, version = split_api_version(api_version)
        path = f"/apis/{api_version}" if group else f"/api/{version}"
        try:
            doc = self._get(path, f"discovery of {api_version}")
        except errors.NotFound:
            return {}
        out: dict[str, Resource] = {}
        for r in doc.get("resources") or []:
            if "/" in r["name"]:
                continue  # subresource
            out[r["kind"]] = Resource(group, version, r["kind"], r["name"], bool(r["namespaced"]))
        return out

    def resource(self, api_version: str, kind: str) -> Resource:
        """Discovery for one kind; refreshes the group/version once when the kind is missing."""
        with self._lock:
            cached = self._cache.get(api_version)
        if cached is None or kind not in cached:
            fresh = self._fetch_group_version(api_version)
            with self._lock:
                self._cache[api_version] = fresh
            cached = fresh
        found = cached.get(kind)
        if found is None:
            raise UnknownKind(
                f"the API server has no resource for apiVersion {api_version} kind {kind}"
                " (is its CRD installed?)"
            )
        return found
