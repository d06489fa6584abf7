"""Names, labels and builders the manager shares between planning and applying.

Sits under ``plan`` (pure) and ``actuate`` (the API side): the generated
Bundle's name (``<bd>-<hash of the template spec>``), the labels that tie
Bundles and instance run pods back to their BundleDeployment,
and where the CRDs live. Nothing here talks to the API.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import Any

from provisioner.engine.apply import inventory
from provisioner.engine.bundle import formats_plain, formats_registry
from provisioner.engine.objects import Obj
from provisioner.engine.objects import name_of as name_of

GROUP = "core.rukpak.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
VERSION_V2 = "v1alpha2"
API_VERSION_V2 = f"{GROUP}/{VERSION_V2}"
"""BundleDeployments only (the storage version): the Bundle kind stays v1alpha1."""
BUNDLE = "Bundle"
BUNDLE_DEPLOYMENT = "BundleDeployment"

REASON_SIGNATURE = "SignatureVerificationFailed"
"""A Bundle's or BundleDeployment's image refused by a ClusterBundlePolicy (our reason)."""
VERIFIED = "Verified"
"""The condition naming the policies and identities that verified a pinned image."""

FINALIZER = "core.rukpak.io/uninstall"
BD_LABEL = "core.rukpak.io/bundle-deployment"
"""On generated Bundles and instance run pods: the owning BundleDeployment."""
OWNER_KIND_LABEL = "core.rukpak.io/owner-kind"
OWNER_NAME_LABEL = "core.rukpak.io/owner-name"
TEMPLATE_HASH_LABEL = "core.rukpak.io/bundle-template-hash"
"""Upstream's labels: on generated Bundles (owner = the BundleDeployment) and on unpack
pods (owner = the Bundle)."""
MAX_BUNDLE_NAME = 52
MAX_BUNDLE_DEPLOYMENT_NAME = 45
"""Upstream's CRD limits (metadata.name maxLength), which leave room for generated names."""
BUNDLE_ANNOTATION = "core.rukpak.io/bundle"
"""On an instance run pod: the Bundle it mounts."""
SPEC_HASH_ANNOTATION = "core.rukpak.io/instance-hash"
"""On an instance run pod: its revision (a hash of its body)."""

PLAIN_CLASS = "core-rukpak-io-plain"
REGISTRY_CLASS = "core-rukpak-io-registry"
CLASS_FORMATS: dict[str, str] = {
    PLAIN_CLASS: formats_plain.NAME,
    REGISTRY_CLASS: formats_registry.NAME,
}
"""Our provisioner classes and the bundle format each one's content is in (the one place
that says so): Bundles of these classes get an unpack pod, BundleDeployments of these
classes an instance; both run the loader of this format. Other classes are left alone."""
CRDS_DIR = Path(__file__).resolve().parent.parent / "crds"
INSTANCE_BINARY = "/opt/rukpak/bin/rukpak-provisioner"


def crd_files() -> list[Path]:
    """The CRD manifests (Bundle, BundleDeployment, ClusterBundlePolicy), in install order."""
    return sorted(CRDS_DIR.glob("*.yaml"))


def stable_hash(value: Any, length: int = 10) -> str:
    """A short hex digest of ``value``'s canonical JSON (key order does not matter)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def template_hash(bd: Obj) -> str:
    """Upstream's template hash: sha224 of the template's JSON in base 36.

    Any change of the template (labels, annotations or spec) changes it: a pivot.
    """
    template = (bd.get("spec") or {}).get("template") or {}
    text = json.dumps(template, sort_keys=True, separators=(",", ":"))
    return formats_registry.sha224_base36(text)


def bundle_name(bd: Obj) -> str:
    """``<bd>-<template hash>``, cut to upstream's 52 characters (GenerateBundleName)."""
    bd_name = name_of(bd)[:MAX_BUNDLE_DEPLOYMENT_NAME]
    return f"{bd_name}-{template_hash(bd)[: MAX_BUNDLE_NAME - len(bd_name) - 1]}"


def instance_name(bd_name: str) -> str:
    """The prefix of a BundleDeployment's instance run pods."""
    return f"rukpak-instance-{bd_name}"


def run_pod_name(bd_name: str, revision: str, run: int) -> str:
    """The pod of run ``run`` of an instance revision (``generate.instance_run_pod``)."""
    return f"{instance_name(bd_name)}-{revision}-{run}"


def parse_run_pod_name(bd_name: str, pod_name: str) -> tuple[str, int] | None:
    """(revision, run) of a run pod's name; None when it is not one of ``bd_name``'s."""
    prefix = instance_name(bd_name) + "-"
    if not pod_name.startswith(prefix):
        return None
    revision, sep, run = pod_name[len(prefix) :].rpartition("-")
    if not sep or not revision or "-" in revision or not run.isdigit():
        return None
    return revision, int(run)


CONTENT_PREFIX = "/bundles/"
CONTENT_SUFFIX = ".tgz"


def content_url(base: str, name: str) -> str:
    """Where the manager serves ``name``'s content (``content``, ``status.contentURL``):
    ``<base>/bundles/<name>.tgz``; "" without a base."""
    return f"{base.rstrip('/')}{CONTENT_PREFIX}{name}{CONTENT_SUFFIX}" if base else ""


def bundle_format(provisioner_class: object) -> str | None:
    """The bundle format of one of our provisioner classes; None for any other class."""
    return CLASS_FORMATS.get(str(provisioner_class or ""))


def seconds_between(start: str, end: str) -> float | None:
    """Seconds from ``start`` to ``end`` (RFC 3339 in whole seconds, as the planners stamp
    ``Observed.now``); None when either is not one."""
    fmt = "%Y-%m-%dT%H:%M:%SZ"
    try:
        return (datetime.strptime(end, fmt) - datetime.strptime(start, fmt)).total_seconds()
    except ValueError:
        return None


def is_digest_ref(ref: str) -> bool:
    return "@sha256:" in ref


@dataclass(frozen=True)
class Settings:
    """How instance run pods and unpack pods are built (the manager's flags)."""

    image: str
    system_namespace: str = inventory.DEFAULT_SYSTEM_NAMESPACE
    service_account: str = "rukpak-instance"
    unpack_service_account: str = "default"
    """ServiceAccount of unpack pods (they never call the API: no token is mounted)."""
    host_network: bool = False
    default_install_namespace: str = "default"
    env: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    """Extra environment of the instance container (e.g. how to reach the API server)."""
    max_concurrent_runs: int = 8
    """Instance run pods active at once across all BundleDeployments (``--max-concurrent-runs``)."""
    run_mode: str = "pod"
    """``pod``: each instance run is a pod; ``standing``: a run whose content is one image
    is a run ConfigMap a standing provisioner takes (``instance.runrecord``), others stay
    pods (``--run-mode``)."""
    content_base_url: str = ""
    """Where the manager serves bundle content (``--content-base-url``): ``status.contentURL``
    is ``<base>/bundles/<name>.tgz``; "" writes none."""
