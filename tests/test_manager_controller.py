"""The BundleDeployment controller against a real kube-apiserver and a real registry.

The controller runs in-process (its informers, queue and workers on threads),
tags are resolved against the ``registry`` fixture, where the hello bundle is
pushed. The API server has no kubelet or controller-manager, so pods never
run here: the tests play the kubelet's part for unpack pods (they write the
pod's status with the termination message ``rukpak-provisioner unpack``
writes) and check what the manager writes (Bundles and their status, unpack
pods, the instance run pods, BD status, events, the finalizer's uninstall, the
restore of drift from the install record). Runs that install need a kubelet and
are proven in tests/test_e2e_runs.py and the other e2e tests; here a test plays
the run's part where one is needed (it installs with the apply engine and leaves
the record the run would). The process itself (``rukpak-provisioner manager``)
runs as a subprocess in the last tests, with leader election.
"""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from provisioner.engine.apply import apply, inventory, inventorystore, lifecycle
from provisioner.engine.bundle import words
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef, condition
from provisioner.instance import unpack
from provisioner.manager import controller, model
from provisioner.manager.acting import actuate
from provisioner.manager.watching import healthwatch
from rukpak.common import errors
from tests import manager_harness as harness
from tests.bundles import (
    bundle_deployment,
    bundle_doc,
    configmap,
    namespace,
    role_binding,
    write_bundle,
)
from tests.crd_helpers import install_crds
from tests.polling import eventually

REPO_ROOT = Path(__file__).resolve().parent.parent
SUFFIX = uuid.uuid4().hex[:6]
SYSTEM_NS = f"rukpak-mgr-{SUFFIX}"
BD_CRD = f"bundledeployments.{model.GROUP}"
IMAGE = harness.IMAGE
get_bd, unique = harness.get_bd, harness.unique


@pytest.fixture(scope="module", autouse=True)
def crds(kube: Kube) -> None:
    """The Bundle and BundleDeployment CRDs, on the session's API server."""
    install_crds(kube)


@pytest.fixture(scope="module")
def images(registry: Any) -> dict[str, str]:
    """Tags of the hello bundle: v1 and v2 (the same content under two tags), and
    "missing": a tag of the same repository that is never pushed."""
    return harness.hello_tags(registry, "rukpak-mgr")


def finish_unpack(
    kube: Kube,
    bundle: str,
    result: unpack.Result | None = None,
    *,
    namespace: str = SYSTEM_NS,
) -> Obj:
    """Play the kubelet: end the Bundle's unpack pod with ``result`` as its termination message."""
    result = result or unpack.Result(kinds={"ConfigMap": 1, "Namespace": 1})
    ref = ObjectRef("", "v1", "Pod", namespace, bundle)
    pod = eventually(lambda: kube.get(ref), timeout=30, what=f"the unpack pod of {bundle}")
    harness.end_container(kube, ref, "unpack", message=result.to_json(), ok=result.ok)
    return pod


@pytest.fixture(scope="module")
def running(kube: Kube, images: dict[str, str]) -> Iterator[controller.Controller]:
    with harness.running_controller(kube, SYSTEM_NS) as ctl:
        yield ctl


def bundles_of(kube: Kube, name: str) -> list[Obj]:
    items, _ = kube.list(model.API_VERSION, model.BUNDLE, label_selector=f"{model.BD_LABEL}={name}")
    return items


def instance_of(kube: Kube, name: str) -> Obj | None:
    """The BD's live instance run pod (not being deleted), if any."""
    return next(iter(harness.pods_of(kube, SYSTEM_NS, name)), None)


def cond_of(kube: Kube, name: str, kind: str) -> tuple[str, str] | None:
    c = condition(get_bd(kube, name), kind)
    return None if c is None else (str(c["status"]), str(c["reason"]))


