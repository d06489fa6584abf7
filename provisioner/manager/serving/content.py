"""A bundle's content over HTTPS as a tar.gz: what ``status.contentURL`` points at.

Sits beside ``webhook`` (served by the same HTTPS server, with the manager's certificate,
at ``/bundles/<name>.tgz``). ``name`` is a v1alpha2 BundleDeployment or a Bundle; its
pinned source (``status.resolvedSource``, ``resolvedSources``) is fetched by this process
through the shared core (``rukpak.image.cache`` for images, ``rukpak.sources.cache`` for
git and http, the API for ConfigMaps) into a temporary directory, packed, sent and
removed: the content is never stored in etcd, nor kept here. A source's TLS
(``certificateData``, skipping verification) applies to its own fetch only, as on nodes.

Who may read it is the API server's decision, as upstream made it: the caller's bearer
token is checked with a TokenReview, then a SubjectAccessReview for the non-resource URL
(``get`` on ``/bundles/<name>.tgz``; upstream's ClusterRole ``bundle-reader`` grants
``/bundles/*``). No token is 401, a token not allowed is 403, an unknown or unpinned name
is 404.
"""

from __future__ import annotations

import base64
import dataclasses
import io
import logging
import re
import shutil
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef
from provisioner.manager import model
from provisioner.manager.planning import inline, sources
from rukpak.common import errors
from rukpak.image import cache as images
from rukpak.oci import client as oci_client
from rukpak.oci import tls as source_tls
from rukpak.oci.auth import Credentials
from rukpak.oci.manifest import Platform
from rukpak.sources import cache as trees
from rukpak.sources.auth import SourceAuth
from rukpak.sources.volume import FetchSource, VolumeSource

log = logging.getLogger("rukpak.content")

PREFIX = model.CONTENT_PREFIX
SUFFIX = model.CONTENT_SUFFIX
_NAME = re.compile(r"^[a-z0-9]([-a-z0-9.]*[a-z0-9])?$")
MAX_NAME = 253


def name_of_path(path: str) -> str | None:
    """The object name a ``/bundles/<name>.tgz`` path asks for; None if it is not one."""
    if not path.startswith(PREFIX) or not path.endswith(SUFFIX):
        return None
    name = path[len(PREFIX) : -len(SUFFIX)]
    return name if len(name) <= MAX_NAME and _NAME.match(name) else None


