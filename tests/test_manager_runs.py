"""Run-to-completion instances, as pure logic: the install record, drift by hash, the plan.

The same flow runs on the local kubelet in tests/test_e2e_manager.py and
tests/test_e2e_install.py (the manager's default mode); here every branch of
``runs.decide`` and ``appliedrecord`` is pinned down with observed states.
"""

from __future__ import annotations

import copy
import json
from typing import Any

import pytest

from provisioner.engine.apply import appliedrecord, inventory
from provisioner.engine.objects import OWNER_LABEL, Obj, ObjectRef
from provisioner.manager import model
from provisioner.manager.planning import generate, plan, runs, sources
from tests.plan_helpers import DIGEST, B, bundle, cond, kinds

SETTINGS = model.Settings(image="registry.example/rukpak:v1")
NOW = "2026-01-01T00:01:00Z"
PINNED = sources.pinned_image(DIGEST)


def run_pod(of: Obj, number: int, phase: str = "Running", **status: Any) -> Obj:
    pod = generate.instance_run_pod(of, model.bundle_name(of), PINNED, SETTINGS, number)
    pod["status"] = {"phase": phase, **status}
    return pod


def revision_of(of: Obj) -> str:
    pod = generate.instance_run_pod(of, model.bundle_name(of), PINNED, SETTINGS, 0)
    return str(pod["metadata"]["annotations"][model.SPEC_HASH_ANNOTATION])


def record(
    of: Obj, number: int = 0, *, bundle_name: str = "", extra: dict[str, Any] | None = None
) -> runs.InstallRecord:
    """The record run ``number`` of ``of`` leaves, read back from its inventory ConfigMap."""
    doc = {
        "by": model.run_pod_name("hello", revision_of(of), number),
        "bundle": bundle_name or model.bundle_name(of),
        **(extra or {}),
    }
    cm = inventory.record_configmap("hello", doc, system_namespace="rukpak-system")
    got = runs.InstallRecord.of_inventory(cm)
    assert got is not None
    return got


def observe(of: Obj, **kw: Any) -> plan.Observed:
    kw.setdefault("bundles", (bundle(of, resolved=DIGEST),))
    return plan.Observed(now=NOW, **kw)


def planned(of: Obj, observed: plan.Observed) -> list[plan.Action]:
    return plan.plan(of, observed, settings=SETTINGS)


def of_kind(actions: list[plan.Action], kind: type) -> list[Any]:
    return [a for a in actions if isinstance(a, kind)]


# -- names and the record ----------------------------------------------------------------


def test_run_pod_names_parse_back_and_never_match_another_deployment() -> None:
    name = model.run_pod_name("hello", "0123abcd", 7)
    assert model.parse_run_pod_name("hello", name) == ("0123abcd", 7)
    assert model.parse_run_pod_name("hell", name) is None
    assert model.parse_run_pod_name("hello-x", model.run_pod_name("hello", "ab", 1)) is None
    assert model.parse_run_pod_name("hello", "rukpak-instance-hello-x-0123abcd-7") is None


def test_the_same_inputs_make_the_same_run_pod_and_a_new_image_a_new_revision() -> None:
    assert run_pod(B, 0)["metadata"]["name"] == run_pod(B, 0)["metadata"]["name"]
    other = generate.instance_run_pod(
        B, model.bundle_name(B), PINNED, model.Settings(image="registry.example/rukpak:v2"), 0
    )
    assert other["metadata"]["annotations"][model.SPEC_HASH_ANNOTATION] != revision_of(B)
    spec = run_pod(B, 0)["spec"]
    assert spec["restartPolicy"] == "Never"
    assert "--bundle" in spec["containers"][0]["command"]
    assert spec["volumes"] == [sources.volume(PINNED)]


