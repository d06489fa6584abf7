"""Benchmark: a new bundle version rolled out to every node of the multi-node cluster at
once: time until every node serves it, and what the registry sent for it.

Where it sits: ``make bench`` (``python -m tests.bench rollout``). Starts the multi-node
local cluster (``NODES`` nodes, ``tests.cluster`` with kube-proxy and CoreDNS) and installs
``deploy/`` as the multi-node tests do (``tests.multinode_helpers.install_system``). Each
round pushes a version no node has seen (a layer of ``PAYLOAD`` random bytes, which no
compression shrinks) to a registry of its own in the control plane's namespace, then
creates one reader pod per node, all at once, each mounting that version through an inline
CSI volume. An iptables counting rule in the control plane's namespace measures the bytes
the registry sent.

Figures (median over the rounds):

- **rollout time**: the pods created -> every node's reader Running (its volume published);
- **registry egress per rollout**, against the version's size in the registry (its blobs
  and manifest): the number of full pulls a rollout costs. Today every node pulls the
  image itself, so this is the node count; the figure is what a node-to-node blob source
  or pre-staging would bring down (see docs/scale.md).

Then, once: ``BURST`` pods on one node mounting the same new version at once: the time
until all are Running, and the p50 and p99 of the plugin's NodePublishVolume latency on
that node, read from its own histogram (``rukpak_csi_rpc_duration_seconds``, so the
figures are bucket bounds: "at most").
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from tests import install_helpers as inst
from tests import multinode_helpers as mn
from tests.bench import Result, bench_install, median, progress
from tests.cluster import bins, images
from tests.cluster.localcluster import LocalCluster
from tests.cluster.process import free_port

NODES = 3
ROUNDS = 3
BURST = 100
PAYLOAD = 4 * 1024 * 1024
REPO_ROOT = Path(__file__).resolve().parents[2]
OCITOOL = REPO_ROOT / "hack" / "image" / "ocitool.py"


def _push_version(workdir: Path, ref: str, host: str) -> int:
    """Push an image of one fresh random layer as ``ref``; its size in the registry."""
    root = workdir / "content"
    shutil.rmtree(root, ignore_errors=True)
    (root / "manifests").mkdir(parents=True)
    (root / "manifests" / "payload.bin").write_bytes(os.urandom(PAYLOAD))
    layer = workdir / "layer.tar.gz"
    subprocess.run([sys.executable, str(OCITOOL), "layer", str(root), str(layer)], check=True,
                   capture_output=True)  # fmt: skip
    subprocess.run(
        [sys.executable, str(OCITOOL), "push", "--insecure", host, "--layer", str(layer),
         "--entrypoint", "/bin/false", "--path", "/bin", ref],
        check=True, capture_output=True,
    )  # fmt: skip
    size = layer.stat().st_size
    return size


def _egress(cluster: LocalCluster, port: int, *, reset: bool = False) -> int:
    """Bytes the registry on ``port`` sent since the last reset (a counting rule)."""
    assert cluster.network is not None
    prefix = cluster.network.control_plane.prefix
    out = subprocess.run(
        [*prefix, "iptables", "-L", "OUTPUT", "-v", "-x", "-n", *(["-Z"] if reset else [])],
        check=True, capture_output=True, text=True,
    ).stdout  # fmt: skip
    for line in out.splitlines():
        if f"spt:{port}" in line:
            return int(line.split()[1])
    raise RuntimeError(f"no counting rule for port {port} in:\n{out}")


def _readers(
    system: inst.RukpakSystem, ns: str, ref: str, nodes: list[str] | None = None
) -> list[dict[str, object]]:
    return mn.reader_pods(
        system, ns, ref, nodes or system.cluster.node_names,
        check="test -s /bundle/manifests/payload.bin",
    )  # fmt: skip


def _all_running(system: inst.RukpakSystem, ns: str, count: int = NODES) -> bool:
    out = system.kubectl("get", "pods", "-n", ns, "-o", "json", timeout=120)
    items = json.loads(out)["items"]
    return len(items) == count and all(p["status"].get("phase") == "Running" for p in items)


def _publish_buckets(cluster: LocalCluster, node: str) -> dict[float, float]:
    """The node plugin's cumulative NodePublishVolume latency buckets (le -> count)."""
    scrape = mn.machine(cluster, node).run("curl", "-fsS", "http://127.0.0.1:9809/metrics")
    if scrape.returncode != 0:
        raise RuntimeError(f"cannot read {node}'s plugin metrics: {scrape.stderr}")
    found: dict[float, float] = {}
    for line in scrape.stdout.splitlines():
        if line.startswith("rukpak_csi_rpc_duration_seconds_bucket{") and (
            'method="NodePublishVolume"' in line
        ):
            le = line.split('le="', 1)[1].split('"', 1)[0]
            found[float(le)] = float(line.rsplit(" ", 1)[1])
    return found