class Denied(Exception):
    """The caller may not read the content: ``status`` is the HTTP status to answer."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status
        self.message = message


def authorize(kube: Kube, token: str, path: str) -> str:
    """The user ``token`` authenticates as, if it may ``get`` the non-resource ``path``;
    raises ``Denied`` otherwise."""
    if not token:
        raise Denied(401, "a bearer token is required (a ServiceAccount token)")
    review = kube.create(
        {
            "apiVersion": "authentication.k8s.io/v1",
            "kind": "TokenReview",
            "spec": {"token": token},
        }
    )
    status: Any = review.get("status") or {}
    if not status.get("authenticated"):
        raise Denied(401, "the token is not valid")
    user: Any = status.get("user") or {}
    spec: Obj = {
        "user": str(user.get("username") or ""),
        "groups": list(user.get("groups") or []),
        "nonResourceAttributes": {"path": path, "verb": "get"},
    }
    if user.get("uid"):
        spec["uid"] = str(user["uid"])
    if user.get("extra"):
        spec["extra"] = user["extra"]
    access = kube.create(
        {
            "apiVersion": "authorization.k8s.io/v1",
            "kind": "SubjectAccessReview",
            "spec": spec,
        }
    )
    if not (access.get("status") or {}).get("allowed"):
        raise Denied(
            403,
            f'{spec["user"]} may not get {path}: bind it to the ClusterRole "bundle-reader"',
        )
    return str(spec["user"])


class Content:
    """Materializes and packs the pinned content of BundleDeployments and Bundles."""

    def __init__(
        self,
        kube: Kube,
        *,
        system_namespace: str,
        registry: Callable[[Credentials | None], oci_client.RegistryClient] | None = None,
    ) -> None:
        self.kube = kube
        self.system_namespace = system_namespace
        self.registry = registry or (lambda creds: oci_client.RegistryClient(credentials=creds))

    def pinned(self, name: str) -> Obj | None:
        """The pinned source of the v1alpha2 BundleDeployment, else the Bundle, ``name``."""
        bd = self.kube.get(
            ObjectRef(model.GROUP, model.VERSION_V2, model.BUNDLE_DEPLOYMENT, "", name)
        )
        if bd is not None and bd.get("status"):
            found = inline.pinned_sources(bd, inline.entries_of(bd.get("spec") or {}))
            if found is not None:
                return found
        bundle = self.kube.get(ObjectRef(model.GROUP, model.VERSION, model.BUNDLE, "", name))
        return sources.pinned(bundle) if bundle is not None else None

    def tarball(self, name: str) -> bytes:
        """The content of ``name`` as a gzip-compressed tar; ``NotFound`` when it is unknown
        or not pinned yet."""
        resolved = self.pinned(name)
        if resolved is None:
            raise errors.NotFound(
                f"no pinned content named {name!r}: a v1alpha2 BundleDeployment or Bundle"
            )
        work = Path(tempfile.mkdtemp(prefix="rukpak-content-"))
        try:
            tree = work / "tree"
            tree.mkdir()
            for index, (destination, part) in enumerate(sources.parts(resolved)):
                target = tree / destination if destination else tree
                self._materialize(part, target, work / f"cache-{index}")
            buffer = io.BytesIO()
            with tarfile.open(fileobj=buffer, mode="w:gz") as tar:
                for path in sorted(tree.rglob("*")):
                    tar.add(path, arcname=str(path.relative_to(tree)), recursive=False)
            return buffer.getvalue()
        finally:
            _remove(work)

    def _secret(self, name: str) -> Obj:
        secret = self.kube.get(ObjectRef("", "v1", "Secret", self.system_namespace, name))
        if secret is None:
            raise errors.NotFound(f"secret {self.system_namespace}/{name} not found")
        return secret

    def _materialize(self, resolved: Obj, target: Path, cache_dir: Path) -> None:
        kind = resolved.get("type")
        if kind == "configMaps":
            self._configmaps(resolved, target)
            return
        volume = sources.volume(resolved)
        attributes: dict[str, str] = dict(volume["csi"]["volumeAttributes"])
        secret_name = str((volume["csi"].get("nodePublishSecretRef") or {}).get("name") or "")
        cache = images.ImageCache(cache_dir, puller_factory=self.registry, durable=False)
        if kind == "image":
            credentials = None
            pull_secret = str((resolved.get("image") or {}).get("pullSecret") or "")
            if pull_secret:
                data = (self._secret(pull_secret).get("data") or {}).get(".dockerconfigjson", "")
                credentials = Credentials.from_dockerconfigjson(base64.b64decode(str(data)))
            tls = VolumeSource.from_attributes(attributes).tls
            with source_tls.using(tls):  # the registry's trust, for this pull only
                unpacked = cache.ensure(
                    attributes["image"],
                    platform=Platform.current(),
                    pull_policy=images.PullPolicy.IF_NOT_PRESENT,
                    credentials=credentials,
                )
        else:
            fetch = FetchSource.from_attributes(attributes)
            if secret_name:
                auth = SourceAuth.from_secret(
                    self._secret(secret_name), name=f"{self.system_namespace}/{secret_name}"
                )
                fetch = dataclasses.replace(fetch, auth=auth)
            with source_tls.using(fetch.tls):  # the server's trust, for this fetch only
                unpacked = trees.SourceCache(cache).ensure(fetch)
        shutil.copytree(unpacked.path, target, symlinks=True, dirs_exist_ok=True)

    def _configmaps(self, resolved: Obj, target: Path) -> None:
        for configmap, key, path in resolved.get(sources.ITEMS_KEY) or []:
            cm = self.kube.get(ObjectRef("", "v1", "ConfigMap", self.system_namespace, configmap))
            if cm is None:
                raise errors.NotFound(f"configmap {self.system_namespace}/{configmap} not found")
            text = (cm.get("data") or {}).get(key)
            if text is None:
                raise errors.NotFound(
                    f"configmap {self.system_namespace}/{configmap} has no key {key}"
                )
            out = target / sources.bundle_path(path)
            out.parent.mkdir(parents=True, exist_ok=True)
            out.write_text(str(text))


def _remove(path: Path) -> None:
    """Remove a work dir whose trees were sealed read-only."""
    for p in [path, *path.rglob("*")]:
        if p.is_dir() and not p.is_symlink():
            p.chmod(0o700)
    shutil.rmtree(path, ignore_errors=True)
