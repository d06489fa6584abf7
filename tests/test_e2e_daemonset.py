"""End to end: the node plugin's DaemonSet as ``deploy/`` installs it, from the real image.

The ``rukpak_system`` fixture (``tests.install_helpers``) installs the whole system from
``deploy/`` with the shipped ``kubelet-root`` component pointing the DaemonSet at this
node's kubelet root (a temp dir here) and plugin cache dir; nothing is edited by hand.
Then, each test on its own (``plugin_running`` applies the DaemonSet before a test and
again after it): the DaemonSet's pod runs and the kubelet lists ``csi.rukpak.io`` on the
node's CSINode; a pod reads a bundle manifest from an inline volume and, deleted, leaves
no mount behind; the volume is read-only on the node too; deleting the DaemonSet stops
the plugin through its SIGTERM path, removes its sockets and leaves nothing mounted,
and re-applying it from the same rendered manifests brings a deleted plugin back.

It stays on ``rukpak_system`` (before the switch to the default install): its subject is
the node plugin, which it deletes and brings back; on the default install that would cut
the standing provisioner's store volume under the tests that run after it.
"""

from __future__ import annotations

import contextlib
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import oras.client
import pytest
import yaml
from kubernetes import client

from tests import e2e_helpers as e2e
from tests import install_helpers as inst
from tests.polling import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

NAMESPACE = inst.NAMESPACE
DAEMONSET = inst.DAEMONSET
SELECTOR = "app.kubernetes.io/name=rukpak-csi,app.kubernetes.io/component=node-plugin"
MANIFEST = "02_configmap.yaml"


@dataclass
class Deployment:
    """The installed system, the API clients of its cluster and the mounts that existed
    before these tests."""

    system: inst.RukpakSystem
    mounts_before: set[Path]
    api_client: client.ApiClient
    core: client.CoreV1Api

    @property
    def cluster(self) -> Any:
        return self.system.cluster

    @property
    def state_dir(self) -> Path:
        return self.system.state_dir

    def registered(self, what: str = "csi.rukpak.io on the CSINode") -> dict[str, str]:
        """The drivers on the node's CSINode, once the kubelet lists ours."""
        return eventually(
            lambda: _registered(self.api_client, self.cluster.node_name), timeout=60, what=what
        )

    def plugin_gone(self) -> None:
        """Wait until the DaemonSet's pod is gone."""
        eventually(
            lambda: _plugin_pod(self.core) is None, timeout=90, what="the plugin's pod to go"
        )

    def dropped(self) -> None:
        """Wait until the kubelet has dropped the driver from the node's CSINode."""
        eventually(
            lambda: e2e.DRIVER not in e2e.csinode_drivers(self.api_client, self.cluster.node_name),
            timeout=60,
            what="the kubelet to drop csi.rukpak.io from the CSINode",
        )


@pytest.fixture(scope="module")
def deployed(
    rukpak_system: inst.RukpakSystem, api_client: client.ApiClient, core: client.CoreV1Api
) -> Deployment:
    kubelet_dir = rukpak_system.kubelet_dir
    assert Path(rukpak_system.cluster.plugins_dir) == kubelet_dir / "plugins"
    assert Path(rukpak_system.cluster.plugins_registry_dir) == kubelet_dir / "plugins_registry"
    before = {m.mount_point for m in e2e.mounts_under(kubelet_dir)}
    return Deployment(rukpak_system, before, api_client, core)


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
def bundle_image(kube_cluster: Any) -> str:
    """The hello bundle, pushed where the node pulls from."""
    ref = f"{kube_cluster.registry_host}/rukpak-e2e/hello-ds:v1"
    e2e.push_bundle(e2e.HELLO_BUNDLE, ref)
    return ref


def _apply_daemonset(system: inst.RukpakSystem) -> None:
    """Apply the DaemonSet from the rendered manifests and wait until it has rolled out."""
    (daemonset,) = [d for d in system.documents() if d["kind"] == "DaemonSet"]
    system.kubectl("apply", "-f", "-", stdin=yaml.safe_dump(daemonset))
    inst.rollout(system, [daemonset], timeout=120)


@pytest.fixture
def plugin_running(deployed: Deployment) -> Iterator[Deployment]:
    """The DaemonSet as installed, its pod ready and the driver on the CSINode; applied
    again afterwards, so a test that deleted it leaves the install as it found it."""
    _apply_daemonset(deployed.system)
    _running_plugin(deployed.core)
    deployed.registered()
    yield deployed
    _apply_daemonset(deployed.system)


def _delete_daemonset(deployed: Deployment) -> None:
    """Delete the DaemonSet and wait until its pod is gone and the kubelet dropped the driver."""
    deployed.system.kubectl("delete", "daemonset", DAEMONSET, "-n", NAMESPACE, "--ignore-not-found")
    deployed.plugin_gone()
    deployed.dropped()


