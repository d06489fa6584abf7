"""A node of the multi-node local cluster: containerd, a kubelet and kube-proxy inside the
node's own network namespace and mount namespace.

Where it sits: ``localcluster`` starts one ``NodeMachine`` per node when it runs more than
one (``network`` made the namespaces). A node's files live in ``<workdir>/nodes/<name>``
on the host. A holder process (``sleep``) keeps the node's mount namespace, in which that
directory is bind-mounted, shared, on ``<workdir>/node``: every node sees its own files at
the same path, so one DaemonSet's ``hostPath`` (the kubelet root, the plugin's cache)
means each node's own directory, as on separate machines. Mounts the kubelet and CSI
plugins make stay inside the namespace and end with it.

kube-proxy runs on each node as a process (iptables mode, in the node's namespace) rather
than a DaemonSet: it is built from the same Kubernetes modules as the kubelet, and the
cluster has no image for it.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from tests.cluster import pki, teardown
from tests.cluster.network import NETNS_DIR, ClusterNetwork, Place
from tests.cluster.node import NodeLayout, start_containerd, start_kubelet
from tests.cluster.process import Component

COMMON = "node"  # below the cluster's work directory: each node's own files, as it sees them
CLUSTER_DNS = "10.0.0.10"


def node_name(i: int) -> str:
    return f"node-{i}"


@dataclass
class NodeMachine:
    """One started node: its name, address, files (host view) and processes."""

    name: str
    address: str
    netns: str
    layout: NodeLayout  # the host's view of the node's files
    components: list[Component] = field(default_factory=list)

    @property
    def holder(self) -> Component:
        return self.components[0]

    @property
    def kubelet(self) -> Component:
        return next(c for c in self.components if c.name.startswith("kubelet"))

    @property
    def place(self) -> Place:
        """Where the node's processes run: its address, inside its holder's namespaces."""
        return Place(address=self.address, prefix=enter(self.holder.pid))

    def stop(self) -> None:
        """Containers first, then kube-proxy, kubelet, containerd and the holder."""
        teardown.kill_containers(self.layout)
        for c in reversed(self.components):
            c.stop(grace=10 if c.name.startswith("kubelet") else 5)
        teardown.remove_log_links(self.layout)

    def run(self, *argv: str, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """``argv`` inside the node's namespaces (as a host-network pod of the node sees it)."""
        return subprocess.run(
            [*enter(self.holder.pid), *argv], capture_output=True, text=True, timeout=timeout
        )


def enter(holder_pid: int) -> tuple[str, ...]:
    return ("nsenter", f"--target={holder_pid}", "--mount", "--net", "--")


def common_dir(workdir: Path) -> Path:
    return workdir / COMMON


def _holder(workdir: Path, name: str, netns: str, real: Path) -> Component:
    """``sleep`` in a new mount namespace (inside ``netns``) where ``real`` is mounted on the
    common path, with shared propagation (Bidirectional volumes need it)."""
    common = common_dir(workdir)
    common.mkdir(parents=True, exist_ok=True)
    script = (
        f"mount --bind '{real}' '{common}' && mount --make-rshared '{common}' "
        "&& exec sleep 2147483647"
    )
    argv = [
        "nsenter",
        f"--net={NETNS_DIR / netns}",
        "--",
        "unshare",
        "--mount",
        "--propagation",
        "private",
        "--",
        "sh",
        "-c",
        script,
    ]
    holder = Component.start(f"holder-{name}", argv, log=real / "logs" / "holder.log")

    def mounted() -> bool:
        info = Path(f"/proc/{holder.pid}/mountinfo").read_text()
        return any(line.split()[4] == str(common) for line in info.splitlines())

    holder.wait_ready(mounted, timeout=10, interval=0.05)
    return holder


def _start_kube_proxy(
    bin_: Path, machine: NodeMachine, *, ca: pki.Pair, server: str, cidr: str
) -> Component:
    """kube-proxy of ``machine`` (started), as ``system:kube-proxy``."""
    name, layout = machine.name, machine.layout
    kubeconfig = pki.client_kubeconfig(
        ca,
        f"kube-proxy-{name}",
        layout.workdir / "kube-proxy.kubeconfig",
        server=server,
        user="system:kube-proxy",  # bound to system:node-proxier by default
    )
    config = {
        "apiVersion": "kubeproxy.config.k8s.io/v1alpha1",
        "kind": "KubeProxyConfiguration",
        "clientConnection": {"kubeconfig": str(kubeconfig)},
        "hostnameOverride": name,
        "mode": "iptables",
        "clusterCIDR": cidr,
        "healthzBindAddress": "127.0.0.1:10256",
        "metricsBindAddress": "127.0.0.1:10249",
        # this machine's conntrack table is the kernel's business, not a test node's
        "conntrack": {
            "maxPerCore": 0,
            "min": 0,
            "tcpEstablishedTimeout": "0s",
            "tcpCloseWaitTimeout": "0s",
        },
    }
    path = layout.workdir / "kube-proxy.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return Component.start(
        f"kube-proxy-{name}",
        machine.place.argv([str(bin_), f"--config={path}", "--v=1"]),
        log=layout.workdir / "logs" / "kube-proxy.log",
    )


def start_node(
    i: int,
    *,
    workdir: Path,
    net: ClusterNetwork,
    binaries: dict[str, Path],
    ca: pki.Pair,
    server: str,
    registry_host: str,
    pause: str,
) -> NodeMachine:
    """Node ``i``: holder, containerd, kubelet and kube-proxy, started (not yet Ready).

    On failure what was started is stopped and the error re-raised."""
    name = node_name(i)
    real = workdir / "nodes" / name
    real.mkdir(parents=True, exist_ok=True)
    layout = NodeLayout(real)
    machine = NodeMachine(
        name=name, address=net.node_address(i), netns=net.node_netns(i), layout=layout
    )
    try:
        machine.components.append(_holder(workdir, name, machine.netns, real))
        place = machine.place
        containerd = start_containerd(
            layout, registry_host=registry_host, pause=pause, subnet=net.pod_subnet(i), place=place
        )
        containerd.name = f"containerd-{name}"
        machine.components.append(containerd)
        kubelet, _ = start_kubelet(
            binaries["kubelet"],
            layout,
            ca=ca,
            node_name=name,
            server=server,
            place=place,
            root_dir=common_dir(workdir) / "kubelet",
            cluster_dns=CLUSTER_DNS,
        )
        kubelet.name = f"kubelet-{name}"
        machine.components.append(kubelet)
        machine.components.append(
            _start_kube_proxy(binaries["kube-proxy"], machine, ca=ca, server=server, cidr=net.cidr)
        )
    except BaseException:
        machine.stop()
        raise
    return machine