def test_a_record_without_its_writer_is_none_and_a_broken_applied_record_is_ignored() -> None:
    assert runs.InstallRecord.of_inventory(None) is None
    cm = inventory.record_configmap("hello", {"by": "x"}, system_namespace="s")
    assert runs.InstallRecord.of_inventory(cm) is None
    broken = {"data": {inventory.RECORD_KEY: "{not json"}}
    assert runs.InstallRecord.of_inventory(broken) is None
    got = record(B, extra={"applied": "gz:not-base64!"})
    assert got.applied is None
    got = record(B, extra={"awaiting": [["monitoring.coreos.com", "v1", "ServiceMonitor"], "junk"]})
    assert got.awaiting == {("monitoring.coreos.com", "v1", "ServiceMonitor")}


def test_a_large_record_is_compressed_on_the_configmap_and_round_trips() -> None:
    applied = {f"v1|ConfigMap|demo|cm-{i}": f"{i:016x}" for i in range(10_000)}
    rec = runs.InstallRecord("rukpak-instance-hello-abc-0", "hello-b", applied)
    cm = inventory.record_configmap("hello", rec.document(), system_namespace="s")
    assert inventory.RECORD_BINARY_KEY in cm["binaryData"] and "data" not in cm
    assert len(json.dumps(cm)) < 1024 * 1024  # fits in one object with room to spare
    assert runs.InstallRecord.of_inventory(cm) == rec


def test_a_run_waits_for_a_free_slot_when_others_fill_them() -> None:
    full = model.Settings(image="registry.example/rukpak:v1", max_concurrent_runs=2)
    actions = plan.plan(B, observe(B, other_runs=2), settings=full)
    assert not of_kind(actions, plan.CreatePod)
    (wait,) = of_kind(actions, plan.Requeue)
    assert wait.after == runs.RUN_SLOT_WAIT
    message = of_kind(actions, plan.WriteStatus)[0].status["conditions"][1]["message"]
    assert "free run slot" in message and "--max-concurrent-runs 2" in message
    actions = plan.plan(B, observe(B, other_runs=1), settings=full)
    assert len(of_kind(actions, plan.CreatePod)) == 1


def live_object(name: str, fields: Obj, owner: str = "hello") -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {
            "name": name,
            "namespace": "demo",
            "labels": {OWNER_LABEL: owner},
            "managedFields": [
                {"manager": "rukpak", "operation": "Apply", "fieldsV1": fields},
                {"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:x": {}}},
            ],
        },
    }


def test_the_applied_record_round_trips_small_and_compressed() -> None:
    small = {appliedrecord.key_of(ObjectRef("", "v1", "ConfigMap", "demo", "a")): "abc"}
    assert appliedrecord.decode(appliedrecord.encode(small)) == small
    big = {f"v1|ConfigMap|demo|cm-{i}": f"{i:016x}" for i in range(2000)}
    text = appliedrecord.encode(big)
    assert text.startswith("gz:") and len(text) < len(json.dumps(big)) / 2
    assert appliedrecord.decode(text) == big
    with pytest.raises(ValueError, match="map of object keys"):
        appliedrecord.decode('{"no-bars": "x"}')


def test_drift_is_a_gone_object_a_lost_label_or_other_fields_we_apply() -> None:
    mine: Obj = {"f:data": {"f:a": {}}}
    good = live_object("a", mine)
    rec = {appliedrecord.key_of(ObjectRef.of(good)): appliedrecord.fields_hash(good)}
    assert appliedrecord.drifted(rec, "hello", lambda ref: good) == {}
    # another writer's fields alone are not drift; ours changing is
    other = copy.deepcopy(good)
    other["metadata"]["managedFields"][1]["fieldsV1"] = {"f:y": {}}
    assert appliedrecord.drifted(rec, "hello", lambda ref: other) == {}
    taken = live_object("a", {"f:data": {}})
    assert list(appliedrecord.drifted(rec, "hello", lambda ref: taken).values()) == [
        "fields we apply were changed by another writer"
    ]
    assert list(appliedrecord.drifted(rec, "hello", lambda ref: None).values()) == ["deleted"]
    relabelled = live_object("a", mine, owner="someone-else")
    lost = appliedrecord.drifted(rec, "hello", lambda r: relabelled) or {}
    assert list(lost.values()) == ["owner label removed or changed"]
    unknown = appliedrecord.drifted(rec, "hello", lambda ref: appliedrecord.UNKNOWN)
    assert unknown is None


