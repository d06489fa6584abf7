"""The inventory: which objects a deployment applied, as references only.

Sits after apply and before pruning. Per deployment one ConfigMap
``rukpak-inventory-NAME`` in the system namespace records the refs of every
object the deployment may own. ``apply`` records *previous | current* before it
writes anything, so a failure part way never leaves an applied object
unrecorded; after pruning it records *current* alone.

Encoding is compact: refs are grouped by apiVersion and kind, namespaces and
names listed under them. Small inventories are JSON under ``data.inventory``
(readable with kubectl); large ones are gzip-compressed under
``binaryData.inventory.gz`` (which the API carries as base64), so thousands of
objects stay far below the 1 MiB object limit.
"""

from __future__ import annotations

import base64
import gzip
import json
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from provisioner.engine.apply import ordering
from provisioner.engine.errors import BundleInvalid
from provisioner.engine.objects import (
    OWNER_LABEL,
    Obj,
    ObjectRef,
    json_annotation,
    split_api_version,
)

FORMAT_VERSION = 1
COMPRESS_ABOVE = 32 * 1024
DATA_KEY = "inventory"
BINARY_KEY = "inventory.gz"
DEFAULT_SYSTEM_NAMESPACE = "rukpak-system"
INVENTORY_LABEL = "core.rukpak.io/inventory"
RECORD_KEY = "install-record"
RECORD_BINARY_KEY = "install-record.gz"
RECORD_MANAGER = "rukpak-record"
"""Field manager of the install record: the inventory's own apply (manager ``rukpak``)
then never removes it, and the record's apply never removes the inventory."""


UNINSTALL_ANNOTATION = "core.rukpak.io/uninstall"
"""On an inventory ConfigMap: ``{"policy": "Delete"|"Orphan", "dependsOn": [names]}``, written
before the deployment's finalizer goes; what an interrupted uninstall is finished from."""


@dataclass(frozen=True)
class UninstallMark:
    policy: str
    """``Delete`` or ``Orphan``."""
    depends_on: tuple[str, ...] = ()
    """The deployments the deleted one depended on (they wait for this uninstall)."""
    user: str = ""
    """Who uninstalls: the instance's user (its ServiceAccount); "" when not recorded."""

    def annotation(self) -> str:
        doc: dict[str, object] = {"policy": self.policy, "dependsOn": list(self.depends_on)}
        if self.user:
            doc["user"] = self.user
        return json.dumps(doc, separators=(",", ":"))


def uninstall_mark(cm: Obj | None) -> UninstallMark | None:
    """The uninstall mark on an inventory ConfigMap; None without one (or unreadable)."""
    doc = json_annotation(cm, UNINSTALL_ANNOTATION) if cm is not None else None
    if not isinstance(doc, dict) or doc.get("policy") not in ("Delete", "Orphan"):
        return None
    names = doc.get("dependsOn")
    kept = tuple(n for n in names if isinstance(n, str)) if isinstance(names, list) else ()
    user = doc.get("user")
    return UninstallMark(str(doc["policy"]), kept, user if isinstance(user, str) else "")


@dataclass(frozen=True)
class Inventory:
    name: str
    """The deployment's name."""
    namespace: str = ""
    """The install namespace (defaults namespaced objects without one)."""
    refs: frozenset[ObjectRef] = field(default_factory=frozenset)


def configmap_name(deployment: str) -> str:
    return f"rukpak-inventory-{deployment}"


def encode(inv: Inventory) -> dict[str, Any]:
    """The inventory as a JSON-able document (grouped, sorted, deterministic)."""
    groups: dict[tuple[str, str], list[list[str]]] = {}
    for ref in sorted(inv.refs):
        groups.setdefault((ref.api_version, ref.kind), []).append([ref.namespace, ref.name])
    return {
        "version": FORMAT_VERSION,
        "name": inv.name,
        "namespace": inv.namespace,
        "objects": [
            {"apiVersion": av, "kind": kind, "items": items}
            for (av, kind), items in sorted(groups.items())
        ],
    }


