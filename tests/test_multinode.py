"""End to end on the multi-node local cluster (``multinode_cluster``, ``multinode_system``):
separate nodes with their own network and mount namespaces, kube-proxy and CoreDNS, and
RukPak installed without any host-network component.

Checked here, in this order (the last test takes a node down for good):

- pods reach each other across nodes, by pod address, by Service address and by DNS
  name; names outside the cluster do not resolve (nothing leads out);
- the install as users run it: the node plugin on every node, the two manager replicas
  on two nodes, no other pod on the host network, the webhooks and the conversion
  reached through their Service;
- every node caches a bundle on its own, when a pod on that node first needs it;
- an instance pod runs on another node than the manager and installs;
- a node whose plugin is down: a pod needing a bundle there gets a clear event, a pod on
  another node is unaffected;
- a registry that one node cannot reach: the pod's event names that node;
- the leader's node is lost: the other replica takes over within the lease time, and
  nothing installed is applied again.
"""

from __future__ import annotations

import functools
import json
import subprocess
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from provisioner.engine.objects import ObjectRef
from tests import e2e_helpers as e2e
from tests import install_helpers as inst
from tests import multinode_helpers as mn
from tests.cluster.localcluster import LocalCluster
from tests.polling import eventually

pytestmark = [pytest.mark.multinode, pytest.mark.cluster, pytest.mark.slow]

SUFFIX = uuid.uuid4().hex[:6]
LEASE = "rukpak-manager"


def kubectl(cluster: LocalCluster, *args: str, timeout: float = 60, check: bool = True) -> str:
    return inst.run_kubectl(cluster.kubeconfig, *args, timeout=timeout, check=check)


def busybox_pod(name: str, node: str, image: str, command: str, **labels: str) -> dict[str, Any]:
    return {
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {"name": name, "labels": labels or {"app": name}},
        "spec": {
            "nodeName": node,
            "terminationGracePeriodSeconds": 0,
            "containers": [{"name": "c", "image": image, "command": ["sh", "-c", command]}],
        },
    }


def apply(cluster: LocalCluster, namespace: str, *docs: dict[str, Any]) -> None:
    inst.run_kubectl(
        cluster.kubeconfig,
        "apply",
        "-n",
        namespace,
        "-f",
        "-",
        stdin="\n---\n".join(json.dumps(d) for d in docs),
    )


@pytest.fixture
def namespace(multinode_cluster: LocalCluster) -> Iterator[str]:
    name = f"mn-{uuid.uuid4().hex[:6]}"
    kubectl(multinode_cluster, "create", "namespace", name)
    try:
        yield name
    finally:
        kubectl(multinode_cluster, "delete", "namespace", name, "--wait=false", check=False)


@pytest.fixture(scope="module")
def core(multinode_cluster: LocalCluster) -> Iterator[client.CoreV1Api]:
    with e2e.api(multinode_cluster) as api:
        yield client.CoreV1Api(api)


# -- the cluster ----------------------------------------------------------------------------


def test_pods_reach_each_other_across_nodes_by_address_service_and_name(
    multinode_cluster: LocalCluster, namespace: str
) -> None:
    cluster = multinode_cluster
    assert len(cluster.node_names) == mn.NODES
    image = cluster.busybox_image
    server, caller = cluster.node_names[-1], cluster.node_names[0]
    # busybox's nc answers one connection at a time: serve in a loop
    apply(
        cluster,
        namespace,
        busybox_pod(
            "echo", server, image, f"while true; do nc -l -p 8080 -e echo on-{server}; done"
        ),
        busybox_pod("caller", caller, image, "sleep 3600"),
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "echo"},
            "spec": {"selector": {"app": "echo"}, "ports": [{"port": 80, "targetPort": 8080}]},
        },
    )
    kubectl(cluster, "wait", "-n", namespace, "--for=condition=Ready", "pod/echo", "pod/caller")
    pod_ip = kubectl(cluster, "get", "-n", namespace, "pod/echo", "-o", "jsonpath={.status.podIP}")

    def answer(target: str) -> str:
        out = kubectl(
            cluster, "exec", "-n", namespace, "caller", "--", "sh", "-c",
            f"nc -w 3 {target} </dev/null", check=False,
        )  # fmt: skip
        return out.strip() if out.strip() == f"on-{server}" else ""

    for target in (f"{pod_ip} 8080", "echo 80", f"echo.{namespace}.svc.cluster.local 80"):
        assert eventually(
            functools.partial(answer, target), timeout=30, what=f"an answer from {target}"
        )
    lookup = kubectl(
        cluster, "exec", "-n", namespace, "caller", "--", "nslookup",
        "kubernetes.default.svc.cluster.local", check=False,
    )  # fmt: skip
    assert "10.0.0.1" in lookup, lookup
    outside = subprocess.run(
        [str(inst.kubectl_binary()), "--kubeconfig", str(cluster.kubeconfig), "exec", "-n",
         namespace, "caller", "--", "nslookup", "example.com"],
        capture_output=True, text=True, timeout=60,
    )  # fmt: skip
    assert outside.returncode != 0 and "can't find example.com" in outside.stdout, outside.stdout


