"""End to end on the multi-node local cluster (``multinode_cluster``, ``multinode_system``):
separate nodes with their own network and mount namespaces, kube-proxy and CoreDNS, and
RukPak installed without any host-network component: the default install, every run taken
by the standing provisioner (one replica, moved between nodes by the tests: every other
node cordoned while its pod is made again), no pod started for any change.

Checked here, in this order (the last test takes a node down for good):

- a cluster of two nodes starts and stops, leaving no namespace, bridge or process;
- pods reach each other across nodes, by pod address, by Service address and by DNS
  name; names outside the cluster do not resolve (nothing leads out);
- the install as users run it: the node plugin on every node, the two manager replicas
  on two nodes, the standing provisioner, no other pod on the host network, the webhooks
  and the conversion reached through their Service;
- every node caches a bundle on its own, when a pod on that node first needs it;
- the standing provisioner on another node than the leading manager installs, its content
  in the cache of the node it runs on; moved to another node, it gets the next bundle from
  that node's own plugin (the first node's cache is not touched);
- a node whose plugin is down: a pod needing a bundle there gets a clear event, a pod on
  another node is unaffected;
- a registry that one node cannot reach: the pod's event names that node;
- an offline rollback (the registry gone, the manager restarted) is taken by the standing
  provisioner from its node's cache, which holds the revision;
- the standing provisioner's node drained while it installs: the provisioner made again on
  another node, the install completes;
- the leader's node is lost with the standing provisioner on it: the other replica takes
  over within the lease time, a provisioner on a node that is left installs new work, and
  nothing installed is applied again.
"""

from __future__ import annotations

import contextlib
import functools
import json
import os
import shutil
import subprocess
import tempfile
import time
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml
from kubernetes import client

from provisioner.engine.objects import ObjectRef
from provisioner.manager import model
from provisioner.manager.acting import actuate
from provisioner.manager.planning import revisions
from rukpak.oci.client import RegistryClient
from rukpak.oci.reference import Reference
from tests import e2e_helpers as e2e
from tests import install_helpers as inst
from tests import multinode_helpers as mn
from tests.cluster import bins, images, process
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


@contextlib.contextmanager
def scratch_namespace(core: client.CoreV1Api, prefix: str) -> Iterator[str]:
    """``e2e.temporary_namespace`` that also waits for its pods to be gone: a pod whose
    volume is still being unpublished must not outlive the plugin that serves it."""
    with e2e.temporary_namespace(core, prefix) as ns:
        try:
            yield ns
        finally:
            core.delete_collection_namespaced_pod(ns, grace_period_seconds=0)
            eventually(
                lambda: not core.list_namespaced_pod(ns).items,
                timeout=120,
                what=f"the pods of {ns} to be gone",
            )


@pytest.fixture(scope="module")
def core(multinode_cluster: LocalCluster) -> Iterator[client.CoreV1Api]:
    with e2e.api(multinode_cluster) as api:
        yield client.CoreV1Api(api)


# -- the cluster ----------------------------------------------------------------------------


def _netns() -> set[str]:
    out = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    return {line.split()[0] for line in out.splitlines() if line.strip()}


def test_a_cluster_of_two_nodes_starts_and_stops_leaving_nothing_behind() -> None:
    """Runs before the session's cluster starts: one cluster at a time."""
    reason = mn.missing_capability()
    if reason:
        pytest.skip(reason)
    # short: containerd's sockets below it must stay under 104 bytes
    workdir = Path(tempfile.mkdtemp(prefix="rk-mn2-"))
    cluster = LocalCluster.start(workdir, nodes=2, binaries=bins.ensure(bins.MULTINODE))
    try:
        assert cluster.network is not None
        names = {ns for ns, _ in cluster.network.machines()}
        assert names <= _netns()
        assert all(cluster.node_ready(n) for n in cluster.node_names) and len(cluster.machines) == 2
        # what `python -m tests.cluster down` loads from state.json stops the same things
        loaded = LocalCluster.load(cluster.workdir)
        assert sorted(loaded.pids()) == sorted(cluster.pids())
    finally:
        pids = cluster.pids()
        LocalCluster.load(cluster.workdir).stop(remove=True)
    assert not names & _netns()
    gone = subprocess.run(["ip", "link", "show", cluster.network.bridge], capture_output=True)
    assert gone.returncode != 0, "the bridge is left"
    assert not [p for p in pids if Path(f"/proc/{p}").exists() and process.pid_alive(p)]
    assert not (workdir / "nodes").exists()
    shutil.rmtree(workdir)


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


