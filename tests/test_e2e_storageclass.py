"""End to end: PVCs of a csi.rukpak.io StorageClass bind, serve a bundle, and go away.

On the local cluster's real node (kube-controller-manager's PV controller, the
kubelet): the node plugin runs as a host process registered with the kubelet (as
in ``tests/test_e2e_csi.py``); the shipped ``storageclass/`` manifests run the
``rukpak-csi-controller`` Deployment (the plugin's Controller service and
``rukpak-provisioner volumes`` sharing a socket) with the project's image, in a
namespace of its own, changed only where this cluster differs: the image, and
hostNetwork plus the API server's loopback address (no kube-proxy; what
``deploy/components/host-network`` does for an install). Then, each test on claims of
its own (the controller, the node plugin and the bound ``hello`` claim are module
fixtures):

- a ReadOnlyMany claim of a class naming a bundle by tag binds to a PV named
  ``pvc-<uid>`` whose ``volumeAttributes.image`` names the pushed digest, with the
  external-provisioner's annotation, finalizer and claimRef;
- two pods mount the claim and read the bundle's manifest;
- deleting the claim deletes the PV (DeleteVolume, then the finalizer is dropped);
- claims of classes with bad parameters (no image, an unknown attribute, a bad
  pullPolicy), or asking ReadWriteMany, stay Pending with a ProvisioningFailed
  Warning event saying what to fix;
- once such a class is fixed (deleted and created again), its claim binds.
"""

from __future__ import annotations

import functools
import json
import subprocess
import time
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from rukpak.oci.client import RegistryClient
from rukpak.oci.reference import Reference
from tests import e2e_helpers as e2e
from tests import image_helpers
from tests.cluster import bins
from tests.polling import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

MANIFESTS = e2e.REPO_ROOT / "storageclass"
DEPLOYMENT = "rukpak-csi-controller"
SHIPPED_NAMESPACE = "rukpak-system"
SELECTOR = "app.kubernetes.io/name=rukpak-csi,app.kubernetes.io/component=controller"
MANIFEST = "02_configmap.yaml"
FINALIZER = "external-provisioner.volume.kubernetes.io/finalizer"


@dataclass(frozen=True)
class Names:
    system: str  # where the controller Deployment runs
    apps: str  # where the claims and reader pods live
    suffix: str


@pytest.fixture(scope="module")
def names() -> Names:
    suffix = uuid.uuid4().hex[:6]
    return Names(system=f"e2e-sc-sys-{suffix}", apps=f"e2e-sc-{suffix}", suffix=suffix)


