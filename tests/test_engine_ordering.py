"""Kind phases, file order inside a phase, and pruning's inventory planning."""

from __future__ import annotations

import pytest

from provisioner.engine.apply import inventory, ordering
from provisioner.engine.bundle.formats import Manifest, Source
from provisioner.engine.objects import ObjectRef


def manifest(
    api_version: str, kind: str, name: str, file: str = "a.yaml", doc: int = 1
) -> Manifest:
    obj = {"apiVersion": api_version, "kind": kind, "metadata": {"name": name}}
    return Manifest(obj=obj, source=Source(file, doc, 1))


def test_phases_follow_dependencies_and_files_order_inside_a_phase() -> None:
    ms = [
        manifest(
            "admissionregistration.k8s.io/v1", "ValidatingWebhookConfiguration", "hook", "00.yaml"
        ),
        manifest("example.com/v1", "Widget", "w", "01.yaml"),
        manifest("apps/v1", "Deployment", "web", "02.yaml"),
        manifest("v1", "ConfigMap", "cfg2", "03.yaml", 2),
        manifest("v1", "ConfigMap", "cfg1", "03.yaml", 1),
        manifest("rbac.authorization.k8s.io/v1", "ClusterRole", "role", "04.yaml"),
        manifest("apiextensions.k8s.io/v1", "CustomResourceDefinition", "widgets", "05.yaml"),
        manifest("v1", "Namespace", "ns", "06.yaml"),
        manifest("v1", "Service", "svc", "00.yaml", 2),
    ]
    got = [(p.name, [m.ref.name for m in p.manifests]) for p in ordering.phases(ms)]
    assert got == [
        ("namespaces", ["ns"]),
        ("crds", ["widgets"]),
        ("rbac", ["role"]),
        ("config", ["cfg1", "cfg2"]),
        ("workloads", ["web"]),
        ("other", ["svc", "w"]),
        ("webhooks", ["hook"]),
    ]
    assert [p.spec.wait_established for p in ordering.phases(ms)].count(True) == 1


def ref(kind: str, name: str, group: str = "", version: str = "v1", ns: str = "") -> ObjectRef:
    return ObjectRef(group, version, kind, ns, name)


@pytest.mark.parametrize(
    ("previous", "current", "doomed"),
    [
        ([], [ref("ConfigMap", "a")], []),
        ([ref("ConfigMap", "a")], [ref("ConfigMap", "a")], []),
        (
            [ref("ConfigMap", "a"), ref("ConfigMap", "b")],
            [ref("ConfigMap", "a")],
            [ref("ConfigMap", "b")],
        ),
        # the same object at a new API version is kept, not pruned
        (
            [ref("HorizontalPodAutoscaler", "h", "autoscaling", "v1", "ns")],
            [ref("HorizontalPodAutoscaler", "h", "autoscaling", "v2", "ns")],
            [],
        ),
        # a namespace is another object
        (
            [ref("ConfigMap", "a", ns="x")],
            [ref("ConfigMap", "a", ns="y")],
            [ref("ConfigMap", "a", ns="x")],
        ),
        # deletion runs in reverse phase order: webhooks first, namespaces last
        (
            [
                ref("Namespace", "ns"),
                ref("CustomResourceDefinition", "w", "apiextensions.k8s.io"),
                ref("Deployment", "d", "apps", ns="ns"),
                ref("MutatingWebhookConfiguration", "m", "admissionregistration.k8s.io"),
            ],
            [],
            [
                ref("MutatingWebhookConfiguration", "m", "admissionregistration.k8s.io"),
                ref("Deployment", "d", "apps", ns="ns"),
                ref("CustomResourceDefinition", "w", "apiextensions.k8s.io"),
                ref("Namespace", "ns"),
            ],
        ),
    ],
)
def test_plan_prune_deletes_what_only_the_previous_revision_applied(
    previous: list[ObjectRef], current: list[ObjectRef], doomed: list[ObjectRef]
) -> None:
    assert inventory.plan_prune(previous, current) == doomed


def test_merged_keeps_previous_objects_and_prefers_the_current_version() -> None:
    old = ref("HorizontalPodAutoscaler", "h", "autoscaling", "v1", "ns")
    new = ref("HorizontalPodAutoscaler", "h", "autoscaling", "v2", "ns")
    gone = ref("ConfigMap", "c", ns="ns")
    assert inventory.merged([old, gone], [new]) == {new, gone}


@pytest.mark.parametrize("count", [0, 3, 5000])
def test_inventories_survive_a_configmap_round_trip_compressed_when_large(count: int) -> None:
    refs = frozenset(ref("ConfigMap", f"cm-{i:05d}", ns=f"ns-{i % 7}") for i in range(count))
    inv = inventory.Inventory("demo", "default", refs)
    cm = inventory.to_configmap(inv, system_namespace="rukpak-system")
    assert cm["metadata"]["name"] == "rukpak-inventory-demo"
    assert ("binaryData" in cm) == (count == 5000)
    assert len(str(cm)) < 100_000
    assert inventory.from_configmap(cm) == inv


def test_an_uninstall_mark_round_trips_on_the_inventory_configmap() -> None:
    mark = inventory.UninstallMark("Orphan", ("a", "b"))
    cm = {"metadata": {"annotations": {inventory.UNINSTALL_ANNOTATION: mark.annotation()}}}
    assert inventory.uninstall_mark(cm) == mark
    assert inventory.uninstall_mark({"metadata": {}}) is None
    assert inventory.uninstall_mark(None) is None
    who = inventory.UninstallMark("Delete", (), "system:serviceaccount:rukpak-system:team-a")
    cm = {"metadata": {"annotations": {inventory.UNINSTALL_ANNOTATION: who.annotation()}}}
    assert inventory.uninstall_mark(cm) == who
    hostile = '{"policy": "Delete", "user": ["system:masters"]}'  # not a string: not taken
    cm = {"metadata": {"annotations": {inventory.UNINSTALL_ANNOTATION: hostile}}}
    assert inventory.uninstall_mark(cm) == inventory.UninstallMark("Delete")


@pytest.mark.parametrize(
    "text",
    ["", "not json", "[]", '{"policy": "Purge"}', '{"dependsOn": ["a"]}', '{"policy": 1}'],
)
def test_a_broken_uninstall_mark_is_no_mark(text: str) -> None:
    """Nothing is deleted on the strength of a mark that does not say Delete or Orphan."""
    cm = {"metadata": {"annotations": {inventory.UNINSTALL_ANNOTATION: text}}}
    assert inventory.uninstall_mark(cm) is None


def test_hostile_depends_on_names_in_a_mark_are_dropped() -> None:
    text = '{"policy": "Delete", "dependsOn": ["a", 3, null, {"x": 1}]}'
    cm = {"metadata": {"annotations": {inventory.UNINSTALL_ANNOTATION: text}}}
    assert inventory.uninstall_mark(cm) == inventory.UninstallMark("Delete", ("a",))
    odd = '{"policy": "Delete", "dependsOn": "a"}'
    assert inventory.uninstall_mark(
        {"metadata": {"annotations": {inventory.UNINSTALL_ANNOTATION: odd}}}
    ) == inventory.UninstallMark("Delete")