PROVISIONER = "app.kubernetes.io/name=rukpak-provisioner"


def provisioner_node(system: inst.RukpakSystem) -> str:
    """The node of the standing provisioner once it is the only one and Ready ("" until)."""
    live = [p for p in pods(system, PROVISIONER) if not p["metadata"].get("deletionTimestamp")]
    if len(live) != 1:
        return ""
    status = live[0].get("status") or {}
    ready = [c.get("ready") for c in status.get("containerStatuses") or []]
    return str(live[0]["spec"].get("nodeName") or "") if ready and all(ready) else ""


def ready_provisioner_nodes(system: inst.RukpakSystem) -> list[str]:
    """The nodes of every Ready standing provisioner pod (a lost node's pod may still be
    listed, no longer Ready, until it is deleted)."""

    def ready(pod: dict[str, Any]) -> bool:  # the node controller marks a lost node's not
        conditions = (pod.get("status") or {}).get("conditions") or []
        return any(c["type"] == "Ready" and c["status"] == "True" for c in conditions)

    return [str(p["spec"].get("nodeName")) for p in pods(system, PROVISIONER) if ready(p)]


def move_provisioner(system: inst.RukpakSystem, node: str) -> None:
    """The standing provisioner made again on ``node`` (every other node cordoned
    meanwhile), Ready there: its store volume is that node's plugin's."""
    if provisioner_node(system) == node:
        return
    only_on(system, node)
    try:
        system.kubectl("delete", "pods", "-n", inst.NAMESPACE, "-l", PROVISIONER, "--wait=false")
        # and the old one gone: until its kubelet stops it, it is a provisioner like any
        # other and may take the next run
        eventually(
            lambda: provisioner_node(system) == node and len(pods(system, PROVISIONER)) == 1,
            timeout=180,
            what=f"the standing provisioner Ready on {node}, the old one gone",
        )
    finally:
        for other in system.cluster.node_names:
            system.kubectl("uncordon", other, check=False)


def no_pod_per_change(system: inst.RukpakSystem, before: set[str]) -> None:
    started = inst.pods_for_changes(system, before)
    assert started == [], f"pods were started for a change: {started}"


def test_the_default_install_runs_without_the_host_network(
    multinode_system: inst.RukpakSystem,
) -> None:
    system = multinode_system
    plugins = pods(system, "app.kubernetes.io/component=node-plugin")
    assert sorted(p["spec"]["nodeName"] for p in plugins) == sorted(system.cluster.node_names)
    managers = pods(system, "app.kubernetes.io/name=rukpak-manager")
    assert len({p["spec"]["nodeName"] for p in managers}) == 2, "replicas on two nodes"
    provisioners = pods(system, PROVISIONER)
    assert len(provisioners) == 1 and provisioner_node(system), "one standing provisioner"
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
    with scratch_namespace(core, "mn-cache") as ns:
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


# -- instances, plugins and registries per node ----------------------------------------------


def installed(system: inst.RukpakSystem, name: str) -> bool:
    live = system.kube.get(actuate.bd_ref(name)) or {}
    c = inst.conditions(live).get("Installed") or {}
    return (c.get("status"), c.get("reason")) == ("True", "InstallationSucceeded")


def revision_nodes(system: inst.RukpakSystem, name: str) -> list[list[str]]:
    """The nodes each kept revision of v1alpha2 ``name`` was installed from."""
    return revision_state(system, name)[1]