def decode(doc: dict[str, Any]) -> Inventory:
    if doc.get("version") != FORMAT_VERSION:
        raise BundleInvalid(f"inventory format {doc.get('version')!r} is not {FORMAT_VERSION}")
    refs: set[ObjectRef] = set()
    for group in doc.get("objects") or []:
        g, v = split_api_version(group["apiVersion"])
        for namespace, name in group["items"]:
            refs.add(ObjectRef(g, v, group["kind"], namespace, name))
    return Inventory(name=doc["name"], namespace=doc.get("namespace", ""), refs=frozenset(refs))


def to_configmap(inv: Inventory, *, system_namespace: str) -> Obj:
    """The ConfigMap that stores ``inv``; compressed when large."""
    text = json.dumps(encode(inv), separators=(",", ":"))
    return _configmap(inv.name, system_namespace, text, DATA_KEY, BINARY_KEY)


def _configmap(name: str, system_namespace: str, text: str, key: str, binary_key: str) -> Obj:
    """Deployment ``name``'s inventory ConfigMap holding ``text`` under ``key``, or gzipped
    under ``binary_key`` when it is large (the API carries binaryData as base64)."""
    body: Obj = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": configmap_name(name),
            "namespace": system_namespace,
            "labels": {INVENTORY_LABEL: "true", OWNER_LABEL: name},
        },
    }
    if len(text) > COMPRESS_ABOVE:
        packed = gzip.compress(text.encode(), compresslevel=6, mtime=0)
        body["binaryData"] = {binary_key: base64.b64encode(packed).decode()}
    else:
        body["data"] = {key: text}
    return body


def from_configmap(cm: Obj) -> Inventory:
    if (cm.get("binaryData") or {}).get(BINARY_KEY):
        text = gzip.decompress(base64.b64decode(cm["binaryData"][BINARY_KEY])).decode()
    else:
        text = (cm.get("data") or {}).get(DATA_KEY, "")
    if not text:
        raise BundleInvalid(f"inventory ConfigMap {cm['metadata']['name']} is empty")
    result: Inventory = decode(json.loads(text))
    return result


def record_configmap(name: str, doc: dict[str, Any], *, system_namespace: str) -> Obj:
    """The apply body that puts install record ``doc`` on deployment ``name``'s inventory
    ConfigMap (apply it with field manager ``RECORD_MANAGER``); compressed when large."""
    text = json.dumps(doc, sort_keys=True, separators=(",", ":"))
    return _configmap(name, system_namespace, text, RECORD_KEY, RECORD_BINARY_KEY)


def record_of(cm: Obj | None) -> dict[str, Any] | None:
    """The install record document on an inventory ConfigMap; None when absent or
    unreadable (then nothing is judged from it)."""
    if cm is None:
        return None
    try:
        packed = (cm.get("binaryData") or {}).get(RECORD_BINARY_KEY)
        if packed:
            text = gzip.decompress(base64.b64decode(packed, validate=True)).decode()
        else:
            text = (cm.get("data") or {}).get(RECORD_KEY) or ""
        doc = json.loads(text) if text else None
    except (OSError, EOFError, ValueError):
        return None
    return doc if isinstance(doc, dict) else None


def plan_prune(previous: Iterable[ObjectRef], current: Iterable[ObjectRef]) -> list[ObjectRef]:
    """What to delete: in ``previous`` but not ``current``, matched across API versions.

    Returned in deletion order (webhooks first, namespaces and CRDs last), so
    nothing is deleted while something that depends on it still exists.
    """
    keep = {ref.identity for ref in current}
    gone = [ref for ref in set(previous) if ref.identity not in keep]
    return ordering.flatten(ordering.deletion_order(gone))


def merged(previous: Iterable[ObjectRef], current: Iterable[ObjectRef]) -> frozenset[ObjectRef]:
    """``previous | current``; where one object appears at two versions, the current wins."""
    now = {ref.identity: ref for ref in current}
    out = dict(now)
    for ref in previous:
        out.setdefault(ref.identity, ref)
    return frozenset(out.values())
