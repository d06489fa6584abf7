"""A PersistentVolumeClaim and a StorageClass of our driver, as the API server returns them.

Where it sits: the PV provisioner's tests build their inputs from these
(``test_storage_plan`` for the pure planner, ``test_storage_provisioner`` for the loop).
"""

from __future__ import annotations

from typing import Any

from provisioner.storage import plan

DRIVER = "csi.rukpak.io"
UID = "0b6f4c1e-7d2a-4f0e-9a57-3c1d2e4f5a6b"


def claim(**spec: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "v1",
        "kind": "PersistentVolumeClaim",
        "metadata": {
            "name": "bundle",
            "namespace": "apps",
            "uid": UID,
            "resourceVersion": "42",
            "annotations": {plan.ANN_STORAGE_PROVISIONER: DRIVER},
        },
        "spec": {
            "accessModes": ["ReadOnlyMany"],
            "storageClassName": "bundles",
            "resources": {"requests": {"storage": "1Mi"}},
            "volumeMode": "Filesystem",
        },
    }
    body["spec"].update(spec)
    return body


def storage_class(**fields: Any) -> dict[str, Any]:
    body: dict[str, Any] = {
        "apiVersion": "storage.k8s.io/v1",
        "kind": "StorageClass",
        "metadata": {"name": "bundles"},
        "provisioner": DRIVER,
        "reclaimPolicy": "Delete",
        "volumeBindingMode": "Immediate",
        "parameters": {"image": "registry.example/bundles/hello:v1"},
    }
    body.update(fields)
    return body