def test_a_bundledeployment_becomes_a_resolved_bundle_and_an_instance_run(
    kube: Kube, running: controller.Controller, images: dict[str, str]
) -> None:
    name = unique("hello")
    kube.create(bundle_deployment(name, images["v1"], installNamespace="team-a"))
    generated = eventually(lambda: bundles_of(kube, name), timeout=30, what="the Bundle")
    # the run starts once the content is pinned, while the unpack pod still checks it
    run = eventually(lambda: instance_of(kube, name), timeout=30, what="the instance run pod")
    assert bundles_of(kube, name)[0]["status"]["phase"] != "Unpacked", "no kubelet ended it"
    unpack_pod = finish_unpack(kube, generated[0]["metadata"]["name"])
    (bundle,) = eventually(
        lambda: b if (b := bundles_of(kube, name))[0]["status"]["phase"] == "Unpacked" else None,
        timeout=30,
        what="the Bundle Unpacked",
    )
    assert (
        unpack_pod["spec"]["volumes"][0]["csi"]["volumeAttributes"]["image"]
        == (bundle["status"]["resolvedSource"]["image"]["ref"])
    )
    labels = bundle["metadata"]["labels"]
    assert labels["core.rukpak.io/owner-kind"] == "BundleDeployment"
    assert labels["core.rukpak.io/owner-name"] == name
    assert labels["core.rukpak.io/bundle-template-hash"] == model.template_hash(get_bd(kube, name))
    assert bundle["metadata"]["name"] == model.bundle_name(get_bd(kube, name))
    assert bundle["metadata"]["labels"]["app"] == name
    pinned = bundle["status"]["resolvedSource"]["image"]["ref"]
    assert pinned.startswith(images["v1"].rsplit(":", 1)[0] + "@sha256:")

    assert run["spec"]["restartPolicy"] == "Never"
    assert run["metadata"]["annotations"][model.BUNDLE_ANNOTATION] == bundle["metadata"]["name"]
    # (the API server adds the ServiceAccount token's projected volume)
    (volume,) = [v for v in run["spec"]["volumes"] if "csi" in v]
    assert volume["csi"]["volumeAttributes"] == {"image": pinned, "pullPolicy": "IfNotPresent"}
    (container,) = run["spec"]["containers"]
    assert container["image"] == IMAGE
    at = container["command"].index("--name")
    assert container["command"][at : at + 6] == [
        "--name",
        name,
        "--namespace",
        "team-a",
        "--system-namespace",
        SYSTEM_NS,
    ]
    assert run["spec"]["hostNetwork"] is True

    eventually(
        lambda: cond_of(kube, name, "HasValidBundle") == ("True", "UnpackSuccessful"),
        timeout=20,
        what="HasValidBundle=True",
    )
    eventually(
        lambda: kube.get(ObjectRef("", "v1", "Pod", SYSTEM_NS, bundle["metadata"]["name"])) is None,
        timeout=20,
        what="the unpack pod deleted once the Bundle is Unpacked",
    )
    live = get_bd(kube, name)
    assert model.FINALIZER in live["metadata"]["finalizers"]
    # activeBundle names a Bundle only once it is installed; no kubelet runs the instance
    assert "activeBundle" not in live["status"]
    assert cond_of(kube, name, "Installed") == ("False", "InstallPending")

    def reasons() -> set[str]:
        events, _ = kube.list("v1", "Event", namespace="default")
        return {e["reason"] for e in events if e["involvedObject"].get("name") == name}

    # events are recorded after the status write they describe
    eventually(
        lambda: {"UnpackPending", "UnpackSuccessful"} <= reasons(),
        timeout=10,
        what="the UnpackPending and UnpackSuccessful events",
    )


def test_a_template_change_pivots_to_a_new_bundle_and_deletes_the_old_one(
    kube: Kube, running: controller.Controller, images: dict[str, str]
) -> None:
    name = unique("pivot")
    kube.create(bundle_deployment(name, images["v1"]))
    finish_unpack(kube, model.bundle_name(eventually(lambda: kube.get(actuate.bd_ref(name)))))
    first = eventually(lambda: instance_of(kube, name), timeout=30, what="the first instance")
    old_bundle = first["metadata"]["annotations"][model.BUNDLE_ANNOTATION]
    kube.merge_patch(
        actuate.bd_ref(name),
        {"spec": {"template": {"spec": {"source": {"image": {"ref": images["v2"]}}}}}},
    )
    new_bundle = model.bundle_name(get_bd(kube, name))
    assert new_bundle != old_bundle
    finish_unpack(kube, new_bundle)

    def pivoted() -> bool:
        run = instance_of(kube, name) or {}
        points = (run.get("metadata") or {}).get("annotations", {}).get(model.BUNDLE_ANNOTATION)
        names = [b["metadata"]["name"] for b in bundles_of(kube, name)]
        return points == new_bundle and names == [new_bundle]

    # the old Bundle was never installed (no kubelet here), so it is neither deployed nor
    # active once a run of the new one starts: its obsolete run is stopped, and it goes
    eventually(pivoted, timeout=30, what="a run of the new Bundle, the old one deleted")


CreateAndReconcile = Callable[[str, Obj], None]


