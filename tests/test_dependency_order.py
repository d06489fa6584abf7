"""Upgrades in dependency order and teardown in reverse order, against a real kube-apiserver
and a real registry, with the manager's controller running in-process.

As in ``test_manager_controller``, no kubelet runs here: the test plays the instance runs
(``play_run`` installs the run's content with the apply engine, leaves the install record
a run would, and ends the pod), so it decides *when* a run finishes and the manager alone
decides *which* runs exist. The order is read from the API server's watch history
(resourceVersions are the store's revisions: one sequence across kinds), never from a
sleep. Checked here:

- a dependency and its dependent changed together: the dependent waits
  (``DependencyNotReady``, "a: upgrading to revision 2") with no run of its own while the
  dependency's new revision installs, and its run starts only after that revision is
  Installed and Healthy;
- a CRD provider and two users of its CRD deleted at once: the users' custom resources are
  deleted by their uninstalls while the CRD still stands, the CRD after, and every
  BundleDeployment is gone (no finalizer left behind);
- a cycle written while no admission webhook answers is reported as ``DependencyCycle``
  and its members can still be deleted.
"""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from provisioner.engine.apply import apply, inventorystore
from provisioner.engine.bundle import formats
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef, condition
from provisioner.manager import controller, model
from provisioner.manager.acting import actuate
from provisioner.manager.planning import runs
from rukpak.common import errors
from rukpak.oci import client as oci_client
from rukpak.oci.reference import Reference
from tests import e2e_helpers as e2e
from tests import manager_harness as harness
from tests.bundles import configmap, crd, namespace, write_bundle
from tests.crd_helpers import install_crds
from tests.install_helpers import bd_v2
from tests.polling import eventually

pytestmark = pytest.mark.cluster

SUFFIX = uuid.uuid4().hex[:6]
SYSTEM_NS = f"rukpak-deporder-{SUFFIX}"
GROUP = f"deporder{SUFFIX}.example.com"

CONTENT: dict[str, formats.Bundle] = {}
"""Image digest -> the bundle pushed under it (what a run of that digest installs)."""


@pytest.fixture(scope="module")
def running(kube: Kube) -> Iterator[controller.Controller]:
    install_crds(kube)
    with harness.running_controller(kube, SYSTEM_NS) as ctl:
        yield ctl


def push(registry: Any, root: Path, name: str, tag: str, docs: list[Obj]) -> str:
    """Push a bundle of ``docs`` as ``<registry>/deporder/<name>:<tag>``; its tag."""
    bundle = write_bundle(root, {"00.yaml": docs})
    ref = f"{registry.host}/deporder-{SUFFIX}/{name}:{tag}"
    e2e.push_bundle(root, ref)
    digest = str(oci_client.RegistryClient(retries=0).resolve(Reference.parse(ref)).digest)
    CONTENT[digest] = bundle
    return ref


def bd_ref(name: str) -> ObjectRef:
    return actuate.bd_ref(name, model.API_VERSION_V2)


def active_run(kube: Kube, name: str) -> Obj | None:
    return next((p for p in harness.pods_of(kube, SYSTEM_NS, name) if runs.is_active(p)), None)


def play_run(kube: Kube, name: str, namespace_: str) -> Obj | None:
    """Do what the BundleDeployment's active run would on a kubelet: install the content
    its volume names, record it, succeed. The pod, or None when no run is active."""
    run = active_run(kube, name)
    if run is None:
        return None
    bundle = CONTENT[harness.mounted(run).rsplit("@", 1)[1]]
    options = apply.Options(name=name, namespace=namespace_, system_namespace=SYSTEM_NS)
    harness.play_run(kube, run, bundle, options)
    return run


def ready_at(bd: Obj | None, revision: int) -> bool:
    """Whether ``bd`` has ``revision`` installed, Installed and Healthy."""
    if bd is None or (bd.get("status") or {}).get("installedRevision") != revision:
        return False
    return all((condition(bd, k) or {}).get("status") == "True" for k in ("Installed", "Healthy"))


def install(kube: Kube, name: str, namespace_: str, revision: int = 1) -> None:
    """Play ``name``'s run and wait until ``revision`` is Installed and Healthy."""
    eventually(lambda: play_run(kube, name, namespace_), timeout=60, what=f"a run of {name}")
    eventually(
        lambda: ready_at(kube.get(bd_ref(name)), revision),
        timeout=60,
        what=f"{name} revision {revision} Installed and Healthy",
    )


