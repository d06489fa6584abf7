"""End to end: runs of the installed system on the local kubelet, from the manifests.

Drift and optional objects, on the default install (``standing_system``: the standing
provisioner takes every run, no pod is started for any change, checked after each test):
drift of an installed object (deleted, or a field we apply taken by another writer) is put
back by the manager from the last good version it saw, as the instance's ServiceAccount,
with no run (a ``DriftRestored`` event says so; the standing provisioner takes no run for
it); an optional object whose API is not served is skipped (the Installed message and an
event say so) and created, without any user action, once a CRD serves it.

Stays on ``rukpak_system`` (the ``run-pods`` component, a pod per change), because its
subject is the run pod itself: a BundleDeployment installs through one run pod that
exits, and at rest no instance pod remains.
"""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import pytest
import yaml

from provisioner.engine.objects import Obj, ObjectRef
from provisioner.manager import model
from provisioner.manager.acting import actuate
from provisioner.runtime import lease
from tests import bundles
from tests import e2e_helpers as e2e
from tests import install_helpers as inst
from tests.polling import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SUFFIX = uuid.uuid4().hex[:6]


def _installed(system: inst.RukpakSystem, name: str) -> tuple[str, str, str]:
    live = system.kube.get(actuate.bd_ref(name)) or {}
    c = inst.conditions(live).get("Installed") or {}
    return str(c.get("status")), str(c.get("reason")), str(c.get("message"))


def _run_pods(system: inst.RukpakSystem, name: str) -> list[Obj]:
    items, _ = system.kube.list("v1", "Pod", namespace=inst.NAMESPACE)
    return [p for p in items if (p["metadata"].get("labels") or {}).get(model.BD_LABEL) == name]


def test_with_run_pods_a_bundledeployment_installs_through_one_run_pod_that_exits(
    rukpak_system: inst.RukpakSystem, tmp_path: Path
) -> None:
    system = rukpak_system
    ns = name = f"runpod-{SUFFIX}"
    root = tmp_path / "bundle"
    (root / "manifests").mkdir(parents=True)
    docs = [bundles.namespace(ns), bundles.configmap("settings", ns, mode="pod")]
    (root / "manifests" / "all.yaml").write_text(yaml.safe_dump_all(docs))
    ref = f"{system.registry_host}/e2e-runs-{SUFFIX}/pod:v1"
    e2e.push_bundle(root, ref)
    before = inst.pods_scheduled(system)
    system.kube.create(inst.bundle_deployment(name, ref))
    eventually(lambda: _installed(system, name)[0] == "True", timeout=180, what="Installed")
    started = [
        p for p in inst.pods_scheduled(system) - before if p.startswith(model.instance_name(name))
    ]
    assert len(started) == 1, started
    eventually(lambda: not _run_pods(system, name), timeout=60, what="no instance pod at rest")
    system.kube.delete(actuate.bd_ref(name))
    eventually(lambda: system.kube.get(actuate.bd_ref(name)) is None, timeout=120, what="gone")


def _runs_taken(system: inst.RukpakSystem, name: str) -> int:
    """How many runs of BundleDeployment ``name`` the standing provisioner finished."""
    run = f"run={model.instance_name(name)}-"
    return sum(
        1
        for line in inst.provisioner_log(system).splitlines()
        if "run finished" in line and run in line
    )


def test_drift_is_restored_with_no_run_and_an_optional_object_waits_for_its_crd(
    standing_system: inst.RukpakSystem, tmp_path: Path
) -> None:
    system = standing_system
    kube = system.kube
    group = f"opt{SUFFIX}.example.com"
    ns = f"runs-{SUFFIX}"
    root = tmp_path / "bundle"
    (root / "manifests").mkdir(parents=True)
    widget = bundles.widget(group, "v1", "w", {"size": 1})
    widget["metadata"]["namespace"] = ns
    widget["metadata"]["annotations"] = {"core.rukpak.io/optional": "true"}
    docs = [bundles.namespace(ns), bundles.configmap("settings", ns, mode="fast"), widget]
    (root / "manifests" / "all.yaml").write_text(yaml.safe_dump_all(docs))
    ref = f"{system.registry_host}/e2e-runs-{SUFFIX}/app:v1"
    e2e.push_bundle(root, ref)
    name = f"runs-{SUFFIX}"
    kube.create(inst.bundle_deployment(name, ref))

    _, _, message = eventually(
        lambda: i if (i := _installed(system, name))[0] == "True" else None,
        timeout=180,
        what="Installed",
    )
    assert f"{group}/v1 Widget" in message, message
    assert "created when the API appears" in message
    runs = eventually(lambda: _runs_taken(system, name), timeout=60, what="the run finished")
    events = system.kubectl(
        "get", "events", "-n", "default", "--field-selector", f"involvedObject.name={name}",
        "-o", "jsonpath={.items[*].message}",
    )  # fmt: skip
    assert "optional objects skipped" in events, events

    # drift: a deleted object comes back, restored by the manager (no run)
    settings = ObjectRef("", "v1", "ConfigMap", ns, "settings")
    kube.delete(settings)
    started = time.monotonic()
    eventually(
        lambda: kube.get(settings) is not None, timeout=60, what="the ConfigMap back", interval=0.02
    )
    restored_in = time.monotonic() - started
    assert _runs_taken(system, name) == runs, "restored by the manager, not by a run"
    # a field we apply, changed by another writer, is taken back
    kube.merge_patch(settings, {"data": {"mode": "slow"}})
    eventually(
        lambda: ((kube.get(settings) or {}).get("data") or {}).get("mode") == "fast",
        timeout=60,
        what="the field taken back",
    )
    assert _runs_taken(system, name) == runs, "restored by the manager, not by a run"
    assert _installed(system, name)[:2] == ("True", "InstallationSucceeded")
    events = system.kubectl(
        "get", "events", "-n", "default", "--field-selector", f"involvedObject.name={name}",
        "-o", "jsonpath={.items[*].reason}",
    )  # fmt: skip
    assert "DriftRestored" in events, events
    print(f"drift restored in {restored_in:.2f}s")

    # the optional object's API appears: the object is created, nobody touches the BD
    crd = bundles.crd(group)
    system.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(crd))
    created = ObjectRef(group, "v1", "Widget", ns, "w")
    eventually(
        lambda: (
            system.kubectl("get", f"widgets.{group}", "-n", ns, "w", "-o", "name", check=False)
            .strip()
            .endswith("/w")
        ),
        timeout=120,
        what=f"the optional {created} created",
    )
    eventually(
        lambda: "optional" not in _installed(system, name)[2],
        timeout=60,
        what="Installed no longer mentions a skipped object",
    )

    kube.delete(actuate.bd_ref(name))
    eventually(lambda: kube.get(actuate.bd_ref(name)) is None, timeout=120, what="BD gone")
    lease_ref = ObjectRef(
        "coordination.k8s.io", "v1", "Lease", inst.NAMESPACE, lease.lease_name(name)
    )
    # the finalizer goes first, then the uninstall and the Lease (upstream's order)
    eventually(lambda: kube.get(lease_ref) is None, timeout=60, what="its Lease gone after it")
    system.kubectl("delete", "crd", f"widgets.{group}", "--wait=false", check=False)
