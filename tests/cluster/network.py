"""The network of the multi-node local cluster: one bridge on the host and a network
namespace per machine (the control plane, and each node), wired to it by a veth pair.

Where it sits: ``localcluster`` makes a ``ClusterNetwork`` when it starts more than one
node. Every address lives in ``10.A.0.0/16``, a block no route of this host uses:

- ``10.A.0.1`` the host's end of the bridge (nothing listens there);
- ``10.A.0.2`` the control plane's namespace (etcd, kube-apiserver, the controllers, the
  registry);
- ``10.A.0.(10+i)`` node ``i``'s namespace (containerd, kubelet, kube-proxy, host-network
  pods); its pods get ``10.A.i.0/24`` on a bridge inside that namespace.

Each namespace has routes to every other node's pod subnet through that node's address,
so pods reach each other across nodes, and the control plane reaches pods (webhooks,
``--enable-aggregator-routing``). A node routes the Service range (:data:`SERVICE_CIDR`)
to the control plane, as a real node's default route would: a host-network process
(the node plugin) dialing a Service address needs a route for the lookup that precedes
kube-proxy's rewrite. No namespace has a default route and nothing is masqueraded to the
outside: no address here leads out of the machine.

``Place`` says where a component runs (loopback on the host, or inside a namespace) and
prefixes its argv with ``nsenter``. ``teardown`` removes the namespaces and the bridge
from the record ``save`` wrote, so ``python -m tests.cluster down`` can undo it.
"""

from __future__ import annotations

import json
import random
import subprocess
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

NETNS_DIR = Path("/run/netns")
RECORD = "network.json"
NODE_OFFSET = 10


SERVICE_CIDR = "10.0.0.0/24"
"""The cluster's Service addresses (kube-apiserver's ``--service-cluster-ip-range``)."""


@dataclass(frozen=True)
class Place:
    """Where a component runs: an address it binds and the argv prefix that gets it there."""

    address: str = "127.0.0.1"
    prefix: tuple[str, ...] = ()

    def argv(self, argv: Sequence[str]) -> list[str]:
        return [*self.prefix, *argv]


LOOPBACK = Place()