def test_the_standing_provisioner_installs_from_the_plugin_of_the_node_it_runs_on(
    multinode_system: inst.RukpakSystem, tmp_path: Path
) -> None:
    system, cluster = multinode_system, multinode_system.cluster
    manager_node = node_of(system, leader(system))
    first, second = [n for n in cluster.node_names if n != manager_node][:2]
    move_provisioner(system, first)
    before = inst.pods_scheduled(system)
    blobs = {n: cached_blobs(cluster, n) for n in (first, second)}
    one = f"mn-elsewhere-{SUFFIX}"
    system.kube.create(inst.bd_v2(one, push_hello(system, tmp_path / "a", "a", one, "first")))
    eventually(lambda: revision_state(system, one)[0] == 1, timeout=180, what=f"{one} Installed")
    assert inst.greeting(system, one) == "first"
    assert revision_nodes(system, one) == [[first]], "installed by the provisioner there"
    gained = cached_blobs(cluster, first) - blobs[first]
    assert gained, "the content is in the cache of the provisioner's node"
    assert cached_blobs(cluster, second) == blobs[second], "and no other node's"
    # moved to another node: the next bundle comes from that node's own plugin
    move_provisioner(system, second)
    two = f"mn-moved-{SUFFIX}"
    system.kube.create(inst.bd_v2(two, push_hello(system, tmp_path / "b", "b", two, "second")))
    eventually(lambda: revision_state(system, two)[0] == 1, timeout=180, what=f"{two} Installed")
    assert inst.greeting(system, two) == "second"
    assert revision_nodes(system, two) == [[second]]
    assert cached_blobs(cluster, second) - blobs[second], "fetched by the second node's plugin"
    assert cached_blobs(cluster, first) - blobs[first] == gained, "the first node's untouched"
    no_pod_per_change(system, before)
    inst.delete_v2(system, one, two)


def plugin_nodes(system: inst.RukpakSystem) -> list[str]:
    return sorted(
        p["spec"]["nodeName"]
        for p in pods(system, "app.kubernetes.io/component=node-plugin")
        if p["status"].get("phase") == "Running"
    )


def wait_failed_mount(core: client.CoreV1Api, ns: str, pod: str, needle: str) -> str:
    def found() -> str:
        return next((m for m in e2e.failed_mount_messages(core, ns, pod) if needle in m), "")

    try:
        return eventually(found, timeout=150, what=f"a FailedMount event of {pod} with {needle!r}")
    except AssertionError as e:
        raise AssertionError(f"{e}\nevents:\n{e2e.pod_events(core, ns, pod)}") from None


def reader(system: inst.RukpakSystem, name: str, node: str, ref: str) -> client.V1Pod:
    pod = e2e.bundle_pod(
        name,
        image=system.busybox_image,
        command="ls /bundle/manifests",
        volume=e2e.inline_bundle_volume(ref),
    )
    pod.spec.node_name = node
    return pod


def wait_registered(cluster: LocalCluster, *, without: str = "") -> None:
    """Until the kubelet of every node but ``without`` has the plugin registered (a
    restarted plugin registers again a moment after its pod is Ready), and ``without``'s
    has not."""

    def settled() -> bool:
        with e2e.api(cluster) as api:
            return all(
                (e2e.DRIVER in e2e.csinode_drivers(api, n)) == (n != without)
                for n in cluster.node_names
            )

    eventually(settled, timeout=90, what=f"csi.rukpak.io registered on every node but {without!r}")


