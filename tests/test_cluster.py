"""The local single-node Kubernetes of tests/cluster: its control plane answers with RBAC
on, its Node becomes Ready, it runs pods from the loopback registry, it reports components
that fail to start with their logs, and it leaves nothing running when stopped."""

from __future__ import annotations

import socket
import subprocess
import sys
import uuid
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client, config

from tests.cluster import bins, controlplane, teardown
from tests.cluster.localcluster import LocalCluster
from tests.cluster.process import ComponentError, pid_alive
from tests.polling import eventually

VERSION = "v1.34.4"


def api(cluster: Any) -> client.ApiClient:
    made: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(cluster.kubeconfig)
    )
    return made


def local_core(cluster: Any, needs: str) -> client.CoreV1Api:
    """The core API of the local cluster; skips the test when ``cluster`` lacks ``needs``
    (KUBECONFIG points at another cluster)."""
    if not hasattr(cluster, needs):
        pytest.skip("needs the local cluster (KUBECONFIG points elsewhere)")
    return client.CoreV1Api(api(cluster))


def review(api_client: client.ApiClient, *, user: str, groups: list[str]) -> bool:
    body = client.V1SubjectAccessReview(
        spec=client.V1SubjectAccessReviewSpec(
            user=user,
            groups=groups,
            resource_attributes=client.V1ResourceAttributes(verb="list", resource="secrets"),
        )
    )
    result = client.AuthorizationV1Api(api_client).create_subject_access_review(body)
    return bool(result.status.allowed)


class TestControlPlane:
    def test_the_apiserver_answers_with_the_pinned_version(self, kube_apiserver: Any) -> None:
        version = client.VersionApi(api(kube_apiserver)).get_code()
        assert version.git_version == VERSION

    def test_rbac_is_on_so_a_stranger_may_not_list_secrets(self, kube_apiserver: Any) -> None:
        with api(kube_apiserver) as c:
            assert not review(c, user="stranger", groups=["system:authenticated"])
            assert review(c, user="admin", groups=["system:masters"])


class TestNode:
    def test_the_node_becomes_ready_with_the_pinned_kubelet(self, kube_cluster: Any) -> None:
        core = client.CoreV1Api(api(kube_cluster))
        nodes = core.list_node().items
        assert [n.metadata.name for n in nodes] == [kube_cluster.node_name]
        ready = {c.type: c.status for c in nodes[0].status.conditions}["Ready"]
        assert ready == "True"
        assert nodes[0].status.node_info.kubelet_version == VERSION

    def test_the_kubelet_dirs_are_exposed_for_the_csi_driver(self, kube_cluster: Any) -> None:
        assert Path(kube_cluster.plugins_registry_dir).is_dir()
        assert Path(kube_cluster.pods_dir).is_dir()
        assert Path(kube_cluster.plugins_registry_dir).parent == Path(kube_cluster.kubelet_dir)

    def test_a_busybox_pod_runs_to_completion_and_its_log_is_read(self, kube_cluster: Any) -> None:
        core = client.CoreV1Api(api(kube_cluster))
        ns = f"pod-test-{uuid.uuid4().hex[:6]}"
        core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=ns)))
        pod = client.V1Pod(
            metadata=client.V1ObjectMeta(name="hello"),
            spec=client.V1PodSpec(
                restart_policy="Never",
                containers=[
                    client.V1Container(
                        name="hello",
                        image=kube_cluster.busybox_image,
                        command=["sh", "-c", "echo hello from $(hostname); ls /var/run/secrets"],
                    )
                ],
            ),
        )
        # the namespace's default ServiceAccount appears shortly after the namespace
        eventually(
            lambda: core.create_namespaced_pod(ns, pod), timeout=30, what="pod to be created"
        )
        phase = eventually(
            lambda: (
                p
                if (p := str(core.read_namespaced_pod("hello", ns).status.phase))
                in ("Succeeded", "Failed")
                else None
            ),
            timeout=90,
            what="pod to finish",
        )
        log = core.read_namespaced_pod_log("hello", ns)
        assert phase == "Succeeded", log
        assert "hello from hello" in log
        assert "kubernetes.io" in log  # the service-account token volume was mounted
        core.delete_namespace(ns)

    def test_a_host_network_pod_reaches_the_apiserver_with_its_token(
        self, kube_cluster: Any
    ) -> None:
        core = local_core(kube_cluster, "in_cluster_env")
        env = kube_cluster.in_cluster_env()
        sa = "/var/run/secrets/kubernetes.io/serviceaccount"
        script = (
            f'wget -q -O- --no-check-certificate --header "Authorization: Bearer $(cat {sa}/token)"'
            " https://$KUBERNETES_SERVICE_HOST:$KUBERNETES_SERVICE_PORT/api"
        )
        pod = client.V1Pod(
            metadata=client.V1ObjectMeta(name=f"api-{uuid.uuid4().hex[:6]}"),
            spec=client.V1PodSpec(
                host_network=True,
                restart_policy="Never",
                containers=[
                    client.V1Container(
                        name="c",
                        image=kube_cluster.busybox_image,
                        command=["sh", "-c", script],
                        env=[client.V1EnvVar(name=k, value=v) for k, v in env.items()],
                    )
                ],
            ),
        )
        name = str(pod.metadata.name)
        eventually(lambda: core.create_namespaced_pod("default", pod), timeout=30, what="pod")
        eventually(
            lambda: (
                str(core.read_namespaced_pod(name, "default").status.phase)
                in ("Succeeded", "Failed")
            ),
            timeout=90,
            what="pod to finish",
        )
        log = core.read_namespaced_pod_log(name, "default")
        assert '"kind":"APIVersions"' in log.replace(" ", "")
        core.delete_namespaced_pod(name, "default")

    def test_a_mount_made_in_a_bidirectional_pod_volume_reaches_the_host(
        self, kube_cluster: Any
    ) -> None:
        # what the CSI node plugin's DaemonSet relies on (the kubelet dir is a shared mount)
        core = local_core(kube_cluster, "plugins_dir")
        name = f"prop-{uuid.uuid4().hex[:6]}"
        host_dir = Path(kube_cluster.plugins_dir) / name
        pod = client.V1Pod(
            metadata=client.V1ObjectMeta(name=name),
            spec=client.V1PodSpec(
                containers=[
                    client.V1Container(
                        name="c",
                        image=kube_cluster.busybox_image,
                        security_context=client.V1SecurityContext(privileged=True),
                        command=[
                            "sh",
                            "-c",
                            "mkdir -p /k/m && mount -t tmpfs none /k/m && echo hi > /k/m/f"
                            " && sleep 3600",
                        ],
                        volume_mounts=[
                            client.V1VolumeMount(
                                name="k", mount_path="/k", mount_propagation="Bidirectional"
                            )
                        ],
                    )
                ],
                volumes=[
                    client.V1Volume(
                        name="k",
                        host_path=client.V1HostPathVolumeSource(
                            path=str(host_dir), type="DirectoryOrCreate"
                        ),
                    )
                ],
            ),
        )
        eventually(lambda: core.create_namespaced_pod("default", pod), timeout=30, what="pod")
        try:
            eventually(
                lambda: (host_dir / "m" / "f").read_text() == "hi\n",
                timeout=60,
                what="the pod's mount to appear on the host",
            )
        finally:
            core.delete_namespaced_pod(name, "default", grace_period_seconds=0)
            teardown.unmount_all(host_dir)


