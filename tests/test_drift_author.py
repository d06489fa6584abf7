"""Drift that names its author, and ignore rules, with the manager running against a real
kube-apiserver (``tests.manager_harness``: the controller in-process, the
test playing the instance run's part, as no kubelet runs here).

Another field manager (``kubectl-edit``, by server-side apply as ``kubectl apply
--server-side --force-conflicts --field-manager kubectl-edit`` writes) changes a field the
bundle applies: the manager restores it, and the BundleDeployment gets a ``Drifted``
condition and a ``DriftCorrected`` event naming that manager, the field and the object.
A fight (the writer keeps changing it) is one ``Fighting`` event, not one per write. A
change to a field ``spec.ignore`` names, on an object its target picks, is left alone.
"""

from __future__ import annotations

import itertools
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from provisioner.engine.apply import apply
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef, condition
from provisioner.instance import process
from provisioner.manager import controller
from provisioner.manager.acting import actuate
from rukpak.common import errors
from tests import manager_harness as harness
from tests.bundles import configmap, namespace, write_bundle
from tests.crd_helpers import install_crds
from tests.install_helpers import bd_v2
from tests.polling import eventually

SYSTEM_NS = f"rukpak-drift-{uuid.uuid4().hex[:6]}"


@pytest.fixture(scope="module")
def images(registry: Any) -> dict[str, str]:
    """Tags of the hello bundle (only their names matter: the test plays the runs)."""
    return harness.hello_tags(registry, "rukpak-drift")


@pytest.fixture(scope="module")
def running(kube: Kube, images: dict[str, str]) -> Iterator[controller.Controller]:
    install_crds(kube)
    with harness.running_controller(kube, SYSTEM_NS) as ctl:
        yield ctl


get_bd, unique = harness.get_bd, harness.unique


pytestmark = pytest.mark.cluster

WRITER = "kubectl-edit"
IGNORE = [{"paths": ["/data/mode"], "target": {"kind": "ConfigMap", "labelSelector": "scaled=yes"}}]


@pytest.fixture(scope="module")
def instance_may_restore(kube: Kube, running: controller.Controller) -> Iterator[None]:
    """The instance's ServiceAccount (which the manager restores as) may write anything."""
    harness.let_the_instance_write_anything(kube, SYSTEM_NS)
    yield


def scaled(name: str, target: str, **data: str) -> Obj:
    cm = configmap(name, target, **data)
    cm["metadata"]["labels"] = {"scaled": "yes"}
    return cm


def play_the_run(kube: Kube, name: str, tmp_path: Path, docs: list[Obj]) -> Obj:
    """Do what the BD's run would on a kubelet, with the ignore rules its pod was given."""
    run = eventually(
        lambda: next(iter(harness.pods_of(kube, SYSTEM_NS, name)), None),
        timeout=30,
        what="the instance run pod",
    )
    args = process_args(run)
    options = apply.Options(
        name=name,
        namespace=args["--namespace"],
        system_namespace=SYSTEM_NS,
        ignore=process.ignore_rules(args.get("--ignore", "")),
    )
    harness.play_run(kube, run, write_bundle(tmp_path, {"00.yaml": docs}), options)
    return run


def process_args(run: Obj) -> dict[str, str]:
    command = run["spec"]["containers"][0]["command"]
    return {a: b for a, b in itertools.pairwise(command) if a.startswith("--")}


def install(
    kube: Kube, tmp_path: Path, images: dict[str, str], docs: list[Obj], **spec: Any
) -> tuple[str, Obj]:
    """A v1alpha2 BundleDeployment of ``docs`` (the first a Namespace), installed: its
    name and its (played) run pod."""
    name = unique("author")
    target = str(docs[0]["metadata"]["name"])
    kube.create(bd_v2(name, images["v1"], installNamespace=target, **spec))
    run = play_the_run(kube, name, tmp_path, docs)
    eventually(
        lambda: (c := condition(get_bd(kube, name), "Installed")) and c["status"] == "True",
        timeout=30,
        what="Installed from the record",
    )
    return name, run


def install_greeting(
    kube: Kube, tmp_path: Path, images: dict[str, str], prefix: str
) -> tuple[str, str]:
    """``install`` of ConfigMap ``greeting`` (hello: x) into a new namespace: the
    BundleDeployment's name and the namespace's."""
    target = unique(prefix)
    name, _ = install(
        kube, tmp_path, images, [namespace(target), configmap("greeting", target, hello="x")]
    )
    return name, target


def write_as(kube: Kube, target: str, cm: str, **data: str) -> None:
    """Another field manager changes ``data`` of ConfigMap ``cm``."""
    body = configmap(cm, target, **data)
    kube.apply(body, manager=WRITER)