def _kubectl(cluster: Any, *args: str, timeout: float = 60) -> str:
    kubectl = bins.find("kubectl")
    if kubectl is None:
        pytest.fail("no kubectl binary: run `make k8s-bins` or set KUBEBUILDER_ASSETS")
    done = subprocess.run(
        [str(kubectl), "--kubeconfig", str(cluster.kubeconfig), *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )
    if done.returncode != 0:
        raise RuntimeError(f"kubectl {' '.join(args)} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def for_test_cluster(
    docs: list[dict[str, Any]], *, image: str, names: Names, env: dict[str, str]
) -> list[dict[str, Any]]:
    """The controller's objects (not the CSIDriver or example class) in ``names.system``,
    cluster-scoped names suffixed, with this cluster's image, host network and API address."""
    adapted = []
    for doc in docs:
        if doc["kind"] in ("CSIDriver", "StorageClass"):
            continue
        doc = json.loads(json.dumps(doc).replace(f'"{SHIPPED_NAMESPACE}"', f'"{names.system}"'))
        if doc["kind"] in ("ClusterRole", "ClusterRoleBinding"):
            doc["metadata"]["name"] += f"-{names.suffix}"
        if doc["kind"] == "ClusterRoleBinding":
            doc["roleRef"]["name"] += f"-{names.suffix}"
        if doc["kind"] == "Deployment":
            spec = doc["spec"]["template"]["spec"]
            spec["hostNetwork"] = True
            spec["dnsPolicy"] = "ClusterFirstWithHostNet"
            for container in spec["containers"]:
                container["image"] = image
            provisioner = spec["containers"][0]
            assert provisioner["name"] == "provisioner"
            provisioner["env"] += [{"name": k, "value": v} for k, v in env.items()]
        adapted.append(doc)
    return adapted


@pytest.fixture(scope="module")
def project_image(kube_cluster: Any, request: pytest.FixtureRequest) -> str:
    e2e.require_local_node(kube_cluster)
    ref = f"{kube_cluster.registry_host}/rukpak/rukpak-python:e2e"
    return image_helpers.build_and_push(ref, request=request)


@pytest.fixture(scope="module")
def node_plugin(kube_cluster: Any, api_client: client.ApiClient) -> Iterator[e2e.HostPlugin]:
    e2e.apply_csidriver(api_client)
    started = e2e.HostPlugin.for_cluster(kube_cluster).start()
    try:
        eventually(
            lambda: e2e.DRIVER in e2e.csinode_drivers(api_client, kube_cluster.node_name),
            timeout=60,
            what="csi.rukpak.io on the CSINode",
        )
        yield started
    finally:
        started.stop()
        started.remove_state()


@pytest.fixture(scope="module")
def controller(
    kube_cluster: Any,
    core: client.CoreV1Api,
    names: Names,
    project_image: str,
    tmp_path_factory: pytest.TempPathFactory,
) -> Iterator[Path]:
    """The shipped controller Deployment running; everything it and the test made removed
    afterwards. Yields the applied manifests' path."""
    rendered = list(yaml.safe_load_all(_kubectl(kube_cluster, "kustomize", str(MANIFESTS))))
    docs = for_test_cluster(
        rendered, image=project_image, names=names, env=kube_cluster.in_cluster_env()
    )
    assert any(d["kind"] == "Deployment" for d in docs), "storageclass/ ships no Deployment"
    path = tmp_path_factory.mktemp("sc") / "controller.yaml"
    path.write_text(yaml.safe_dump_all(docs))
    for namespace in (names.system, names.apps):
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    _kubectl(kube_cluster, "apply", "-f", str(path))
    try:
        yield path
    finally:
        _kubectl(kube_cluster, "delete", "namespace", names.apps, "--wait=true", timeout=180)
        _kubectl(kube_cluster, "delete", "--ignore-not-found", "-f", str(path), timeout=120)
        core.delete_namespace(names.system, grace_period_seconds=0)
        storage = client.StorageV1Api(core.api_client)
        for sc in storage.list_storage_class().items:
            name = str(sc.metadata.name)
            if name.endswith(names.suffix):
                storage.delete_storage_class(name)


def _controller_pod(core: client.CoreV1Api, names: Names) -> Any:
    pods = core.list_namespaced_pod(names.system, label_selector=SELECTOR).items
    return pods[0] if len(pods) == 1 else None


def _bound(
    core: client.CoreV1Api,
    namespace: str,
    claim: str,
    *,
    timeout: float,
    context: Callable[[], str],
) -> Any:
    """Wait until the claim is Bound; the claim. On timeout the error adds ``context()``."""

    def is_bound() -> Any:
        pvc: Any = core.read_namespaced_persistent_volume_claim(claim, namespace)
        return pvc if pvc.status.phase == "Bound" else None

    try:
        return eventually(is_bound, timeout=timeout, what=f"the claim {claim} to be Bound")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{context()}") from None


def _logs(core: client.CoreV1Api, names: Names) -> str:
    pod = _controller_pod(core, names)
    if pod is None:
        return "(no controller pod)"
    out = []
    for container in ("provisioner", "plugin"):
        try:
            text = core.read_namespaced_pod_log(
                pod.metadata.name, names.system, container=container
            )
        except ApiException as e:
            text = f"(no log: {e.reason})"
        out.append(f"--- {container}:\n{str(text)[-3000:]}")
    return "\n".join(out)


def _running_controller(core: client.CoreV1Api, names: Names) -> Any:
    def ready() -> Any:
        pod = _controller_pod(core, names)
        statuses = (pod.status.container_statuses or []) if pod is not None else []
        if pod is not None and pod.status.phase == "Running" and len(statuses) == 2:
            return pod if all(s.ready for s in statuses) else None
        return None

    try:
        return eventually(ready, timeout=150, what="the controller pod to be Running and ready")
    except AssertionError as e:
        pod = _controller_pod(core, names)
        detail = ""
        if pod is not None:
            detail = e2e.pod_events(core, names.system, pod.metadata.name)
            detail += f"\nstatus: {pod.status.container_statuses}\n{_logs(core, names)}"
        raise AssertionError(f"{e}\n{detail}") from None


def make_class(api_client: client.ApiClient, name: str, parameters: dict[str, str]) -> None:
    client.StorageV1Api(api_client).create_storage_class(
        client.V1StorageClass(
            metadata=client.V1ObjectMeta(name=name, labels={"app.kubernetes.io/part-of": "rukpak"}),
            provisioner=e2e.DRIVER,
            reclaim_policy="Delete",
            volume_binding_mode="Immediate",
            parameters=parameters,
        )
    )


def make_claim(
    core: client.CoreV1Api,
    namespace: str,
    name: str,
    storage_class: str,
    *,
    mode: str = "ReadOnlyMany",
) -> Any:
    return core.create_namespaced_persistent_volume_claim(
        namespace,
        client.V1PersistentVolumeClaim(
            metadata=client.V1ObjectMeta(name=name),
            spec=client.V1PersistentVolumeClaimSpec(
                access_modes=[mode],
                storage_class_name=storage_class,
                resources=client.V1VolumeResourceRequirements(requests={"storage": "1Mi"}),
            ),
        ),
    )


def claim_events(core: client.CoreV1Api, namespace: str, name: str) -> list[Any]:
    selector = f"involvedObject.kind=PersistentVolumeClaim,involvedObject.name={name}"
    return list(core.list_namespaced_event(namespace, field_selector=selector).items)


def _pv_or_none(core: client.CoreV1Api, name: str) -> Any:
    try:
        return core.read_persistent_volume(name)
    except ApiException as e:
        if e.status == 404:
            return None
        raise


@dataclass
class Bound:
    claim: str
    pv: str
    uid: str
    bundle: str
    digest: str


@pytest.fixture(scope="module")
def bound(
    kube_cluster: Any,
    api_client: client.ApiClient,
    core: client.CoreV1Api,
    names: Names,
    node_plugin: e2e.HostPlugin,
    controller: Path,
) -> Bound:
    bundle = f"{kube_cluster.registry_host}/rukpak-e2e/hello-sc:{names.suffix}"
    e2e.push_bundle(e2e.HELLO_BUNDLE, bundle)
    digest = bundle_digest(bundle)
    _running_controller(core, names)
    make_class(
        api_client, f"bundles-{names.suffix}", {"image": bundle, "pullPolicy": "IfNotPresent"}
    )
    started = time.monotonic()
    claim = bind_claim(core, names, "hello", f"bundles-{names.suffix}")
    print(f"\nclaim Bound {time.monotonic() - started:.2f}s after its creation")
    return Bound(claim="hello", pv=claim.pv, uid=claim.uid, bundle=bundle, digest=digest)


@dataclass(frozen=True)
class Claim:
    pv: str
    uid: str


def bind_claim(core: client.CoreV1Api, names: Names, claim: str, storage_class: str) -> Claim:
    """Create ``claim`` of ``storage_class`` in ``names.apps`` and wait until it is Bound."""
    created = make_claim(core, names.apps, claim, storage_class)

    def context() -> str:
        events = [
            f"{x.type} {x.reason}: {x.message}" for x in claim_events(core, names.apps, claim)
        ]
        return f"events: {events}\n{_logs(core, names)}"

    pvc = _bound(core, names.apps, claim, timeout=120, context=context)
    return Claim(pv=pvc.spec.volume_name, uid=created.metadata.uid)


def provisioning_failed(core: client.CoreV1Api, names: Names, claim: str) -> Any:
    """Wait for the claim's first ProvisioningFailed event from the provisioner and return
    it. The persistentvolume-controller may say first that it does not know the claim's
    StorageClass yet (its informer lags behind a class made just before): not that one."""

    def failed() -> Any:
        events = claim_events(core, names.apps, claim)
        return [
            e
            for e in events
            if e.reason == "ProvisioningFailed"
            and (e.source is None or e.source.component != "persistentvolume-controller")
        ]

    try:
        (event, *_) = eventually(failed, timeout=90, what=f"a ProvisioningFailed event of {claim}")
    except AssertionError as e:
        raise AssertionError(f"{e}\n{_logs(core, names)}") from None
    return event


def _log_is(core: client.CoreV1Api, namespace: str, name: str, expected: str) -> bool:
    return bool(core.read_namespaced_pod_log(name, namespace) == expected)


def bundle_digest(ref: str) -> str:
    """The manifest digest the registry serves for ``ref`` now."""
    with RegistryClient() as registry:
        return registry.resolve(Reference.parse(ref)).digest


class TestStorageClassVolumes:
    """Each test stands alone: what it changes (deleting a claim, fixing a class) it
    creates itself."""

    def test_a_claim_binds_to_a_pv_pinned_to_the_bundle_digest(
        self, core: client.CoreV1Api, bound: Bound, names: Names
    ) -> None:
        pv: Any = core.read_persistent_volume(bound.pv)
        assert bound.pv == f"pvc-{bound.uid}"
        repository = bound.bundle.rsplit(":", 1)[0]
        assert pv.spec.csi.driver == e2e.DRIVER
        assert pv.spec.csi.volume_attributes["image"] == f"{repository}@{bound.digest}"
        assert pv.spec.access_modes == ["ReadOnlyMany"]
        assert pv.spec.persistent_volume_reclaim_policy == "Delete"
        assert pv.spec.storage_class_name == f"bundles-{names.suffix}"
        assert pv.metadata.annotations["pv.kubernetes.io/provisioned-by"] == e2e.DRIVER
        assert FINALIZER in pv.metadata.finalizers
        assert (pv.spec.claim_ref.namespace, pv.spec.claim_ref.name) == (names.apps, "hello")
        assert pv.spec.claim_ref.uid == bound.uid
        reasons = {e.reason for e in claim_events(core, names.apps, "hello")}
        assert {"Provisioning", "ProvisioningSucceeded"} <= reasons, reasons

    def test_two_pods_read_the_bundle_from_the_claim(
        self, kube_cluster: Any, core: client.CoreV1Api, bound: Bound, names: Names,
        node_plugin: e2e.HostPlugin,
    ) -> None:  # fmt: skip
        expected = (e2e.HELLO_BUNDLE / "manifests" / MANIFEST).read_text()
        readers = [f"reader-{i}" for i in range(2)]
        for name in readers:
            e2e.start_bundle_pod(
                core,
                names.apps,
                name,
                image=kube_cluster.busybox_image,
                command=f"cat /bundle/manifests/{MANIFEST} && exec sleep 3600",
                volume=e2e.claim_volume(bound.claim),
            )
        try:
            for name in readers:
                try:
                    e2e.wait_phase(core, names.apps, name, ("Running",), timeout=120)
                except AssertionError as e:
                    raise AssertionError(
                        f"{e}\nnode plugin:\n{node_plugin.log()[-3000:]}"
                    ) from None
                eventually(
                    functools.partial(_log_is, core, names.apps, name, expected),
                    timeout=30,
                    what=f"the manifest in {name}'s log",
                )
            # the node pulled the digest the PV names, once per pod's target
            pinned = f"image={bound.bundle.rsplit(':', 1)[0]}@{bound.digest}"
            assert node_plugin.log().count(pinned) >= 2, node_plugin.log()[-3000:]
        finally:
            for name in readers:
                e2e.delete_pod_and_wait(core, names.apps, name)

    def test_deleting_the_claim_deletes_the_pv(
        self, core: client.CoreV1Api, bound: Bound, names: Names
    ) -> None:
        doomed = bind_claim(core, names, "doomed", f"bundles-{names.suffix}")
        assert _pv_or_none(core, doomed.pv) is not None
        core.delete_namespaced_persistent_volume_claim("doomed", names.apps)
        try:
            eventually(
                lambda: _pv_or_none(core, doomed.pv) is None,
                timeout=120,
                what=f"PV {doomed.pv} to be deleted",
            )
        except AssertionError as e:
            raise AssertionError(
                f"{e}: {_pv_or_none(core, doomed.pv)}\n{_logs(core, names)}"
            ) from None
        logs = _logs(core, names)
        assert "method=DeleteVolume code=OK" in logs, logs
        assert f"msg='deleted' pv={doomed.pv}" in logs, logs

    @pytest.mark.parametrize(
        ("case", "parameters", "mode", "words"),
        [
            ("no-image", {"pullPolicy": "Always"}, "ReadOnlyMany", "'image' is required"),
            ("typo", {"image": "BUNDLE", "imagePullPolicy": "Always"}, "ReadOnlyMany",
             "unknown volume attribute(s) imagePullPolicy"),
            ("policy", {"image": "BUNDLE", "pullPolicy": "Often"}, "ReadOnlyMany", "Often"),
            ("rwx", {"image": "BUNDLE"}, "ReadWriteMany",
             "MULTI_NODE_MULTI_WRITER is not supported"),
        ],
    )  # fmt: skip
    def test_bad_parameters_leave_the_claim_pending_with_an_event_saying_what_to_fix(
        self,
        api_client: client.ApiClient,
        core: client.CoreV1Api,
        bound: Bound,
        names: Names,
        case: str,
        parameters: dict[str, str],
        mode: str,
        words: str,
    ) -> None:
        params = {k: bound.bundle if v == "BUNDLE" else v for k, v in parameters.items()}
        cls = f"bad-{case}-{names.suffix}"
        make_class(api_client, cls, params)
        make_claim(core, names.apps, f"bad-{case}", cls, mode=mode)
        event = provisioning_failed(core, names, f"bad-{case}")
        assert event.type == "Warning"
        assert f'failed to provision volume with StorageClass "{cls}"' in event.message
        assert "code = InvalidArgument" in event.message and words in event.message, event.message
        pvc: Any = core.read_namespaced_persistent_volume_claim(f"bad-{case}", names.apps)
        assert pvc.status.phase == "Pending"
        assert pvc.spec.volume_name in (None, "")

    def test_a_claim_binds_once_its_class_is_fixed(
        self, api_client: client.ApiClient, core: client.CoreV1Api, bound: Bound, names: Names
    ) -> None:
        cls = f"unfixed-{names.suffix}"
        make_class(api_client, cls, {"pullPolicy": "Always"})  # no image
        make_claim(core, names.apps, "unfixed", cls)
        assert "'image' is required" in provisioning_failed(core, names, "unfixed").message

        # parameters are immutable: a fix is the class deleted and created again
        storage = client.StorageV1Api(api_client)
        storage.delete_storage_class(cls)

        def gone() -> bool:
            try:
                storage.read_storage_class(cls)
            except ApiException as e:
                return bool(e.status == 404)
            return False

        eventually(gone, timeout=30, what="the bad class to go")
        make_class(api_client, cls, {"image": bound.bundle})

        pvc = _bound(core, names.apps, "unfixed", timeout=90, context=lambda: _logs(core, names))
        pv: Any = core.read_persistent_volume(pvc.spec.volume_name)
        repository = bound.bundle.rsplit(":", 1)[0]
        assert pv.spec.csi.volume_attributes["image"] == f"{repository}@{bound.digest}"
