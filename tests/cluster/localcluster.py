"""A local Kubernetes in one work directory: the entry point of ``tests.cluster``.

``LocalCluster.start(workdir, node=False)`` runs etcd + kube-apiserver only (seconds;
enough for apply-engine tests); ``node=True`` adds kube-controller-manager,
kube-scheduler, a registry with the pause and busybox images, containerd and a kubelet,
all on loopback, and returns once the Node is Ready. ``nodes=N`` (N > 1, or 1 with
``networked``) starts a cluster with Service networking instead: the control plane in a
network namespace of its own, N nodes each in their own network and mount namespaces
(``machines``, ``network``) with kube-proxy, pods routed across nodes, and CoreDNS
behind the ``kube-dns`` Service (``dns``). ``stop`` ends every process by pid and undoes
the nodes' mounts and network. ``save``/``load`` keep the pids in ``state.json`` for the
detached ``python -m tests.cluster up|down``.
"""

from __future__ import annotations

import contextlib
import functools
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import requests

from tests.cluster import bins, controlplane, dns, images, machines, node, pki, teardown
from tests.cluster.machines import NodeMachine
from tests.cluster.network import LOOPBACK, ClusterNetwork, Place
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
    machines: list[NodeMachine] = field(default_factory=list)
    network: ClusterNetwork | None = None

    # -- where things are ------------------------------------------------------------------

    @property
    def layout(self) -> node.NodeLayout:
        """The node's files; on a multi-node cluster, the first node's, as the host sees them
        (the mounts its kubelet made are inside its namespace)."""
        if self.machines:
            return self.machines[0].layout
        return node.NodeLayout(self.workdir)

    @property
    def kubelet_dir(self) -> Path:
        """The kubelet root as pods' ``hostPath`` see it (on every node the same path)."""
        if self.machines:
            return machines.common_dir(self.workdir) / "kubelet"
        return self.layout.kubelet_dir

    @property
    def node_names(self) -> list[str]:
        return [m.name for m in self.machines] or ([self.node_name] if self.node_name else [])

    @property
    def multinode(self) -> bool:
        return bool(self.machines)

    plugins_registry_dir = below("layout.plugins_registry_dir")
    plugins_dir = below("layout.plugins_dir")
    pods_dir = below("layout.pods_dir")
    containerd_socket = below("layout.containerd_socket")
    logs_dir = below("workdir", "logs")

    @property
    def api_port(self) -> int:
        return int(self.server.rsplit(":", 1)[1])

    @property
    def api_host(self) -> str:
        return self.server.split("://", 1)[1].rsplit(":", 1)[0]

    def in_cluster_env(self) -> dict[str, str]:
        """Environment for a ``hostNetwork`` pod's in-cluster client. On one node the apiserver
        listens on loopback only and there is no kube-proxy, so the ``kubernetes`` Service's
        ClusterIP does not route; the pod must use 127.0.0.1 (its token and CA work as
        usual). On several nodes it is the control plane's address, which every node reaches
        (the Service works there too)."""
        return {
            "KUBERNETES_SERVICE_HOST": self.api_host,
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
        nodes: int = 1,
        networked: bool = False,
        registry: images.Registry | None = None,
        binaries: dict[str, Path] | None = None,
    ) -> LocalCluster:
        """Start a cluster in ``workdir``; on any failure stop what started and re-raise.

        ``registry`` (host, url, stop) is used instead of starting one; the cluster does not
        stop it. ``nodes`` > 1, or ``networked``, starts the cluster of nodes in their own
        namespaces, with kube-proxy and CoreDNS (and its own registry, which the nodes reach).
        """
        workdir.mkdir(parents=True, exist_ok=True)
        if nodes > 1 or networked:
            return cls._start_multinode(workdir, nodes, binaries)
        names = bins.CLUSTER if node else bins.CONTROL_PLANE
        found = binaries or bins.ensure(names)
        files = controlplane.Pki.make(workdir / "pki")
        started: list[Component] = []
        cluster: LocalCluster | None = None
        try:
            cluster = cls._with_apiserver(
                workdir, found, files, started, external_registry=registry
            )
            if node:
                cluster._start_node(found, files)
            cluster.save()
            return cluster
        except BaseException:
            _undo(cluster, started)
            raise

    @classmethod
    def _with_apiserver(
        cls,
        workdir: Path,
        found: dict[str, Path],
        files: controlplane.Pki,
        started: list[Component],
        *,
        place: Place = LOOPBACK,
        extra_args: tuple[str, ...] = (),
        **fields: Any,
    ) -> LocalCluster:
        """etcd and kube-apiserver started (appended to ``started``) and the admin
        kubeconfig written: the cluster as far as that, with ``fields`` set."""
        etcd, etcd_url = controlplane.start_etcd(found["etcd"], workdir, place=place)
        started.append(etcd)
        apiserver, server = controlplane.start_kube_apiserver(
            found["kube-apiserver"],
            workdir,
            etcd_url=etcd_url,
            files=files,
            place=place,
            extra_args=extra_args,
        )
        started.append(apiserver)
        kubeconfig = pki.kubeconfig(
            workdir / "admin.kubeconfig",
            server=server,
            ca=files.ca.cert,
            client=files.admin,
            user="admin",
        )
        return cls(
            workdir=workdir,
            server=server,
            kubeconfig=kubeconfig,
            ca_file=files.ca.cert,
            admin_cert=(str(files.admin.cert), str(files.admin.key)),
            components=started,
            **fields,
        )

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

    @classmethod
    def _start_multinode(
        cls, workdir: Path, count: int, binaries: dict[str, Path] | None
    ) -> LocalCluster:
        found = binaries or bins.ensure(bins.NETWORKED)
        net = ClusterNetwork.create(workdir, count)
        cp = net.control_plane
        started: list[Component] = []
        cluster: LocalCluster | None = None
        try:
            files = controlplane.Pki.make(workdir / "pki", addresses=(cp.address,))
            cluster = cls._with_apiserver(
                workdir,
                found,
                files,
                started,
                place=cp,
                # webhooks and conversion are dialled at their endpoints (the control plane
                # has routes to every pod subnet, and no kube-proxy of its own)
                extra_args=("--enable-aggregator-routing=true",),
                network=net,
            )
            cluster._start_machines(found, files, count)
            cluster.save()
            return cluster
        except BaseException:
            _undo(cluster, started, net)
            raise

    def _start_machines(self, found: dict[str, Path], files: controlplane.Pki, count: int) -> None:
        """Controllers, registry and images in the control plane's namespace; then the nodes,
        and CoreDNS once they are Ready."""
        assert self.network is not None
        cp, wd = self.network.control_plane, self.workdir
        self.components.append(
            controlplane.start_kube_controller_manager(
                found["kube-controller-manager"],
                wd,
                kubeconfig=self.kubeconfig,
                files=files,
                place=cp,
                # a lost node is NotReady (and unreachable-tainted) after 20 s, not 50 s
                extra_args=("--node-monitor-grace-period=20s",),
            )
        )
        self.components.append(
            controlplane.start_kube_scheduler(
                found["kube-scheduler"], wd, kubeconfig=self.kubeconfig, place=cp
            )
        )
        own = images.start_registry(wd / "registry", log=self.logs_dir / "registry.log", place=cp)
        self.components.append(own.component)
        self.registry_host = own.host
        self.pause_image, self.busybox_image = images.push_test_images(own.url)
        for i in range(1, count + 1):
            self.machines.append(
                machines.start_node(
                    i,
                    workdir=wd,
                    net=self.network,
                    binaries=found,
                    ca=files.ca,
                    server=self.server,
                    registry_host=own.host,
                    pause=self.pause_image,
                )
            )
        self.node_name = self.machines[0].name
        for m in self.machines:
            m.kubelet.wait_ready(
                functools.partial(self.node_ready, m.name),
                timeout=NODE_READY_TIMEOUT,
                interval=0.5,
            )
        dns.install(
            kubectl=found["kubectl"],
            kubeconfig=self.kubeconfig,
            binary=found["coredns"],
            registry_url=own.url,
            cluster_ip=machines.CLUSTER_DNS,
        )

    def get(self, path: str) -> requests.Response:
        """GET ``path`` from the apiserver as the admin."""
        return requests.get(
            self.server + path, cert=self.admin_cert, verify=str(self.ca_file), timeout=10
        )

    def node_ready(self, name: str = "") -> bool:
        resp = self.get(f"/api/v1/nodes/{name or self.node_name}")
        if resp.status_code != 200:
            return False
        conditions = resp.json().get("status", {}).get("conditions", [])
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    def pids(self) -> list[int]:
        return [c.pid for m in self.machines for c in m.components] + [
            c.pid for c in self.components
        ]

    def stop(self, *, remove: bool = True) -> None:
        """Stop every component (reverse start order) and undo the node's host changes.

        With ``remove``, the work directory is deleted except its ``logs`` (the nodes' logs
        are copied there). Idempotent.
        """
        for m in reversed(self.machines):
            m.stop()
        for c in reversed(self.components):
            if c.name == "containerd":
                teardown.kill_containers(self.layout)
            c.stop(grace=10 if c.name == "kubelet" else 5)
        left = teardown.cleanup(self.layout) if self.has_node else []
        if self.network is not None:
            self.network.teardown()
        if left:
            raise RuntimeError(f"still mounted under {self.workdir}: {left}")
        if remove:
            for m in self.machines:
                if (m.layout.workdir / "logs").is_dir():
                    shutil.copytree(
                        m.layout.workdir / "logs", self.logs_dir / m.name, dirs_exist_ok=True
                    )
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
        every = [*self.components, *(c for m in self.machines for c in m.components)]
        return {c.name: log_tail(c.log, lines) for c in every}

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
            "components": [_record(c) for c in self.components],
            "machines": [
                {
                    "name": m.name,
                    "address": m.address,
                    "netns": m.netns,
                    "workdir": str(m.layout.workdir),
                    "components": [_record(c) for c in m.components],
                }
                for m in self.machines
            ],
        }
        path = self.workdir / STATE_FILE
        path.write_text(json.dumps(state, indent=2))
        return path

    @classmethod
    def load(cls, workdir: Path) -> LocalCluster:
        """The cluster ``save`` described; components whose pid was reused are dropped."""
        state = json.loads((workdir / STATE_FILE).read_text())
        nodes = [
            NodeMachine(
                name=m["name"],
                address=m["address"],
                netns=m["netns"],
                layout=node.NodeLayout(Path(m["workdir"])),
                components=_alive(m["components"]),
            )
            for m in state.get("machines", [])
        ]
        return cls(
            workdir=workdir,
            server=state["server"],
            kubeconfig=Path(state["kubeconfig"]),
            ca_file=Path(state["ca_file"]),
            admin_cert=(state["admin_cert"][0], state["admin_cert"][1]),
            components=_alive(state["components"]),
            registry_host=state["registry_host"],
            pause_image=state["pause_image"],
            busybox_image=state["busybox_image"],
            node_name=state["node_name"],
            machines=nodes,
            network=ClusterNetwork.load(workdir),
        )


def _undo(
    cluster: LocalCluster | None, started: list[Component], network: ClusterNetwork | None = None
) -> None:
    """After a failed start: stop the cluster as far as it got (its ``stop`` removes its
    network too), or the processes started before it existed, and the network."""
    if cluster is not None:
        cluster.stop(remove=False)
        return
    for c in reversed(started):
        c.stop(grace=2)
    if network is not None:
        network.teardown()


def _record(c: Component) -> dict[str, object]:
    """What ``load`` needs of a component: the program its pid runs (after ``nsenter``)."""
    try:
        argv0 = Path(f"/proc/{c.pid}/cmdline").read_bytes().split(b"\0")[0].decode()
    except OSError:
        argv0 = c.argv[0]
    return {"name": c.name, "pid": c.pid, "argv0": argv0, "log": str(c.log)}


def _alive(records: list[dict[str, object]]) -> list[Component]:
    found = []
    for c in records:
        comp = Component(
            name=str(c["name"]),
            argv=[str(c["argv0"])],
            log=Path(str(c["log"])),
            pid=int(str(c["pid"])),
        )
        if _is_same_process(comp):
            found.append(comp)
    return found


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