@pytest.fixture(scope="module")
def namespace(core: client.CoreV1Api) -> Iterator[str]:
    with e2e.temporary_namespace(core, "e2e-ds") as name:
        yield name


@pytest.fixture
def bundle_pods(namespace: str, plugin_running: Deployment) -> e2e.BundlePods:
    """Pods of this module's namespace, the DaemonSet's plugin running."""
    return e2e.BundlePods.on(plugin_running.cluster, plugin_running.core, namespace)


class TestTheShippedDaemonSet:
    """Each test stands alone: ``plugin_running`` gives it the installed DaemonSet
    running, and restores it after a test that deleted it."""

    def test_its_pod_runs_and_the_kubelet_registers_the_driver_on_the_csinode(
        self, plugin_running: Deployment
    ) -> None:
        deployed = plugin_running
        pod = _running_plugin(deployed.core)
        assert pod.spec.containers[0].image == deployed.system.image
        assert pod.spec.host_network
        drivers = deployed.registered()
        assert drivers[e2e.DRIVER] == deployed.cluster.node_name
        log = _plugin_log(deployed.core, pod)
        assert "msg='serving'" in log, log
        assert "registered with kubelet" in log, log

    def test_a_pod_reads_a_bundle_manifest_and_leaves_no_mount_behind(
        self, bundle_pods: e2e.BundlePods, bundle_image: str
    ) -> None:
        pods = bundle_pods
        command = f"cat /bundle/manifests/{MANIFEST} && exec sleep 3600"
        name = pods.start("reader", command, e2e.inline_bundle_volume(bundle_image))
        plugin = _plugin_pod(pods.core)
        try:
            running = pods.running(name)
        except AssertionError as e:
            raise AssertionError(f"{e}\nplugin log:\n{_plugin_log(pods.core, plugin)}") from None
        expected = (e2e.HELLO_BUNDLE / "manifests" / MANIFEST).read_text()
        eventually(
            lambda: pods.log(name) == expected,
            timeout=30,
            what="the manifest in the pod's log",
        )
        # the plugin mounted inside its container; Bidirectional propagation put it here
        target = pods.target(running)
        mounted = {m.mount_point for m in e2e.mounts_under(target)}
        assert target in mounted, f"{target} is not mounted on the host"

        pods.delete(name)
        eventually(
            lambda: not e2e.mounts_under(target) and not target.exists(),
            timeout=60,
            what=f"{target} to be unmounted and removed",
        )
        assert f"msg='unpublished' target={target}" in _plugin_log(pods.core, plugin)

    def test_a_pod_reads_the_files_of_an_oras_artifact_by_their_titles(
        self, bundle_pods: e2e.BundlePods, kube_cluster: Any, tmp_path: Path
    ) -> None:
        """Any OCI artifact as a volume: files ``oras push`` titled, not tar layers."""
        (tmp_path / "weights.bin").write_bytes(b"\x00weights\x01")
        (tmp_path / "notes.txt").write_text("pushed by oras\n")
        ref = f"{kube_cluster.registry_host}/rukpak-e2e/artifact:v1"
        with contextlib.chdir(tmp_path):  # oras titles a file by the path it was given
            oras.client.OrasClient(hostname=kube_cluster.registry_host, insecure=True).push(
                target=ref,
                files=["weights.bin:application/vnd.example.weights", "notes.txt:text/plain"],
                quiet=True,
            )
        command = "cat /bundle/notes.txt && wc -c < /bundle/weights.bin && exec sleep 3600"
        name = bundle_pods.start("artifact", command, e2e.inline_bundle_volume(ref))
        try:
            bundle_pods.running(name)
            eventually(
                lambda: bundle_pods.log(name).split() == ["pushed", "by", "oras", "9"],
                timeout=30,
                what="the artifact's files in the pod's log",
            )
        finally:
            bundle_pods.delete(name)

    def test_a_running_pod_sees_its_tag_move_and_is_told(
        self, bundle_pods: e2e.BundlePods, kube_cluster: Any, tmp_path: Path
    ) -> None:
        """Live content refresh (volume attribute ``refresh``): the new digest's files
        appear in the running container, ``..digest`` names it, the pod gets an event."""
        ref = f"{kube_cluster.registry_host}/rukpak-e2e/live:v1"

        def push(text: str) -> str:
            root = tmp_path / text
            (root / "manifests").mkdir(parents=True)
            (root / "manifests" / "cm.yaml").write_text(
                "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: live, namespace: default}\n"
                f"data: {{text: {text}}}\n"
            )
            return e2e.push_bundle(root, ref)

        push("first")
        volume = client.V1Volume(
            name="bundle",
            csi=client.V1CSIVolumeSource(
                driver=e2e.DRIVER, read_only=True, volume_attributes={"image": ref, "refresh": "1s"}
            ),
        )
        command = "while true; do cat /bundle/manifests/cm.yaml; sleep 0.2; done"
        name = bundle_pods.start("live", command, volume)
        try:
            bundle_pods.running(name)
            eventually(lambda: "text: first" in bundle_pods.log(name), timeout=30, what="first")
            push("second")
            eventually(
                lambda: "text: second" in bundle_pods.log(name),
                timeout=30,
                what="second in the pod",
            )
            events = bundle_pods.core.list_namespaced_event(
                bundle_pods.namespace, field_selector=f"involvedObject.name={name}"
            ).items
            refreshed = [e for e in events if e.reason == "ContentRefreshed"]
            assert refreshed, [(e.reason, e.message) for e in events]
            assert "moved from sha256:" in str(refreshed[0].message)
        finally:
            bundle_pods.delete(name)

    def test_the_volume_is_read_only_on_the_node_and_for_read_write_mounts(
        self, bundle_pods: e2e.BundlePods, bundle_image: str
    ) -> None:
        pods = bundle_pods
        script = (
            "if touch /bundle/manifests/new.yaml; then echo WROTE; else echo REFUSED; fi; "
            "rm -f /bundle/manifests/new.yaml; exec sleep 3600"
        )
        name = pods.start("writer", script, e2e.inline_bundle_volume(bundle_image), read_only=False)
        target: Path | None = None
        try:
            running = pods.running(name)
            log = eventually(lambda: pods.log(name), timeout=30, what="the writer's log")
            target = pods.target(running)
            host_view = {m.mount_point: m for m in e2e.mounts_under(target)}
        finally:
            pods.delete(name)
            if target is not None:  # unpublished while the plugin still runs
                eventually(
                    lambda: not e2e.mounts_under(target),
                    timeout=60,
                    what=f"{target} to be unmounted",
                )
        assert "REFUSED" in log and "WROTE" not in log, log
        assert host_view[target].read_only, host_view[target]

    def test_deleting_it_stops_the_plugin_cleanly_and_leaves_nothing_mounted(
        self, plugin_running: Deployment
    ) -> None:
        deployed = plugin_running
        cluster = deployed.cluster
        pod = _running_plugin(deployed.core)
        kubectl = inst.kubectl_binary()
        follow_log = deployed.system.workdir / "plugin-follow.log"
        argv = [str(kubectl), "--kubeconfig", str(cluster.kubeconfig), "logs", "-f"]
        argv += ["-n", NAMESPACE, pod.metadata.name, "-c", "plugin"]
        with follow_log.open("wb") as out:
            follower = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT)
        try:
            eventually(
                lambda: b"msg='serving'" in follow_log.read_bytes(),
                timeout=20,
                what="kubectl logs -f to follow the plugin",
            )
            deployed.system.kubectl("delete", "daemonset", DAEMONSET, "-n", NAMESPACE)
            deployed.plugin_gone()
            follower.wait(timeout=30)
        finally:
            if follower.poll() is None:
                follower.terminate()
                follower.wait(timeout=10)
        log = follow_log.read_text(errors="replace")
        assert "msg='stopping' signal=SIGTERM" in log, log
        assert "msg='stopped'" in log, log

        plugins_dir = Path(cluster.plugins_dir) / e2e.DRIVER
        registration = Path(cluster.plugins_registry_dir) / f"{e2e.DRIVER}-reg.sock"
        assert not (plugins_dir / "csi.sock").exists()
        assert not registration.exists()
        deployed.dropped()
        assert not e2e.mounts_under(deployed.state_dir)
        assert (deployed.state_dir / "images").is_dir()  # the cache survives, as on a node

        def leftover() -> set[Path]:
            now = {m.mount_point for m in e2e.mounts_under(Path(cluster.kubelet_dir))}
            return now - deployed.mounts_before

        try:
            eventually(
                lambda: not leftover(), timeout=60, what="no new mounts under the kubelet dir"
            )
        except AssertionError as e:
            raise AssertionError(f"{e}: {sorted(map(str, leftover()))}") from None

    def test_reapplying_the_rendered_manifests_brings_the_plugin_back(
        self, plugin_running: Deployment
    ) -> None:
        deployed = plugin_running
        _delete_daemonset(deployed)
        _apply_daemonset(deployed.system)
        pod = _running_plugin(deployed.core)
        assert pod.spec.containers[0].image == deployed.system.image
        deployed.registered("csi.rukpak.io on the CSINode again")
