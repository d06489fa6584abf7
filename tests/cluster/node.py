"""The node of the local cluster: containerd (own root, state and socket under the work
directory, images from the loopback registry over plain HTTP, a bridge CNI network of
its own) and a kubelet listening on 127.0.0.1, registered as ``node_name`` ("localhost":
the apiserver dials the Node's Hostname address, and the kubelet rejects a loopback
``--node-ip``).

``localcluster`` starts it after the control plane; ``teardown`` undoes what it did to
the host.
"""

from __future__ import annotations

import contextlib
import json
import random
import subprocess
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import yaml

from tests.cluster import pki, teardown
from tests.cluster.network import LOOPBACK, Place
from tests.cluster.process import Component, free_port
from tests.derived import below

CNI_BIN_DIR = "/usr/lib/cni"


@dataclass(frozen=True)
class NodeLayout:
    """Where the node keeps things, all under one work directory."""

    workdir: Path

    containerd_dir = below("workdir", "containerd")
    containerd_socket = below("containerd_dir", "containerd.sock")
    kubelet_dir = below("workdir", "kubelet")
    plugins_registry_dir = below(
        "kubelet_dir",
        "plugins_registry",
        doc="Where CSI plugins put their registration sockets for the kubelet to find.",
    )
    plugins_dir = below("kubelet_dir", "plugins")
    pods_dir = below("kubelet_dir", "pods")
    network_file = below("workdir", "cni", "network.json")


def _pick_network() -> tuple[str, str]:
    """A bridge name and a /24 that no route on this host uses yet."""
    routes = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    while True:
        a, b = random.randint(200, 249), random.randint(0, 255)
        subnet = f"10.{a}.{b}.0/24"
        if subnet not in routes:
            return f"rkp{a:02x}{b:02x}{random.randint(0, 255):02x}", subnet


def bridge_plugin(
    bridge: str, subnet: str, *, ip_masq: bool, data_dir: Path | None = None
) -> dict[str, Any]:
    """The CNI ``bridge`` plugin's entry of a conflist: pods get addresses of ``subnet``
    (host-local IPAM, kept in ``data_dir`` when given) behind ``bridge``, their gateway."""
    ipam: dict[str, Any] = {
        "type": "host-local",
        "ranges": [[{"subnet": subnet}]],
        "routes": [{"dst": "0.0.0.0/0"}],
    }
    if data_dir is not None:
        ipam["dataDir"] = str(data_dir)
    return {
        "type": "bridge",
        "bridge": bridge,
        "isGateway": True,
        "ipMasq": ip_masq,
        "hairpinMode": True,
        "ipam": ipam,
    }


def write_containerd_config(
    layout: NodeLayout, *, registry_host: str, pause: str, subnet: str | None = None
) -> Path:
    """containerd's config.toml, the registry's hosts.toml and the CNI conflist (pods on
    ``subnet``, or on a /24 picked here that no host route uses)."""
    d = layout.containerd_dir
    certs_d = d / "certs.d"
    (certs_d / registry_host).mkdir(parents=True, exist_ok=True)
    (certs_d / registry_host / "hosts.toml").write_text(
        f'server = "http://{registry_host}"\n\n'
        f'[host."http://{registry_host}"]\n'
        '  capabilities = ["pull", "resolve", "push"]\n'
    )
    bridge, picked = _pick_network()
    subnet = subnet or picked
    cni_conf = layout.workdir / "cni" / "net.d"
    cni_conf.mkdir(parents=True, exist_ok=True)
    layout.network_file.write_text(json.dumps({"bridge": bridge, "subnet": subnet}))
    conflist = {
        "cniVersion": "0.4.0",
        "name": f"rukpak-{bridge}",
        "plugins": [
            bridge_plugin(bridge, subnet, ip_masq=False, data_dir=layout.workdir / "cni" / "ipam")
        ],
    }
    (cni_conf / "10-rukpak.conflist").write_text(json.dumps(conflist, indent=2))
    cri = 'plugins."io.containerd.grpc.v1.cri"'
    config = f"""version = 2
root = "{d / "root"}"
state = "{d / "state"}"
disabled_plugins = [
  "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.zfs",
  "io.containerd.snapshotter.v1.aufs",
  "io.containerd.snapshotter.v1.devmapper",
]

[grpc]
  address = "{layout.containerd_socket}"

[ttrpc]
  address = "{layout.containerd_socket}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{d / "opt"}"

[{cri}]
  sandbox_image = "{pause}"
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  netns_mounts_under_state_dir = true
  # this host withholds CAP_SYS_RESOURCE: oom_score_adj may not go below our own
  restrict_oom_score_adj = true

[{cri}.containerd]
  snapshotter = "overlayfs"
  default_runtime_name = "runc"

[{cri}.containerd.runtimes.runc]
  runtime_type = "io.containerd.runc.v2"

[{cri}.containerd.runtimes.runc.options]
  SystemdCgroup = false
  Root = "{d / "runc"}"

[{cri}.cni]
  bin_dir = "{CNI_BIN_DIR}"
  conf_dir = "{cni_conf}"

[{cri}.registry]
  config_path = "{certs_d}"
"""
    path = d / "config.toml"
    path.write_text(config)
    return path


