"""Building blocks of test bundles: manifests and the ``manifests/`` directory holding them.

Shared by the apply, instance and manager tests (the ``kube`` and ``name``
fixtures they use live in ``tests/conftest.py``).
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import yaml

from provisioner.engine.bundle import formats
from provisioner.manager import model


def write_bundle(root: Path, files: dict[str, list[dict[str, Any]]]) -> formats.Bundle:
    manifests = root / "manifests"
    manifests.mkdir(parents=True, exist_ok=True)
    for old in manifests.iterdir():
        old.unlink()
    for file, docs in files.items():
        (manifests / file).write_text(yaml.safe_dump_all(docs))
    return formats.load(root)


def namespace(name: str) -> dict[str, Any]:
    return {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}


def configmap(name: str, namespace: str | None = None, **data: str) -> dict[str, Any]:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": data}


def crd(
    group: str,
    *,
    versions: list[tuple[str, bool, bool]] | None = None,
    spec_props: dict[str, Any] | None = None,
    annotations: dict[str, str] | None = None,
) -> dict[str, Any]:
    """The Widget CRD of ``group``; ``versions`` are (name, served, storage), by default
    one served and stored ``v1``."""
    versions = versions or [("v1", True, True)]
    props = spec_props or {"size": {"type": "integer"}}
    meta: dict[str, Any] = {"name": f"widgets.{group}"}
    if annotations:
        meta["annotations"] = annotations
    return {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": meta,
        "spec": {
            "group": group,
            "scope": "Namespaced",
            "names": {
                "kind": "Widget",
                "plural": "widgets",
                "singular": "widget",
                "listKind": "WidgetList",
            },
            "versions": [
                {
                    "name": v,
                    "served": served,
                    "storage": storage,
                    "schema": {
                        "openAPIV3Schema": {
                            "type": "object",
                            "properties": {"spec": {"type": "object", "properties": props}},
                        }
                    },
                }
                for v, served, storage in versions
            ],
        },
    }


def widget(group: str, version: str, name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": f"{group}/{version}",
        "kind": "Widget",
        "metadata": {"name": name},
        "spec": spec,
    }


def deployment(
    name: str = "web",
    *,
    image: str = "example.invalid/web:1",
    namespace: str | None = None,
    replicas: int | None = None,
    containers: list[dict[str, Any]] | None = None,
) -> dict[str, Any]:
    """A Deployment labelled ``app: NAME``, one container unless ``containers`` are given;
    without ``namespace`` the install namespace is used."""
    meta: dict[str, Any] = {"name": name}
    if namespace is not None:
        meta.update(namespace=namespace, labels={"app": name})
    spec: dict[str, Any] = {} if replicas is None else {"replicas": replicas}
    spec["selector"] = {"matchLabels": {"app": name}}
    spec["template"] = {
        "metadata": {"labels": {"app": name}},
        "spec": {"containers": containers or [{"name": name, "image": image}]},
    }
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": meta, "spec": spec}


def role_binding(
    name: str,
    role: str,
    subjects: list[dict[str, Any]],
    *,
    namespace: str = "",
    role_kind: str = "ClusterRole",
) -> dict[str, Any]:
    """A binding of ``role`` (a ClusterRole unless ``role_kind`` says Role) to ``subjects``:
    a RoleBinding in ``namespace`` when one is given, else a ClusterRoleBinding."""
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "RoleBinding" if namespace else "ClusterRoleBinding",
        "metadata": meta,
        "roleRef": {"apiGroup": "rbac.authorization.k8s.io", "kind": role_kind, "name": role},
        "subjects": subjects,
    }


def bundle_doc(name: str, ref: str, *, cls: str = model.PLAIN_CLASS) -> dict[str, Any]:
    """A Bundle object (the manager's CRD) of the image ``ref``, for provisioner class ``cls``."""
    return {
        "apiVersion": model.API_VERSION,
        "kind": model.BUNDLE,
        "metadata": {"name": name},
        "spec": {"provisionerClassName": cls, "source": {"type": "image", "image": {"ref": ref}}},
    }


def bundle_deployment(name: str, image: str, **spec: Any) -> dict[str, Any]:
    """An upstream-style plain BundleDeployment of the bundle image ``image``; ``spec``
    adds to (or replaces) its spec's fields."""
    return {
        "apiVersion": model.API_VERSION,
        "kind": model.BUNDLE_DEPLOYMENT,
        "metadata": {"name": name},
        "spec": {
            "provisionerClassName": model.PLAIN_CLASS,
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "provisionerClassName": model.PLAIN_CLASS,
                    "source": {"type": "image", "image": {"ref": image}},
                },
            },
            **spec,
        },
    }