def test_a_node_without_its_plugin_fails_its_pods_clearly_and_no_other(
    multinode_system: inst.RukpakSystem, core: client.CoreV1Api, tmp_path: Path
) -> None:
    system, cluster = multinode_system, multinode_system.cluster
    down, up = cluster.node_names[-1], cluster.node_names[0]
    ref = push_hello(system, tmp_path / "b", "noplugin", "mn-noplugin", "x")
    label = "rukpak.test/no-plugin"
    away = {
        "spec": {"template": {"spec": {"affinity": {"nodeAffinity": {
            "requiredDuringSchedulingIgnoredDuringExecution": {"nodeSelectorTerms": [
                {"matchExpressions": [{"key": label, "operator": "DoesNotExist"}]}
            ]}
        }}}}}
    }  # fmt: skip
    ds = ["-n", inst.NAMESPACE, f"daemonset/{inst.DAEMONSET}"]
    system.kubectl("label", "node", down, f"{label}=true")
    system.kubectl("patch", *ds, "--type=merge", "-p", json.dumps(away))
    try:
        system.kubectl("rollout", "status", *ds, "--timeout=180s", timeout=200)
        assert down not in plugin_nodes(system)
        wait_registered(cluster, without=down)
        with scratch_namespace(core, "mn-noplugin") as ns:
            e2e.create_pod(core, ns, reader(system, "there", down, ref))
            e2e.create_pod(core, ns, reader(system, "elsewhere", up, ref))
            message = wait_failed_mount(core, ns, "there", "csi.rukpak.io")
            assert "not found in the list of registered CSI drivers" in message, message
            done = e2e.wait_phase(core, ns, "elsewhere", ("Succeeded", "Failed"), timeout=120)
            assert done.status.phase == "Succeeded", e2e.pod_events(core, ns, "elsewhere")
            # (a kubelet's own hiccup with the token volume under load is no concern here)
            ours = [m for m in e2e.failed_mount_messages(core, ns, "elsewhere") if '"bundle"' in m]
            assert not ours, ours
    finally:
        system.kubectl("label", "node", down, f"{label}-")
        system.kubectl(
            "patch", *ds, "--type=json",
            "-p", '[{"op": "remove", "path": "/spec/template/spec/affinity"}]', check=False,
        )  # fmt: skip
        system.kubectl("rollout", "status", *ds, "--timeout=180s", timeout=200)
    assert plugin_nodes(system) == sorted(cluster.node_names)
    wait_registered(cluster)


def test_a_registry_one_node_cannot_reach_is_reported_with_that_node(
    multinode_system: inst.RukpakSystem, core: client.CoreV1Api, tmp_path: Path
) -> None:
    system, cluster = multinode_system, multinode_system.cluster
    assert cluster.network is not None
    blocked, fine = cluster.node_names[1], cluster.node_names[0]
    # a registry of its own, so the node still pulls its pods' images from the cluster's
    own = images.start_registry(
        tmp_path / "registry", log=tmp_path / "registry.log", place=cluster.network.control_plane
    )
    rule = ["OUTPUT", "-p", "tcp", "-d", own.address, "--dport", str(own.port), "-j", "REJECT",
            "--reject-with", "tcp-reset"]  # fmt: skip
    node = mn.machine(cluster, blocked)
    try:
        inst.hello_bundle(tmp_path / "b", namespace="mn-blocked", image=system.busybox_image)
        ref = f"{own.host}/mn-{SUFFIX}/blocked:v1"
        e2e.push_bundle(tmp_path / "b", ref, insecure=True)
        added = node.run("iptables", "-I", *rule)
        assert added.returncode == 0, added.stderr
        with scratch_namespace(core, "mn-blocked") as ns:
            e2e.create_pod(core, ns, reader(system, "blocked", blocked, ref))
            e2e.create_pod(core, ns, reader(system, "fine", fine, ref))
            message = wait_failed_mount(core, ns, "blocked", f"(from node {blocked})")
            assert own.host in message, message
            done = e2e.wait_phase(core, ns, "fine", ("Succeeded", "Failed"), timeout=120)
            assert done.status.phase == "Succeeded", e2e.pod_events(core, ns, "fine")
    finally:
        node.run("iptables", "-D", *rule)
        own.stop()


def revision_state(system: inst.RukpakSystem, name: str) -> tuple[int, list[list[str]]]:
    status = inst.live_v2(system, name).get("status") or {}
    installed_now = inst.cond_v2(system, name, "Installed")[0] == "True"
    number = int(status.get("installedRevision") or 0) if installed_now else 0
    return number, [list(r.get("nodes") or []) for r in status.get("revisions") or []]


def only_on(system: inst.RukpakSystem, node: str) -> None:
    """Every node but ``node`` cordoned (new pods go there)."""
    for other in system.cluster.node_names:
        system.kubectl("uncordon" if other == node else "cordon", other)


