"""Helpers for the end-to-end tests: our CSI node plugin as a host process registered with
the local cluster's kubelet, bundle images pushed where the node pulls from, pods that
mount bundles, and small waits.

Where it sits: ``tests/test_e2e_csi.py`` uses it with the ``kube_cluster`` fixture
(``tests.cluster``). The plugin runs beside the kubelet (there is no container image of
it), serves kubelet's plugin registration itself in ``plugins_registry_dir`` and its CSI
socket at ``plugins_dir/<driver>/csi.sock``, exactly where a DaemonSet would put them.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import subprocess
import sys
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Self

import pytest
import yaml
from kubernetes import client
from kubernetes.client.exceptions import ApiException

from tests.csi_helpers import terminate
from tests.polling import eventually

REPO_ROOT = Path(__file__).resolve().parent.parent
DRIVER = "csi.rukpak.io"
CSIDRIVER_YAML = REPO_ROOT / "storageclass" / "csidriver.yaml"
HELLO_BUNDLE = REPO_ROOT / "examples" / "bundles" / "hello"

_OCTAL = re.compile(r"\\([0-7]{3})")


# --- the plugin on the host ---------------------------------------------------------------


@dataclass
class HostPlugin:
    """``python -m csi.plugin`` as a host process of the cluster's node, stopped by pid."""

    kubelet_dir: Path
    registration_dir: Path
    plugins_dir: Path
    node_id: str
    driver: str = DRIVER
    workdir: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="rk-plugin-")))
    process: subprocess.Popen[bytes] | None = None

    @classmethod
    def for_cluster(cls, cluster: Any) -> HostPlugin:
        return cls(
            kubelet_dir=Path(cluster.kubelet_dir),
            registration_dir=Path(cluster.plugins_registry_dir),
            plugins_dir=Path(cluster.plugins_dir),
            node_id=cluster.node_name,
        )

    @property
    def socket(self) -> Path:
        return self.plugins_dir / self.driver / "csi.sock"

    @property
    def registration_socket(self) -> Path:
        return self.registration_dir / f"{self.driver}-reg.sock"

    @property
    def log_path(self) -> Path:
        return self.workdir / "plugin.log"

    def argv(self) -> list[str]:
        return [
            sys.executable, "-m", "csi.plugin",
            "--endpoint", f"unix://{self.socket}",
            "--driver-name", self.driver,
            "--node-id", self.node_id,
            "--state-dir", str(self.workdir / "state"),
            "--kubelet-dir", str(self.kubelet_dir),
            "--registration-dir", str(self.registration_dir),
            "--registry-timeout", "10",
        ]  # fmt: skip

    def start(self) -> HostPlugin:
        """Start the plugin and wait for its registration socket (kubelet then dials it)."""
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                self.argv(),
                cwd=REPO_ROOT,
                stdout=log,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        try:
            eventually(
                lambda: self._alive() and self.registration_socket.is_socket(),
                timeout=20,
                what="the plugin's registration socket",
            )
        except AssertionError:
            self.stop()
            raise RuntimeError(f"plugin did not start:\n{self.log()}") from None
        return self

    @contextlib.contextmanager
    def registered(self, api_client: client.ApiClient) -> Iterator[Self]:
        """The CSIDriver object applied and the plugin started until the block ends; then
        the plugin stopped, the CSIDriver deleted and the plugin's state removed."""
        apply_csidriver(api_client)
        self.start()
        try:
            yield self
        finally:
            self.stop()
            client.StorageV1Api(api_client).delete_csi_driver(DRIVER)
            self.remove_state()

    def _alive(self) -> bool:
        if self.process is None or self.process.poll() is not None:
            raise RuntimeError(f"plugin exited:\n{self.log()}")
        return True

    def log(self) -> str:
        try:
            return self.log_path.read_text(errors="replace")
        except OSError:
            return ""

    def stop(self) -> int | None:
        """SIGTERM, SIGKILL after a grace period; then remove its state (unmounted by now)."""
        return None if self.process is None else terminate(self.process)

    def remove_state(self) -> None:
        if not mounts_under(self.workdir):
            shutil.rmtree(self.workdir, ignore_errors=True)


@dataclass(frozen=True)
class Mount:
    """One line of /proc/self/mountinfo: where, its per-mount options, and whether
    they hold ``ro``."""

    mount_point: Path
    options: tuple[str, ...]
    read_only: bool


def mounts_under(root: Path, *, pid: int | None = None) -> list[Mount]:
    """Mounts at or below ``root`` in this mount namespace, or in that of process ``pid``
    (a node of the multi-node cluster), read straight from /proc/<pid>/mountinfo (not
    through the plugin's own mount code, which is under test)."""
    real = Path(root).resolve()
    found = []
    for line in Path(f"/proc/{pid or 'self'}/mountinfo").read_text().splitlines():
        fields = line.split(" ")
        point = Path(_OCTAL.sub(lambda m: chr(int(m.group(1), 8)), fields[4]))
        if point.is_relative_to(real):
            options = tuple(fields[5].split(","))
            found.append(Mount(point, options, read_only="ro" in options))
    return found


