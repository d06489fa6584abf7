"""Drift and no-op decisions (pure) and the diff's object comparison."""

from __future__ import annotations

import copy
from typing import Any

from provisioner.engine.apply import ownership
from provisioner.engine.apply.drift import drift_reason
from provisioner.engine.objects import with_owner
from provisioner.engine.preview.diff import comparable, unified
from tests.bundles import deployment


def test_drift_is_decided_by_existence_owner_label_and_our_managed_fields() -> None:
    ours: dict[str, Any] = {"f:data": {"f:a": {}}}

    def live(fields: object, owner: str = "demo", **meta: object) -> dict[str, object]:
        return {
            "metadata": {
                "labels": {"core.rukpak.io/owner-name": owner},
                "managedFields": [
                    {"manager": "kubectl", "operation": "Update", "fieldsV1": {"f:data": {}}},
                    {"manager": "rukpak", "operation": "Apply", "fieldsV1": fields},
                ],
                **meta,
            }
        }

    assert drift_reason(ours, live(ours), "demo") is None
    assert drift_reason(ours, None, "demo") == "deleted"
    assert drift_reason(ours, live(ours, deletionTimestamp="now"), "demo") == "deleted"
    assert drift_reason(ours, live(ours, owner="other"), "demo") == "owner label removed or changed"
    assert drift_reason(ours, live({"f:data": {}}), "demo") == (
        "fields we apply were changed by another writer"
    )


def test_the_diff_ignores_status_and_server_maintained_metadata() -> None:
    live = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "a", "resourceVersion": "9", "uid": "u", "managedFields": []},
        "data": {"k": "old"},
        "status": {"x": 1},
    }
    assert comparable(live) == {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "a"},
        "data": {"k": "old"},
    }
    assert unified(live, {**live, "status": {"x": 2}}, "cm") == ""
    text = unified(live, {**live, "data": {"k": "new"}}, "cm")
    assert "-  k: old\n+  k: new\n" in text


DEPLOYMENT: dict[str, Any] = deployment(
    namespace="demo",
    replicas=1,
    containers=[
        {
            "name": "web",
            "image": "example.com/web:1",
            "args": ["--port", "8080"],
            "ports": [{"containerPort": 8080}],
        }
    ],
)

# as the API server records it: the selector and args are atomic (leaves), the ports
# key carries the protocol the server defaulted
DEPLOYMENT_FIELDS: dict[str, Any] = {
    "f:metadata": {"f:labels": {"f:app": {}}},
    "f:spec": {
        "f:replicas": {},
        "f:selector": {},
        "f:template": {
            "f:metadata": {"f:labels": {"f:app": {}}},
            "f:spec": {
                "f:containers": {
                    'k:{"name":"web"}': {
                        ".": {},
                        "f:args": {},
                        "f:image": {},
                        "f:name": {},
                        "f:ports": {
                            'k:{"containerPort":8080,"protocol":"TCP"}': {
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


def without(fields: dict[str, Any], *path: str) -> dict[str, Any]:
    out = copy.deepcopy(fields)
    node = out
    for key in path[:-1]:
        node = node[key]
    del node[path[-1]]
    return out


def test_our_field_set_covers_what_we_apply_until_another_writer_takes_a_field() -> None:
    # leaves ({}) own their whole value: the atomic selector and args
    assert ownership.covers(DEPLOYMENT_FIELDS, DEPLOYMENT)
    container = ("f:spec", "f:template", "f:spec", "f:containers", 'k:{"name":"web"}')
    assert not ownership.covers(without(DEPLOYMENT_FIELDS, *container, "f:image"), DEPLOYMENT)
    assert not ownership.covers(without(DEPLOYMENT_FIELDS, "f:spec", "f:replicas"), DEPLOYMENT)
    assert not ownership.covers(without(DEPLOYMENT_FIELDS, *container, "f:ports"), DEPLOYMENT)
    assert not ownership.covers(None, DEPLOYMENT)
    # a null asks for removal: nothing to own
    assert ownership.covers(DEPLOYMENT_FIELDS, {**DEPLOYMENT, "status": {"x": 1}, "extra": None})


def test_sets_of_scalars_are_matched_by_value() -> None:
    obj = {"apiVersion": "v1", "kind": "X", "metadata": {"name": "a", "finalizers": ["a", "b"]}}
    fields: dict[str, Any] = {"f:metadata": {"f:finalizers": {".": {}, 'v:"a"': {}, 'v:"b"': {}}}}
    assert ownership.covers(fields, obj)
    assert not ownership.covers(without(fields, "f:metadata", "f:finalizers", 'v:"b"'), obj)


def test_an_unchanged_object_is_recognised_by_digest_owner_and_fields() -> None:
    desired = ownership.with_digest(with_owner(DEPLOYMENT, "demo"))
    assert ownership.digest(desired) == ownership.digest(with_owner(DEPLOYMENT, "demo"))
    fields = copy.deepcopy(DEPLOYMENT_FIELDS)
    fields["f:metadata"]["f:labels"]["f:core.rukpak.io/owner-name"] = {}
    fields["f:metadata"]["f:labels"]["f:core.rukpak.io/owner-kind"] = {}
    fields["f:metadata"]["f:annotations"] = {f"f:{ownership.DIGEST_ANNOTATION}": {}}
    live = copy.deepcopy(desired)
    live["metadata"]["managedFields"] = [
        {"manager": "rukpak", "operation": "Apply", "fieldsV1": fields}
    ]
    live["status"] = {"replicas": 1}
    assert ownership.stale_reason(desired, live, "demo") is None
    assert ownership.stale_reason(desired, None, "demo") == "deleted"
    assert ownership.stale_reason(desired, live, "other") == "owner label removed or changed"
    changed = ownership.with_digest(with_owner({**DEPLOYMENT, "data": {"x": "1"}}, "demo"))
    assert ownership.stale_reason(changed, live, "demo") == "content changed since the last apply"
    assert ownership.stale_reason(with_owner(DEPLOYMENT, "demo"), live, "demo") is not None
    live["metadata"]["managedFields"][0]["fieldsV1"] = without(fields, "f:spec", "f:replicas")
    assert ownership.stale_reason(desired, live, "demo") == (
        "fields we apply were changed by another writer"
    )