# -- the plan ----------------------------------------------------------------------------


def test_an_unpacked_bundle_without_a_record_starts_run_zero() -> None:
    actions = planned(B, observe(B))
    created = of_kind(actions, plan.CreatePod)
    assert [c.pod["metadata"]["name"] for c in created] == [run_pod(B, 0)["metadata"]["name"]]
    assert cond(actions, plan.INSTALLED) == ("False", "InstallPending")


def test_a_running_run_is_waited_for_and_not_started_twice() -> None:
    actions = planned(B, observe(B, pods=(run_pod(B, 0),)))
    assert not of_kind(actions, plan.CreatePod)
    assert cond(actions, plan.INSTALLED) == ("False", "InstallPending")


def test_a_recorded_run_is_installed_and_its_pod_goes() -> None:
    done = run_pod(B, 0, "Succeeded")
    actions = planned(B, observe(B, pods=(done,), record=record(B)))
    assert [a.name for a in of_kind(actions, plan.DeletePod)] == [done["metadata"]["name"]]
    assert not of_kind(actions, plan.CreatePod)
    assert cond(actions, plan.INSTALLED) == ("True", "InstallationSucceeded")
    status = of_kind(actions, plan.WriteStatus)[0].status
    assert status["activeBundle"] == model.bundle_name(B)


def test_drift_starts_the_next_run_while_installed_stays_true() -> None:
    actions = planned(B, observe(B, record=record(B, 3), drift=("v1/ConfigMap demo/a: deleted",)))
    assert [c.pod["metadata"]["name"] for c in of_kind(actions, plan.CreatePod)] == [
        run_pod(B, 4)["metadata"]["name"]
    ]
    assert cond(actions, plan.INSTALLED) == ("True", "InstallationSucceeded")


