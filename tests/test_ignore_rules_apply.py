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


def modes(kube: Kube, name: str) -> dict[str, str]:
    """The ``mode`` of ConfigMaps one and two, each checked to hold ``keep: b`` beside it
    and nothing else."""
    found: dict[str, str] = {}
    for cm in ("one", "two"):
        values = data(kube, name, cm)
        assert values.keys() == {"mode", "keep"} and values["keep"] == "b", (cm, values)
        found[cm] = values["mode"]
    return found


def install(kube: Kube, tmp_path: Path, name: str, mode: str) -> apply.Result:
    """Install the bundle of ``mode`` as deployment ``name``, with the ignore rules."""
    opts = apply.Options(name=name, namespace=name, ignore=RULES)
    return apply.install(kube, bundle(tmp_path, name, mode), opts)


def intrude(kube: Kube, name: str, cm: str, **values: str) -> None:
    """``kubectl apply --server-side --force-conflicts --field-manager kubectl-edit`` of
    ``values`` into ConfigMap ``cm``'s data."""
    kube.apply(configmap(cm, name, **values), manager="kubectl-edit")


def test_an_ignored_field_is_created_then_left_to_the_writer_that_changed_it(
    kube: Kube, name: str, tmp_path: Path
) -> None:
    install(kube, tmp_path, name, "a")
    assert modes(kube, name) == {"one": "a", "two": "a"}  # created with it

    for cm in ("one", "two"):
        intrude(kube, name, cm, mode="theirs")
    install(kube, tmp_path, name, "a")
    # the target is left to the writer; the other one is taken back
    assert modes(kube, name) == {"one": "theirs", "two": "a"}

    # a new revision changing the ignored field still leaves it to the other writer
    install(kube, tmp_path, name, "c")
    assert modes(kube, name) == {"one": "theirs", "two": "c"}


def test_an_ignored_field_nobody_else_owns_keeps_its_value(
    kube: Kube, name: str, tmp_path: Path
) -> None:
    install(kube, tmp_path, name, "a")
    install(kube, tmp_path, name, "c")
    # leaving it out of the apply would have removed it (we were its only owner)
    assert modes(kube, name) == {"one": "a", "two": "c"}


def test_the_drift_watcher_leaves_an_ignored_field_and_corrects_the_rest(
    kube: Kube, name: str, tmp_path: Path
) -> None:
    """``rukpak apply --watch`` and the helm provisioner honour the same rules."""
    result = install(kube, tmp_path, name, "a")
    events: list[str] = []
    watcher = drift.DriftWatcher(
        kube, name, result.applied, report=events.append, watch_timeout=5, rules=RULES
    )
    watcher.start()
    try:
        informer = watcher.informer("v1", "ConfigMap")
        assert informer.wait_synced(10)
        intrude(kube, name, "one", mode="theirs")  # ignored on "one": left alone
        intrude(kube, name, "two", mode="theirs")  # not on "two": corrected (and our marker)
        eventually(lambda: data(kube, name, "two")["mode"] == "a", what="two corrected")
        eventually(lambda: watcher.corrections >= 1, what="the correction counted")
        assert data(kube, name, "one")["mode"] == "theirs"
        assert watcher.corrections == 1, events
        assert "two" in events[0] and "one" not in events[0].split(":")[0], events
        # a change of a field of "one" that is not ignored is still corrected, and the
        # correction leaves the ignored field as the other writer set it
        intrude(kube, name, "one", mode="theirs", keep="edited")  # (its mode kept as set)
        eventually(lambda: data(kube, name, "one")["keep"] == "b", what="one corrected")
        assert data(kube, name, "one")["mode"] == "theirs"
    finally:
        watcher.stop()
