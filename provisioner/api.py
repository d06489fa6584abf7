"""The public API for provisioners written outside this project (and the CLI's engine).

Where it sits: above ``provisioner.engine`` (apply, inventory, drift), the image
pipeline (``rukpak.oci``, ``rukpak.image``) and the Lease helper, and below any
provisioner that is not part of the core: ``contrib/helm-provisioner`` imports
nothing else from this project. Everything not named in ``__all__`` may change
without notice; docs/writing-a-provisioner.md says what is public and how stable.

The flow, in the order a provisioner uses it::

    from provisioner import api

    kube = api.Kube.from_kubeconfig()                         # the one client adapter
    lock = api.lead(kube, namespace="rukpak-system", name="my-provisioner",
                    identity=pod_name, stop=stop, lost=lost)  # one active replica
    workers = api.Workers(api.WorkQueue(), reconcile, log=log)  # reconcile(key) -> delay?
    caches = api.InformerSet(kube, stop=workers.stopping)       # one stop, one watch timeout
    bds = caches.add(api.API_VERSION, "BundleDeployment",
                     on_change=lambda bd: workers.queue.add(bd["metadata"]["name"]))
    caches.start()                                            # list, then watch
    workers.start(1)                                          # retries with backoff

    pinned = api.fetch_bundle("registry.example.com/charts/web:v1", Path("/cache/web"))
    # or, standing (no second fetch path): the node plugin's store volume at /store
    tree = api.open_store(Path("/store")).fetch(api.pin_image("registry.example.com/web:v1"))
    bundle = api.Bundle("my-format", tuple(api.parse_manifests("rendered.yaml", text)))
    result = api.install(kube, bundle, api.Options(name="web", namespace="web"))
    watcher = api.DriftWatcher(kube, "web", result.applied)   # .run() until .stop()
    api.uninstall(kube, "web")                                # on BundleDeployment deletion

``Reconciler`` is the frame of such a controller as a base class (``kube``, ``queue``,
``workers``, ``caches`` and one stop event): the helm provisioner's controller
subclasses it. ``record_event`` writes an Event about a Bundle or BundleDeployment.

A provisioner whose content is already a plain+v0 or registry+v1 tree can use
``load_bundle(root, format=...)``; ``register_format(name, loader)`` adds a loader
``(root: Path) -> Bundle`` for ``load_bundle``. Errors are ``rukpak.common.errors``
values (each has ``.message`` and a gRPC-style code); the engine's own subclasses
are re-exported below.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
from collections.abc import Iterable
from pathlib import Path

from provisioner.engine.apply.apply import Applied, DeletionPolicy, Options, Result, install
from provisioner.engine.apply.drift import DriftWatcher
from provisioner.engine.apply.inventory import DEFAULT_SYSTEM_NAMESPACE
from provisioner.engine.apply.lifecycle import ObjectStatus, status, uninstall
from provisioner.engine.bundle import words
from provisioner.engine.bundle.formats import Bundle, Manifest, Source
from provisioner.engine.bundle.formats import load as load_bundle
from provisioner.engine.bundle.formats import register as register_format
from provisioner.engine.bundle.formats_plain import parse as _parse
from provisioner.engine.errors import (
    ApplyFailed,
    BundleInvalid,
    CRDUpgradeUnsafe,
    OwnershipConflict,
    UnknownKind,
)
from provisioner.engine.health.health import Health, unhealthy
from provisioner.engine.health.health import assess as assess_health
from provisioner.engine.kube.informers import InformerSet
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import FIELD_MANAGER, OWNER_LABEL, Obj, ObjectRef
from provisioner.engine.preview.diff import Change
from provisioner.engine.preview.diff import plan as diff
from provisioner.manager.acting.events import record as record_event
from provisioner.manager.conversion import origin as created_in
from provisioner.manager.conversion import to_v1alpha2 as as_v1alpha2
from provisioner.manager.planning import actions
from provisioner.manager.planning.generate import desired_bundle
from provisioner.runtime.leader import lead
from provisioner.runtime.lease import LeaseLock
from provisioner.runtime.queue import WorkQueue
from provisioner.runtime.service import Election, serve
from provisioner.runtime.signals import stop_on_signals
from provisioner.runtime.workers import Reconciler, Workers
from rukpak.common.errors import RukpakError
from rukpak.kube.listwatch import Informer
from rukpak.sources.storeclient import StoreClient

GROUP = "core.rukpak.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
"""``apiVersion`` of Bundles and BundleDeployments."""

__all__ = [
    "API_VERSION",
    "DEFAULT_SYSTEM_NAMESPACE",
    "FIELD_MANAGER",
    "GROUP",
    "OWNER_LABEL",
    "VERSION",
    "Applied",
    "ApplyFailed",
    "Bundle",
    "BundleInvalid",
    "CRDUpgradeUnsafe",
    "Change",
    "DeletionPolicy",
    "DriftWatcher",
    "Election",
    "Health",
    "Informer",
    "InformerSet",
    "Kube",
    "LeaseLock",
    "Manifest",
    "Obj",
    "ObjectRef",
    "ObjectStatus",
    "Options",
    "OwnershipConflict",
    "Reconciler",
    "Result",
    "RukpakError",
    "Source",
    "StoreClient",
    "UnknownKind",
    "WorkQueue",
    "Workers",
    "actions",
    "as_v1alpha2",
    "assess_health",
    "bundle_deployment_ref",
    "bundle_ref",
    "created_in",
    "desired_bundle",
    "diff",
    "fetch_bundle",
    "fetch_tarball",
    "install",
    "lead",
    "load_bundle",
    "open_store",
    "parse_manifests",
    "pin_image",
    "record_event",
    "register_format",
    "serve",
    "status",
    "stop_on_signals",
    "unhealthy",
    "uninstall",
    "words",
]


def bundle_ref(name: str) -> ObjectRef:
    """The Bundle ``name`` (cluster-scoped), for ``Kube.get``/``merge_patch_status``/``delete``."""
    return ObjectRef(GROUP, VERSION, "Bundle", "", name)


def bundle_deployment_ref(name: str) -> ObjectRef:
    """The BundleDeployment ``name`` (cluster-scoped)."""
    return ObjectRef(GROUP, VERSION, "BundleDeployment", "", name)


def parse_manifests(file: str, text: str) -> list[Manifest]:
    """The objects in one YAML (or, for ``*.json``, JSON) text, each remembering ``file``,
    its document and line, so apply errors point back at it (e.g. a rendered template's
    name). ``BundleInvalid`` names the document at fault. Empty documents are skipped."""
    return _parse(file, text)


def fetch_bundle(
    ref: str,
    dest: Path,
    *,
    insecure: Iterable[str] = (),
    timeout: float = 30.0,
) -> str:
    """Pull the bundle image ``ref`` and write its files to ``dest``; return the pinned
    reference (``repository@sha256:...`` of what ``ref`` pointed at, index or manifest).

    The same pipeline as the CSI node plugin: every blob verified against its digest,
    layers extracted safely (no path escapes, bounded sizes), the platform of this
    machine picked from an index. ``dest`` must not exist; it appears complete or not
    at all (written beside it, then renamed), its files writable by the caller. A
    digest reference is fetched as is, so the content of a pinned reference never
    changes. Loopback registries are spoken to over plain HTTP; ``insecure`` lists
    other ``host:port`` that are. No credentials: public images only, for now.

    Errors: ``rukpak.common.errors`` values naming the reference and the registry's answer
    (NotFound for a missing tag, Unavailable when the registry does not answer, ...).
    """
    from provisioner.bundle import source

    if dest.exists():
        raise FileExistsError(f"{dest} exists: fetch_bundle writes a new directory")
    hosts = tuple(insecure)
    pinned = pin_image(ref, insecure=hosts, timeout=timeout)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        with source.local_bundle(pinned, insecure=hosts, timeout=timeout) as tree:
            shutil.copytree(tree, staging / "tree", symlinks=True)
        _make_writable(staging / "tree")
        os.rename(staging / "tree", dest)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return pinned


def pin_image(ref: str, *, insecure: Iterable[str] = (), timeout: float = 30.0) -> str:
    """``ref`` pinned: ``repository@sha256:...`` of what the tag points at now (one request
    for its manifest's digest, no content); a digest reference as it is."""
    from rukpak.oci import client as oci_client
    from rukpak.oci import reference

    parsed = reference.Reference.parse(ref)
    if parsed.digest is not None:
        return f"{parsed.name}@{parsed.digest}"
    with oci_client.RegistryClient(insecure=tuple(insecure), timeout=timeout) as registry:
        return f"{parsed.name}@{registry.resolve(parsed).digest}"


def open_store(mount: Path) -> StoreClient:
    """A client of the node plugin's store volume mounted at ``mount`` (a CSI volume with
    the attribute ``kind: store``, which the plugin publishes only to the ServiceAccounts
    its ``--store-volume-allow`` names): the standing pattern. ``fetch(pinned,
    dockerconfigjson=...)`` asks the node plugin for an image by digest, checked against
    that credential as a pod's volume is, and returns ``<mount>/<digest>``, read-only, the
    same content on every ask; nothing is pulled by the provisioner itself. Close it when
    done."""
    return StoreClient(mount)


def fetch_tarball(url: str, dest: Path, *, insecure: bool = False) -> str:
    """Download the tar (plain or gzip) at ``url`` and write its files to ``dest``; return
    the pinned URL (``url#sha256=<hex of the bytes>``): the upstream ``http`` source.

    The same pipeline as the CSI node plugin's http volumes: bounded download (no redirect
    to another host), digest checked, the archive extracted by the image extractor's rules
    (no path escapes, bounded sizes). A URL pinned already (``#sha256=<hex>``) is fetched
    as is, and other bytes are ``FailedPrecondition``; otherwise the bytes are digested
    first. ``dest`` must not exist; it appears complete or not at all, its files writable
    by the caller. No credentials, for now. ``insecure`` skips TLS verification.
    """
    from rukpak.image.cache import ImageCache
    from rukpak.oci import client as oci_client
    from rukpak.sources import http
    from rukpak.sources.cache import SourceCache
    from rukpak.sources.volume import FetchSource

    if dest.exists():
        raise FileExistsError(f"{dest} exists: fetch_tarball writes a new directory")
    http.check_url(url)
    bare, digest = http.split_pinned(url)
    if digest is None:
        digest = http.fetch(bare, insecure=insecure)
    dest.parent.mkdir(parents=True, exist_ok=True)
    staging = Path(tempfile.mkdtemp(prefix=f".{dest.name}.", dir=dest.parent))
    try:
        cache = ImageCache(
            staging / "cache",
            puller_factory=lambda creds: oci_client.RegistryClient(credentials=creds),
            durable=False,
        )
        tree = SourceCache(cache).ensure(FetchSource("http", bare, digest, insecure=insecure))
        shutil.copytree(tree.path, staging / "tree", symlinks=True)
        _make_writable(staging / "tree")
        os.rename(staging / "tree", dest)
    finally:
        _make_writable(staging)
        shutil.rmtree(staging, ignore_errors=True)
    return http.pin_url(bare, digest)


def _make_writable(root: Path) -> None:
    """The image cache seals trees read-only; a caller's copy is its own to remove."""
    for dirpath, dirnames, filenames in os.walk(root):
        for name in [*dirnames, *filenames]:
            path = Path(dirpath, name)
            mode = path.lstat().st_mode
            if not stat.S_ISLNK(mode):
                path.chmod(stat.S_IMODE(mode) | stat.S_IWUSR)
    root.chmod(stat.S_IMODE(root.stat().st_mode) | stat.S_IWUSR)