def wait_gone(kube: Kube, name: str, *, timeout: float = 60) -> None:
    eventually(lambda: kube.get(bd_ref(name)) is None, timeout=timeout, what=f"{name} gone")


def history(kube: Kube, api_version: str, kind: str, since: str, **options: str) -> list[Obj]:
    """Every (type, object) event after resourceVersion ``since``, in the store's order."""
    return [
        {"type": kind_, "object": obj}
        for kind_, obj in kube.watch(
            api_version, kind, resource_version=since, timeout_seconds=2, **options
        )
    ]


def first_rv(events: list[Obj], predicate: Any) -> int:
    for event in events:
        if predicate(event["type"], event["object"]):
            return int(event["object"]["metadata"]["resourceVersion"])
    raise AssertionError("no such event in the watch history")


def test_a_dependent_upgrades_only_after_its_dependencys_new_revision_is_installed_and_healthy(
    kube: Kube, running: controller.Controller, registry: Any, tmp_path: Path
) -> None:
    a, b = f"dep-a-{SUFFIX}", f"dep-b-{SUFFIX}"
    refs = {
        (bd_name, tag): push(
            registry,
            tmp_path / bd_name / tag,
            bd_name,
            tag,
            [namespace(bd_name), configmap("greeting", bd_name, version=tag)],
        )
        for bd_name in (a, b)
        for tag in ("v1", "v2")
    }
    kube.create(bd_v2(a, refs[a, "v1"], installNamespace=a))
    kube.create(bd_v2(b, refs[b, "v1"], installNamespace=b, dependsOn=[{"name": a}]))
    install(kube, a, a)
    install(kube, b, b)
    _, since = kube.list(model.API_VERSION_V2, model.BUNDLE_DEPLOYMENT)

    # both change together, the dependency first (as `kubectl apply -f` of both would)
    for bd_name in (a, b):
        source = {"type": "image", "image": {"ref": refs[bd_name, "v2"]}}
        kube.merge_patch(bd_ref(bd_name), {"spec": {"source": source}})
    eventually(lambda: active_run(kube, a), timeout=60, what="the run of a's revision 2")

    def waiting() -> str | None:
        found = condition(kube.get(bd_ref(b)) or {}, "Installed") or {}
        message = str(found.get("message") or "")
        ok = found.get("reason") == "DependencyNotReady" and "upgrading to revision 2" in message
        return message if ok else None

    message = eventually(waiting, timeout=60, what="b waiting for a's revision 2")
    assert f"{a}: upgrading to revision 2" in message
    # (a's run is held by this test: while it is, b has no run of its own)
    assert active_run(kube, b) is None
    assert (kube.get(bd_ref(b)) or {})["status"]["installedRevision"] == 1

    install(kube, a, a, revision=2)
    install(kube, b, b, revision=2)

    bds = history(kube, model.API_VERSION_V2, model.BUNDLE_DEPLOYMENT, since)
    a_ready = first_rv(bds, lambda _, obj: obj["metadata"]["name"] == a and ready_at(obj, 2))
    b_moved = first_rv(
        bds,
        lambda _, obj: (
            obj["metadata"]["name"] == b and (obj.get("status") or {}).get("installedRevision") == 2
        ),
    )
    pods = history(kube, "v1", "Pod", since, namespace=SYSTEM_NS)
    b_run = first_rv(
        pods,
        lambda type_, obj: (
            type_ == "ADDED" and (obj["metadata"].get("labels") or {}).get(model.BD_LABEL) == b
        ),
    )
    assert a_ready < b_run < b_moved, (a_ready, b_run, b_moved)
    installed_at = {
        n: (kube.get(bd_ref(n)) or {})["status"]["revisions"][-1]["installedAt"] for n in (a, b)
    }
    assert installed_at[a] <= installed_at[b]
    for bd_name in (a, b):
        kube.delete(bd_ref(bd_name))
    for bd_name in (a, b):
        wait_gone(kube, bd_name)