@pytest.fixture
def create_and_reconcile(
    kube: Kube, running: controller.Controller, monkeypatch: pytest.MonkeyPatch
) -> CreateAndReconcile:
    """``create_and_reconcile(method, doc)`` creates ``doc``, then waits until a whole
    ``running.<method>`` of it (one reconcile) has returned: the event that must come
    first before a test may check that the controller left the object alone."""

    def create(method: str, doc: Obj) -> None:
        key = doc["metadata"]["name"]
        done = threading.Event()
        real: Callable[[str], float | None] = getattr(running, method)

        def recording(k: str) -> float | None:
            after = real(k)
            if k == key:
                done.set()
            return after

        monkeypatch.setattr(running, method, recording)
        kube.create(doc)
        assert done.wait(30), f"the controller never ran {method} on {doc['kind']} {key}"

    return create


def test_a_paused_bundledeployment_is_left_alone(
    kube: Kube, images: dict[str, str], create_and_reconcile: CreateAndReconcile
) -> None:
    name = unique("paused")
    create_and_reconcile("reconcile", bundle_deployment(name, images["v1"], paused=True))
    live = get_bd(kube, name)
    assert bundles_of(kube, name) == []
    assert instance_of(kube, name) is None
    assert not live["metadata"].get("finalizers")
    assert "status" not in live or not live["status"]
    kube.merge_patch(actuate.bd_ref(name), {"spec": {"paused": False}})
    finish_unpack(kube, model.bundle_name(live))
    eventually(lambda: instance_of(kube, name), timeout=30, what="the instance once unpaused")


def test_an_image_that_does_not_exist_becomes_a_condition(
    kube: Kube, running: controller.Controller, images: dict[str, str], name: str
) -> None:
    kube.create(bundle_deployment(name, images["missing"]))

    def waiting_message() -> str:
        cond = condition(get_bd(kube, name), "HasValidBundle") or {}
        ok = (cond.get("status"), cond.get("reason")) == ("True", "UnpackPending")
        return str(cond.get("message") or "") if ok else ""

    message: str = eventually(
        lambda: waiting_message() if "no-such-tag" in waiting_message() else None,
        timeout=30,
        what="HasValidBundle UnpackPending naming the missing tag",
    )
    # upstream v0.24's words, the same for a Bundle and a v1alpha2 BundleDeployment
    assert "source bundle content: error fetching image descriptor: " in message
    assert images["missing"] in message
    (bundle,) = bundles_of(kube, name)
    assert bundle["status"]["phase"] == "Pending"
    assert instance_of(kube, name) is None


def install_greeting(kube: Kube, tmp_path: Path, name: str, target: str) -> ObjectRef:
    """What an instance would have installed under deployment ``name``: the Namespace
    ``target`` and the ConfigMap ``greeting`` in it (returned)."""
    bundle = write_bundle(
        tmp_path, {"00.yaml": [namespace(target), configmap("greeting", target, hello="x")]}
    )
    apply.install(
        kube, bundle, apply.Options(name=name, namespace=target, system_namespace=SYSTEM_NS)
    )
    return ObjectRef("", "v1", "ConfigMap", target, "greeting")


@pytest.mark.parametrize("policy", ["Delete", "Orphan"])
def test_deleting_a_bundledeployment_uninstalls_through_its_finalizer(
    kube: Kube,
    running: controller.Controller,
    images: dict[str, str],
    tmp_path: Path,
    policy: str,
) -> None:
    name = unique(f"del-{policy.lower()}")
    target = unique("target")
    # what an instance pod would have installed under the BD's name
    greeting = install_greeting(kube, tmp_path, name, target)
    kube.create(bundle_deployment(name, images["v1"], deletionPolicy=policy))
    finish_unpack(kube, model.bundle_name(eventually(lambda: kube.get(actuate.bd_ref(name)))))
    eventually(lambda: instance_of(kube, name), timeout=30, what="the instance run pod")
    assert kube.get(greeting) is not None

    kube.delete(actuate.bd_ref(name))
    eventually(lambda: kube.get(actuate.bd_ref(name)) is None, timeout=30, what="the BD to go")
    assert instance_of(kube, name) is None
    assert bundles_of(kube, name) == []
    # the BD goes first (its finalizer before the uninstall), its install record after
    eventually(
        lambda: inventorystore.read_inventory(kube, name, system_namespace=SYSTEM_NS) is None,
        timeout=30,
        what="the install record to go",
    )
    live = kube.get(greeting)
    if policy == "Delete":
        assert live is None or live["metadata"].get("deletionTimestamp")
    else:
        assert live is not None and not live["metadata"].get("deletionTimestamp")


