"""The multi-node cluster's address plan (``tests.cluster.network``), pure: no namespace is
made here (``tests/test_multinode.py`` starts real ones)."""

from __future__ import annotations

import ipaddress

from tests.cluster.network import LOOPBACK, ClusterNetwork, Place


def test_every_machine_and_pod_subnet_is_distinct_and_inside_the_block() -> None:
    net = ClusterNetwork(block=150, nodes=5)
    block = ipaddress.ip_network(net.cidr)
    addresses = [a for _, a in net.machines()]
    assert len(set(addresses)) == 6 and addresses[0] == net.control_plane.address
    assert all(ipaddress.ip_address(a) in block for a in addresses)
    subnets = [ipaddress.ip_network(net.pod_subnet(i)) for i in range(1, 6)]
    machines = ipaddress.ip_network("10.150.0.0/24")
    for i, subnet in enumerate(subnets):
        assert subnet.subnet_of(block)  # type: ignore[arg-type]
        assert not subnet.overlaps(machines)
        assert all(not subnet.overlaps(other) for other in subnets[i + 1 :])


def test_interface_names_fit_the_kernels_limit() -> None:
    net = ClusterNetwork(block=249, nodes=9)
    # the host end of the last machine's veth is the longest name made
    assert len(f"{net.name}v{len(net.machines()) - 1}") <= 15
    assert len(net.bridge) <= 15


def test_a_place_prefixes_argv_and_loopback_does_not() -> None:
    net = ClusterNetwork(block=150, nodes=1)
    cp = net.control_plane
    assert cp.argv(["etcd", "--x"]) == ["nsenter", "--net=/run/netns/rk150-cp", "--", "etcd", "--x"]
    assert LOOPBACK.argv(["etcd"]) == ["etcd"] and Place() == LOOPBACK
