"""Status and uninstall of a deployment, driven by its inventory.

Beside ``apply``: ``status`` reads every object the inventory lists and judges
it with ``health``; ``uninstall`` deletes (or, with the ``Orphan`` policy,
releases) them in reverse phase order and then removes the inventory. Both
only touch objects that still carry the deployment's owner label.
"""

from __future__ import annotations

from dataclasses import dataclass

from provisioner.engine.apply import apply, deletion, inventory, inventorystore, preflight
from provisioner.engine.health import health
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef, owner_of
from rukpak.common import errors


@dataclass(frozen=True)
class ObjectStatus:
    ref: ObjectRef
    live: Obj | None
    health: health.Health


def _inventory(kube: Kube, name: str, system_namespace: str) -> inventory.Inventory:
    inv = inventorystore.read_inventory(kube, name, system_namespace=system_namespace)
    if inv is None:
        raise errors.NotFound(
            f"no deployment {name!r}: ConfigMap {system_namespace}/"
            f"{inventory.configmap_name(name)} does not exist"
        )
    return inv


def status(
    kube: Kube,
    name: str,
    *,
    system_namespace: str = inventory.DEFAULT_SYSTEM_NAMESPACE,
    concurrency: int = 8,
) -> list[ObjectStatus]:
    """Each inventoried object with its health, sorted by ref."""
    inv = _inventory(kube, name, system_namespace)
    refs = sorted(inv.refs)
    out: list[ObjectStatus] = []
    live = preflight.read_live(kube, refs, concurrency)
    for ref in refs:
        got = live.get(ref)
        if isinstance(got, errors.RukpakError):
            out.append(ObjectStatus(ref, None, health.Health(False, f"cannot read it: {got}")))
        elif got is not None and owner_of(got) != name:
            out.append(ObjectStatus(ref, got, health.Health(False, "no longer owned by it")))
        else:
            out.append(ObjectStatus(ref, got, health.assess(got)))
    return out


def uninstall(
    kube: Kube,
    name: str,
    *,
    policy: apply.DeletionPolicy = "Delete",
    system_namespace: str = inventory.DEFAULT_SYSTEM_NAMESPACE,
    concurrency: int = 8,
    progress: apply.Progress = apply.no_progress,
) -> apply.Result:
    """Delete (``Delete``) or release (``Orphan``) everything the deployment owns.

    Idempotent up to the inventory: running it again after success is NotFound.
    """
    inv = _inventory(kube, name, system_namespace)
    progress(f"{'deleting' if policy == 'Delete' else 'orphaning'} {len(inv.refs)} objects")
    result = apply.Result()
    result.add(
        deletion.delete_owned(kube, sorted(inv.refs), name, policy=policy, concurrency=concurrency)
    )
    inventorystore.delete_inventory(kube, name, system_namespace=system_namespace)
    return result