def taken_port() -> tuple[socket.socket, int]:
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    s.listen()
    return s, s.getsockname()[1]


class TestFailures:
    @pytest.mark.parametrize("problem", ["port taken", "bad flag"])
    def test_a_component_that_fails_to_start_raises_an_error_with_its_log_tail(
        self, tmp_path: Path, problem: str
    ) -> None:
        binary = bins.ensure(bins.CONTROL_PLANE)["kube-apiserver"]
        files = controlplane.Pki.make(tmp_path / "pki")
        holder, port = taken_port()
        extra = ["--no-such-flag"] if problem == "bad flag" else []
        with holder, pytest.raises(ComponentError) as raised:
            controlplane.start_kube_apiserver(
                binary,
                tmp_path,
                etcd_url="http://127.0.0.1:1",
                files=files,
                port=port if problem == "port taken" else None,
                extra_args=extra,
            )
        message = str(raised.value)
        assert "kube-apiserver exited before it was ready" in message
        expected = "unknown flag: --no-such-flag" if problem == "bad flag" else "address already"
        assert expected in message
        assert str(tmp_path / "logs" / "kube-apiserver.log") in message


class TestStop:
    def test_stopping_the_control_plane_leaves_no_process_running(self, tmp_path: Path) -> None:
        cluster = LocalCluster.start(tmp_path / "c", node=False)
        pids = cluster.pids()
        assert all(pid_alive(p) for p in pids)
        cluster.stop()
        assert not any(pid_alive(p) for p in pids)
        assert sorted(p.name for p in (tmp_path / "c").iterdir()) == ["logs"]

    def test_cluster_up_and_down_from_the_command_line_stop_by_recorded_pids(
        self, tmp_path: Path
    ) -> None:
        workdir = tmp_path / "state"
        cli = [sys.executable, "-m", "tests.cluster"]
        up = subprocess.run(
            [*cli, "up", "--no-node", "--dir", str(workdir)], capture_output=True, text=True
        )
        assert up.returncode == 0, up.stderr
        assert f"export KUBECONFIG={workdir / 'admin.kubeconfig'}" in up.stdout
        pids = LocalCluster.load(workdir).pids()
        assert len(pids) == 2 and all(pid_alive(p) for p in pids)
        down = subprocess.run([*cli, "down", "--dir", str(workdir)], capture_output=True, text=True)
        assert down.returncode == 0, down.stderr
        assert not any(pid_alive(p) for p in pids)

    def test_stopping_a_node_kills_its_containers_and_unmounts_everything(
        self, tmp_path: Path
    ) -> None:
        cluster = LocalCluster.start(Path(tmp_path) / "n", node=True)
        layout = cluster.layout
        try:
            core = client.CoreV1Api(api(cluster))
            pod = client.V1Pod(
                metadata=client.V1ObjectMeta(name="sleeper"),
                spec=client.V1PodSpec(
                    containers=[
                        client.V1Container(
                            name="s", image=cluster.busybox_image, command=["sleep", "3600"]
                        )
                    ]
                ),
            )
            eventually(lambda: core.create_namespaced_pod("default", pod), timeout=30, what="pod")
            eventually(
                lambda: core.read_namespaced_pod("sleeper", "default").status.phase == "Running",
                timeout=90,
                what="pod to run",
            )
            assert teardown.shim_pids(layout)
            assert teardown.mounts_under(layout.workdir)
        finally:
            pids = cluster.pids()
            cluster.stop()
        assert not any(pid_alive(p) for p in pids)
        assert teardown.shim_pids(layout) == []
        assert teardown.mounts_under(layout.workdir) == []