def _quantile(before: dict[float, float], after: dict[float, float], q: float) -> float:
    """The upper bound of the bucket holding quantile ``q`` of the calls in between."""
    bounds = sorted(after)
    total = after[bounds[-1]] - before.get(bounds[-1], 0.0)
    for bound in bounds:
        if after[bound] - before.get(bound, 0.0) >= q * total:
            return bound
    return bounds[-1]


def _burst(
    system: inst.RukpakSystem, workdir: Path, registry: images.LocalRegistry
) -> list[Result]:
    cluster = system.cluster
    node = cluster.node_names[0]
    ref = f"{registry.host}/bench-rollout/burst:v1"
    _push_version(workdir, ref, registry.host)
    ns = "burst"
    system.kubectl("create", "namespace", ns)
    before = _publish_buckets(cluster, node)
    started = time.monotonic()
    system.kubectl("apply", "-f", "-", timeout=300, stdin="\n---\n".join(
        json.dumps(d) for d in _readers(system, ns, ref, [node] * BURST)))  # fmt: skip
    deadline = started + 900
    while not _all_running(system, ns, BURST):
        if time.monotonic() > deadline:
            raise TimeoutError(f"not all {BURST} readers Running on {node}")
        time.sleep(1.0)
    took = time.monotonic() - started
    after = _publish_buckets(cluster, node)
    calls = after[max(after)] - before.get(max(after), 0.0)
    p50, p99 = _quantile(before, after, 0.5), _quantile(before, after, 0.99)
    progress(f"rollout: {BURST} pods on {node}: all Running in {took:.1f}s; "
             f"{calls:.0f} publishes, p50 <= {p50}s, p99 <= {p99}s")  # fmt: skip
    system.kubectl("delete", "namespace", ns, "--wait=false")
    return [
        Result(
            f"{BURST} pods on one node mounting the same new bundle at once: publish p99",
            p99,
            "s",
            note=f"at most (histogram bucket); p50 <= {p50} s; {calls:.0f} NodePublishVolume "
            f"calls; all pods Running in {took:.0f} s",
        )
    ]


def _rounds(
    system: inst.RukpakSystem, workdir: Path, registry: images.LocalRegistry, label: str
) -> tuple[list[float], list[float], list[float]]:
    """``ROUNDS`` rollouts of a new version each: (times, full pulls, layer sizes)."""
    cluster = system.cluster
    times: list[float] = []
    pulls: list[float] = []
    sizes: list[float] = []
    for index in range(ROUNDS):
        ref = f"{registry.host}/bench-rollout/app-{label}:v{index}"
        size = _push_version(workdir, ref, registry.host)
        ns = f"rollout-{label}-{index}"
        system.kubectl("create", "namespace", ns)
        _egress(cluster, registry.port, reset=True)
        started = time.monotonic()
        system.kubectl("apply", "-f", "-", stdin="\n---\n".join(
            json.dumps(d) for d in _readers(system, ns, ref)))  # fmt: skip
        deadline = started + 180
        while not _all_running(system, ns):
            if time.monotonic() > deadline:
                raise TimeoutError(f"{label} round {index}: not every reader Running")
            time.sleep(0.1)
        took = time.monotonic() - started
        sent = _egress(cluster, registry.port)
        times.append(took)
        pulls.append(sent / size)
        sizes.append(size)
        progress(f"rollout ({label}): round {index}: {took:.2f}s, registry sent {sent} B "
                 f"for a {size} B layer ({sent / size:.2f} pulls)")  # fmt: skip
        system.kubectl("delete", "namespace", ns, "--wait=false")
    return times, pulls, sizes


