"""The manager's controller in-process against a real kube-apiserver, with no kubelet.

Where it sits: the harness of the manager tests that play the kubelet's part
(``test_manager_controller``, ``test_manager_approval``, ``test_dependency_order``,
``test_drift_author``) and of the drift benchmark (``tests/bench/bench_drift.py``). It
prepares a system namespace, starts ``controller.Controller`` on threads, finds the pods
the manager asks for, and plays them: a run installs its content with the apply engine,
leaves the install record a run would and ends Succeeded; an unpack or preview pod ends
with the termination message its container would write. The manager alone decides which
pods exist; these helpers decide when they finish.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from provisioner.engine.apply import appliedrecord, apply, inventory
from provisioner.engine.bundle import formats
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef
from provisioner.manager import controller, model
from provisioner.manager.acting import actuate
from provisioner.manager.planning import runs
from rukpak.oci import client as oci_client
from tests import e2e_helpers as e2e
from tests.bundles import role_binding

IMAGE = "registry.example/rukpak-python:test"
"""The image the manager's pods name (never pulled: no kubelet runs)."""


def hello_tags(registry: Any, repository: str) -> dict[str, str]:
    """The hello bundle pushed to ``registry`` as ``<repository>/hello`` v1 and v2 (the
    same content under two tags), and "missing": a tag of it that is never pushed."""
    refs = {tag: f"{registry.host}/{repository}/hello:{tag}" for tag in ("v1", "v2")}
    for ref in refs.values():
        e2e.push_bundle(e2e.HELLO_BUNDLE, ref)
    return {**refs, "missing": f"{registry.host}/{repository}/hello:no-such-tag"}


def prepare_system_namespace(kube: Kube, namespace: str) -> None:
    """The system namespace and its ServiceAccounts (no controller-manager makes them),
    the default instance identity allowed anything, as deploy/instance grants it: the
    manager reads, restores and uninstalls a bundle's objects as that identity."""
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})
    for account in ("default", "rukpak-instance"):
        kube.apply(
            {
                "apiVersion": "v1",
                "kind": "ServiceAccount",
                "metadata": {"name": account, "namespace": namespace},
            }
        )
    let_the_instance_write_anything(kube, namespace)


def let_the_instance_write_anything(kube: Kube, namespace: str) -> None:
    """Bind the instance's ServiceAccount (which the manager reads, restores drift and
    uninstalls as) to cluster-admin."""
    account = {"kind": "ServiceAccount", "name": "rukpak-instance", "namespace": namespace}
    kube.apply(role_binding(f"{namespace}-instance", "cluster-admin", [account]))


@contextmanager
def running_controller(
    kube: Kube,
    system_namespace: str,
    *,
    image: str = IMAGE,
    resolve: actuate.Resolver | None = None,
) -> Iterator[controller.Controller]:
    """The system namespace prepared and the controller running until the block ends;
    tags resolve against the registry unless ``resolve`` says otherwise."""
    prepare_system_namespace(kube, system_namespace)
    # every BundleDeployment on the shared API server is this controller's, those other
    # modules left too (their runs never end here): they must not take its run slots
    settings = model.Settings(
        image=image, system_namespace=system_namespace, host_network=True, max_concurrent_runs=512
    )
    ctl = controller.Controller(
        kube,
        settings,
        resolve=resolve or actuate.RegistryResolver(oci_client.RegistryClient(retries=0)),
        resync=2.0,
        watch_timeout=10,
    )
    ctl.start()
    try:
        yield ctl
    finally:
        ctl.stop()


def unique(prefix: str) -> str:
    """A name no earlier test on the session's API server used."""
    return f"{prefix}-{uuid.uuid4().hex[:5]}"


def get_bd(kube: Kube, name: str) -> Obj:
    """BundleDeployment ``name`` as the manager's storage version, which must exist."""
    live = kube.get(actuate.bd_ref(name))
    assert live is not None
    return live


def pods_of(kube: Kube, system_namespace: str, name: str) -> list[Obj]:
    """The pods the manager made for BundleDeployment ``name``, not being deleted."""
    items, _ = kube.list(
        "v1", "Pod", namespace=system_namespace, label_selector=f"{model.BD_LABEL}={name}"
    )
    return [p for p in items if not p["metadata"].get("deletionTimestamp")]


def mounted(pod: Obj) -> str:
    """The image reference the pod's first (CSI) volume asks the node plugin to mount."""
    return str(pod["spec"]["volumes"][0]["csi"]["volumeAttributes"]["image"])


def play_run(kube: Kube, run: Obj, bundle: formats.Bundle, options: apply.Options) -> apply.Result:
    """Do what the instance run ``run`` would on a kubelet: install ``bundle`` with
    ``options`` (``options.name`` is the BundleDeployment), leave the install record, end
    the pod Succeeded."""
    result = apply.install(kube, bundle, options)
    record = runs.InstallRecord(
        run["metadata"]["name"],
        run["metadata"]["annotations"][model.BUNDLE_ANNOTATION],
        appliedrecord.of(result.applied),
    )
    system_namespace = options.system_namespace
    body = inventory.record_configmap(
        options.name, record.document(), system_namespace=system_namespace
    )
    kube.apply(body, manager=inventory.RECORD_MANAGER)
    pod_ref = ObjectRef("", "v1", "Pod", system_namespace, run["metadata"]["name"])
    kube.merge_patch_status(pod_ref, {"status": {"phase": "Succeeded"}})
    return result


def end_container(
    kube: Kube, pod: ObjectRef, container: str, *, message: str, ok: bool = True
) -> None:
    """Play the kubelet: ``pod``'s one container ``container`` terminated with ``message``
    (its termination message), the pod Succeeded, or Failed when not ``ok``."""
    terminated = {
        "exitCode": 0 if ok else 1,
        "reason": "Completed" if ok else "Error",
        "message": message,
        "startedAt": "2026-01-01T00:00:00Z",
        "finishedAt": "2026-01-01T00:00:01Z",
    }
    status = {
        "name": container,
        "image": IMAGE,
        "imageID": "",
        "ready": False,
        "restartCount": 0,
        "state": {"terminated": terminated},
    }
    phase = "Succeeded" if ok else "Failed"
    kube.merge_patch_status(pod, {"status": {"phase": phase, "containerStatuses": [status]}})
