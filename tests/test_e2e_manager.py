"""End to end: the manager's Bundle and BundleDeployment controllers on the local kubelet.

RukPak is installed from ``deploy/`` as users install it (the ``standing_system``
fixture, ``tests.install_helpers``): the manager runs as the installed Deployment, and
every Bundle check and instance run is taken by the standing provisioner, which reads
bundle images through the installed CSI plugin's store volume; no pod is started for any
change (checked after each test). Bundle images are pushed to the cluster's registry.
Checked here:

- standalone Bundles: another provisioner class keeps an empty status; a missing
  tag stays Pending naming the reference; a missing digest stays Pending with
  the node plugin's FailedMount answer; no ``manifests/``, an empty one and one
  with a subdirectory each reach upstream's exact message; a valid bundle
  becomes Unpacked, checked by the standing provisioner;
- a BundleDeployment: installed (activeBundle, upstream's messages), pivoted
  on a template change while the leading manager pod is killed (the other replica
  finishes it; the old Bundle deleted once the new one is installed),
  a bad image keeps the old Bundle, its objects and its instance with
  HasValidBundle=False, and deleting the BundleDeployment removes its objects;
- a BundleDeployment whose custom resources need a CRD another one provides is
  InstallFailed naming the kind, then installs once the provider exists.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import yaml

from provisioner.engine.bundle import words
from provisioner.engine.objects import Obj, ObjectRef
from provisioner.manager.acting import actuate
from tests import bundles, csi_helpers
from tests import e2e_helpers as e2e
from tests import install_helpers as inst
from tests.bundles import bundle_doc
from tests.polling import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SUFFIX = uuid.uuid4().hex[:6]
MANAGER_LEASE = ObjectRef("coordination.k8s.io", "v1", "Lease", inst.NAMESPACE, inst.MANAGER)
CONFIGMAP = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c\n  namespace: default\n"


def unpacked(system: inst.RukpakSystem, name: str) -> tuple[str, str, str]:
    live = system.kube.get(actuate.bundle_ref(name)) or {}
    status = live.get("status") or {}
    cond = inst.conditions(live).get("Unpacked") or {}
    return str(status.get("phase")), str(cond.get("reason")), str(cond.get("message"))


def final(system: inst.RukpakSystem, name: str, *, timeout: float = 120) -> tuple[str, str, str]:
    return eventually(
        lambda: u if (u := unpacked(system, name))[0] in ("Unpacked", "Failing") else None,
        timeout=timeout,
        what=f"Bundle {name} Unpacked or Failing",
    )


def push(system: inst.RukpakSystem, tag: str, entries: list[csi_helpers.Entry]) -> str:
    return csi_helpers.push_image(system.registry_host, f"e2e-mgr-{SUFFIX}", tag, [entries]).ref


@pytest.fixture(scope="module")
def system(standing_system: inst.RukpakSystem) -> Iterator[inst.RukpakSystem]:
    yield standing_system
    for name in standing_system.kubectl("get", "bundles", "-o", "name", check=False).split():
        if SUFFIX in name:
            standing_system.kubectl("delete", name, "--wait=false", check=False)


# -- standalone Bundles ---------------------------------------------------------------------


@pytest.mark.parametrize(
    ("entries", "message"),
    [
        ([("README", "file", "no manifests here")], words.MISSING_MANIFESTS),
        ([("manifests", "dir")], words.ZERO_OBJECTS),
        (
            [
                ("manifests", "dir"),
                ("manifests/a.yaml", "file", CONFIGMAP),
                ("manifests/sub", "dir"),
                ("manifests/sub/b.yaml", "file", CONFIGMAP),
            ],
            words.subdirectory("manifests/sub"),
        ),
    ],
    ids=["no manifests", "empty manifests", "a subdirectory"],
)
def test_an_invalid_bundle_fails_with_upstreams_message(
    system: inst.RukpakSystem, entries: list[csi_helpers.Entry], message: str
) -> None:
    name = f"bad-{uuid.uuid4().hex[:6]}-{SUFFIX}"
    system.kube.create(bundle_doc(name, push(system, name, entries)))
    assert final(system, name) == ("Failing", "UnpackFailed", message)
    assert inst.taken_standing(system, name), "the check did not run standing"


def test_a_valid_bundle_is_checked_by_the_standing_provisioner_on_the_node(
    system: inst.RukpakSystem, tmp_path: Path
) -> None:
    name = f"hello-{SUFFIX}"
    root = inst.hello_bundle(
        tmp_path / "hello", namespace=f"hello-{SUFFIX}", image=system.busybox_image
    )
    ref = f"{system.registry_host}/e2e-mgr-{SUFFIX}/hello:v1"
    e2e.push_bundle(root, ref)
    system.kube.create(bundle_doc(name, ref))
    phase, reason, message = final(system, name)
    assert (phase, reason) == ("Unpacked", "UnpackSuccessful"), message
    assert message.startswith("Successfully unpacked the image Bundle: ")
    live = system.kube.get(actuate.bundle_ref(name)) or {}
    assert "@sha256:" in live["status"]["resolvedSource"]["image"]["ref"]
    assert inst.taken_standing(system, name), "the check did not run standing"


def test_a_bundle_of_another_class_keeps_an_empty_status(system: inst.RukpakSystem) -> None:
    ours = f"ours-{SUFFIX}"
    theirs = f"theirs-{SUFFIX}"
    ref = push(system, "theirs", [("manifests", "dir"), ("manifests/a.yaml", "file", CONFIGMAP)])
    system.kube.create(bundle_doc(theirs, ref, cls="core-rukpak-io-helm"))
    system.kube.create(bundle_doc(ours, ref))
    final(system, ours)  # the manager has seen both (the informer delivers them in order)
    assert (system.kube.get(actuate.bundle_ref(theirs)) or {}).get("status") in (None, {})


def test_a_missing_tag_stays_pending_naming_the_reference(system: inst.RukpakSystem) -> None:
    name = f"notag-{SUFFIX}"
    ref = f"{system.registry_host}/e2e-mgr-{SUFFIX}/nothing:v9"
    system.kube.create(bundle_doc(name, ref))
    phase, reason, message = eventually(
        lambda: u if (u := unpacked(system, name))[0] != "None" else None,
        timeout=60,
        what="a Pending message",
    )
    assert (phase, reason) == ("Pending", "UnpackPending")
    assert message.startswith("source bundle content: error fetching image descriptor: ")
    assert ref in message


def test_a_missing_digest_stays_pending_with_the_mount_failure(system: inst.RukpakSystem) -> None:
    name = f"nodigest-{SUFFIX}"
    ref = f"{system.registry_host}/e2e-mgr-{SUFFIX}/nothing@sha256:{'0' * 64}"
    system.kube.create(bundle_doc(name, ref))
    phase, reason, message = eventually(
        lambda: u if "MountVolume" in (u := unpacked(system, name))[2] else None,
        timeout=120,
        what="the FailedMount message on the Bundle",
    )
    assert (phase, reason) == ("Pending", "UnpackPending")
    assert f"e2e-mgr-{SUFFIX}/nothing" in message


# -- a BundleDeployment's life ------------------------------------------------------------------


def _bd(system: inst.RukpakSystem, name: str) -> Obj:
    return system.kube.get(actuate.bd_ref(name)) or {}


def _cond(system: inst.RukpakSystem, name: str, kind: str) -> tuple[str, str, str]:
    c = inst.conditions(_bd(system, name)).get(kind) or {}
    return str(c.get("status")), str(c.get("reason")), str(c.get("message"))


def test_a_bundledeployment_installs_pivots_survives_a_bad_image_and_uninstalls(
    system: inst.RukpakSystem, tmp_path: Path
) -> None:
    name = f"life-{SUFFIX}"
    target = f"life-{SUFFIX}"
    refs = {}
    for text in ("one", "two"):
        root = inst.hello_bundle(
            tmp_path / text, namespace=target, image=system.busybox_image, greeting=text
        )
        refs[text] = f"{system.registry_host}/e2e-mgr-{SUFFIX}/life:{text}"
        e2e.push_bundle(root, refs[text])
    kube = system.kube
    kube.create(inst.bundle_deployment(name, refs["one"]))

    def installed_bundle() -> str:
        status, reason, message = _cond(system, name, "Installed")
        active = str((_bd(system, name).get("status") or {}).get("activeBundle") or "")
        if (status, reason) == ("True", "InstallationSucceeded") and active:
            assert message == f"Instantiated bundle {active} successfully"
            return active
        return ""

    first = eventually(installed_bundle, timeout=180, what="Installed")
    assert _cond(system, name, "HasValidBundle")[:2] == ("True", "UnpackSuccessful")
    labels = (kube.get(actuate.bundle_ref(first)) or {})["metadata"]["labels"]
    assert labels["core.rukpak.io/owner-kind"] == "BundleDeployment"
    assert labels["core.rukpak.io/owner-name"] == name
    greeting = ObjectRef("", "v1", "ConfigMap", target, "hello-greeting")

    def greeting_is(text: str) -> bool:
        return ((kube.get(greeting) or {}).get("data") or {}).get("greeting") == text

    eventually(lambda: greeting_is("one"), timeout=60, what="the first greeting")
    eventually(
        lambda: _cond(system, name, "Healthy")[:2] == ("True", "Healthy"),
        timeout=120,
        what="Healthy (from the manager's watches of the installed objects)",
    )

    # the pivot, with the leading manager killed right after the change: the other
    # replica takes the Lease and finishes it; the new Bundle installed, the old one deleted
    kube.merge_patch(
        actuate.bd_ref(name),
        {"spec": {"template": {"spec": {"source": {"image": {"ref": refs["two"]}}}}}},
    )
    leader = str((kube.get(MANAGER_LEASE) or {}).get("spec", {}).get("holderIdentity") or "")
    assert leader, "no manager holds the Lease"
    system.kubectl("delete", "pod", leader, "-n", inst.NAMESPACE, "--grace-period=0", "--force")
    second = eventually(
        lambda: b if (b := installed_bundle()) and b != first else None,
        timeout=180,
        what="the new Bundle installed",
    )
    eventually(lambda: greeting_is("two"), timeout=60, what="the second greeting")
    eventually(
        lambda: kube.get(actuate.bundle_ref(first)) is None,
        timeout=60,
        what="the old Bundle deleted",
    )

    # a bad image: HasValidBundle=False, the active Bundle and its objects stay
    empty = push(system, "empty", [("manifests", "dir")])
    kube.merge_patch(
        actuate.bd_ref(name),
        {"spec": {"template": {"spec": {"source": {"image": {"ref": empty}}}}}},
    )
    _, reason, message = eventually(
        lambda: c if (c := _cond(system, name, "HasValidBundle"))[0] == "False" else None,
        timeout=120,
        what="HasValidBundle=False",
    )
    assert reason == "UnpackFailed"
    assert "found zero objects" in message
    assert (_bd(system, name).get("status") or {}).get("activeBundle") == second
    assert kube.get(actuate.bundle_ref(second)) is not None
    assert greeting_is("two")
    assert _cond(system, name, "Installed")[:2] == ("True", "InstallationSucceeded")

    # deletion removes what it installed
    kube.delete(actuate.bd_ref(name))
    eventually(lambda: kube.get(actuate.bd_ref(name)) is None, timeout=120, what="the BD gone")
    inst.gone(system, greeting)


def test_a_bundledeployment_waits_for_the_crds_another_one_provides(
    system: inst.RukpakSystem, tmp_path: Path
) -> None:
    group = f"e2e{SUFFIX}.example.com"
    consumer_ns = f"consumer-{SUFFIX}"
    consumer_root = tmp_path / "consumer"
    (consumer_root / "manifests").mkdir(parents=True)
    (consumer_root / "manifests" / "00_ns.yaml").write_text(
        yaml.safe_dump(bundles.namespace(consumer_ns))
    )
    cr = bundles.widget(group, "v1", "one", {"size": 1})
    cr["metadata"]["namespace"] = consumer_ns
    (consumer_root / "manifests" / "10_widget.yaml").write_text(yaml.safe_dump(cr))
    provider_root = tmp_path / "provider"
    (provider_root / "manifests").mkdir(parents=True)
    (provider_root / "manifests" / "00_crd.yaml").write_text(yaml.safe_dump(bundles.crd(group)))
    refs = {}
    for name, root in (("consumer", consumer_root), ("provider", provider_root)):
        refs[name] = f"{system.registry_host}/e2e-mgr-{SUFFIX}/{name}:v1"
        e2e.push_bundle(root, refs[name])
    consumer, provider = f"consumer-{SUFFIX}", f"provider-{SUFFIX}"
    system.kube.create(inst.bundle_deployment(consumer, refs["consumer"]))
    _, _, message = eventually(
        lambda: c if (c := _cond(system, consumer, "Installed"))[1] == "InstallFailed" else None,
        timeout=180,
        what="the consumer InstallFailed",
    )
    assert "Widget" in message, message
    system.kube.create(inst.bundle_deployment(provider, refs["provider"]))
    eventually(
        lambda: _cond(system, consumer, "Installed")[:2] == ("True", "InstallationSucceeded"),
        timeout=180,
        what="the consumer installed once the provider's CRD exists, without being touched",
    )
    # kubectl: this test's client discovered the API before the CRD existed
    found = system.kubectl("get", f"widgets.{group}", "-n", consumer_ns, "one", "-o", "name")
    assert found.strip() == f"widget.{group}/one"
    crd_ref = ObjectRef(
        "apiextensions.k8s.io", "v1", "CustomResourceDefinition", "", f"widgets.{group}"
    )
    system.kube.delete(actuate.bd_ref(provider))
    eventually(lambda: system.kube.get(crd_ref) is None, timeout=120, what="the CRD deleted")
    eventually(
        lambda: system.kube.get(actuate.bd_ref(provider)) is None,
        timeout=60,
        what="the provider gone",
    )
    system.kube.delete(actuate.bd_ref(consumer))
    eventually(
        lambda: system.kube.get(actuate.bd_ref(consumer)) is None,
        timeout=120,
        what="the consumer gone",
    )
