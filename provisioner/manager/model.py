"""Names, labels and builders the manager shares between planning and applying.

Sits under ``plan`` (pure) and ``actuate`` (the API side): the generated
Bundle's name (``<bd>-<hash of the template spec>``), the labels that tie
Bundles, instance Deployments and their pods back to their BundleDeployment,
and where the CRDs live. Nothing here talks to the API.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from provisioner.engine import inventory
from provisioner.engine.objects import Obj

GROUP = "core.rukpak.io"
VERSION = "v1alpha1"
API_VERSION = f"{GROUP}/{VERSION}"
BUNDLE = "Bundle"
BUNDLE_DEPLOYMENT = "BundleDeployment"

FINALIZER = "core.rukpak.io/uninstall"
BD_LABEL = "core.rukpak.io/bundle-deployment"
"""On generated Bundles, instance Deployments and their pods: the owning BundleDeployment."""
BUNDLE_ANNOTATION = "core.rukpak.io/bundle"
"""On the instance Deployment and its pod template: the Bundle it mounts."""
SPEC_HASH_ANNOTATION = "core.rukpak.io/instance-hash"
"""On the instance Deployment: hash of the body the manager last applied."""

PLAIN_CLASS = "core-rukpak-io-plain"
CRDS_DIR = Path(__file__).resolve().parent.parent / "crds"
INSTANCE_BINARY = "/opt/rukpak/bin/rukpak-provisioner"


def crd_files() -> list[Path]:
    """The CRD manifests (Bundle, BundleDeployment), in install order."""
    return sorted(CRDS_DIR.glob("*.yaml"))


def stable_hash(value: Any, length: int = 10) -> str:
    """A short hex digest of ``value``'s canonical JSON (key order does not matter)."""
    text = json.dumps(value, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def bundle_name(bd: Obj) -> str:
    """``<bd>-<hash>``: changes exactly when the template's spec changes."""
    spec = ((bd.get("spec") or {}).get("template") or {}).get("spec") or {}
    return f"{name_of(bd)}-{stable_hash(spec)}"


def instance_name(bd_name: str) -> str:
    """The instance Deployment (and its pods' prefix) of a BundleDeployment."""
    return f"rukpak-instance-{bd_name}"


def name_of(obj: Obj) -> str:
    return str((obj.get("metadata") or {}).get("name") or "")


def is_digest_ref(ref: str) -> bool:
    return "@sha256:" in ref


@dataclass(frozen=True)
class Settings:
    """How instance Deployments are built (the manager's flags)."""

    image: str
    system_namespace: str = inventory.DEFAULT_SYSTEM_NAMESPACE
    service_account: str = "rukpak-instance"
    host_network: bool = False
    default_install_namespace: str = "default"
    env: tuple[tuple[str, str], ...] = field(default_factory=tuple)
    """Extra environment of the instance container (e.g. how to reach the API server)."""