def test_an_offline_rollback_is_taken_by_the_standing_provisioner_from_its_nodes_cache(
    multinode_system: inst.RukpakSystem, tmp_path: Path
) -> None:
    """Revisions 1 and 2 installed by the standing provisioner on one node; with the
    registry gone and the manager restarted (a new manager has not kept revision 1's
    objects, so a run must install it), the provisioner installs revision 1 again from
    its node's cache, and no pod is started for any of it."""
    system, cluster = multinode_system, multinode_system.cluster
    assert cluster.network is not None
    first = cluster.node_names[1]
    move_provisioner(system, first)
    before = inst.pods_scheduled(system)
    own = images.start_registry(
        tmp_path / "registry", log=tmp_path / "registry.log", place=cluster.network.control_plane
    )
    name = ns = f"mn-rollback-{SUFFIX}"
    refs = []
    try:
        for tag, text in (("v1", "one"), ("v2", "two")):
            inst.hello_bundle(
                tmp_path / tag, namespace=ns, image=system.busybox_image, greeting=text
            )
            refs.append(f"{own.host}/mn-{SUFFIX}/rollback:{tag}")
            e2e.push_bundle(tmp_path / tag, refs[-1], insecure=True)
        system.kube.create(inst.bd_v2(name, refs[0]))
        eventually(lambda: revision_state(system, name)[0] == 1, timeout=180, what="rev 1")
        patch = {"spec": {"source": {"type": "image", "image": {"ref": refs[1]}}}}
        system.kube.merge_patch(actuate.bd_ref(name, model.API_VERSION_V2), patch)
        eventually(lambda: revision_state(system, name)[0] == 2, timeout=180, what="rev 2")
        assert revision_state(system, name)[1] == [[first], [first]]
    except BaseException:
        own.stop()  # a test that fails leaves no registry behind
        raise
    own.stop()  # from here on, nothing can be fetched
    inst.restart_managers(system)
    generation = int(inst.live_v2(system, name)["metadata"]["generation"])
    rollback = revisions.rollback_annotation(1, generation, revisions.MANUAL)
    system.kube.merge_patch(
        actuate.bd_ref(name, model.API_VERSION_V2),
        {"metadata": {"annotations": {revisions.ROLLBACK_ANNOTATION: rollback}}},
    )
    eventually(lambda: revision_state(system, name)[0] == 1, timeout=180, what="revision 1 back")
    assert inst.greeting(system, ns) == "one"
    assert provisioner_node(system) == first and revision_nodes(system, name)[0] == [first]
    no_pod_per_change(system, before)
    inst.delete_v2(system, name)


def test_the_provisioners_node_drained_while_it_installs_and_the_install_completes(
    multinode_system: inst.RukpakSystem, tmp_path: Path
) -> None:
    """The drain evicts the standing provisioner (SIGTERM: a run it holds is given back
    unfinished, or finished) and its Deployment makes it again on a node that is left,
    which takes what is left to do."""
    system, cluster = multinode_system, multinode_system.cluster
    target = cluster.node_names[0]
    move_provisioner(system, target)
    before = inst.pods_scheduled(system)
    name = ns = f"mn-drain-{SUFFIX}"
    ref = push_hello(system, tmp_path / "b", "drain", ns, "drained")
    try:
        system.kube.create(inst.bd_v2(name, ref))
        drained = system.kubectl(
            "drain", target, "--ignore-daemonsets", "--delete-emptydir-data", "--force",
            "--timeout=120s", timeout=150,
        )  # fmt: skip
        assert target in drained
        eventually(lambda: revision_state(system, name)[0] == 1, timeout=180, what="Installed")
        moved = eventually(lambda: provisioner_node(system), timeout=180, what="a provisioner")
        assert moved != target, "made again on a node that is left"
    finally:
        for node in cluster.node_names:
            system.kubectl("uncordon", node, check=False)
    assert inst.greeting(system, ns) == "drained"
    no_pod_per_change(system, before)
    inst.delete_v2(system, name)


# -- losing a node ----------------------------------------------------------------------------


