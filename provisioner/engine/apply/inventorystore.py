"""Where inventories live: one ConfigMap per deployment in the system namespace.

The adapter-facing half of ``inventory`` (which stays pure): read, write and
delete a deployment's inventory through ``Kube``. Writing creates the system
namespace first when it is missing, and sends nothing when the caller knows
the stored inventory already is the one to write.
"""

from __future__ import annotations

from provisioner.engine.apply import inventory
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import ObjectRef
from rukpak.common import errors


def read_inventory(kube: Kube, name: str, *, system_namespace: str) -> inventory.Inventory | None:
    ref = ObjectRef("", "v1", "ConfigMap", system_namespace, inventory.configmap_name(name))
    cm = kube.get(ref)
    return inventory.from_configmap(cm) if cm is not None else None


def write_inventory(
    kube: Kube,
    inv: inventory.Inventory,
    *,
    system_namespace: str,
    stored: inventory.Inventory | None = None,
) -> inventory.Inventory:
    """Store ``inv`` unless it equals ``stored`` (what the ConfigMap holds); returns ``inv``."""
    if inv == stored:
        return inv
    ns_ref = ObjectRef("", "v1", "Namespace", "", system_namespace)
    if kube.get(ns_ref) is None:
        kube.apply(
            {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": system_namespace}}
        )
    kube.apply(inventory.to_configmap(inv, system_namespace=system_namespace))
    return inv


def delete_inventory(kube: Kube, name: str, *, system_namespace: str) -> None:
    ref = ObjectRef("", "v1", "ConfigMap", system_namespace, inventory.configmap_name(name))
    kube.delete(ref)


def mark_uninstall(
    kube: Kube, name: str, mark: inventory.UninstallMark, *, system_namespace: str
) -> bool:
    """Put ``mark`` on deployment ``name``'s inventory; False when it has none (nothing
    was installed, so nothing is left to finish)."""
    ref = ObjectRef("", "v1", "ConfigMap", system_namespace, inventory.configmap_name(name))
    patch = {"metadata": {"annotations": {inventory.UNINSTALL_ANNOTATION: mark.annotation()}}}
    try:
        kube.merge_patch(ref, patch)
    except errors.NotFound:
        return False
    return True