def deleted_at(kube: Kube, ref: ObjectRef, since: str) -> int:
    """The resourceVersion (the store's revision) at which ``ref`` was deleted, from the
    watch history after ``since``."""
    for kind, obj in kube.watch(
        ref.api_version, ref.kind, resource_version=since, namespace=ref.namespace,
        timeout_seconds=2,
    ):  # fmt: skip
        if kind == "DELETED" and obj["metadata"]["name"] == ref.name:
            return int(obj["metadata"]["resourceVersion"])
    raise AssertionError(f"no DELETED event for {ref} after resourceVersion {since}")


def test_a_deleted_bundledeployment_is_gone_no_later_than_its_last_object(
    kube: Kube, running: controller.Controller, images: dict[str, str], tmp_path: Path
) -> None:
    """Upstream's suite reads the BD as NotFound right after its objects are gone (its
    objects go by garbage collection, after their owner): the finalizer goes before the
    first delete is sent. The watch history of both kinds gives the order."""
    name = unique("order")
    target = unique("target")
    greeting = install_greeting(kube, tmp_path, name, target)
    kube.create(bundle_deployment(name, images["v1"]))
    finish_unpack(kube, model.bundle_name(eventually(lambda: kube.get(actuate.bd_ref(name)))))
    eventually(lambda: instance_of(kube, name), timeout=30, what="the instance run pod")
    _, since = kube.list("v1", "ConfigMap", namespace=target)
    kube.delete(actuate.bd_ref(name))
    eventually(lambda: kube.get(greeting) is None, timeout=30, what="the ConfigMap to go")
    assert kube.get(actuate.bd_ref(name)) is None  # upstream's check, at this very moment
    assert deleted_at(kube, actuate.bd_ref(name), since) < deleted_at(kube, greeting, since)


def test_an_uninstall_cut_short_after_the_finalizer_went_is_finished(
    kube: Kube, running: controller.Controller, tmp_path: Path
) -> None:
    """A manager that stopped between removing the finalizer and uninstalling left a marked
    install record and no BundleDeployment: the controller finishes from the mark (here the
    record's watch event brings it, as the first list does after a restart)."""
    name = unique("cut")
    target = unique("target")
    greeting = install_greeting(kube, tmp_path, name, target)
    mark = inventory.UninstallMark("Delete")
    assert inventorystore.mark_uninstall(kube, name, mark, system_namespace=SYSTEM_NS)
    eventually(lambda: kube.get(greeting) is None, timeout=30, what="the ConfigMap uninstalled")
    eventually(
        lambda: inventorystore.read_inventory(kube, name, system_namespace=SYSTEM_NS) is None,
        timeout=30,
        what="the install record removed",
    )
    # an unmarked record of a deployment that is not there is left alone (a BD whose
    # finalizer someone else removed: its objects are orphaned, as upstream would have it)
    other = unique("orphan")
    kept_ns = unique("kept")
    apply.install(
        kube,
        write_bundle(
            tmp_path / "o", {"00.yaml": [namespace(kept_ns), configmap("kept", kept_ns, hello="y")]}
        ),
        apply.Options(name=other, namespace=kept_ns, system_namespace=SYSTEM_NS),
    )
    eventually(
        lambda: running.health.inventories.get(SYSTEM_NS, inventory.configmap_name(other)),
        timeout=30,
        what="the unmarked record in the manager's cache",
    )
    assert running.reconcile(other) is None  # a pass for it, done when this returns
    assert kube.get(ObjectRef("", "v1", "ConfigMap", kept_ns, "kept")) is not None
    assert inventorystore.read_inventory(kube, other, system_namespace=SYSTEM_NS) is not None


# -- drift restored from the record, and a fight ----------------------------------------------


def play_the_run(kube: Kube, name: str, tmp_path: Path, target: str) -> Obj:
    """Do what the BD's first run would on a kubelet: install, record, succeed."""
    run = eventually(lambda: instance_of(kube, name), timeout=30, what="the instance run pod")
    bundle = write_bundle(
        tmp_path, {"00.yaml": [namespace(target), configmap("greeting", target, hello="x")]}
    )
    options = apply.Options(name=name, namespace=target, system_namespace=SYSTEM_NS)
    harness.play_run(kube, run, bundle, options)
    return run


def intrude(kube: Kube, target: str, value: str) -> None:
    """Another writer takes ``data.hello`` of the installed ConfigMap."""
    kube.apply(
        {
            "apiVersion": "v1",
            "kind": "ConfigMap",
            "metadata": {"name": "greeting", "namespace": target},
            "data": {"hello": value},
        },
        manager="intruder",
    )


