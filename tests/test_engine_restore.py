"""Restoring drift from the last good observation (``provisioner.engine.apply.restore``):
the projection onto our field set (pure, and against the real kube-apiserver, where a
restored object must carry exactly our field set again), naming what another writer
took, and the backoff of a fight."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from provisioner.engine.apply import appliedrecord, ownership, restore
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import FIELD_MANAGER, ObjectRef, with_owner
from rukpak.common.backoff import Backoff
from tests.bundles import deployment

WEB = {"name": "web", "image": "web:1", "ports": [{"containerPort": 80}]}
DEPLOYMENT: dict[str, Any] = deployment(
    namespace="demo", replicas=2, containers=[WEB, {"name": "side", "image": "side:1"}]
)

FIELDS: dict[str, Any] = {
    "f:metadata": {"f:labels": {".": {}, "f:app": {}}},
    "f:spec": {
        "f:replicas": {},
        "f:selector": {},
        "f:template": {
            "f:metadata": {"f:labels": {".": {}, "f:app": {}}},
            "f:spec": {
                "f:containers": {
                    'k:{"name":"web"}': {
                        ".": {},
                        "f:image": {},
                        "f:name": {},
                        "f:ports": {
                            'k:{"containerPort":80,"protocol":"TCP"}': {
                                ".": {},
                                "f:containerPort": {},
                            }
                        },
                    }
                }
            },
        },
    },
}


def _live() -> dict[str, Any]:
    live = copy.deepcopy(DEPLOYMENT)
    live["metadata"].update(uid="u", resourceVersion="7", generation=3)
    live["spec"]["template"]["spec"]["containers"][0]["ports"][0]["protocol"] = "TCP"
    live["spec"]["strategy"] = {"type": "RollingUpdate"}  # defaulted: nobody's field
    live["status"] = {"replicas": 2}
    return live


def test_ours_sets_exactly_the_owned_fields_with_their_last_good_values() -> None:
    body = restore.ours(_live(), FIELDS)
    # the side container, the status and managedFields are not ours: they are left out
    assert body == deployment(namespace="demo", replicas=2, containers=[WEB])


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"f:spec": {"f:paused": {}}}, "spec.paused is missing"),
        (
            {"f:spec": {"f:template": {"f:spec": {"f:containers": {'k:{"name":"gone"}': {}}}}}},
            "1 list entries are missing",
        ),
        ({"f:spec": {"f:replicas": {"f:x": {}}}}, "a scalar where the field set has members"),
        ("not a field set", "no field set"),
    ],
)
def test_a_field_set_the_object_cannot_fill_is_refused(fields: Any, why: str) -> None:
    with pytest.raises(restore.Unprojectable, match=why):
        restore.ours(_live(), fields)


def test_set_and_index_members_project_too() -> None:
    obj = {"apiVersion": "v1", "kind": "X", "metadata": {"name": "x"}, "l": ["a", "b"], "i": [1, 2]}
    body = restore.ours(obj, {"f:l": {'v:"b"': {}}, "f:i": {"i:1": {}}})
    assert body["l"] == ["b"] and body["i"] == [2]
    only_the_map = restore.ours({**obj, "m": {"a": 1}}, {"f:m": {".": {}}})
    assert only_the_map["m"] == {}  # owning a map's existence claims none of its members


def test_fields_of_names_leaf_paths_and_others_owning_names_their_manager() -> None:
    paths = set(restore.fields_of(FIELDS))
    assert "spec.replicas" in paths
    assert "spec.template.spec.containers[name=web].image" in paths
    live = _live()
    live["metadata"]["managedFields"] = [
        {"manager": FIELD_MANAGER, "operation": "Apply", "fieldsV1": {"f:spec": {}}},
        {"manager": "hpa", "operation": "Update", "fieldsV1": {"f:spec": {"f:replicas": {}}}},
    ]
    assert restore.others_owning(live, frozenset(paths)) == [("hpa", "spec.replicas")]
    assert restore.others_owning(None, frozenset(paths)) == []


def test_the_damper_backs_off_exponentially_and_forgets_after_a_quiet_window() -> None:
    damper = restore.Damper(Backoff(base=1.0, cap=8.0), window=100.0)
    assert damper.wait("bd/a", 0.0) == 0.0
    waits = []
    now = 0.0
    for _ in range(6):
        now += damper.wait("bd/a", now)
        damper.record("bd/a", now)
        waits.append(damper.wait("bd/a", now))
    assert waits == [1.0, 2.0, 4.0, 8.0, 8.0, 8.0]
    assert damper.fights("bd/a", now) == 6
    assert damper.wait("bd/a", now + 100.0) == 0.0  # quiet for a window: afresh
    damper.record("bd/b", now)
    damper.forget("bd/")
    assert damper.fights("bd/b", now) == 0
    damper.record("web", now)
    damper.record("web-2", now)
    damper.drop("web")  # one deleted BundleDeployment, not every name it prefixes
    assert (damper.fights("web", now), damper.fights("web-2", now)) == (0, 1)


# -- against the real API server -----------------------------------------------------------


@pytest.mark.cluster
def test_a_restored_object_carries_our_field_set_and_values_again(kube: Kube, name: str) -> None:
    ns = {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}}
    kube.apply(ns)
    try:
        desired = with_owner(copy.deepcopy(DEPLOYMENT), name)
        desired["metadata"]["namespace"] = name
        good = kube.apply(desired)
        recorded = appliedrecord.fields_hash(good)
        ours_before = ownership.applied_fields(good)

        ref = ObjectRef.of(good)
        # another writer takes two fields we apply (an update, as kubectl edit sends)
        patch = {
            "spec": {
                "replicas": 5,
                "template": {"spec": {"containers": [{"name": "web", "image": "web:evil"}]}},
            }
        }
        drifted = kube.merge_patch(ref, patch)
        assert drifted["spec"]["template"]["spec"]["containers"][0]["image"] == "web:evil"
        assert appliedrecord.drift_of(recorded, drifted, name) is not None
        named = restore.others_owning(drifted, frozenset(restore.fields_of(ours_before)))
        assert [path for _, path in named if path == "spec.replicas"] == ["spec.replicas"]
        assert all(manager != FIELD_MANAGER for manager, _ in named)

        restored = kube.apply(restore.ours(good, ours_before))
        assert appliedrecord.drift_of(recorded, restored, name) is None
        assert restored["spec"]["replicas"] == 2
        assert restored["spec"]["template"]["spec"]["containers"][0]["image"] == "web:1"
        assert kube.get(ref) is not None
    finally:
        kube.delete(ObjectRef("", "v1", "Namespace", "", name))