def test_the_leaders_node_is_lost_and_the_other_replica_takes_over(
    multinode_system: inst.RukpakSystem, tmp_path: Path
) -> None:
    """Runs last: the node stays down (its pods are force-deleted, the Node removed). The
    standing provisioner is on that node too (the worst case): it is made again on a node
    that is left once the lost node's pods are evicted."""
    system, cluster = multinode_system, multinode_system.cluster
    old = leader(system)
    lost = node_of(system, old)
    move_provisioner(system, lost)
    before = inst.pods_scheduled(system)
    name = ns = f"mn-before-{SUFFIX}"
    ref = push_hello(system, tmp_path / "a", "before", ns, "before")
    system.kube.create(inst.bundle_deployment(name, ref))
    eventually(lambda: installed(system, name), timeout=180, what=f"{name} Installed")
    settings = inst.greeting_ref(ns)
    version = (system.kube.get(settings) or {})["metadata"]["resourceVersion"]

    started = time.monotonic()
    mn.machine(cluster, lost).stop()  # kubelet, containers, kube-proxy: the machine is off
    try:
        new = eventually(
            lambda: next((h for h in [leader(system)] if h and h != old), None),
            timeout=90,
            what="a new Lease holder",
        )
        took = time.monotonic() - started
        assert node_of(system, new) != lost
        print(f"takeover after the leader's node was lost: {took:.1f}s")
        # new work is done by the new leader, on the nodes that are left
        system.kubectl(
            "wait", "node", lost, "--for=condition=Ready=Unknown", "--timeout=90s", timeout=100
        )
        after = f"mn-after-{SUFFIX}"
        ref2 = push_hello(system, tmp_path / "b", "after", after, "after")
        system.kube.create(inst.bundle_deployment(after, ref2))
        eventually(lambda: installed(system, after), timeout=300, what=f"{after} Installed")
        assert inst.greeting(system, after) == "after"
        # (it takes runs as soon as it starts; Ready follows at its next probe)
        eventually(
            lambda: set(ready_provisioner_nodes(system)) - {lost},
            timeout=60,
            what="a Ready provisioner on a node that is left",
        )
        # what was installed before was not applied again
        assert (system.kube.get(settings) or {})["metadata"]["resourceVersion"] == version
        assert installed(system, name)
        no_pod_per_change(system, before)
    finally:
        # what ran there can never say it stopped: remove it, as an operator would
        system.kubectl(
            "delete", "pods", "--all-namespaces", "--field-selector", f"spec.nodeName={lost}",
            "--force", "--grace-period=0", check=False,
        )  # fmt: skip
        system.kubectl("delete", "node", lost, "--wait=false", check=False)


MIRROR_COMPONENT = inst.DEPLOY / "components" / "registry-mirror"


def _mirror_objects(system: inst.RukpakSystem, upstream: str) -> list[dict[str, Any]]:
    """The component's Deployment and Service as shipped, with the test image and the
    plain-HTTP upstream (a user with such a registry adds the same flag), and its
    ConfigMap."""
    docs = [
        yaml.safe_load((MIRROR_COMPONENT / f).read_text())
        for f in ("deployment.yaml", "service.yaml")
    ]
    container = docs[0]["spec"]["template"]["spec"]["containers"][0]
    container["image"] = system.image
    container["args"].append(f"--insecure-registry={upstream}")
    configmap = {
        "apiVersion": "v1",
        "kind": "ConfigMap",
        "metadata": {"name": "rukpak-registry-mirror", "namespace": inst.NAMESPACE},
        "data": {"upstream": upstream},
    }
    return [configmap, *docs]


def _plugin_rollout(system: inst.RukpakSystem) -> None:
    system.kubectl("rollout", "status", f"daemonset/{inst.DAEMONSET}", "-n", inst.NAMESPACE,
                   "--timeout=300s", timeout=320)  # fmt: skip