def test_drift_is_restored_by_the_manager_as_the_instance_and_a_fight_is_damped(
    kube: Kube, running: controller.Controller, images: dict[str, str], tmp_path: Path
) -> None:
    name = unique("drift")
    target = unique("target")
    harness.let_the_instance_write_anything(kube, SYSTEM_NS)
    kube.create(bundle_deployment(name, images["v1"], installNamespace=target))
    finish_unpack(kube, model.bundle_name(eventually(lambda: kube.get(actuate.bd_ref(name)))))
    run = play_the_run(kube, name, tmp_path, target)
    eventually(
        lambda: cond_of(kube, name, "Healthy") == ("True", "Healthy"),
        timeout=30,
        what="Installed and Healthy from the record",
    )
    greeting = ObjectRef("", "v1", "ConfigMap", target, "greeting")

    def restored() -> bool:
        live = kube.get(greeting) or {}
        owners = {m["manager"] for m in live["metadata"].get("managedFields") or []}
        return live.get("data") == {"hello": "x"} and "intruder" not in owners

    def events(reason: str) -> list[Obj]:
        items, _ = kube.list("v1", "Event", namespace="default")
        return [
            e for e in items if e["involvedObject"].get("name") == name and e["reason"] == reason
        ]

    for value in ("a", "b", "c"):  # the first restore is at once, then 1 s, then 2 s apart
        intrude(kube, target, value)
        eventually(restored, timeout=30, what=f"data.hello restored after {value!r}")
    restores = events("DriftRestored")
    assert sum(int(e.get("count") or 1) for e in restores) == 3
    assert all("greeting" in e["message"] for e in restores)
    assert instance_of(kube, name) is None, "restored without a run"
    assert kube.get(ObjectRef("", "v1", "Pod", SYSTEM_NS, run["metadata"]["name"])) is None

    intrude(kube, target, "d")
    message: str = eventually(
        lambda: (
            (c or {}).get("message")
            if (c := condition(get_bd(kube, name), "FieldConflict")) and c["status"] == "True"
            else None
        ),
        timeout=30,
        what="FieldConflict=True",
    )
    assert "data.hello" in message and "(by intruder)" in message
    # the event of the transition is written after the status that carries it
    eventually(lambda: events("AnotherWriter"), timeout=30, what="an AnotherWriter event")
    eventually(restored, timeout=30, what="the fourth restore, after the backoff")


# -- standalone Bundles -------------------------------------------------------------------


def bundle_status(kube: Kube, name: str) -> Obj:
    live = kube.get(actuate.bundle_ref(name)) or {}
    status: Obj = live.get("status") or {}
    return status


def unpacked(kube: Kube, name: str) -> tuple[str, str, str, str]:
    status = bundle_status(kube, name)
    cond: Obj = next((c for c in status.get("conditions") or [] if c["type"] == "Unpacked"), {})
    return (
        str(status.get("phase")),
        str(cond.get("status")),
        str(cond.get("reason")),
        str(cond.get("message")),
    )


def test_a_bundle_of_another_class_keeps_an_empty_status(
    kube: Kube, images: dict[str, str], create_and_reconcile: CreateAndReconcile
) -> None:
    name = unique("helm")
    create_and_reconcile(
        "reconcile_bundle", bundle_doc(name, images["v1"], cls="core-rukpak-io-helm")
    )
    assert bundle_status(kube, name) == {}
    assert kube.get(ObjectRef("", "v1", "Pod", SYSTEM_NS, name)) is None


def test_a_bundle_is_resolved_unpacked_by_a_pod_and_the_pod_goes(
    kube: Kube, running: controller.Controller, images: dict[str, str]
) -> None:
    name = unique("standalone")
    kube.create(bundle_doc(name, images["v1"]))
    pod_ref = ObjectRef("", "v1", "Pod", SYSTEM_NS, name)
    first = eventually(lambda: kube.get(pod_ref), timeout=30, what="the unpack pod")
    assert unpacked(kube, name)[:3] == ("Pending", "False", "UnpackPending")
    pinned = bundle_status(kube, name)["resolvedSource"]["image"]["ref"]
    assert pinned.startswith(images["v1"].rsplit(":", 1)[0] + "@sha256:")
    assert first["metadata"]["ownerReferences"][0]["kind"] == "Bundle"

    kube.delete(pod_ref)  # a deleted unpack pod comes back until the Bundle is Unpacked
    eventually(
        lambda: (
            (p := kube.get(pod_ref)) is not None
            and p["metadata"]["uid"] != first["metadata"]["uid"]
        ),
        timeout=30,
        what="a new unpack pod",
    )
    finish_unpack(kube, name, unpack.Result(kinds={"ConfigMap": 3}))
    eventually(
        lambda: (
            unpacked(kube, name)
            == (
                "Unpacked",
                "True",
                "UnpackSuccessful",
                "Successfully unpacked the image Bundle: 3 objects (ConfigMap 3)",
            )
        ),
        timeout=30,
        what="the Bundle Unpacked",
    )
    eventually(lambda: kube.get(pod_ref) is None, timeout=30, what="the unpack pod gone")
    assert bundle_status(kube, name)["resolvedSource"]["image"]["ref"] == pinned


