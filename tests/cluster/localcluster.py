"""A single-node Kubernetes on loopback, in one work directory: the entry point of
``tests.cluster``.

``LocalCluster.start(workdir, node=False)`` runs etcd + kube-apiserver only (seconds;
enough for apply-engine tests); ``node=True`` adds kube-controller-manager,
kube-scheduler, a registry with the pause and busybox images, containerd and a kubelet,
and returns once the Node is Ready. ``stop`` ends every process by pid and undoes the
node's mounts. ``save``/``load`` keep the pids in ``state.json`` for the detached
``python -m tests.cluster up|down``.
"""

from __future__ import annotations

import contextlib
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import requests

from tests.cluster import bins, controlplane, images, node, pki, teardown
from tests.cluster.process import Component, ComponentError, log_tail, pid_alive
from tests.derived import below

# The apiserver reaches the kubelet (logs, exec) at the Node's Hostname address: the kubelet
# refuses a loopback --node-ip, and "localhost" is the one name that resolves to loopback.
NODE_NAME = "localhost"
NODE_READY_TIMEOUT = 90.0
STATE_FILE = "state.json"


@dataclass
class LocalCluster:
    """A started cluster; attributes are what tests and the CSI driver need."""

    workdir: Path
    server: str
    kubeconfig: Path
    ca_file: Path
    admin_cert: tuple[str, str]
    components: list[Component] = field(default_factory=list)
    registry_host: str = ""
    pause_image: str = ""
    busybox_image: str = ""
    node_name: str = ""
    external_registry: images.Registry | None = None

    # -- where things are ------------------------------------------------------------------

    @property
    def layout(self) -> node.NodeLayout:
        return node.NodeLayout(self.workdir)

    kubelet_dir = below("layout.kubelet_dir")
    plugins_registry_dir = below("layout.plugins_registry_dir")
    plugins_dir = below("layout.plugins_dir")
    pods_dir = below("layout.pods_dir")
    containerd_socket = below("layout.containerd_socket")
    logs_dir = below("workdir", "logs")

    @property
    def api_port(self) -> int:
        return int(self.server.rsplit(":", 1)[1])

    def in_cluster_env(self) -> dict[str, str]:
        """Environment for a ``hostNetwork`` pod's in-cluster client: the apiserver listens on
        loopback only and there is no kube-proxy, so the ``kubernetes`` Service's ClusterIP
        does not route; the pod must use 127.0.0.1 (its token and CA work as usual)."""
        return {
            "KUBERNETES_SERVICE_HOST": "127.0.0.1",
            "KUBERNETES_SERVICE_PORT": str(self.api_port),
        }

    @property
    def has_node(self) -> bool:
        return bool(self.node_name)

    # -- life cycle ------------------------------------------------------------------------

    @classmethod
    def start(
        cls,
        workdir: Path,
        *,
        node: bool = True,
        registry: images.Registry | None = None,
        binaries: dict[str, Path] | None = None,
    ) -> LocalCluster:
        """Start a cluster in ``workdir``; on any failure stop what started and re-raise.

        ``registry`` (host, url, stop) is used instead of starting one; the cluster does not
        stop it.
        """
        workdir.mkdir(parents=True, exist_ok=True)
        names = bins.ALL if node else bins.CONTROL_PLANE
        found = binaries or bins.ensure(names)
        files = controlplane.Pki.make(workdir / "pki")
        started: list[Component] = []
        cluster: LocalCluster | None = None
        try:
            etcd, etcd_url = controlplane.start_etcd(found["etcd"], workdir)
            started.append(etcd)
            apiserver, server = controlplane.start_kube_apiserver(
                found["kube-apiserver"], workdir, etcd_url=etcd_url, files=files
            )
            started.append(apiserver)
            kubeconfig = pki.kubeconfig(
                workdir / "admin.kubeconfig",
                server=server,
                ca=files.ca.cert,
                client=files.admin,
                user="admin",
            )
            cluster = cls(
                workdir=workdir,
                server=server,
                kubeconfig=kubeconfig,
                ca_file=files.ca.cert,
                admin_cert=(str(files.admin.cert), str(files.admin.key)),
                components=started,
                external_registry=registry,
            )
            if node:
                cluster._start_node(found, files)
            cluster.save()
            return cluster
        except BaseException:
            if cluster is not None:
                cluster.stop(remove=False)
            else:
                for c in reversed(started):
                    c.stop(grace=2)
            raise

    def _start_node(self, found: dict[str, Path], files: controlplane.Pki) -> None:
        wd = self.workdir
        self.components.append(
            controlplane.start_kube_controller_manager(
                found["kube-controller-manager"], wd, kubeconfig=self.kubeconfig, files=files
            )
        )
        self.components.append(
            controlplane.start_kube_scheduler(
                found["kube-scheduler"], wd, kubeconfig=self.kubeconfig
            )
        )
        if self.external_registry is None:
            own = images.start_registry(wd / "registry", log=self.logs_dir / "registry.log")
            self.components.append(own.component)
            registry_url, self.registry_host = own.url, own.host
        else:
            registry_url = self.external_registry.url
            self.registry_host = self.external_registry.host
        self.pause_image, self.busybox_image = images.push_test_images(registry_url)
        self.components.append(
            node.start_containerd(
                self.layout, registry_host=self.registry_host, pause=self.pause_image
            )
        )
        self.node_name = NODE_NAME
        kubelet, _ = node.start_kubelet(
            found["kubelet"], self.layout, ca=files.ca, node_name=NODE_NAME, server=self.server
        )
        self.components.append(kubelet)
        kubelet.wait_ready(self.node_ready, timeout=NODE_READY_TIMEOUT, interval=0.5)

    def get(self, path: str) -> requests.Response:
        """GET ``path`` from the apiserver as the admin."""
        return requests.get(
            self.server + path, cert=self.admin_cert, verify=str(self.ca_file), timeout=10
        )

    def node_ready(self) -> bool:
        resp = self.get(f"/api/v1/nodes/{self.node_name}")
        if resp.status_code != 200:
            return False
        conditions = resp.json().get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def pids(self) -> list[int]:
        return [c.pid for c in self.components]

    def stop(self, *, remove: bool = True) -> None:
        """Stop every component (reverse start order) and undo the node's host changes.

        With ``remove``, the work directory is deleted except its ``logs``. Idempotent.
        """
        for c in reversed(self.components):
            if c.name == "containerd":
                teardown.kill_containers(self.layout)
            c.stop(grace=10 if c.name == "kubelet" else 5)
        left = teardown.cleanup(self.layout) if self.has_node else []
        if left:
            raise RuntimeError(f"still mounted under {self.workdir}: {left}")
        if remove:
            for child in self.workdir.iterdir():
                if child.name in ("logs", STATE_FILE):
                    continue
                if child.is_dir() and not child.is_symlink():
                    shutil.rmtree(child, ignore_errors=True)
                else:
                    child.unlink(missing_ok=True)
        with contextlib.suppress(FileNotFoundError):
            (self.workdir / STATE_FILE).unlink()

    def log_tails(self, lines: int = 30) -> dict[str, str]:
        """The last lines of each component's log, by component name."""
        return {c.name: log_tail(c.log, lines) for c in self.components}

    # -- detached use ----------------------------------------------------------------------

    def save(self) -> Path:
        """Write ``state.json``: enough for ``load`` in another process to stop everything."""
        state = {
            "server": self.server,
            "kubeconfig": str(self.kubeconfig),
            "ca_file": str(self.ca_file),
            "admin_cert": list(self.admin_cert),
            "registry_host": self.registry_host,
            "pause_image": self.pause_image,
            "busybox_image": self.busybox_image,
            "node_name": self.node_name,
            "components": [
                {"name": c.name, "pid": c.pid, "argv0": c.argv[0], "log": str(c.log)}
                for c in self.components
            ],
        }
        path = self.workdir / STATE_FILE
        path.write_text(json.dumps(state, indent=2))
        return path

    @classmethod
    def load(cls, workdir: Path) -> LocalCluster:
        """The cluster ``save`` described; components whose pid was reused are dropped."""
        state = json.loads((workdir / STATE_FILE).read_text())
        components = []
        for c in state["components"]:
            comp = Component(name=c["name"], argv=[c["argv0"]], log=Path(c["log"]), pid=c["pid"])
            if _is_same_process(comp):
                components.append(comp)
        return cls(
            workdir=workdir,
            server=state["server"],
            kubeconfig=Path(state["kubeconfig"]),
            ca_file=Path(state["ca_file"]),
            admin_cert=(state["admin_cert"][0], state["admin_cert"][1]),
            components=components,
            registry_host=state["registry_host"],
            pause_image=state["pause_image"],
            busybox_image=state["busybox_image"],
            node_name=state["node_name"],
        )


def _is_same_process(c: Component) -> bool:
    """True if ``c.pid`` still runs ``c.argv[0]`` (and was not reused by another program)."""
    if not pid_alive(c.pid):
        return False
    try:
        exe = Path(f"/proc/{c.pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        return False
    return Path(exe).name == Path(c.argv[0]).name


__all__ = ["ComponentError", "LocalCluster"]