def test_the_registry_mirror_component_serves_a_rollout_to_every_node_with_one_pull(
    multinode_system: inst.RukpakSystem, tmp_path: Path
) -> None:
    """deploy/components/registry-mirror on the cluster: the mirror Deployment behind its
    Service, the node plugins patched by the component's own patch; a new image read on
    every node at once costs its registry one pull (an iptables counting rule)."""
    system, cluster = multinode_system, multinode_system.cluster
    assert cluster.network is not None
    place = cluster.network.control_plane
    own = images.start_registry(tmp_path / "registry", log=tmp_path / "registry.log", place=place)
    count = ["OUTPUT", "-p", "tcp", "--sport", str(own.port)]
    ds = f"daemonset/{inst.DAEMONSET}"
    original = json.loads(system.kubectl("get", ds, "-n", inst.NAMESPACE, "-o", "json"))
    patch = yaml.safe_load(
        yaml.safe_load((MIRROR_COMPONENT / "kustomization.yaml").read_text())["patches"][0]["patch"]
    )
    mirror = _mirror_objects(system, own.host)
    try:
        system.kubectl("apply", "-f", "-", stdin="\n---\n".join(json.dumps(d) for d in mirror))
        system.kubectl("rollout", "status", "deployment/rukpak-registry-mirror", "-n",
                       inst.NAMESPACE, "--timeout=180s", timeout=200)  # fmt: skip
        system.kubectl("patch", ds, "-n", inst.NAMESPACE, "--type=json", "-p", json.dumps(patch))
        _plugin_rollout(system)
        # content big enough (and random) that requests' own bytes do not count
        big = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "big"},
               "data": {"random": os.urandom(300 * 1024).hex()}}  # fmt: skip
        (tmp_path / "bundle" / "manifests").mkdir(parents=True)
        (tmp_path / "bundle" / "manifests" / "big.yaml").write_text(yaml.safe_dump(big))
        tag = f"{own.host}/mn-{SUFFIX}/mirrored:v1"
        e2e.push_bundle(tmp_path / "bundle", tag, insecure=True)
        with RegistryClient(insecure=[own.host]) as registry:  # pinned: no tag asked per node
            ref = f"{tag.rsplit(':', 1)[0]}@{registry.resolve(Reference.parse(tag)).digest}"
        size = sum(p.stat().st_size for p in (tmp_path / "registry").rglob("data") if p.is_file())
        subprocess.run([*place.prefix, "iptables", "-I", *count], check=True)
        nodes = ready_nodes(system)  # (an earlier test may have lost one)
        assert len(nodes) >= 2, nodes
        readers = mn.reader_pods(system, "default", ref, nodes, prefix="mirrored")
        names = [r["metadata"]["name"] for r in readers]
        system.kubectl("apply", "-f", "-", stdin="\n---\n".join(json.dumps(r) for r in readers))

        def running() -> bool:
            phases = system.kubectl(
                "get", "pods", *names, "-n", "default", "-o", "jsonpath={.items[*].status.phase}"
            ).split()
            return phases == ["Running"] * len(names)

        eventually(running, timeout=180, what="a reader Running on every node")
        sent = _sent(place, own.port)
        assert sent < 1.5 * size, f"the registry sent {sent} B for {size} B of content"
    finally:
        system.kubectl("delete", "pods", "-n", "default", "--wait=false", "--ignore-not-found",
                       *[f"mirrored-{i}-{n}" for i, n in enumerate(ready_nodes(system))],
                       check=False)  # fmt: skip
        spec = original["spec"]["template"]["spec"]["containers"][0]
        restore = [
            {
                "op": "replace",
                "path": "/spec/template/spec/containers/0/args",
                "value": spec["args"],
            },
            {"op": "replace", "path": "/spec/template/spec/containers/0/env", "value": spec["env"]},
        ]
        system.kubectl("patch", ds, "-n", inst.NAMESPACE, "--type=json", "-p", json.dumps(restore),
                       check=False)  # fmt: skip
        _plugin_rollout(system)
        for doc in mirror:
            system.kubectl("delete", doc["kind"], doc["metadata"]["name"], "-n", inst.NAMESPACE,
                           "--ignore-not-found", check=False)  # fmt: skip
        subprocess.run([*place.prefix, "iptables", "-D", *count], check=False)
        own.stop()


def ready_nodes(system: inst.RukpakSystem) -> list[str]:
    """The nodes whose Ready condition is True."""
    nodes = json.loads(system.kubectl("get", "nodes", "-o", "json"))["items"]
    return sorted(
        n["metadata"]["name"]
        for n in nodes
        if any(c["type"] == "Ready" and c["status"] == "True" for c in n["status"]["conditions"])
    )


def _sent(place: Any, port: int) -> int:
    """Bytes sent from ``port`` in ``place``'s namespace, by its counting rule."""
    out = subprocess.run([*place.prefix, "iptables", "-L", "OUTPUT", "-v", "-x", "-n"],
                         check=True, capture_output=True, text=True).stdout  # fmt: skip
    return next(int(line.split()[1]) for line in out.splitlines() if f"spt:{port}" in line)