def test_an_invalid_bundle_is_failing_with_the_unpack_message(
    kube: Kube, running: controller.Controller, images: dict[str, str]
) -> None:
    name = unique("invalid")
    kube.create(bundle_doc(name, images["v1"]))
    finish_unpack(kube, name, unpack.Result(error=words.MISSING_MANIFESTS))
    eventually(
        lambda: (
            unpacked(kube, name) == ("Failing", "False", "UnpackFailed", words.MISSING_MANIFESTS)
        ),
        timeout=30,
        what="the Bundle Failing",
    )
    pod_ref = ObjectRef("", "v1", "Pod", SYSTEM_NS, name)
    eventually(lambda: kube.get(pod_ref) is None, timeout=30, what="the unpack pod gone")


def test_a_missing_tag_stays_pending_with_the_registrys_answer(
    kube: Kube, running: controller.Controller, images: dict[str, str], name: str
) -> None:
    kube.create(bundle_doc(name, images["missing"]))
    phase, status, reason, message = eventually(
        lambda: u if (u := unpacked(kube, name))[0] != "None" else None,
        timeout=30,
        what="a status",
    )
    assert (phase, status, reason) == ("Pending", "False", "UnpackPending")
    assert message.startswith("source bundle content: error fetching image descriptor: ")
    assert images["missing"] in message
    assert kube.get(ObjectRef("", "v1", "Pod", SYSTEM_NS, name)) is None


# -- the process ---------------------------------------------------------------------------