def _ip(*args: str) -> None:
    proc = subprocess.run(["ip", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        raise RuntimeError(f"ip {' '.join(args)}: {proc.stderr.strip()}")


def _sysctl(netns: str, key: str, value: str) -> None:
    # /proc/sys/net is the namespace of the reader: write it from inside
    subprocess.run(
        ["nsenter", f"--net={NETNS_DIR / netns}", "--", "sysctl", "-qw", f"{key}={value}"],
        check=True,
        capture_output=True,
    )


def _free_block() -> int:
    """``A`` of a ``10.A.0.0/16`` that no route or address of this host touches."""
    seen = subprocess.run(["ip", "-4", "route"], capture_output=True, text=True).stdout
    seen += subprocess.run(["ip", "-4", "addr"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    # names of this scheme in use: namespaces rkA-*, and interfaces rkA / rkAvN (a veth
    # outlives its namespace's name while a process still holds the namespace)
    taken = {name.split("-", 1)[0] for name in _netns_names()}
    taken |= {f.split(":")[1].strip().split("@")[0].split("v")[0] for f in links.splitlines()}
    for _ in range(200):
        a = random.randint(100, 249)
        if f" 10.{a}." not in seen and f"\n10.{a}." not in seen and f"rk{a}" not in taken:
            return a
    raise RuntimeError("no free 10.A.0.0/16 block for the cluster network")


def _netns_names() -> list[str]:
    try:
        return [p.name for p in NETNS_DIR.iterdir()]
    except FileNotFoundError:
        return []


@dataclass(frozen=True)
class ClusterNetwork:
    """The bridge, the namespaces and their addresses (see the module docstring)."""

    block: int
    nodes: int

    @property
    def name(self) -> str:
        return f"rk{self.block}"

    @property
    def bridge(self) -> str:
        return self.name

    @property
    def cidr(self) -> str:
        """Every pod and machine address of the cluster (kube-proxy's clusterCIDR)."""
        return f"10.{self.block}.0.0/16"

    @property
    def control_plane(self) -> Place:
        return self._place(f"{self.name}-cp", f"10.{self.block}.0.2")

    def node_netns(self, i: int) -> str:
        return f"{self.name}-n{i}"

    def node_address(self, i: int) -> str:
        return f"10.{self.block}.0.{NODE_OFFSET + i}"

    def pod_subnet(self, i: int) -> str:
        return f"10.{self.block}.{i}.0/24"

    def _place(self, netns: str, address: str) -> Place:
        return Place(address=address, prefix=("nsenter", f"--net={NETNS_DIR / netns}", "--"))

    def machines(self) -> list[tuple[str, str]]:
        """(namespace, address) of the control plane and of each node."""
        cp = self.control_plane
        return [(f"{self.name}-cp", cp.address)] + [
            (self.node_netns(i), self.node_address(i)) for i in range(1, self.nodes + 1)
        ]

    # -- life cycle ----------------------------------------------------------------------

    @classmethod
    def create(cls, workdir: Path, nodes: int) -> ClusterNetwork:
        """Make the bridge and every namespace; on failure undo what was made."""
        net = cls(block=_free_block(), nodes=nodes)
        net.save(workdir)
        try:
            net._wire()
        except BaseException:
            net.teardown()
            raise
        return net

    def _wire(self) -> None:
        _ip("link", "add", self.bridge, "type", "bridge")
        _ip("addr", "add", f"10.{self.block}.0.1/24", "dev", self.bridge)
        _ip("link", "set", self.bridge, "up")
        for n, (netns, address) in enumerate(self.machines()):
            _ip("netns", "add", netns)
            host_end = f"{self.name}v{n}"
            _ip("link", "add", host_end, "type", "veth", "peer", "name", "eth0", "netns", netns)
            _ip("link", "set", host_end, "master", self.bridge, "up")
            _ip("-n", netns, "addr", "add", f"{address}/24", "dev", "eth0")
            _ip("-n", netns, "link", "set", "eth0", "up")
            _ip("-n", netns, "link", "set", "lo", "up")
            _sysctl(netns, "net.ipv4.ip_forward", "1")
        for i in range(1, self.nodes + 1):
            via = self.node_address(i)
            _ip("route", "add", self.pod_subnet(i), "via", via)
            for j, (netns, _) in enumerate(self.machines()):
                if j != i:
                    _ip("-n", netns, "route", "add", self.pod_subnet(i), "via", via)
            _ip(
                "-n",
                self.node_netns(i),
                "route",
                "add",
                SERVICE_CIDR,
                "via",
                self.control_plane.address,
            )
            # Services to a pod on the same node go out and back over the node's bridge:
            # let them pass kube-proxy's rules on the way back too
            _sysctl(self.node_netns(i), "net.bridge.bridge-nf-call-iptables", "1")

    def save(self, workdir: Path) -> None:
        (workdir / RECORD).write_text(json.dumps({"block": self.block, "nodes": self.nodes}))

    @classmethod
    def load(cls, workdir: Path) -> ClusterNetwork | None:
        try:
            record = json.loads((workdir / RECORD).read_text())
        except (OSError, ValueError):
            return None
        return cls(block=int(record["block"]), nodes=int(record["nodes"]))

    def teardown(self) -> None:
        """Remove the namespaces (their veths go with them), the routes and the bridge."""
        for i in range(1, self.nodes + 1):
            subprocess.run(["ip", "route", "del", self.pod_subnet(i)], capture_output=True)
        for netns, _ in self.machines():
            subprocess.run(["ip", "netns", "del", netns], capture_output=True)
        subprocess.run(["ip", "link", "del", self.bridge], capture_output=True)