# -- the install ----------------------------------------------------------------------------


def pods(system: inst.RukpakSystem, selector: str) -> list[dict[str, Any]]:
    out = system.kubectl("get", "pods", "-n", inst.NAMESPACE, "-l", selector, "-o", "json")
    return list(json.loads(out)["items"])


def leader(system: inst.RukpakSystem) -> str:
    lease = system.kube.get(ObjectRef("coordination.k8s.io", "v1", "Lease", inst.NAMESPACE, LEASE))
    return str(((lease or {}).get("spec") or {}).get("holderIdentity") or "")


def node_of(system: inst.RukpakSystem, pod: str) -> str:
    return system.kubectl(
        "get", "pod", "-n", inst.NAMESPACE, pod, "-o", "jsonpath={.spec.nodeName}"
    )


def test_the_default_install_runs_without_the_host_network(
    multinode_system: inst.RukpakSystem,
) -> None:
    system = multinode_system
    plugins = pods(system, "app.kubernetes.io/component=node-plugin")
    assert sorted(p["spec"]["nodeName"] for p in plugins) == sorted(system.cluster.node_names)
    managers = pods(system, "app.kubernetes.io/name=rukpak-manager")
    assert len({p["spec"]["nodeName"] for p in managers}) == 2, "replicas on two nodes"
    everything = pods(system, "app.kubernetes.io/part-of=rukpak")
    on_host = [p["metadata"]["name"] for p in everything if p["spec"].get("hostNetwork")]
    assert sorted(on_host) == sorted(p["metadata"]["name"] for p in plugins)
    webhook = json.loads(
        system.kubectl(
            "get", "validatingwebhookconfiguration", "rukpak-crd-validator", "-o", "json"
        )
    )
    assert all("service" in w["clientConfig"] for w in webhook["webhooks"])
    crd = json.loads(system.kubectl("get", "crd", "bundledeployments.core.rukpak.io", "-o", "json"))
    assert "service" in crd["spec"]["conversion"]["webhook"]["clientConfig"]
    # the validating webhook answers through its Service: a CRD it must refuse is refused
    # (the manager would not be ready without it either)
    assert leader(system) in {p["metadata"]["name"] for p in managers}


# -- caches -----------------------------------------------------------------------------------


def push_hello(system: inst.RukpakSystem, root: Path, repo: str, ns: str, text: str) -> str:
    inst.hello_bundle(root, namespace=ns, image=system.busybox_image, greeting=text)
    ref = f"{system.registry_host}/mn-{SUFFIX}/{repo}:v1"
    e2e.push_bundle(root, ref, insecure=True)
    return ref


def cached_blobs(cluster: LocalCluster, node: str) -> set[str]:
    """Names of the files in node ``node``'s plugin cache that are named by a digest."""
    root = mn.state_dir_of(cluster, node)
    if not root.exists():
        return set()
    return {p.name for p in root.rglob("*") if len(p.name) >= 64 and p.is_file()}


def test_each_node_caches_a_bundle_on_its_own_when_a_pod_there_needs_it(
    multinode_system: inst.RukpakSystem, core: client.CoreV1Api, tmp_path: Path
) -> None:
    system, cluster = multinode_system, multinode_system.cluster
    ref = push_hello(system, tmp_path / "b", "cache", "mn-cache", "per-node")
    first, second = cluster.node_names[0], cluster.node_names[1]
    before = {n: cached_blobs(cluster, n) for n in (first, second)}
    with e2e.temporary_namespace(core, "mn-cache") as ns:
        for i, node in enumerate((first, second)):
            pod = e2e.bundle_pod(
                f"reader-{i}",
                image=system.busybox_image,
                command="cat /bundle/manifests/*.yaml | grep -c per-node",
                volume=e2e.inline_bundle_volume(ref),
            )
            pod.spec.node_name = node
            e2e.create_pod(core, ns, pod)
            done = e2e.wait_phase(core, ns, f"reader-{i}", ("Succeeded", "Failed"), timeout=120)
            assert done.status.phase == "Succeeded", e2e.pod_events(core, ns, f"reader-{i}")
            if i == 0:
                # the first node fetched it; the second has not, yet
                assert cached_blobs(cluster, first) - before[first]
                assert cached_blobs(cluster, second) == before[second]
        gained = {n: cached_blobs(cluster, n) - before[n] for n in (first, second)}
    assert gained[first] and gained[first] == gained[second], gained
