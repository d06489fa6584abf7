"""Ignore rules in the apply engine, against a real kube-apiserver: the first create sends
the ignored fields, a later install leaves another writer's value of them alone (and only
on the objects the rule's target picks), and a field we alone own keeps its value."""

from __future__ import annotations

from pathlib import Path

import pytest

from provisioner.engine.apply import apply, drift, ignore
from provisioner.engine.bundle import formats
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import ObjectRef
from tests.bundles import configmap, namespace, write_bundle
from tests.polling import eventually

pytestmark = pytest.mark.cluster

RULES = ignore.parse_rules(
    [{"paths": ["/data/mode"], "target": {"kind": "ConfigMap", "labelSelector": "scaled=yes"}}]
)


def bundle(tmp_path: Path, name: str, mode: str) -> formats.Bundle:
    one = configmap("one", mode=mode, keep="b")
    one["metadata"]["labels"] = {"scaled": "yes"}
    two = configmap("two", mode=mode, keep="b")
    return write_bundle(tmp_path / mode, {"a.yaml": [namespace(name), one, two]})


def data(kube: Kube, name: str, cm: str) -> dict[str, str]:
    live = kube.get(ObjectRef("", "v1", "ConfigMap", name, cm)) or {}
    return dict(live.get("data") or {})


def intrude(kube: Kube, name: str, cm: str, value: str) -> None:
    """``kubectl apply --server-side --force-conflicts --field-manager kubectl-edit``."""
    body = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": cm, "namespace": name},
        "data": {"mode": value},
    }
    kube.apply(body, manager="kubectl-edit")


def test_an_ignored_field_is_created_then_left_to_the_writer_that_changed_it(
    kube: Kube, name: str, tmp_path: Path
) -> None:
    opts = apply.Options(name=name, namespace=name, ignore=RULES)
    apply.install(kube, bundle(tmp_path, name, "a"), opts)
    assert data(kube, name, "one") == {"mode": "a", "keep": "b"}  # created with it

    for cm in ("one", "two"):
        intrude(kube, name, cm, "theirs")
    apply.install(kube, bundle(tmp_path, name, "a"), opts)
    assert data(kube, name, "one") == {"mode": "theirs", "keep": "b"}  # the target: left
    assert data(kube, name, "two") == {"mode": "a", "keep": "b"}  # not the target: taken back

    # a new revision changing the ignored field still leaves it to the other writer
    apply.install(kube, bundle(tmp_path, name, "c"), opts)
    assert data(kube, name, "one") == {"mode": "theirs", "keep": "b"}
    assert data(kube, name, "two") == {"mode": "c", "keep": "b"}


def test_an_ignored_field_nobody_else_owns_keeps_its_value(
    kube: Kube, name: str, tmp_path: Path
) -> None:
    opts = apply.Options(name=name, namespace=name, ignore=RULES)
    apply.install(kube, bundle(tmp_path, name, "a"), opts)
    apply.install(kube, bundle(tmp_path, name, "c"), opts)
    # leaving it out of the apply would have removed it (we were its only owner)
    assert data(kube, name, "one") == {"mode": "a", "keep": "b"}
    assert data(kube, name, "two") == {"mode": "c", "keep": "b"}


def test_the_drift_watcher_leaves_an_ignored_field_and_corrects_the_rest(
    kube: Kube, name: str, tmp_path: Path
) -> None:
    """``rukpak apply --watch`` and the helm provisioner honour the same rules."""
    opts = apply.Options(name=name, namespace=name, ignore=RULES)
    result = apply.install(kube, bundle(tmp_path, name, "a"), opts)
    events: list[str] = []
    watcher = drift.DriftWatcher(
        kube, name, result.applied, report=events.append, watch_timeout=5, rules=RULES
    )
    watcher.start()
    try:
        informer = watcher.informer("v1", "ConfigMap")
        assert informer.wait_synced(10)
        intrude(kube, name, "one", "theirs")  # ignored on "one": left alone
        intrude(kube, name, "two", "theirs")  # not on "two": corrected (and our marker)
        eventually(lambda: data(kube, name, "two")["mode"] == "a", what="two corrected")
        eventually(lambda: watcher.corrections >= 1, what="the correction counted")
        assert data(kube, name, "one")["mode"] == "theirs"
        assert watcher.corrections == 1, events
        assert "two" in events[0] and "one" not in events[0].split(":")[0], events
        # a change of a field of "one" that is not ignored is still corrected, and the
        # correction leaves the ignored field as the other writer set it
        body = {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "one", "namespace": name},
            "data": {"mode": "theirs", "keep": "edited"},  # (its mode kept as it set it)
        }
        kube.apply(body, manager="kubectl-edit")
        eventually(lambda: data(kube, name, "one")["keep"] == "b", what="one corrected")
        assert data(kube, name, "one")["mode"] == "theirs"
    finally:
        watcher.stop()
