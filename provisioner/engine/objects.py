"""Object references and the labels that mark ownership.

Sits under every other engine module: a ``ObjectRef`` names one Kubernetes
object (group/version/kind/namespace/name) without its content, which is all
the inventory records and all pruning needs.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from typing import Any

Obj = dict[str, Any]
"""A Kubernetes object as decoded JSON."""

FIELD_MANAGER = "rukpak"
OWNER_LABEL = "core.rukpak.io/owner-name"
OWNER_KIND_LABEL = "core.rukpak.io/owner-kind"
OWNER_KIND = "BundleDeployment"
"""Upstream's pair of labels on every installed object (its suite selects a
BundleDeployment's objects by both); ownership is read from ``OWNER_LABEL`` alone."""
DELETION_POLICY_ANNOTATION = "core.rukpak.io/deletion-policy"
"""Per-object override: ``Orphan`` keeps the object when it is pruned or uninstalled."""


def meta_of(obj: Obj) -> dict[str, Any]:
    """``metadata`` of ``obj`` ({} when absent): the one accessor every module uses."""
    found: dict[str, Any] = obj.get("metadata") or {}
    return found


def name_of(obj: Obj) -> str:
    return str(meta_of(obj).get("name") or "")


def labels_of(obj: Obj) -> dict[str, str]:
    found: dict[str, str] = meta_of(obj).get("labels") or {}
    return found


def annotations_of(obj: Obj) -> dict[str, str]:
    found: dict[str, str] = meta_of(obj).get("annotations") or {}
    return found


def json_annotation(obj: Obj, key: str) -> Any:
    """The JSON document the annotation ``key`` of ``obj`` holds; None when there is no such
    annotation or it is not JSON (callers check the document's shape)."""
    text = annotations_of(obj).get(key)
    if not isinstance(text, str):
        return None
    try:
        return json.loads(text)
    except ValueError:
        return None


def split_api_version(api_version: str) -> tuple[str, str]:
    """``apps/v1`` -> ``("apps", "v1")``; ``v1`` -> ``("", "v1")``."""
    group, _, version = api_version.rpartition("/")
    return group, version


@dataclass(frozen=True, order=True)
class ObjectRef:
    """Names one object; ``namespace`` is empty for cluster-scoped objects."""

    group: str
    version: str
    kind: str
    namespace: str
    name: str

    @classmethod
    def of(cls, obj: Obj) -> ObjectRef:
        group, version = split_api_version(str(obj.get("apiVersion", "")))
        meta = obj.get("metadata") or {}
        return cls(
            group=group,
            version=version,
            kind=str(obj.get("kind", "")),
            namespace=str(meta.get("namespace") or ""),
            name=str(meta.get("name") or ""),
        )

    @property
    def api_version(self) -> str:
        return f"{self.group}/{self.version}" if self.group else self.version

    @property
    def identity(self) -> tuple[str, str, str, str]:
        """The object's identity across API versions (group, kind, namespace, name)."""
        return (self.group, self.kind, self.namespace, self.name)

    def __str__(self) -> str:
        kind = f"{self.kind}.{self.group}" if self.group else self.kind
        where = f"{self.namespace}/" if self.namespace else ""
        return f"{kind} {where}{self.name}"


def owner_of(obj: Obj) -> str | None:
    """The deployment that owns ``obj`` according to its label, if any."""
    labels = (obj.get("metadata") or {}).get("labels") or {}
    value = labels.get(OWNER_LABEL)
    return str(value) if value else None


def with_owner(obj: Obj, owner: str) -> Obj:
    """A copy of ``obj`` (top-level and metadata copied) labelled as owned by ``owner``."""
    out = dict(obj)
    meta = dict(out.get("metadata") or {})
    labels = dict(meta.get("labels") or {})
    labels[OWNER_LABEL] = owner
    labels[OWNER_KIND_LABEL] = OWNER_KIND
    meta["labels"] = labels
    out["metadata"] = meta
    return out


def with_namespace(obj: Obj, namespace: str) -> Obj:
    """A copy of ``obj`` with ``metadata.namespace`` set (or removed when empty)."""
    out = dict(obj)
    meta = dict(out.get("metadata") or {})
    if namespace:
        meta["namespace"] = namespace
    else:
        meta.pop("namespace", None)
    out["metadata"] = meta
    return out


def condition(obj: Obj, kind: str) -> Obj | None:
    """The status condition of type ``kind``, or None."""
    for cond in (obj.get("status") or {}).get("conditions") or []:
        if isinstance(cond, dict) and cond.get("type") == kind:
            return cond
    return None