# --- cluster objects ----------------------------------------------------------------------


def require_local_node(cluster: Any) -> None:
    """Skip unless ``cluster`` is the local cluster, whose node and kubelet dirs these
    end-to-end tests use (a cluster from ``KUBECONFIG`` has neither)."""
    if getattr(cluster, "plugins_dir", None) is None or not getattr(cluster, "registry_host", ""):
        pytest.skip("needs the local cluster's node (KUBECONFIG points at another cluster)")


@pytest.fixture(scope="module")
def api_client(kube_cluster: Any) -> Iterator[client.ApiClient]:
    """An API client for the local cluster (skips elsewhere, see ``require_local_node``)."""
    require_local_node(kube_cluster)
    with api(kube_cluster) as c:
        yield c


@pytest.fixture(scope="module")
def core(api_client: client.ApiClient) -> client.CoreV1Api:
    return client.CoreV1Api(api_client)


def api(cluster: Any) -> client.ApiClient:
    from kubernetes import config

    made: client.ApiClient = config.new_client_from_config(  # type: ignore[no-untyped-call]
        config_file=str(cluster.kubeconfig)
    )
    return made


def apply_csidriver(api_client: client.ApiClient) -> dict[str, Any]:
    """Create (or replace) the CSIDriver object of ``storageclass/csidriver.yaml``."""
    body = yaml.safe_load(CSIDRIVER_YAML.read_text())
    storage = client.StorageV1Api(api_client)
    try:
        storage.create_csi_driver(body)
    except ApiException as e:
        if e.status != 409:
            raise
        storage.delete_csi_driver(body["metadata"]["name"])
        eventually(
            lambda: _absent(lambda: storage.read_csi_driver(body["metadata"]["name"])),
            timeout=30,
            what="the old CSIDriver to go",
        )
        storage.create_csi_driver(body)
    return body  # type: ignore[no-any-return]


def _absent(read: Callable[[], object]) -> bool:
    try:
        read()
    except ApiException as e:
        if e.status == 404:
            return True
        raise
    return False


def csinode_drivers(api_client: client.ApiClient, node_name: str) -> dict[str, str]:
    """Driver name → node ID, as the kubelet recorded them on the Node's CSINode.

    Read as JSON: the typed client refuses a CSINode whose ``spec.drivers`` is null
    (no driver registered)."""
    raw: Any = client.StorageV1Api(api_client).read_csi_node(node_name, _preload_content=False)
    spec = json.loads(raw.data).get("spec") or {}
    return {d["name"]: d["nodeID"] for d in spec.get("drivers") or []}


def run_tool(
    argv: list[str], *, what: str, timeout: float, check: bool = True, stdin: str | None = None
) -> str:
    """Run a command-line tool; its stdout, or RuntimeError naming ``what`` with both streams."""
    done = subprocess.run(
        argv, capture_output=True, text=True, timeout=timeout, input=stdin, check=False
    )
    if check and done.returncode != 0:
        raise RuntimeError(f"{what} failed:\n{done.stdout}{done.stderr}")
    return done.stdout


def push_bundle(directory: Path, ref: str, *, insecure: bool = False) -> str:
    """``rukpak bundle build DIR --tag REF --push [--insecure]``; return its output."""
    rukpak = Path(sys.executable).parent / "rukpak"
    flags = ["--insecure"] if insecure else []
    return run_tool(
        [str(rukpak), "bundle", "build", str(directory), "--tag", ref, "--push", *flags],
        what=f"pushing {directory} to {ref}",
        timeout=120,
    )


def bundle_pod(
    name: str,
    *,
    image: str,
    command: str,
    volume: client.V1Volume,
    mount_path: str = "/bundle",
    read_only: bool = True,
) -> client.V1Pod:
    """A one-container busybox pod (``image``) running ``sh -c command`` beside a volume."""
    return client.V1Pod(
        metadata=client.V1ObjectMeta(name=name, labels={"app.kubernetes.io/part-of": "rukpak"}),
        spec=client.V1PodSpec(
            restart_policy="Never",
            termination_grace_period_seconds=1,
            containers=[
                client.V1Container(
                    name="reader",
                    image=image,
                    command=["sh", "-c", command],
                    volume_mounts=[
                        client.V1VolumeMount(
                            name=volume.name, mount_path=mount_path, read_only=read_only
                        )
                    ],
                )
            ],
            volumes=[volume],
        ),
    )


def inline_bundle_volume(image: str, *, name: str = "bundle") -> client.V1Volume:
    """``csi: {driver: csi.rukpak.io, readOnly: true, volumeAttributes: {image: ...}}``."""
    return client.V1Volume(
        name=name,
        csi=client.V1CSIVolumeSource(
            driver=DRIVER, read_only=True, volume_attributes={"image": image}
        ),
    )