def start_containerd(
    layout: NodeLayout,
    *,
    registry_host: str,
    pause: str,
    subnet: str | None = None,
    place: Place = LOOPBACK,
) -> Component:
    """containerd serving CRI on ``layout.containerd_socket``."""
    config = write_containerd_config(
        layout, registry_host=registry_host, pause=pause, subnet=subnet
    )
    with contextlib.suppress(FileNotFoundError):
        layout.containerd_socket.unlink()
    containerd = Component.start(
        "containerd",
        place.argv(["containerd", "--config", str(config)]),
        log=layout.workdir / "logs" / "containerd.log",
    )
    containerd.wait_ready(layout.containerd_socket.exists, timeout=30)
    return containerd


def write_kubelet_config(
    layout: NodeLayout,
    *,
    ca: pki.Pair,
    node_name: str,
    server: str,
    address: str = "127.0.0.1",
    cluster_dns: str | None = None,
) -> tuple[Path, Path, int]:
    """The kubelet's config file and kubeconfig; and its healthz port. The kubelet serves
    on ``address``; pods resolve names through ``cluster_dns`` when given."""
    d = layout.kubelet_dir
    d.mkdir(parents=True, exist_ok=True)
    kubeconfig = pki.client_kubeconfig(
        ca,
        f"kubelet-client-{node_name}",
        layout.workdir / "kubelet.kubeconfig",
        server=server,
        user=f"system:node:{node_name}",
        orgs=("system:nodes",),
    )
    serving = pki.issue(
        ca,
        f"kubelet-serving-{node_name}",
        cn=node_name,
        sans=("IP:127.0.0.1", f"IP:{address}", f"DNS:{node_name}", "DNS:localhost"),
        server=True,
    )
    healthz_port = free_port()
    socket = f"unix://{layout.containerd_socket}"
    config = {
        "apiVersion": "kubelet.config.k8s.io/v1beta1",
        "kind": "KubeletConfiguration",
        "address": address,
        "port": free_port(),
        "readOnlyPort": 0,
        "healthzBindAddress": "127.0.0.1",
        "healthzPort": healthz_port,
        "tlsCertFile": str(serving.cert),
        "tlsPrivateKeyFile": str(serving.key),
        "authentication": {
            "anonymous": {"enabled": False},
            "webhook": {"enabled": True},
            "x509": {"clientCAFile": str(ca.cert)},
        },
        "authorization": {"mode": "Webhook"},
        "containerRuntimeEndpoint": socket,
        "imageServiceEndpoint": socket,
        "cgroupDriver": "cgroupfs",
        "cgroupsPerQOS": False,
        "enforceNodeAllocatable": [],
        "failSwapOn": False,
        "failCgroupV1": False,
        "podLogsDir": str(layout.workdir / "pod-logs"),
        "volumePluginDir": str(layout.workdir / "volume-plugins"),
        "evictionHard": {
            "memory.available": "1Mi",
            "nodefs.available": "1%",
            "nodefs.inodesFree": "1%",
            "imagefs.available": "1%",
        },
        "imageGCHighThresholdPercent": 100,
        "imageGCLowThresholdPercent": 99,
        "localStorageCapacityIsolation": False,
        "serializeImagePulls": False,
        "nodeStatusUpdateFrequency": "5s",
        "syncFrequency": "10s",
        "shutdownGracePeriod": "0s",
        "rotateCertificates": False,
        "serverTLSBootstrap": False,
    }
    if cluster_dns:
        config |= {"clusterDNS": [cluster_dns], "clusterDomain": "cluster.local"}
        # a node of its own /24: room for the benchmarks' bursts (kubelet's default is 110)
        config["maxPods"] = 250
    path = layout.workdir / "kubelet-config.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    return path, kubeconfig, healthz_port


def make_shared_mount(path: Path) -> None:
    """Bind-mount ``path`` on itself with shared propagation: mounts a CSI plugin makes under
    the kubelet dir then reach pods, and Bidirectional volumes are allowed (this host's
    mounts are all private). ``teardown.unmount_all`` removes it with the rest."""
    path.mkdir(parents=True, exist_ok=True)
    if str(path.resolve()) not in teardown.mounts_under(path):
        subprocess.run(["mount", "--bind", str(path), str(path)], check=True)
    subprocess.run(["mount", "--make-rshared", str(path)], check=True)


def start_kubelet(
    bin_: Path,
    layout: NodeLayout,
    *,
    ca: pki.Pair,
    node_name: str,
    server: str,
    place: Place = LOOPBACK,
    root_dir: Path | None = None,
    cluster_dns: str | None = None,
) -> tuple[Component, int]:
    """The kubelet (started; the caller waits for its Node to be Ready) and its healthz port.

    On loopback the kubelet dir is made a shared mount here; in a node's namespaces
    (``place``) its holder did that, and ``root_dir`` is the dir as the node sees it."""
    config, kubeconfig, healthz_port = write_kubelet_config(
        layout,
        ca=ca,
        node_name=node_name,
        server=server,
        address=place.address,
        cluster_dns=cluster_dns,
    )
    if place == LOOPBACK:
        make_shared_mount(layout.kubelet_dir)
    root = root_dir or layout.kubelet_dir
    argv = [
        *place.prefix,
        str(bin_),
        f"--config={config}",
        f"--kubeconfig={kubeconfig}",
        f"--root-dir={root}",
        f"--cert-dir={root / 'pki'}",
        f"--hostname-override={node_name}",
        *([] if place == LOOPBACK else [f"--node-ip={place.address}"]),
        "--v=2",
    ]
    kubelet = Component.start("kubelet", argv, log=layout.workdir / "logs" / "kubelet.log")
    return kubelet, healthz_port