@pytest.fixture
def manager_process(kube_apiserver: Any, kube: Kube) -> Iterator[Any]:
    system_ns = unique("rukpak-proc")
    harness.prepare_system_namespace(kube, system_ns)
    env = {**os.environ, "KUBECONFIG": str(kube_apiserver.kubeconfig), "POD_NAME": "manager-0"}
    args = [sys.executable, "-m", "provisioner", "manager", "--image", IMAGE]
    args += ["--system-namespace", system_ns, "--leader-elect", "--resync", "2"]
    # BundleDeployments other modules left on the shared API server must not take its slots
    args += ["--max-concurrent-runs", "512"]
    with socket.socket() as probe:  # a free loopback port for the CRD webhook
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    args += ["--webhook-bind", "127.0.0.1", "--webhook-port", str(port)]
    proc = subprocess.Popen(
        args, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    # the BundleDeployment conversion goes to this manager, as the host-network install
    # points it (the manager writes its own CA into the CRD)
    crd = ObjectRef("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "", BD_CRD)
    url = f"https://127.0.0.1:{port}/convert"
    kube.merge_patch(crd, {"spec": {"conversion": {"webhook": {"clientConfig": {"url": url}}}}})

    # an object of a class nobody handles: reading it as v1alpha1 needs the conversion
    probe_bd = unique("conversion-probe")
    probe_doc: dict[str, Any] = {
        "apiVersion": "core.rukpak.io/v1alpha2",
        "kind": "BundleDeployment",
        "metadata": {"name": probe_bd},
        "spec": {
            "installNamespace": "default",
            "provisionerClassName": "nobody-handles-this",
            "source": {"type": "image", "image": {"ref": "example.com/none:v1"}},
        },
    }
    # the API server swaps the CRD's handler after the patch; until it has, writes are
    # answered 503 "apiserver is shutting down" (the old handler draining): ask again
    eventually(lambda: kube.create(probe_doc), timeout=30, what="the probe created")

    def converting() -> bool:
        secret = kube.get(ObjectRef("", "v1", "Secret", system_ns, "rukpak-webhook-cert"))
        live = kube.get(crd) or {}
        client = live["spec"]["conversion"]["webhook"]["clientConfig"]
        if secret is None or client.get("caBundle") != secret["data"]["ca.crt"]:
            return False  # the manager has not published its CA yet
        # the API server takes up a CRD's new webhook CA a moment after the CRD changes
        try:
            kube.get(ObjectRef("core.rukpak.io", "v1alpha1", "BundleDeployment", "", probe_bd))
        except errors.RukpakError:
            return False
        return True

    eventually(converting, timeout=60, what="the manager process serving the conversion")
    kube.delete(ObjectRef("core.rukpak.io", "v1alpha2", "BundleDeployment", "", probe_bd))
    try:
        yield proc, system_ns
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)
        install_crds(kube)  # back to this process's conversion webhook


def test_the_manager_process_takes_its_lease_reconciles_and_releases_on_sigterm(
    kube: Kube, manager_process: Any, images: dict[str, str]
) -> None:
    proc, system_ns = manager_process
    lease_ref = ObjectRef("coordination.k8s.io", "v1", "Lease", system_ns, "rukpak-manager")
    name = unique("proc")
    digest_ref = images["v1"].rsplit(":", 1)[0] + "@sha256:" + "0" * 64  # pinned: no lookup
    kube.create(bundle_deployment(name, digest_ref))
    eventually(
        lambda: (kube.get(lease_ref) or {}).get("spec", {}).get("holderIdentity") == "manager-0",
        timeout=30,
        what="the manager Lease held by $POD_NAME",
    )
    secret = kube.get(ObjectRef("", "v1", "Secret", system_ns, "rukpak-webhook-cert"))
    assert secret is not None, "the webhook certificate is generated before the Lease is taken"
    finish_unpack(kube, model.bundle_name(get_bd(kube, name)), namespace=system_ns)

    def run_pods() -> list[Obj]:
        items, _ = kube.list("v1", "Pod", namespace=system_ns, label_selector=model.BD_LABEL)
        return [p for p in items if p["metadata"]["labels"][model.BD_LABEL] == name]

    pods = eventually(run_pods, timeout=60, what="the first instance run made by the process")
    assert pods[0]["spec"]["restartPolicy"] == "Never"  # runs to completion
    assert "--bundle" in pods[0]["spec"]["containers"][0]["command"]
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out.decode(errors="replace")
    assert (kube.get(lease_ref) or {})["spec"].get("holderIdentity", "") == ""
    # (the manager served the conversion: without it, only the storage version answers)
    stored = actuate.bd_ref(name, model.API_VERSION_V2)
    kube.merge_patch(stored, {"metadata": {"finalizers": []}})
    kube.delete(stored)


def test_the_manager_refuses_to_start_without_an_image() -> None:
    done = subprocess.run(
        [sys.executable, "-m", "provisioner", "manager"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 1
    assert "--image is required" in done.stderr


# -- health from watches ---------------------------------------------------------------------


def test_health_follows_the_installed_objects_through_watches(kube: Kube, tmp_path: Path) -> None:
    name = unique("health")
    target = unique("target")
    system_ns = unique("rukpak-health")
    changed: list[str] = []
    stop = threading.Event()
    watch = healthwatch.HealthWatch(  # short watches: a dropped informer ends with its watch
        kube, system_namespace=system_ns, on_change=changed.append, stop=stop, watch_timeout=5
    )
    watch.start()
    try:
        assert watch.health(name) is None  # nothing installed under that name
        bundle = write_bundle(
            tmp_path, {"00.yaml": [namespace(target), configmap("greeting", target, hello="x")]}
        )
        apply.install(
            kube, bundle, apply.Options(name=name, namespace=target, system_namespace=system_ns)
        )
        # the ConfigMap informer may list before the apply creates "greeting": wait for ready
        verdict = eventually(
            lambda: v if (v := watch.health(name)) and v[0] else None,
            timeout=30,
            what="a ready verdict",
        )
        assert verdict == (True, "all 2 installed objects are ready")
        assert name in changed
        kube.delete(ObjectRef("", "v1", "ConfigMap", target, "greeting"))
        _, message = eventually(
            lambda: v if (v := watch.health(name)) and not v[0] else None,
            timeout=30,
            what="the deleted ConfigMap seen",
        )
        assert "greeting" in message and "not found" in message
        # uninstalled (its inventory goes): the informers only it read through end
        made = [i for i in watch.informers() if i is not watch.inventories]
        assert len(made) == 2, made  # Namespaces and ConfigMaps, read as the manager
        lifecycle.uninstall(kube, name, system_namespace=system_ns)
        eventually(
            lambda: watch.informers() == [watch.inventories],
            timeout=30,
            what="the uninstalled deployment's informers dropped",
        )
        eventually(lambda: not any(i.running for i in made), timeout=30, what="them ended")
        assert watch.health(name) is None and watch.inventories.running and not stop.is_set()
    finally:
        stop.set()


def test_health_is_read_as_each_deployments_own_account_in_its_namespaces(
    kube: Kube, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    """The manager reads installed objects as the deployment's user, not as itself: an
    account that may read ConfigMaps in one namespace only (no cluster-wide list) gets a verdict
    from informers of that namespace; an account granted nothing is refused by the API
    server, which names it, and its deployment's health stays unknown."""
    system_ns, target = unique("rukpak-health"), unique("target")
    narrow, nobody = unique("narrow"), unique("nobody")
    users = {
        narrow: f"system:serviceaccount:{system_ns}:{narrow}",
        nobody: f"system:serviceaccount:{system_ns}:{nobody}",
    }
    kube.apply(namespace(target))
    reader = {
        "apiVersion": "rbac.authorization.k8s.io/v1",
        "kind": "Role",
        "metadata": {"name": "configmap-reader", "namespace": target},
        "rules": [
            {"apiGroups": [""], "resources": ["configmaps"], "verbs": ["get", "list", "watch"]}
        ],
    }
    kube.apply(reader)
    subject = {"kind": "ServiceAccount", "name": narrow, "namespace": system_ns}
    kube.apply(
        role_binding(narrow, "configmap-reader", [subject], namespace=target, role_kind="Role")
    )
    stop = threading.Event()
    looked_at: list[tuple[str, bool]] = []  # (owner, whether an informer was refused then)

    def look(owner: str) -> None:
        looked_at.append((owner, any(i.listwatch.error for i in watch.informers())))

    watch = healthwatch.HealthWatch(
        kube,
        system_namespace=system_ns,
        on_change=look,
        stop=stop,
        user_of=users.get,
        watch_timeout=10,
    )
    caplog.set_level("WARNING", logger="rukpak.kube.listwatch")
    watch.start()
    try:
        for owner in (narrow, nobody):
            bundle = write_bundle(
                tmp_path / owner, {"00.yaml": [configmap(f"cm-{owner}", target, hello="x")]}
            )
            options = apply.Options(name=owner, namespace=target, system_namespace=system_ns)
            apply.install(kube, bundle, options)
        verdict = eventually(
            lambda: v if (v := watch.health(narrow)) and v[0] else None,
            timeout=30,
            what="a ready verdict read as the narrow account",
        )
        assert verdict == (True, "all 1 installed objects are ready")
        refused = eventually(
            lambda: [r.getMessage() for r in caplog.records if users[nobody] in r.getMessage()],
            timeout=30,
            what="the API server refusing the ungranted account's list",
        )
        assert "forbidden" in refused[0].lower() and target in refused[0], refused
        assert watch.health(nobody) is None  # unknown, not judged with the manager's rights
        # ... and it says why, for its Healthy condition: the controller is told to look
        why = eventually(lambda: watch.unknown_why(nobody), timeout=30, what="why unknown")
        assert users[nobody] in why and "forbidden" in why.lower() and "ConfigMap" in why, why
        assert "grant that account get, list and watch" in why
        assert (nobody, True) in looked_at  # looked at again once refused
        assert watch.unknown_why(narrow) == ""
        # the watch after the list goes as the user too (not only the list)
        as_narrow = kube.impersonating(users[narrow])
        _, rv = as_narrow.list("v1", "ConfigMap", namespace=target)
        with pytest.raises(errors.PermissionDenied, match=users[narrow]):
            next(iter(as_narrow.watch("v1", "ConfigMap", resource_version=rv, namespace="default")))
        assert watch.lookup(ObjectRef("", "v1", "ConfigMap", target, f"cm-{narrow}"), owner=narrow)
        # its ServiceAccount changes to one granted: read as that from its next look, and
        # the informer only the old account read through ends (no watch left behind)
        failing = [i for i in watch.informers() if i.listwatch.error]
        assert len(failing) == 1, failing
        users[nobody] = users[narrow]
        verdict = eventually(
            lambda: v if (v := watch.health(nobody)) and v[0] else None,
            timeout=30,
            what="a ready verdict once read as the granted account",
        )
        assert verdict == (True, "all 1 installed objects are ready")
        assert failing[0] not in watch.informers() and watch.unknown_why(nobody) == ""
        eventually(lambda: not failing[0].running, timeout=30, what="the refused informer ended")
        assert not stop.is_set() and all(i.running for i in watch.informers())
    finally:
        stop.set()
        kube.delete(ObjectRef("", "v1", "Namespace", "", target))