def claim_volume(claim: str, *, name: str = "bundle") -> client.V1Volume:
    return client.V1Volume(
        name=name,
        persistent_volume_claim=client.V1PersistentVolumeClaimVolumeSource(
            claim_name=claim, read_only=True
        ),
    )


@contextlib.contextmanager
def temporary_namespace(core: client.CoreV1Api, prefix: str) -> Iterator[str]:
    """A fresh namespace ``PREFIX-xxxxxx``, deleted (with what it holds) afterwards."""
    name = f"{prefix}-{uuid.uuid4().hex[:6]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=name)))
    try:
        yield name
    finally:
        core.delete_namespace(name, grace_period_seconds=0)


def start_bundle_pod(core: client.CoreV1Api, namespace: str, name: str, **pod: Any) -> client.V1Pod:
    """Create ``bundle_pod(name, **pod)`` (image, command, volume, ...) in ``namespace``."""
    return create_pod(core, namespace, bundle_pod(name, **pod))


def create_pod(core: client.CoreV1Api, namespace: str, pod: client.V1Pod) -> client.V1Pod:
    # a new namespace's default ServiceAccount appears shortly after the namespace
    return eventually(
        lambda: core.create_namespaced_pod(namespace, pod), timeout=30, what="the pod's creation"
    )


def wait_phase(
    core: client.CoreV1Api, namespace: str, name: str, phases: tuple[str, ...], *, timeout: float
) -> Any:
    def check() -> Any:
        pod: Any = core.read_namespaced_pod(name, namespace)
        return pod if pod.status.phase in phases else None

    try:
        return eventually(check, timeout=timeout, what=f"pod {namespace}/{name} to be {phases}")
    except AssertionError as e:
        raise AssertionError(f"{e}\nevents:\n{pod_events(core, namespace, name)}") from None


def pod_events(core: client.CoreV1Api, namespace: str, name: str) -> str:
    events = core.list_namespaced_event(
        namespace, field_selector=f"involvedObject.kind=Pod,involvedObject.name={name}"
    ).items
    return "\n".join(f"{e.type} {e.reason}: {e.message}" for e in events)


def failed_mount_messages(core: client.CoreV1Api, namespace: str, name: str) -> list[str]:
    events = core.list_namespaced_event(
        namespace,
        field_selector=f"involvedObject.kind=Pod,involvedObject.name={name},reason=FailedMount",
    ).items
    return [e.message or "" for e in events]


def delete_pod_and_wait(
    core: client.CoreV1Api, namespace: str, name: str, *, timeout: float = 60
) -> None:
    core.delete_namespaced_pod(name, namespace, grace_period_seconds=0)
    eventually(
        lambda: _absent(lambda: core.read_namespaced_pod(name, namespace)),
        timeout=timeout,
        what=f"pod {namespace}/{name} to be gone",
    )


def csi_target_path(kubelet_dir: Path, pod_uid: str, volume: str) -> Path:
    """Where the kubelet asks a CSI driver to publish a pod's volume."""
    return kubelet_dir / "pods" / pod_uid / "volumes" / "kubernetes.io~csi" / volume / "mount"


@dataclass(frozen=True)
class BundlePods:
    """A test's busybox pods in ``namespace`` that mount a bundle volume at /bundle."""

    core: client.CoreV1Api
    namespace: str
    image: str  # busybox, as the node has it
    kubelet_dir: Path

    @classmethod
    def on(cls, cluster: Any, core: client.CoreV1Api, namespace: str) -> BundlePods:
        return cls(core, namespace, str(cluster.busybox_image), Path(cluster.kubelet_dir))

    def start(self, prefix: str, command: str, volume: client.V1Volume, **pod: Any) -> str:
        """Start pod ``prefix-<random>`` running ``sh -c command`` with ``volume`` at
        /bundle (``bundle_pod`` takes ``pod``); its name."""
        name = f"{prefix}-{uuid.uuid4().hex[:6]}"
        start_bundle_pod(
            self.core, self.namespace, name, image=self.image, command=command, volume=volume, **pod
        )
        return name

    def running(self, name: str) -> Any:
        """Pod ``name`` once it runs."""
        return wait_phase(self.core, self.namespace, name, ("Running",), timeout=90)

    def log(self, name: str) -> str:
        log: str = self.core.read_namespaced_pod_log(name, self.namespace)
        return log

    def delete(self, name: str) -> None:
        delete_pod_and_wait(self.core, self.namespace, name)

    def target(self, pod: Any) -> Path:
        """Where the kubelet asked the driver to publish ``pod``'s "bundle" volume."""
        return csi_target_path(self.kubelet_dir, pod.metadata.uid, "bundle").resolve()
