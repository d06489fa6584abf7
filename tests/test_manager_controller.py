"""The BundleDeployment controller against a real kube-apiserver and a real registry.

The controller runs in-process (its watches, queue and workers on threads),
tags are resolved against the ``registry`` fixture, where the hello bundle is
pushed. The API server has no controller-manager, so instance Deployments
never get pods here: what is checked is what the manager writes (Bundles,
the instance Deployment's pod template, status, events, the finalizer's
uninstall). The process itself (``rukpak-provisioner manager``) runs as a
subprocess in the last tests, with leader election.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from csi.oci import client as oci_client
from provisioner.engine import apply, inventorystore
from provisioner.engine.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef, condition
from provisioner.manager import actuate, controller, model
from tests import e2e_helpers as e2e
from tests.polling import eventually
from tests.test_apply_cluster import configmap, namespace, write_bundle
from tests.test_manager_crds import install_crds

REPO_ROOT = Path(__file__).resolve().parent.parent
SUFFIX = uuid.uuid4().hex[:6]
SYSTEM_NS = f"rukpak-mgr-{SUFFIX}"
IMAGE = "registry.example/rukpak-python:test"


@pytest.fixture(scope="module")
def kube(kube_apiserver: Any) -> Iterator[Kube]:
    client = Kube.from_kubeconfig(str(kube_apiserver.kubeconfig))
    install_crds(client)
    yield client
    client.close()


@pytest.fixture(scope="module")
def images(registry: Any) -> dict[str, str]:
    """Tags of the hello bundle: v1 and v2 (the same content under two tags)."""
    refs = {tag: f"{registry.host}/rukpak-mgr/hello:{tag}" for tag in ("v1", "v2")}
    for ref in refs.values():
        e2e.push_bundle(e2e.HELLO_BUNDLE, ref)
    return refs


@pytest.fixture(scope="module")
def running(kube: Kube, images: dict[str, str]) -> Iterator[controller.Controller]:
    settings = model.Settings(image=IMAGE, system_namespace=SYSTEM_NS, host_network=True)
    ctl = controller.Controller(
        kube,
        settings,
        resolve=actuate.RegistryResolver(oci_client.RegistryClient(retries=0)),
        resync=2.0,
        watch_timeout=10,
    )
    ctl.start()
    yield ctl
    ctl.stop()


def bd_doc(name: str, ref: str, **spec: Any) -> Obj:
    return {
        "apiVersion": model.API_VERSION,
        "kind": model.BUNDLE_DEPLOYMENT,
        "metadata": {"name": name},
        "spec": {
            "provisionerClassName": model.PLAIN_CLASS,
            "template": {
                "metadata": {"labels": {"app": name}},
                "spec": {
                    "provisionerClassName": model.PLAIN_CLASS,
                    "source": {"type": "image", "image": {"ref": ref}},
                },
            },
            **spec,
        },
    }


def get_bd(kube: Kube, name: str) -> Obj:
    live = kube.get(actuate.bd_ref(name))
    assert live is not None
    return live


def bundles_of(kube: Kube, name: str) -> list[Obj]:
    items, _ = kube.list(model.API_VERSION, model.BUNDLE, label_selector=f"{model.BD_LABEL}={name}")
    return items


def instance_of(kube: Kube, name: str) -> Obj | None:
    return kube.get(ObjectRef("apps", "v1", "Deployment", SYSTEM_NS, model.instance_name(name)))


def cond_of(kube: Kube, name: str, kind: str) -> tuple[str, str] | None:
    c = condition(get_bd(kube, name), kind)
    return None if c is None else (str(c["status"]), str(c["reason"]))


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:5]}"


def test_a_bundledeployment_becomes_a_resolved_bundle_and_an_instance_deployment(
    kube: Kube, running: controller.Controller, images: dict[str, str]
) -> None:
    name = unique("hello")
    kube.create(bd_doc(name, images["v1"], installNamespace="team-a"))
    dep = eventually(lambda: instance_of(kube, name), timeout=30, what="the instance Deployment")
    (bundle,) = bundles_of(kube, name)
    assert bundle["metadata"]["name"] == model.bundle_name(get_bd(kube, name))
    assert bundle["metadata"]["labels"]["app"] == name
    pinned = bundle["status"]["resolvedSource"]["image"]["ref"]
    assert pinned.startswith(images["v1"].rsplit(":", 1)[0] + "@sha256:")

    template = dep["spec"]["template"]
    assert dep["spec"]["strategy"]["type"] == "Recreate"
    assert (
        template["metadata"]["annotations"][model.BUNDLE_ANNOTATION] == bundle["metadata"]["name"]
    )
    (volume,) = template["spec"]["volumes"]
    assert volume["csi"]["volumeAttributes"] == {"image": pinned, "pullPolicy": "IfNotPresent"}
    (container,) = template["spec"]["containers"]
    assert container["image"] == IMAGE
    assert container["command"][-6:] == [
        "--name",
        name,
        "--namespace",
        "team-a",
        "--system-namespace",
        SYSTEM_NS,
    ]
    assert template["spec"]["hostNetwork"] is True

    eventually(
        lambda: cond_of(kube, name, "HasValidBundle") == ("True", "BundleResolved"),
        timeout=20,
        what="HasValidBundle=True",
    )
    # activeBundle is what the instance Deployment runs, so it is set by the reconcile
    # that observes the Deployment, possibly one after HasValidBundle turned True
    live = eventually(
        lambda: (b := get_bd(kube, name))["status"].get("activeBundle") and b,
        timeout=10,
        what="activeBundle",
    )
    assert model.FINALIZER in live["metadata"]["finalizers"]
    assert live["status"]["activeBundle"] == bundle["metadata"]["name"]
    assert cond_of(kube, name, "Installed") == ("False", "InstallPending")  # no kubelet here

    def reasons() -> set[str]:
        events, _ = kube.list("v1", "Event", namespace="default")
        return {e["reason"] for e in events if e["involvedObject"].get("name") == name}

    # events are recorded after the status write they describe
    eventually(
        lambda: {"BundlePending", "BundleResolved"} <= reasons(),
        timeout=10,
        what="the BundlePending and BundleResolved events",
    )


def test_a_template_change_pivots_to_a_new_bundle_and_deletes_the_old_one(
    kube: Kube, running: controller.Controller, images: dict[str, str]
) -> None:
    name = unique("pivot")
    kube.create(bd_doc(name, images["v1"]))
    first = eventually(lambda: instance_of(kube, name), timeout=30, what="the first instance")
    old_bundle = first["metadata"]["annotations"][model.BUNDLE_ANNOTATION]
    kube.merge_patch(
        actuate.bd_ref(name),
        {"spec": {"template": {"spec": {"source": {"image": {"ref": images["v2"]}}}}}},
    )
    new_bundle = model.bundle_name(get_bd(kube, name))
    assert new_bundle != old_bundle

    def pivoted() -> bool:
        dep = instance_of(kube, name) or {}
        points = (dep.get("metadata") or {}).get("annotations", {}).get(model.BUNDLE_ANNOTATION)
        names = [b["metadata"]["name"] for b in bundles_of(kube, name)]
        return points == new_bundle and names == [new_bundle]

    eventually(pivoted, timeout=30, what="the instance on the new Bundle, the old one deleted")
    eventually(
        lambda: get_bd(kube, name).get("status", {}).get("activeBundle") == new_bundle,
        timeout=20,
        what="activeBundle to follow",
    )


def test_a_paused_bundledeployment_is_left_alone(
    kube: Kube, running: controller.Controller, images: dict[str, str]
) -> None:
    name = unique("paused")
    kube.create(bd_doc(name, images["v1"], paused=True))
    time.sleep(3)  # a resync (2 s) and the create event have both passed
    live = get_bd(kube, name)
    assert bundles_of(kube, name) == []
    assert instance_of(kube, name) is None
    assert not live["metadata"].get("finalizers")
    assert "status" not in live or not live["status"]
    kube.merge_patch(actuate.bd_ref(name), {"spec": {"paused": False}})
    eventually(lambda: instance_of(kube, name), timeout=30, what="the instance once unpaused")


def test_an_image_that_does_not_exist_becomes_a_condition(
    kube: Kube, running: controller.Controller, images: dict[str, str]
) -> None:
    name = unique("missing")
    kube.create(bd_doc(name, images["v1"].replace(":v1", ":no-such-tag")))
    eventually(
        lambda: cond_of(kube, name, "HasValidBundle") == ("False", "ResolveFailed"),
        timeout=30,
        what="HasValidBundle=False ResolveFailed",
    )
    assert instance_of(kube, name) is None
    message = str((condition(get_bd(kube, name), "HasValidBundle") or {})["message"])
    assert "no-such-tag" in message


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
    bundle = write_bundle(
        tmp_path, {"00.yaml": [namespace(target), configmap("greeting", target, hello="x")]}
    )
    apply.install(
        kube, bundle, apply.Options(name=name, namespace=target, system_namespace=SYSTEM_NS)
    )
    kube.create(bd_doc(name, images["v1"], deletionPolicy=policy))
    eventually(lambda: instance_of(kube, name), timeout=30, what="the instance Deployment")
    greeting = ObjectRef("", "v1", "ConfigMap", target, "greeting")
    assert kube.get(greeting) is not None

    kube.delete(actuate.bd_ref(name))
    eventually(lambda: kube.get(actuate.bd_ref(name)) is None, timeout=30, what="the BD to go")
    assert instance_of(kube, name) is None
    assert bundles_of(kube, name) == []
    assert inventorystore.read_inventory(kube, name, system_namespace=SYSTEM_NS) is None
    live = kube.get(greeting)
    if policy == "Delete":
        assert live is None or live["metadata"].get("deletionTimestamp")
    else:
        assert live is not None and not live["metadata"].get("deletionTimestamp")


# -- the process ---------------------------------------------------------------------------


@pytest.fixture
def manager_process(kube_apiserver: Any, kube: Kube) -> Iterator[Any]:
    system_ns = unique("rukpak-proc")
    env = {**os.environ, "KUBECONFIG": str(kube_apiserver.kubeconfig), "POD_NAME": "manager-0"}
    args = [sys.executable, "-m", "provisioner", "manager", "--image", IMAGE]
    args += ["--system-namespace", system_ns, "--leader-elect", "--resync", "2"]
    proc = subprocess.Popen(
        args, cwd=REPO_ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT
    )
    try:
        yield proc, system_ns
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=10)


def test_the_manager_process_takes_its_lease_reconciles_and_releases_on_sigterm(
    kube: Kube, manager_process: Any, images: dict[str, str]
) -> None:
    proc, system_ns = manager_process
    lease_ref = ObjectRef("coordination.k8s.io", "v1", "Lease", system_ns, "rukpak-manager")
    name = unique("proc")
    digest_ref = images["v1"].rsplit(":", 1)[0] + "@sha256:" + "0" * 64  # pinned: no lookup
    kube.create(bd_doc(name, digest_ref))
    eventually(
        lambda: (kube.get(lease_ref) or {}).get("spec", {}).get("holderIdentity") == "manager-0",
        timeout=30,
        what="the manager Lease held by $POD_NAME",
    )
    eventually(
        lambda: kube.get(
            ObjectRef("apps", "v1", "Deployment", system_ns, model.instance_name(name))
        ),
        timeout=30,
        what="the instance Deployment made by the process",
    )
    proc.send_signal(signal.SIGTERM)
    out, _ = proc.communicate(timeout=30)
    assert proc.returncode == 0, out.decode(errors="replace")
    assert (kube.get(lease_ref) or {})["spec"].get("holderIdentity", "") == ""
    kube.merge_patch(actuate.bd_ref(name), {"metadata": {"finalizers": []}})
    kube.delete(actuate.bd_ref(name))


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
