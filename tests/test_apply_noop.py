"""Re-installing unchanged content sends no write requests; changed or edited objects are sent.

Against a real kube-apiserver: the ``Kube`` adapter counts the requests it sends.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from provisioner.engine.apply import apply, drift, ownership
from provisioner.engine.bundle import formats
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import ObjectRef
from tests import bundles
from tests.polling import eventually

pytestmark = pytest.mark.cluster


def write_bundle(root: Path, docs: list[dict[str, Any]]) -> formats.Bundle:
    return bundles.write_bundle(root, {"all.yaml": docs})


def varied(name: str, *, replicas: int = 1) -> list[dict[str, Any]]:
    """Kinds whose field sets have maps, keyed lists with defaulted keys, atomic lists, sets,
    nulls and empty maps."""
    group = f"{name}.example.com"
    return [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}},
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "settings", "annotations": {"note": "hi"}},
            "data": {"mode": "fast", "level": "3"},
        },
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {"name": "web", "labels": {"app": "web"}},
            "spec": {
                "replicas": replicas,
                "selector": {"matchLabels": {"app": "web"}},
                "template": {
                    # as generators write them: a null timestamp, empty maps
                    "metadata": {"labels": {"app": "web"}, "creationTimestamp": None},
                    "spec": {
                        "containers": [
                            {
                                "name": "web",
                                "image": "example.com/web:1",
                                "args": ["--port", "8080"],
                                "ports": [{"containerPort": 8080}],  # protocol defaulted
                                "env": [{"name": "A", "value": "1"}],
                                "resources": {},
                                "securityContext": {},
                            }
                        ],
                        "tolerations": [{"key": "k", "operator": "Exists"}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "web"},
            "spec": {"selector": {"app": "web"}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": f"{name}-reader"},
            "rules": [{"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list"]}],
        },
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"gadgets.{group}"},
            "spec": {
                "group": group,
                "scope": "Namespaced",
                "names": {"kind": "Gadget", "plural": "gadgets"},
                "versions": [
                    {
                        "name": "v1",
                        "served": True,
                        "storage": True,
                        "schema": {
                            "openAPIV3Schema": {
                                "type": "object",
                                "x-kubernetes-preserve-unknown-fields": True,
                            }
                        },
                    }
                ],
            },
        },
        {
            "apiVersion": f"{group}/v1",
            "kind": "Gadget",
            "metadata": {"name": "g"},
            "spec": {"items": [1, 2], "nested": {"deep": {"x": True}}},
        },
    ]


def test_reinstalling_unchanged_content_sends_no_writes(
    kube: Kube, name: str, tmp_path: Path
) -> None:
    bundle = write_bundle(tmp_path, varied(name))
    options = apply.Options(name=name, namespace=name)
    first = apply.install(kube, bundle, options)
    assert not any(a.unchanged for a in first.applied)
    before = kube.writes
    again = apply.install(kube, bundle, options)
    assert kube.writes == before
    assert [a.ref for a in again.applied] == [a.ref for a in first.applied]
    assert all(a.unchanged for a in again.applied)
    # what an unchanged object reports as live is the object as it is
    assert all(a.live["metadata"]["name"] == a.ref.name for a in again.applied)


def test_changed_content_and_fields_another_writer_took_are_applied_again(
    kube: Kube, name: str, tmp_path: Path
) -> None:
    options = apply.Options(name=name, namespace=name)
    apply.install(kube, write_bundle(tmp_path, varied(name)), options)
    # another writer edits a field we apply (it takes that field's ownership) and one we do not
    cm = ObjectRef("", "v1", "ConfigMap", name, "settings")
    kube.merge_patch(cm, {"data": {"mode": "slow"}})
    svc = ObjectRef("", "v1", "Service", name, "web")
    kube.merge_patch(svc, {"metadata": {"labels": {"team": "other"}}})
    # and the bundle changes one object
    before = kube.writes
    result = apply.install(kube, write_bundle(tmp_path, varied(name, replicas=2)), options)
    sent = {a.ref.kind for a in result.applied if not a.unchanged}
    assert sent == {"ConfigMap", "Deployment"}
    assert kube.writes - before == 2
    live = kube.get(cm)
    assert live is not None and live["data"] == {"mode": "fast", "level": "3"}
    desired = next(a.manifest.obj for a in result.applied if a.ref == cm)
    assert ownership.stale_reason(desired, live, name) is None


def install_two(kube: Kube, name: str, tmp_path: Path) -> tuple[formats.Bundle, apply.Options]:
    """Namespace ``name`` and its ConfigMap ``settings``, installed as deployment ``name``."""
    options = apply.Options(name=name, namespace=name)
    bundle = write_bundle(tmp_path, varied(name)[:2])
    apply.install(kube, bundle, options)
    return bundle, options


def test_objects_applied_without_a_digest_are_applied_once_more(
    kube: Kube, name: str, tmp_path: Path
) -> None:
    bundle, options = install_two(kube, name, tmp_path)
    # as an engine without digests left it: same content, no annotation
    cm = ObjectRef("", "v1", "ConfigMap", name, "settings")
    kube.merge_patch(cm, {"metadata": {"annotations": {ownership.DIGEST_ANNOTATION: None}}})
    result = apply.install(kube, bundle, options)
    assert [a.ref for a in result.applied if not a.unchanged] == [cm]
    before = kube.writes
    apply.install(kube, bundle, options)
    assert kube.writes == before


def test_the_drift_watcher_works_from_an_unchanged_reinstall(
    kube: Kube, name: str, tmp_path: Path
) -> None:
    bundle, options = install_two(kube, name, tmp_path)
    result = apply.install(kube, bundle, options)
    assert all(a.unchanged for a in result.applied)
    events: list[str] = []
    watcher = drift.DriftWatcher(kube, name, result.applied, report=events.append, watch_timeout=5)
    watcher.start()
    try:
        informer = watcher.informer("v1", "ConfigMap")
        assert informer.wait_synced(10)
        assert watcher.idle and watcher.corrections == 0, events  # listed copies compare equal
        cm = ObjectRef("", "v1", "ConfigMap", name, "settings")
        kube.merge_patch(cm, {"data": {"mode": "slow"}})
        eventually(
            lambda: ((kube.get(cm) or {}).get("data") or {}).get("mode") == "fast",
            what=f"the edit undone; reports: {events}",
        )
        eventually(lambda: watcher.corrections >= 1, what="the correction to be counted")
        assert watcher.corrections == 1, events
    finally:
        watcher.stop()
