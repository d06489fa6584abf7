"""End to end: bundles reach pods as read-only CSI volumes served by our node plugin.

The proof of the design's central idea on a real node: the local cluster's kubelet and
containerd, our plugin as a host process beside them (registered through kubelet's
plugin registration, as a DaemonSet's would be), the ``CSIDriver`` object of
``storageclass/csidriver.yaml``, and the example bundle pushed to the registry the
node pulls its container images from. Pods mount the bundle inline or through a static
ReadOnlyMany PV and read its manifests; writes fail; deleting a pod unmounts and removes
its volume; a missing image shows the plugin's error as a FailedMount event.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests import e2e_helpers as e2e
from tests.polling import eventually, logged

MANIFEST = "02_configmap.yaml"


@pytest.fixture(scope="module")
def plugin(kube_cluster: Any, api_client: client.ApiClient) -> Iterator[e2e.HostPlugin]:
    """Our plugin registered with the kubelet, and the CSIDriver object applied."""
    with e2e.HostPlugin.for_cluster(kube_cluster).registered(api_client) as started:
        yield started


@pytest.fixture(scope="module")
def bundle_image(kube_cluster: Any) -> str:
    """The hello bundle, pushed to the registry the node's containerd and our plugin use."""
    ref = f"{kube_cluster.registry_host}/rukpak-e2e/hello:v1"
    e2e.push_bundle(e2e.HELLO_BUNDLE, ref)
    return ref


@pytest.fixture(scope="module")
def namespace(core: client.CoreV1Api) -> Iterator[str]:
    with e2e.temporary_namespace(core, "e2e-csi") as name:
        yield name


