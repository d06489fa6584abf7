"""Drift decisions (pure) and the diff's object comparison."""

from __future__ import annotations

from provisioner.engine.diff import comparable, unified
from provisioner.engine.drift import drift_reason


def test_drift_is_decided_by_existence_owner_label_and_our_managed_fields() -> None:
    ours = {"f:data": {"f:a": {}}}

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
