"""The public API of the apply engine, for the instance pod and out-of-tree provisioners.

A small, deliberately named surface over ``provisioner.engine``; everything
not listed here may change. The flow, in the order a caller uses it::

    from provisioner import api

    kube = api.Kube.from_kubeconfig()                  # the one client adapter
    bundle = api.load_bundle(Path("/bundle"))          # plain+v0 by default
    result = api.install(kube, bundle, api.Options(name="demo", namespace="demo"))
    print(api.unhealthy([(a.ref, kube.get(a.ref)) for a in result.applied]))
    api.DriftWatcher(kube, "demo", result.applied).run(stop_event)

To follow other objects the way drift correction and the manager do (list, then
watch; re-list on 410 Gone; a local cache with add/update/delete handlers), use
``api.Informer`` (``provisioner.engine.listwatch``).

Bundle formats are plug-ins: ``register_format("registry+v1", loader)`` where
``loader(root: Path) -> Bundle``. Errors are ``csi.common.errors`` values; the
engine's own subclasses are re-exported below.
"""

from __future__ import annotations

from provisioner.engine.apply import Applied, DeletionPolicy, Options, Result, install
from provisioner.engine.crdsafety import check as check_crd_upgrade
from provisioner.engine.diff import Change
from provisioner.engine.diff import plan as diff
from provisioner.engine.drift import DriftWatcher
from provisioner.engine.errors import (
    ApplyFailed,
    BundleInvalid,
    CRDUpgradeUnsafe,
    OwnershipConflict,
    UnknownKind,
)
from provisioner.engine.formats import Bundle, Manifest, Source
from provisioner.engine.formats import load as load_bundle
from provisioner.engine.formats import register as register_format
from provisioner.engine.health import Health, unhealthy
from provisioner.engine.health import assess as assess_health
from provisioner.engine.inventory import Inventory, plan_prune
from provisioner.engine.kube import Kube
from provisioner.engine.lifecycle import ObjectStatus, status, uninstall
from provisioner.engine.listwatch import Informer
from provisioner.engine.objects import FIELD_MANAGER, OWNER_LABEL, ObjectRef
from provisioner.engine.ordering import Phase, phases

__all__ = [
    "FIELD_MANAGER",
    "OWNER_LABEL",
    "Applied",
    "ApplyFailed",
    "Bundle",
    "BundleInvalid",
    "CRDUpgradeUnsafe",
    "Change",
    "DeletionPolicy",
    "DriftWatcher",
    "Health",
    "Informer",
    "Inventory",
    "Kube",
    "Manifest",
    "ObjectRef",
    "ObjectStatus",
    "Options",
    "OwnershipConflict",
    "Phase",
    "Result",
    "Source",
    "UnknownKind",
    "assess_health",
    "check_crd_upgrade",
    "diff",
    "install",
    "load_bundle",
    "phases",
    "plan_prune",
    "register_format",
    "status",
    "unhealthy",
    "uninstall",
]