def test_a_failed_run_is_install_failed_then_retried_after_a_while() -> None:
    ended = {"state": {"terminated": {"exitCode": 1, "message": "boom: no CRD for Foo"}}}
    failed = run_pod(B, 0, "Failed", containerStatuses=[ended])
    failed["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] = NOW
    actions = planned(B, observe(B, pods=(failed,)))
    assert cond(actions, plan.INSTALLED) == ("False", "InstallFailed")
    message = of_kind(actions, plan.WriteStatus)[0].status["conditions"][1]["message"]
    assert "boom: no CRD for Foo" in message
    assert not of_kind(actions, plan.DeletePod) and of_kind(actions, plan.Requeue)
    later = copy.deepcopy(failed)
    later["status"]["containerStatuses"][0]["state"]["terminated"]["finishedAt"] = (
        "2026-01-01T00:00:30Z"
    )
    actions = planned(B, observe(B, pods=(later,)))
    assert [a.name for a in of_kind(actions, plan.DeletePod)] == [failed["metadata"]["name"]]


def test_a_new_bundle_stops_an_obsolete_run_and_keeps_the_old_one_active_until_recorded() -> None:
    old = copy.deepcopy(B)
    old["spec"]["template"]["spec"]["source"]["image"]["ref"] = "registry.example/hello:v0"
    old_run = generate.instance_run_pod(old, model.bundle_name(old), PINNED, SETTINGS, 0)
    old_run["status"] = {"phase": "Running"}
    bundles = (bundle(B, resolved=DIGEST), bundle(old, resolved=DIGEST))
    rec = runs.InstallRecord(old_run["metadata"]["name"], model.bundle_name(old))
    actions = planned(B, observe(B, bundles=bundles, pods=(old_run,), record=rec))
    assert [a.name for a in of_kind(actions, plan.DeletePod)] == [old_run["metadata"]["name"]]
    assert not of_kind(actions, plan.CreatePod)  # after the obsolete run stopped
    assert cond(actions, plan.INSTALLED) == ("False", "InstallPending")
    assert not of_kind(actions, plan.DeleteBundle)  # the old Bundle is still the active one


def test_an_unpack_failure_keeps_correcting_the_installed_bundle() -> None:
    old = copy.deepcopy(B)
    old["spec"]["template"]["spec"]["source"]["image"]["ref"] = "registry.example/hello:v0"
    bundles = (bundle(B, failing="no manifests"), bundle(old, resolved=DIGEST))
    rec = record(old, 2, bundle_name=model.bundle_name(old))
    drift = ("v1/ConfigMap demo/a: deleted",)
    actions = planned(B, observe(B, bundles=bundles, record=rec, drift=drift))
    assert cond(actions, plan.HAS_VALID_BUNDLE) == ("False", "UnpackFailed")
    assert cond(actions, plan.INSTALLED) == ("True", "InstallationSucceeded")
    created = of_kind(actions, plan.CreatePod)
    assert [c.pod["metadata"]["annotations"][model.BUNDLE_ANNOTATION] for c in created] == [
        model.bundle_name(old)
    ]


def test_deletion_stops_every_run_then_drops_the_finalizer_and_uninstalls() -> None:
    gone: Obj = copy.deepcopy(B)
    gone["metadata"]["deletionTimestamp"] = NOW
    actions = planned(gone, observe(gone, pods=(run_pod(B, 0),)))
    assert kinds(actions) == ["DeletePod", "Requeue"]
    actions = planned(gone, observe(gone))
    assert kinds(actions)[-4:] == ["MarkUninstall", "RemoveFinalizer", "Uninstall", "DeleteLease"]


def test_run_pods_and_unpack_pods_run_as_non_root_without_privilege() -> None:
    unpack = generate.unpack_pod(bundle(B, resolved=DIGEST), PINNED, SETTINGS)
    for pod in (run_pod(B, 0), unpack):
        assert pod["spec"]["securityContext"]["runAsNonRoot"] is True
        assert pod["spec"]["securityContext"]["runAsUser"] != 0
        container = pod["spec"]["containers"][0]["securityContext"]
        assert container["allowPrivilegeEscalation"] is False
        assert container["capabilities"] == {"drop": ["ALL"]}
        assert container["readOnlyRootFilesystem"] is True


def test_a_finished_run_wakes_the_oldest_bundle_deployments_waiting_for_a_slot() -> None:
    """Waiting for a run slot costs no reconcile every few seconds: the controller keeps the
    waiters in order and a run that ends (pod or run ConfigMap) wakes the oldest two."""
    import threading

    from provisioner.instance import runrecord
    from provisioner.manager import controller
    from provisioner.runtime.queue import WorkQueue

    ctl = controller.Controller.__new__(controller.Controller)
    ctl._repairs = threading.Lock()
    ctl._slot_waiters = {}
    ctl.queue = WorkQueue()
    slot: list[plan.Action] = [plan.Requeue(runs.RUN_SLOT_WAIT, runs.SLOT_WAIT_WHY)]
    for name in ("a", "b", "c"):
        ctl._wait_for_slot(name, slot)
    ctl._wait_for_slot("b", [])  # b got its slot meanwhile
    running = {"kind": "Pod", "metadata": {"name": "x"}, "status": {"phase": "Running"}}
    ctl._owned(running)
    assert len(ctl.queue) == 0 and list(ctl._slot_waiters) == ["a", "c"]
    done = runrecord.from_pod(
        run_pod := {"kind": "Pod", "metadata": {"name": "y", "namespace": "s"}}
    )
    done["metadata"]["annotations"][runrecord.PHASE] = "Succeeded"
    del run_pod
    ctl._owned(done)
    woken = {ctl.queue.get(timeout=1), ctl.queue.get(timeout=1)}
    assert woken == {controller.BD_KEY + "a", controller.BD_KEY + "c"}
    assert ctl._slot_waiters == {}