def _name(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def _finished(core: client.CoreV1Api, namespace: str, name: str, plugin: e2e.HostPlugin) -> str:
    """Wait for a run-to-completion pod; return its log, asserting it Succeeded."""
    try:
        pod: Any = e2e.wait_phase(core, namespace, name, ("Succeeded", "Failed"), timeout=90)
    except AssertionError as e:
        raise AssertionError(f"{e}\nplugin log (tail):\n{plugin.log()[-3000:]}") from None
    log: str = core.read_namespaced_pod_log(name, namespace)
    assert pod.status.phase == "Succeeded", f"{log}\n{e2e.pod_events(core, namespace, name)}"
    return log


def _registered(api_client: client.ApiClient, node: str) -> dict[str, str] | None:
    drivers = e2e.csinode_drivers(api_client, node)
    return drivers if e2e.DRIVER in drivers else None


def _claim_phase(core: client.CoreV1Api, namespace: str, name: str) -> str:
    claim: Any = core.read_namespaced_persistent_volume_claim(name, namespace)
    return str(claim.status.phase)


@dataclass(frozen=True)
class Scene:
    """What the volume tests use: the cluster, its API, our plugin, the bundle, a namespace."""

    cluster: Any
    core: client.CoreV1Api
    plugin: e2e.HostPlugin
    bundle_image: str
    namespace: str

    @property
    def pods(self) -> e2e.BundlePods:
        return e2e.BundlePods.on(self.cluster, self.core, self.namespace)

    def finished(self, name: str) -> str:
        return _finished(self.core, self.namespace, name, self.plugin)

    def cat_manifest(self, prefix: str, volume: client.V1Volume) -> str:
        """What a pod with ``volume`` at /bundle prints for ``cat`` of the test manifest."""
        name = self.pods.start(prefix, f"cat /bundle/manifests/{MANIFEST}", volume)
        log = self.finished(name)
        self.pods.delete(name)
        return log


@pytest.fixture
def scene(
    kube_cluster: Any,
    core: client.CoreV1Api,
    plugin: e2e.HostPlugin,
    bundle_image: str,
    namespace: str,
) -> Scene:
    return Scene(kube_cluster, core, plugin, bundle_image, namespace)


class TestRegistration:
    def test_the_kubelet_registers_the_plugin_on_the_nodes_csinode(
        self, kube_cluster: Any, api_client: client.ApiClient, plugin: e2e.HostPlugin
    ) -> None:
        drivers = eventually(
            lambda: _registered(api_client, kube_cluster.node_name),
            timeout=30,
            what="csi.rukpak.io on the CSINode",
        )
        assert drivers[e2e.DRIVER] == kube_cluster.node_name
        # kubelet writes the CSINode before it notifies the plugin
        logged(plugin.log, "registered with kubelet")


class TestInlineVolume:
    def test_a_pod_reads_a_manifest_of_the_bundle_from_its_inline_volume(
        self, scene: Scene
    ) -> None:
        log = scene.cat_manifest("reader", e2e.inline_bundle_volume(scene.bundle_image))
        assert log == (e2e.HELLO_BUNDLE / "manifests" / MANIFEST).read_text()

    def test_writing_to_the_volume_fails_even_when_the_pod_mounts_it_read_write(
        self, scene: Scene
    ) -> None:
        script = (
            "if echo x > /bundle/manifests/new.yaml; then echo WROTE; else echo REFUSED; fi; "
            "if rm /bundle/manifests/" + MANIFEST + "; then echo REMOVED; else echo KEPT; fi; "
            "ls /bundle/manifests"
        )
        volume = e2e.inline_bundle_volume(scene.bundle_image)
        name = scene.pods.start("writer", script, volume, read_only=False)
        log = scene.finished(name)
        assert "REFUSED" in log and "KEPT" in log, log
        assert "Read-only file system" in log
        assert "WROTE" not in log and "REMOVED" not in log
        scene.pods.delete(name)

    def test_deleting_the_pod_unmounts_and_removes_the_published_volume(self, scene: Scene) -> None:
        volume = e2e.inline_bundle_volume(scene.bundle_image)
        name = scene.pods.start("sleeper", "ls /bundle/manifests && exec sleep 3600", volume)
        target = scene.pods.target(scene.pods.running(name))
        mounted = {Path(m.mount_point): m for m in e2e.mounts_under(target)}
        assert target in mounted, f"{target} is not in /proc/self/mountinfo"
        assert mounted[target].read_only
        expected = sorted(p.name for p in (e2e.HELLO_BUNDLE / "manifests").iterdir())
        assert sorted(p.name for p in (target / "manifests").iterdir()) == expected

        scene.pods.delete(name)
        eventually(
            lambda: not e2e.mounts_under(target) and not target.exists(),
            timeout=60,
            what=f"{target} to be unmounted and removed",
        )
        logged(scene.plugin.log, f"msg='unpublished' target={target}")


class TestBadInput:
    def test_a_missing_image_shows_the_plugins_not_found_error_as_a_failed_mount_event(
        self, scene: Scene
    ) -> None:
        core, namespace = scene.core, scene.namespace
        missing = f"{scene.cluster.registry_host}/rukpak-e2e/does-not-exist:v9"
        name = scene.pods.start("missing", "ls /bundle", e2e.inline_bundle_volume(missing))
        messages = eventually(
            lambda: e2e.failed_mount_messages(core, namespace, name),
            timeout=60,
            what="a FailedMount event",
        )
        message = messages[0]
        # e.g. MountVolume.SetUp failed for volume "bundle" : rpc error: code = NotFound
        # desc = image HOST/rukpak-e2e/does-not-exist:v9 not found in registry HOST: check ...
        assert 'volume "bundle"' in message, message
        assert "code = NotFound" in message, message
        assert f"image {missing} not found" in message, message
        assert "check the name and tag" in message, message
        pending: Any = core.read_namespaced_pod(name, namespace)
        assert pending.status.phase == "Pending"
        scene.pods.delete(name)


class TestPersistentVolume:
    def test_a_pod_reads_the_bundle_through_a_static_read_only_many_pv_and_claim(
        self, scene: Scene
    ) -> None:
        core, namespace = scene.core, scene.namespace
        pv_name = _name("hello-bundle")
        labels = {"app.kubernetes.io/part-of": "rukpak"}
        pv = client.V1PersistentVolume(
            metadata=client.V1ObjectMeta(name=pv_name, labels=labels),
            spec=client.V1PersistentVolumeSpec(
                capacity={"storage": "1Mi"},
                access_modes=["ReadOnlyMany"],
                persistent_volume_reclaim_policy="Retain",
                storage_class_name="",
                csi=client.V1CSIPersistentVolumeSource(
                    driver=e2e.DRIVER,
                    volume_handle=pv_name,
                    read_only=True,
                    volume_attributes={
                        "image": scene.bundle_image,
                        "pullPolicy": "IfNotPresent",
                    },
                ),
            ),
        )
        claim = client.V1PersistentVolumeClaim(
            metadata=client.V1ObjectMeta(name="hello-bundle", labels=labels),
            spec=client.V1PersistentVolumeClaimSpec(
                access_modes=["ReadOnlyMany"],
                storage_class_name="",
                volume_name=pv_name,
                resources=client.V1VolumeResourceRequirements(requests={"storage": "1Mi"}),
            ),
        )
        core.create_persistent_volume(pv)
        try:
            core.create_namespaced_persistent_volume_claim(namespace, claim)
            eventually(
                lambda: _claim_phase(core, namespace, "hello-bundle") == "Bound",
                timeout=60,
                what="the claim to bind",
            )
            log = scene.cat_manifest("pv-reader", e2e.claim_volume("hello-bundle"))
            assert log == (e2e.HELLO_BUNDLE / "manifests" / MANIFEST).read_text()
            core.delete_namespaced_persistent_volume_claim("hello-bundle", namespace)
        finally:
            core.delete_persistent_volume(pv_name)