def _with_mirror(
    system: inst.RukpakSystem, workdir: Path, registry: images.LocalRegistry
) -> subprocess.Popen[str]:
    """Start ``python -m csi.mirror`` in the control plane's namespace for ``registry`` and
    point every node plugin at it (``--registry-mirror``), rolled out; the mirror process."""
    cluster = system.cluster
    assert cluster.network is not None
    place = cluster.network.control_plane
    port = free_port()
    with (workdir / "mirror.log").open("w") as log:
        mirror = subprocess.Popen(
            place.argv([sys.executable, "-m", "csi.mirror", "--listen", f"{place.address}:{port}",
                        "--root", str(workdir / "mirror"), "--upstream", registry.host,
                        "--insecure-registry", registry.host]),
            stdout=subprocess.PIPE, stderr=log, text=True, cwd=REPO_ROOT,
        )  # fmt: skip
    assert mirror.stdout is not None
    announced = mirror.stdout.readline().strip()
    if not announced:
        raise RuntimeError(f"the mirror did not start: {(workdir / 'mirror.log').read_text()}")
    ds = json.loads(system.kubectl("get", "daemonset", "-n", inst.NAMESPACE, "-o", "json"))
    plugin = next(d for d in ds["items"] if d["metadata"]["name"] == "rukpak-csi-node")
    index = next(
        i for i, c in enumerate(plugin["spec"]["template"]["spec"]["containers"])
        if any(str(a).startswith("--endpoint") for a in c.get("args") or [])
    )  # fmt: skip
    path = f"/spec/template/spec/containers/{index}/args/-"
    patch = [
        {"op": "add", "path": path, "value": f"--registry-mirror={registry.host}={announced}"},
        {"op": "add", "path": path, "value": f"--insecure-registry={announced}"},
    ]
    system.kubectl("patch", "daemonset", "rukpak-csi-node", "-n", inst.NAMESPACE,
                   "--type=json", "-p", json.dumps(patch))  # fmt: skip
    system.kubectl("rollout", "status", "daemonset/rukpak-csi-node", "-n", inst.NAMESPACE,
                   "--timeout=300s", timeout=320)  # fmt: skip
    progress(f"rollout: the node plugins ask the mirror at {announced} first")
    return mirror


def _measure(system: inst.RukpakSystem, workdir: Path) -> list[Result]:
    cluster = system.cluster
    assert cluster.network is not None
    registry = images.start_registry(
        workdir / "registry", log=workdir / "registry.log", place=cluster.network.control_plane
    )
    rule = ["OUTPUT", "-p", "tcp", "--sport", str(registry.port)]
    subprocess.run([*cluster.network.control_plane.prefix, "iptables", "-I", *rule], check=True)
    mirror: subprocess.Popen[str] | None = None
    try:
        times, pulls, sizes = _rounds(system, workdir, registry, "direct")
        burst = _burst(system, workdir, registry)
        mirror = _with_mirror(system, workdir, registry)
        m_times, m_pulls, _ = _rounds(system, workdir, registry, "mirror")
    finally:
        if mirror is not None:
            mirror.terminate()
            mirror.wait(timeout=30)
            tail = (workdir / "mirror.log").read_text(errors="replace").splitlines()[-8:]
            progress("rollout: the mirror's log ends:\n  " + "\n  ".join(tail))
        registry.stop()
    return [
        *burst,
        Result(
            f"{NODES}-node rollout of a new {PAYLOAD // 1024 // 1024} MiB bundle: all serving",
            median(times),
            "s",
            note="pods created -> every node's reader Running",
        ),
        Result(
            f"registry egress per {NODES}-node rollout (full pulls)",
            median(pulls),
            "pulls",
            note=f"bytes sent / layer size ({median(sizes):.0f} B); every node pulls itself",
        ),
        Result(
            f"{NODES}-node rollout through the mirror (csi.mirror): all serving",
            median(m_times),
            "s",
            note="the same rollout, the node plugins started with --registry-mirror",
        ),
        Result(
            f"registry egress per {NODES}-node rollout through the mirror (full pulls)",
            median(m_pulls),
            "pulls",
            target=1.1,
            note="the mirror fetches each digest once, however many nodes ask at once",
        ),
    ]


def measure_on_nodes(
    label: str,
    workdir: Path,
    nodes: int,
    measure: Callable[[inst.RukpakSystem, Path], list[Result]],
) -> list[Result]:
    """``measure`` RukPak installed from ``deploy/`` on a new cluster of ``nodes`` nodes
    (the multi-node benches' start), which is stopped and removed afterwards."""
    reason = mn.missing_capability()
    if reason:
        raise RuntimeError(reason)
    found = bins.ensure(bins.MULTINODE)
    progress(f"{label}: starting a {nodes}-node cluster")
    cluster = LocalCluster.start(workdir / "cluster", nodes=nodes, binaries=found)

    def install() -> inst.RukpakSystem:
        progress(f"{label}: building the image and installing deploy/")
        return mn.install_system(cluster, workdir / "install")

    return bench_install.measure_installed(
        cluster, install, lambda system: measure(system, workdir)
    )


def run(workdir: Path) -> list[Result]:
    return measure_on_nodes("rollout", workdir, NODES, _measure)