def events(kube: Kube, name: str, reason: str) -> list[Obj]:
    items, _ = kube.list("v1", "Event", namespace="default")
    return [e for e in items if e["involvedObject"].get("name") == name and e["reason"] == reason]


def data_of(kube: Kube, target: str, cm: str) -> dict[str, str]:
    return dict((kube.get(ObjectRef("", "v1", "ConfigMap", target, cm)) or {}).get("data") or {})


def test_another_writers_change_is_restored_and_named_in_a_condition_and_an_event(
    kube: Kube, instance_may_restore: None, images: dict[str, str], tmp_path: Path
) -> None:
    name, target = install_greeting(kube, tmp_path, images, "drift-ns")
    assert condition(get_bd(kube, name), "Drifted") is None  # it never drifted

    write_as(kube, target, "greeting", hello="edited")
    (event,) = eventually(
        lambda: events(kube, name, "DriftCorrected"), timeout=10, interval=0.05, what="the event"
    )
    said = f'field manager "{WRITER}" changed data.hello of ConfigMap {target}/greeting; restored'
    assert said in event["message"]
    assert event["message"].startswith("Drifted=True: ")
    cond = condition(get_bd(kube, name), "Drifted")
    assert cond is not None
    assert (cond["status"], cond["reason"], cond["message"]) == ("True", "DriftCorrected", said)
    eventually(lambda: data_of(kube, target, "greeting") == {"hello": "x"}, what="restored")


def test_a_fight_is_one_event_not_one_per_write(
    kube: Kube, instance_may_restore: None, images: dict[str, str], tmp_path: Path
) -> None:
    name, target = install_greeting(kube, tmp_path, images, "fight-ns")
    writes = 5
    for value in range(writes):  # each change waits for its restore (the damper spaces them)
        write_as(kube, target, "greeting", hello=f"edit-{value}")
        eventually(
            lambda: data_of(kube, target, "greeting") == {"hello": "x"},
            timeout=30,
            what=f"the restore after write {value}",
        )
    fighting = eventually(lambda: events(kube, name, "Fighting"), timeout=10, what="Fighting")
    restores = sum(int(e.get("count") or 1) for e in events(kube, name, "DriftRestored"))
    assert restores == writes  # every write was restored ...
    assert len(events(kube, name, "DriftCorrected")) == 1  # ... and reported once
    assert len(fighting) == 1 and int(fighting[0].get("count") or 1) == 1
    assert f'field manager "{WRITER}" changed data.hello' in fighting[0]["message"]
    assert fighting[0]["type"] == "Warning"
    cond = condition(get_bd(kube, name), "Drifted")
    assert cond is not None and (cond["status"], cond["reason"]) == ("True", "Fighting")


def test_an_ignored_field_on_the_targeted_object_is_left_to_its_writer(
    kube: Kube, instance_may_restore: None, images: dict[str, str], tmp_path: Path
) -> None:
    target = unique("ignore-ns")
    docs = [
        namespace(target),
        scaled("scaled", target, mode="a"),  # the rule's target picks this one ...
        configmap("fixed", target, mode="a"),  # ... not this one
    ]
    name, run = install(kube, tmp_path, images, docs, ignore=IGNORE)
    assert process.ignore_rules(process_args(run)["--ignore"])  # the run was given the rules

    write_as(kube, target, "scaled", mode="theirs")  # ignored: no restore, no Drifted
    write_as(kube, target, "fixed", mode="theirs")  # not ignored: restored (our marker)
    eventually(lambda: data_of(kube, target, "fixed")["mode"] == "a", what="fixed restored")
    (event,) = eventually(lambda: events(kube, name, "DriftCorrected"), what="the event")
    assert "of ConfigMap " + f"{target}/fixed" in event["message"]
    assert "scaled" not in event["message"]
    assert data_of(kube, target, "scaled")["mode"] == "theirs"

    # once more with only the ignored field: the manager looks (the BD is queued by the
    # change) and leaves it; the Drifted message still names only the other object
    write_as(kube, target, "scaled", mode="theirs-again")
    write_as(kube, target, "fixed", mode="theirs-again")
    eventually(lambda: data_of(kube, target, "fixed")["mode"] == "a", timeout=30, what="again")
    assert data_of(kube, target, "scaled")["mode"] == "theirs-again"
    cond = condition(get_bd(kube, name), "Drifted")
    assert cond is not None and "scaled" not in cond["message"]


def test_a_bad_json_pointer_is_refused_at_admission_naming_the_field(
    kube: Kube, images: dict[str, str]
) -> None:
    bad = bd_v2(unique("bad"), images["v1"], ignore=[{"paths": ["spec/replicas"]}])
    with pytest.raises(errors.RukpakError, match=r"spec.ignore\[0\].paths\[0\]"):
        kube.create(bad)
    assert kube.get(actuate.bd_ref(bad["metadata"]["name"])) is None
