"""End to end: a bundle of 10,000 objects installs, pivots and deletes with one install record.

On the local cluster with RukPak installed from ``deploy/`` (``standing_system``: the
standing provisioner applies it; no pod is started for any change, checked after each
test): a plain bundle of a Namespace and 10,000 ConfigMaps, pushed as an image, installed by one
BundleDeployment. The install record (``runs.InstallRecord`` on the inventory
ConfigMap, compressed) names every object and stays far below the 1 MiB object
limit; a pivot to a bundle where one ConfigMap changed rewrites that one and leaves
the others alone (their resourceVersions do not move); deleting the
BundleDeployment removes all of it. The seconds each step took are printed.
"""

from __future__ import annotations

import json
import time
import uuid
from pathlib import Path

import pytest
import yaml

from provisioner.engine.apply import inventory
from provisioner.engine.objects import ObjectRef
from provisioner.manager.acting import actuate
from provisioner.manager.planning import runs
from tests import e2e_helpers as e2e
from tests import install_helpers as inst
from tests.polling import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

COUNT = 10_000


def _bundle(root: Path, namespace: str, first: str) -> Path:
    """A Namespace and COUNT ConfigMaps; ``cm-0`` holds ``first``."""
    manifests = root / "manifests"
    manifests.mkdir(parents=True)
    (manifests / "00_namespace.yaml").write_text(
        yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    )
    docs = (
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": f"cm-{i}", "namespace": namespace},
            "data": {"value": first if i == 0 else str(i)},
        }
        for i in range(COUNT)
    )
    (manifests / "01_configmaps.yaml").write_text(yaml.safe_dump_all(docs))
    return root


def _installed(system: inst.RukpakSystem, name: str) -> dict[str, str]:
    live = system.kube.get(actuate.bd_ref(name)) or {}
    c = inst.conditions(live).get("Installed") or {}
    return {
        "status": str(c.get("status")),
        "active": str(live.get("status", {}).get("activeBundle")),
    }


def test_ten_thousand_objects_install_pivot_and_delete_with_one_record(
    standing_system: inst.RukpakSystem, tmp_path: Path
) -> None:
    system = standing_system
    kube = system.kube
    suffix = uuid.uuid4().hex[:6]
    ns, name = f"large-{suffix}", f"large-{suffix}"
    v1, v2 = (f"{system.registry_host}/e2e-large-{suffix}/app:{tag}" for tag in ("v1", "v2"))
    e2e.push_bundle(_bundle(tmp_path / "v1", ns, "one"), v1)
    e2e.push_bundle(_bundle(tmp_path / "v2", ns, "two"), v2)
    inv_ref = ObjectRef("", "v1", "ConfigMap", inst.NAMESPACE, inventory.configmap_name(name))

    started = time.monotonic()
    kube.create(inst.bundle_deployment(name, v1))
    first = eventually(
        lambda: i if (i := _installed(system, name))["status"] == "True" else None,
        timeout=900,
        what=f"{COUNT} objects Installed",
        interval=1.0,
    )
    installed_in = time.monotonic() - started
    cm = kube.get(inv_ref)
    record = runs.InstallRecord.of_inventory(cm)
    assert record is not None and record.applied is not None
    assert len(record.applied) == COUNT + 1
    assert len(inventory.from_configmap(cm or {}).refs) == COUNT + 1
    size = len(json.dumps(cm))
    assert size < 1024 * 1024 / 2, f"inventory with the record is {size} bytes"
    lease_ref = ObjectRef(
        "coordination.k8s.io", "v1", "Lease", inst.NAMESPACE, f"rukpak-instance-{name}"
    )
    assert not ((kube.get(lease_ref) or {}).get("metadata", {}).get("annotations") or {})

    untouched = ObjectRef("", "v1", "ConfigMap", ns, f"cm-{COUNT - 1}")
    before = (kube.get(untouched) or {})["metadata"]["resourceVersion"]
    started = time.monotonic()
    kube.merge_patch(
        actuate.bd_ref(name),
        {"spec": {"template": {"spec": {"source": {"image": {"ref": v2}}}}}},
    )
    eventually(
        lambda: (
            (i := _installed(system, name))["status"] == "True" and i["active"] != first["active"]
        ),
        timeout=900,
        what="the pivot Installed",
        interval=0.5,
    )
    pivoted_in = time.monotonic() - started
    changed = kube.get(ObjectRef("", "v1", "ConfigMap", ns, "cm-0")) or {}
    assert changed.get("data") == {"value": "two"}
    assert (kube.get(untouched) or {})["metadata"]["resourceVersion"] == before
    again = runs.InstallRecord.of_inventory(kube.get(inv_ref))
    assert again is not None and again.by != record.by and len(again.applied or {}) == COUNT + 1

    started = time.monotonic()
    kube.delete(actuate.bd_ref(name))
    eventually(
        lambda: kube.get(actuate.bd_ref(name)) is None,
        timeout=900,
        what="the BundleDeployment gone",
        interval=1.0,
    )
    # the BundleDeployment goes first; the uninstall follows, the install record last
    eventually(
        lambda: kube.get(inv_ref) is None, timeout=900, what="the uninstall done", interval=1.0
    )
    deleted_in = time.monotonic() - started
    namespace = kube.get(ObjectRef("", "v1", "Namespace", "", ns))
    assert namespace is None or namespace["metadata"].get("deletionTimestamp")
    print(
        f"{COUNT} objects: installed in {installed_in:.1f}s, pivoted in {pivoted_in:.1f}s, "
        f"deleted in {deleted_in:.1f}s; inventory with record {size} bytes"
    )
