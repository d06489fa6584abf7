"""Diff, status, uninstall and drift correction against a real kube-apiserver."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.engine.apply import apply, drift, inventorystore, lifecycle
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import DELETION_POLICY_ANNOTATION, OWNER_LABEL, ObjectRef
from provisioner.engine.preview import diff
from rukpak.common import errors
from tests.bundles import configmap, crd, deployment, namespace, widget, write_bundle
from tests.polling import eventually, seen_by

pytestmark = pytest.mark.cluster


def test_diff_shows_creates_updates_and_prunes_without_writing(
    kube: Kube, name: str, tmp_path: Path
) -> None:
    opts = apply.Options(name=name, namespace=name)
    same = configmap("same", k="v")
    before = [namespace(name), same, configmap("edit", k="old"), configmap("gone")]
    apply.install(kube, write_bundle(tmp_path, {"a.yaml": before}), opts)
    after = [namespace(name), same, configmap("edit", k="new"), configmap("fresh")]
    bundle = write_bundle(tmp_path, {"a.yaml": after})
    changes = {(c.ref.kind, c.ref.name): c for c in diff.plan(kube, bundle, opts)}
    assert {k: c.action for k, c in changes.items()} == {
        ("Namespace", name): "unchanged",
        ("ConfigMap", "same"): "unchanged",
        ("ConfigMap", "edit"): "update",
        ("ConfigMap", "fresh"): "create",
        ("ConfigMap", "gone"): "prune",
    }
    assert "-  k: old\n+  k: new\n" in changes[("ConfigMap", "edit")].detail
    assert kube.get(ObjectRef("", "v1", "ConfigMap", name, "fresh")) is None


def test_diff_of_a_fresh_bundle_with_its_own_namespace_and_crd_only_creates(
    kube: Kube, name: str, group: str, tmp_path: Path
) -> None:
    docs = [namespace(name), configmap("c"), crd(group), widget(group, "v1", "w", {"size": 1})]
    bundle = write_bundle(tmp_path, {"a.yaml": docs})
    actions = {
        c.ref.kind: c.action
        for c in diff.plan(kube, bundle, apply.Options(name=name, namespace=name))
    }
    assert actions == {
        "Namespace": "create",
        "ConfigMap": "create",
        "CustomResourceDefinition": "create",
        "Widget": "create",
    }


def test_status_reports_health_of_every_inventoried_object(
    kube: Kube, name: str, tmp_path: Path
) -> None:
    apply.install(
        kube,
        write_bundle(tmp_path, {"a.yaml": [namespace(name), configmap("c"), deployment()]}),
        apply.Options(name=name, namespace=name),
    )
    states = {s.ref.kind: s.health for s in lifecycle.status(kube, name)}
    assert states["ConfigMap"].ready and states["Namespace"].ready
    # no controller-manager runs here, so the Deployment is never observed
    assert (
        not states["Deployment"].ready
        and "not observed generation 1" in states["Deployment"].reason
    )


def test_uninstall_deletes_owned_objects_and_honours_orphan(
    kube: Kube, name: str, tmp_path: Path
) -> None:
    keep = configmap("keep")
    keep["metadata"]["annotations"] = {DELETION_POLICY_ANNOTATION: "Orphan"}
    apply.install(
        kube,
        write_bundle(tmp_path, {"a.yaml": [namespace(name), configmap("drop"), keep]}),
        apply.Options(name=name, namespace=name),
    )
    result = lifecycle.uninstall(kube, name)
    assert result.pruned == [
        ObjectRef("", "v1", "ConfigMap", name, "drop"),
        ObjectRef("", "v1", "Namespace", "", name),
    ]
    assert result.orphaned == [ObjectRef("", "v1", "ConfigMap", name, "keep")]
    # no namespace controller runs here, so the orphan outlives its Terminating namespace
    kept = kube.get(ObjectRef("", "v1", "ConfigMap", name, "keep"))
    assert kept is not None and OWNER_LABEL not in (kept["metadata"].get("labels") or {})
    assert inventorystore.read_inventory(kube, name, system_namespace="rukpak-system") is None
    with pytest.raises(errors.NotFound, match="no deployment"):
        lifecycle.uninstall(kube, name)


def test_drift_is_corrected_within_seconds_and_steady_state_sends_no_writes(
    kube: Kube, name: str, tmp_path: Path
) -> None:
    result = apply.install(
        kube,
        write_bundle(
            tmp_path,
            {"a.yaml": [namespace(name), configmap("cfg", mode="fast"), configmap("other")]},
        ),
        apply.Options(name=name, namespace=name),
    )
    events: list[str] = []
    watcher = drift.DriftWatcher(kube, name, result.applied, report=events.append, watch_timeout=5)
    watcher.start()
    try:
        informer = watcher.informer("v1", "ConfigMap")
        assert informer.wait_synced(10)  # the listed copies were compared: equal
        assert watcher.idle and watcher.corrections == 0, events
        cfg = ObjectRef("", "v1", "ConfigMap", name, "cfg")
        kube.merge_patch(cfg, {"data": {"mode": "slow", "extra": "kept"}})
        eventually(lambda: (kube.get(cfg) or {}).get("data", {}).get("mode") == "fast")
        live = kube.get(cfg)
        assert live is not None and live["data"]["extra"] == "kept"  # not ours to remove
        kube.delete(ObjectRef("", "v1", "ConfigMap", name, "other"))
        eventually(lambda: kube.get(ObjectRef("", "v1", "ConfigMap", name, "other")) is not None)
        kube.merge_patch(cfg, {"metadata": {"labels": {OWNER_LABEL: None}}})
        eventually(
            lambda: OWNER_LABEL in ((kube.get(cfg) or {}).get("metadata", {}).get("labels") or {})
        )
        # the watcher counts a correction once its write has returned, which can be just
        # after the restored object is visible to us
        eventually(lambda: watcher.corrections >= 3, what="the third correction to be counted")
        settled = watcher.corrections
        assert settled == 3, events
        # past a watch timeout the server ends the watch and the watcher starts another:
        # a write that touches no field of ours, seen by that new watch, changes nothing
        watches = informer.listwatch.watches
        eventually(lambda: informer.listwatch.watches > watches, timeout=20, what="a re-watch")
        note = kube.merge_patch(cfg, {"metadata": {"annotations": {"note": "not ours"}}})
        seen_by(informer, note)
        assert watcher.idle and watcher.corrections == settled, events
    finally:
        watcher.stop()


def test_a_fight_is_damped_and_reported_once_naming_the_other_field_manager_and_field(
    kube: Kube, name: str, tmp_path: Path
) -> None:
    """`rukpak apply --watch` (and the helm provisioner) correct drift with the manager's
    damper: another writer that keeps changing a field of ours gets backoff, and one report
    that names it and the field, not one per write."""
    result = apply.install(
        kube,
        write_bundle(tmp_path, {"a.yaml": [namespace(name), configmap("cfg", name, mode="fast")]}),
        apply.Options(name=name, namespace=name),
    )
    events: list[str] = []
    watcher = drift.DriftWatcher(kube, name, result.applied, report=events.append, watch_timeout=5)
    watcher.start()
    cfg = ObjectRef("", "v1", "ConfigMap", name, "cfg")
    try:
        assert watcher.informer("v1", "ConfigMap").wait_synced(10)
        for round_ in range(1, drift.FIGHT_THRESHOLD + 2):
            kube.apply(configmap("cfg", name, mode="slow"), manager="autoscaler", force=True)
            eventually(
                lambda r=round_: watcher.corrections >= r,  # type: ignore[misc]
                timeout=30,
                what=f"correction {round_}",
            )
            assert (kube.get(cfg) or {})["data"]["mode"] == "fast"
        first = events[0]
        assert "data.mode (by autoscaler)" in first, events
        fights = [e for e in events if e.startswith("fight over")]
        assert len(fights) == 1, events  # reported once, then only damped
        assert "autoscaler keeps changing data.mode" in fights[0]
        assert watcher.fights[cfg] == fights[0]
    finally:
        watcher.stop()
