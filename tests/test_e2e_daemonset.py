"""End to end: the shipped ``daemonset/`` manifests run the node plugin's real image.

``hack/image/build.sh`` builds the image (no container engine) and pushes it to the
registry the local cluster's containerd pulls from; ``kubectl kustomize daemonset/`` is
applied with only what differs on this test node changed: the image reference, the
kubelet's root dir (a temp dir here, not /var/lib/kubelet) and the plugin's state dir
(a temp dir). Then, in order: the DaemonSet's pod runs and the kubelet lists
``csi.rukpak.io`` on the node's CSINode; a pod reads a bundle manifest from an inline
volume and, deleted, leaves no mount behind; deleting the DaemonSet stops the plugin
through its SIGTERM path, removes its sockets and leaves nothing mounted.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tempfile
import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from tests import e2e_helpers as e2e
from tests import image_helpers
from tests.cluster import bins
from tests.polling import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

NAMESPACE = "rukpak-system"
DAEMONSET = "rukpak-csi-node"
SELECTOR = "app.kubernetes.io/name=rukpak-csi,app.kubernetes.io/component=node-plugin"
SHIPPED_KUBELET_DIR = "/var/lib/kubelet"
SHIPPED_STATE_DIR = "/var/lib/rukpak-csi"
MANIFEST = "02_configmap.yaml"


def _kubectl(cluster: Any, *args: str, timeout: float = 60) -> str:
    kubectl = bins.find("kubectl")
    if kubectl is None:
        pytest.fail(
            "no kubectl binary: run `make k8s-bins` (make test does) or set KUBEBUILDER_ASSETS"
        )
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


def for_test_node(
    docs: list[dict[str, Any]], *, image: str, kubelet_dir: Path, state_dir: Path
) -> list[dict[str, Any]]:
    """The rendered manifests with the image, kubelet root and state dir of this node."""
    adapted = []
    for doc in docs:
        if doc["kind"] == "DaemonSet":
            text = json.dumps(doc).replace(SHIPPED_KUBELET_DIR, str(kubelet_dir))
            doc = json.loads(text)
            spec = doc["spec"]["template"]["spec"]
            (plugin,) = [c for c in spec["containers"] if c["name"] == "plugin"]
            plugin["image"] = image
            for volume in spec["volumes"]:
                if volume.get("hostPath", {}).get("path") == SHIPPED_STATE_DIR:
                    volume["hostPath"]["path"] = str(state_dir)
        adapted.append(doc)
    return adapted


@dataclass
class Deployment:
    """The applied manifests and what the test checks against afterwards."""

    manifests: Path
    state_dir: Path
    mounts_before: set[Path]


@pytest.fixture(scope="module")
def plugin_image(kube_cluster: Any, request: pytest.FixtureRequest) -> str:
    e2e.require_local_node(kube_cluster)
    ref = f"{kube_cluster.registry_host}/rukpak/rukpak-python:e2e"
    return image_helpers.build_and_push(ref, request=request)


@pytest.fixture(scope="module")
def deployed(
    kube_cluster: Any, api_client: client.ApiClient, plugin_image: str
) -> Iterator[Deployment]:
    """``daemonset/`` applied for this node; everything it created deleted afterwards."""
    kubelet_dir = Path(kube_cluster.kubelet_dir)
    assert Path(kube_cluster.plugins_dir) == kubelet_dir / "plugins"
    assert Path(kube_cluster.plugins_registry_dir) == kubelet_dir / "plugins_registry"
    workdir = Path(tempfile.mkdtemp(prefix="rk-ds-"))
    state_dir = workdir / "state"
    rendered = list(
        yaml.safe_load_all(_kubectl(kube_cluster, "kustomize", str(e2e.REPO_ROOT / "daemonset")))
    )
    docs = for_test_node(rendered, image=plugin_image, kubelet_dir=kubelet_dir, state_dir=state_dir)
    manifests = workdir / "manifests.yaml"
    manifests.write_text(yaml.safe_dump_all(docs))
    before = {m.mount_point for m in e2e.mounts_under(kubelet_dir)}
    _kubectl(kube_cluster, "apply", "-f", str(manifests))
    try:
        yield Deployment(manifests=manifests, state_dir=state_dir, mounts_before=before)
    finally:
        _kubectl(kube_cluster, "delete", "--ignore-not-found", "--wait=false", "-f", str(manifests))
        if not e2e.mounts_under(workdir):
            shutil.rmtree(workdir, ignore_errors=True)


def _plugin_pod(core: client.CoreV1Api) -> Any:
    pods = core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR).items
    return pods[0] if len(pods) == 1 else None


def _ready(pod: Any) -> bool:
    statuses = pod.status.container_statuses or []
    return pod.status.phase == "Running" and bool(statuses) and all(s.ready for s in statuses)


def _plugin_log(core: client.CoreV1Api, pod: Any) -> str:
    try:
        return str(core.read_namespaced_pod_log(pod.metadata.name, NAMESPACE, container="plugin"))
    except client.ApiException as e:
        return f"(no log: {e.reason})"


def _running_plugin(core: client.CoreV1Api) -> Any:
    def ready() -> Any:
        pod = _plugin_pod(core)
        return pod if pod is not None and _ready(pod) else None

    try:
        return eventually(ready, timeout=150, what="the DaemonSet's pod to be Running and ready")
    except AssertionError as e:
        pod = _plugin_pod(core)
        detail = ""
        if pod is not None:
            detail = e2e.pod_events(core, NAMESPACE, pod.metadata.name)
            detail += f"\nstatus: {pod.status.container_statuses}\nlog:\n{_plugin_log(core, pod)}"
        raise AssertionError(f"{e}\n{detail}") from None


def _registered(api_client: client.ApiClient, node: str) -> dict[str, str] | None:
    drivers = e2e.csinode_drivers(api_client, node)
    return drivers if e2e.DRIVER in drivers else None


@pytest.fixture(scope="module")
def namespace(core: client.CoreV1Api) -> Iterator[str]:
    name = f"e2e-ds-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        core.delete_namespace(name, grace_period_seconds=0)


class TestTheShippedDaemonSet:
    """In file order: each test builds on the state the previous one left."""

    def test_its_pod_runs_and_the_kubelet_registers_the_driver_on_the_csinode(
        self,
        kube_cluster: Any,
        api_client: client.ApiClient,
        core: client.CoreV1Api,
        deployed: Deployment,
        plugin_image: str,
    ) -> None:
        pod = _running_plugin(core)
        assert pod.spec.containers[0].image == plugin_image
        assert pod.spec.host_network
        drivers = eventually(
            lambda: _registered(api_client, kube_cluster.node_name),
            timeout=60,
            what="csi.rukpak.io on the CSINode",
        )
        assert drivers[e2e.DRIVER] == kube_cluster.node_name
        log = _plugin_log(core, pod)
        assert "msg='serving'" in log, log
        assert "registered with kubelet" in log, log

    def test_a_pod_reads_a_bundle_manifest_and_leaves_no_mount_behind(
        self,
        kube_cluster: Any,
        core: client.CoreV1Api,
        deployed: Deployment,
        namespace: str,
    ) -> None:
        bundle = f"{kube_cluster.registry_host}/rukpak-e2e/hello-ds:v1"
        e2e.push_bundle(e2e.HELLO_BUNDLE, bundle)
        name = f"reader-{uuid.uuid4().hex[:6]}"
        pod = e2e.bundle_pod(
            name,
            image=kube_cluster.busybox_image,
            command=f"cat /bundle/manifests/{MANIFEST} && exec sleep 3600",
            volume=e2e.inline_bundle_volume(bundle),
        )
        e2e.create_pod(core, namespace, pod)
        plugin = _plugin_pod(core)
        try:
            running: Any = e2e.wait_phase(core, namespace, name, ("Running",), timeout=90)
        except AssertionError as e:
            raise AssertionError(f"{e}\nplugin log:\n{_plugin_log(core, plugin)}") from None
        expected = (e2e.HELLO_BUNDLE / "manifests" / MANIFEST).read_text()
        eventually(
            lambda: core.read_namespaced_pod_log(name, namespace) == expected,
            timeout=30,
            what="the manifest in the pod's log",
        )
        # the plugin mounted inside its container; Bidirectional propagation put it here
        target = e2e.csi_target_path(
            Path(kube_cluster.kubelet_dir), running.metadata.uid, "bundle"
        ).resolve()
        mounted = {m.mount_point for m in e2e.mounts_under(target)}
        assert target in mounted, f"{target} is not mounted on the host"

        e2e.delete_pod_and_wait(core, namespace, name)
        eventually(
            lambda: not e2e.mounts_under(target) and not target.exists(),
            timeout=60,
            what=f"{target} to be unmounted and removed",
        )
        assert f"msg='unpublished' target={target}" in _plugin_log(core, plugin)

    def test_the_volume_is_read_only_on_the_node_and_for_read_write_mounts(
        self,
        kube_cluster: Any,
        core: client.CoreV1Api,
        deployed: Deployment,
        namespace: str,
    ) -> None:
        bundle = f"{kube_cluster.registry_host}/rukpak-e2e/hello-ds:v1"
        name = f"writer-{uuid.uuid4().hex[:6]}"
        script = (
            "if touch /bundle/manifests/new.yaml; then echo WROTE; else echo REFUSED; fi; "
            "rm -f /bundle/manifests/new.yaml; exec sleep 3600"
        )
        pod = e2e.bundle_pod(
            name,
            image=kube_cluster.busybox_image,
            command=script,
            volume=e2e.inline_bundle_volume(bundle),
            read_only=False,
        )
        e2e.create_pod(core, namespace, pod)
        target: Path | None = None
        try:
            running: Any = e2e.wait_phase(core, namespace, name, ("Running",), timeout=90)
            log = eventually(
                lambda: core.read_namespaced_pod_log(name, namespace),
                timeout=30,
                what="the writer's log",
            )
            target = e2e.csi_target_path(
                Path(kube_cluster.kubelet_dir), running.metadata.uid, "bundle"
            ).resolve()
            host_view = {m.mount_point: m for m in e2e.mounts_under(target)}
        finally:
            e2e.delete_pod_and_wait(core, namespace, name)
            if target is not None:  # unpublished while the plugin still runs
                eventually(
                    lambda: not e2e.mounts_under(target),
                    timeout=60,
                    what=f"{target} to be unmounted",
                )
        assert "REFUSED" in log and "WROTE" not in log, log
        assert host_view[target].read_only, host_view[target]

    def test_deleting_it_stops_the_plugin_cleanly_and_leaves_nothing_mounted(
        self,
        kube_cluster: Any,
        api_client: client.ApiClient,
        core: client.CoreV1Api,
        deployed: Deployment,
    ) -> None:
        pod = _running_plugin(core)
        kubectl = bins.find("kubectl")
        assert kubectl is not None
        follow_log = deployed.manifests.parent / "plugin-follow.log"
        argv = [str(kubectl), "--kubeconfig", str(kube_cluster.kubeconfig), "logs", "-f"]
        argv += ["-n", NAMESPACE, pod.metadata.name, "-c", "plugin"]
        with follow_log.open("wb") as out:
            follower = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            eventually(
                lambda: b"msg='serving'" in follow_log.read_bytes(),
                timeout=20,
                what="kubectl logs -f to follow the plugin",
            )
            _kubectl(kube_cluster, "delete", "daemonset", DAEMONSET, "-n", NAMESPACE)
            eventually(lambda: _plugin_pod(core) is None, timeout=90, what="the plugin's pod to go")
            follower.wait(timeout=30)
        finally:
            if follower.poll() is None:
                follower.terminate()
                follower.wait(timeout=10)
        log = follow_log.read_text(errors="replace")
        assert "msg='stopping' signal=SIGTERM" in log, log
        assert "msg='stopped'" in log, log

        plugins_dir = Path(kube_cluster.plugins_dir) / e2e.DRIVER
        registration = Path(kube_cluster.plugins_registry_dir) / f"{e2e.DRIVER}-reg.sock"
        assert not (plugins_dir / "csi.sock").exists()
        assert not registration.exists()
        eventually(
            lambda: e2e.DRIVER not in e2e.csinode_drivers(api_client, kube_cluster.node_name),
            timeout=60,
            what="the kubelet to drop csi.rukpak.io from the CSINode",
        )
        assert not e2e.mounts_under(deployed.state_dir)
        assert (deployed.state_dir / "images").is_dir()  # the cache survives, as on a node

        def leftover() -> set[Path]:
            now = {m.mount_point for m in e2e.mounts_under(Path(kube_cluster.kubelet_dir))}
            return now - deployed.mounts_before

        try:
            eventually(
                lambda: not leftover(), timeout=60, what="no new mounts under the kubelet dir"
            )
        except AssertionError as e:
            raise AssertionError(f"{e}: {sorted(map(str, leftover()))}") from None