def test_a_crd_provider_and_its_users_deleted_at_once_go_users_first_and_all_go(
    kube: Kube, running: controller.Controller, registry: Any, tmp_path: Path
) -> None:
    provider = f"crds-{SUFFIX}"
    users = [f"user-{i}-{SUFFIX}" for i in (1, 2)]
    the_crd = crd(GROUP)
    crd_ref = ObjectRef.of(the_crd)
    provided = push(registry, tmp_path / provider, provider, "v1", [the_crd])
    kube.create(bd_v2(provider, provided, installNamespace="default"))
    widgets: dict[str, ObjectRef] = {}
    for user in users:
        widget: Obj = {
            "apiVersion": f"{GROUP}/v1",
            "kind": "Widget",
            "metadata": {"name": "one", "namespace": user},
            "spec": {"size": 1},
        }
        widgets[user] = ObjectRef.of(widget)
        ref = push(registry, tmp_path / user, user, "v1", [namespace(user), widget])
        kube.create(bd_v2(user, ref, installNamespace=user, dependsOn=[{"name": provider}]))
    install(kube, provider, "default")
    for user in users:
        install(kube, user, user)
    assert all(kube.get(w) is not None for w in widgets.values())
    _, since = kube.list(model.API_VERSION_V2, model.BUNDLE_DEPLOYMENT)
    # (the Widgets' history is read while it lasts: it goes with the CRD)
    widget_events: list[Obj] = []

    def record_widgets() -> None:
        try:
            for type_, obj in kube.watch(
                f"{GROUP}/v1", "Widget", resource_version=since, timeout_seconds=180
            ):
                widget_events.append({"type": type_, "object": obj})
        except errors.RukpakError:
            pass  # the CRD went

    recorder = threading.Thread(target=record_widgets, daemon=True)
    recorder.start()

    # all at once, the provider first: it must wait for its users
    for name in (provider, *users):
        kube.delete(bd_ref(name))
    for name in (provider, *users):
        wait_gone(kube, name, timeout=90)
    eventually(lambda: kube.get(crd_ref) is None, timeout=60, what="the CRD uninstalled")
    for name in (provider, *users):
        assert inventorystore.read_inventory(kube, name, system_namespace=SYSTEM_NS) is None

    bds = history(kube, model.API_VERSION_V2, model.BUNDLE_DEPLOYMENT, since)
    waited = [
        str(cond.get("message"))
        for event in bds
        if event["object"]["metadata"]["name"] == provider
        and (cond := condition(event["object"], "Deleting"))
        and cond.get("reason") == "WaitingForDependents"
    ]
    assert waited and all(u in waited[0] for u in users), waited
    crds = history(kube, "apiextensions.k8s.io/v1", "CustomResourceDefinition", since)
    crd_going = first_rv(
        crds,
        lambda _, obj: (
            obj["metadata"]["name"] == crd_ref.name
            and bool(obj["metadata"].get("deletionTimestamp"))
        ),
    )
    recorder.join(timeout=60)
    assert not recorder.is_alive(), "the Widgets' watch ends with their CRD"
    for user in users:
        gone = first_rv(
            widget_events,
            lambda type_, obj, u=user: type_ == "DELETED" and obj["metadata"]["namespace"] == u,
        )
        user_gone = first_rv(
            bds, lambda type_, obj, u=user: type_ == "DELETED" and obj["metadata"]["name"] == u
        )
        # the user's own uninstall deleted its Widget while the CRD still stood
        assert user_gone < gone < crd_going, (user, user_gone, gone, crd_going)


def test_a_cycle_written_while_no_webhook_answers_is_a_condition_and_its_members_still_go(
    kube: Kube, running: controller.Controller, registry: Any, tmp_path: Path
) -> None:
    """No BundleDeployment webhook is registered in this module (as while no manager
    answers: failurePolicy Ignore): the cycle is stored, reported after the fact, and
    deleting its members does not wait on each other."""
    a, b = f"loop-a-{SUFFIX}", f"loop-b-{SUFFIX}"
    ref = push(registry, tmp_path, a, "v1", [namespace(a), configmap("greeting", a)])
    kube.create(bd_v2(a, ref, installNamespace=a, dependsOn=[{"name": b}]))
    kube.create(bd_v2(b, ref, installNamespace=a, dependsOn=[{"name": a}]))

    def refused() -> str | None:
        found = condition(kube.get(bd_ref(a)) or {}, "Installed") or {}
        return str(found.get("message")) if found.get("reason") == "DependencyCycle" else None

    message = eventually(refused, timeout=60, what="the cycle reported")
    assert f"spec.dependsOn makes a cycle: {a} -> {b} -> {a}" in message
    assert active_run(kube, a) is None and active_run(kube, b) is None
    for name in (a, b):
        kube.delete(bd_ref(name))
    for name in (a, b):
        wait_gone(kube, name)
