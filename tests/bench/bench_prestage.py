"""Benchmark: a 3-node pivot of a 100 MB bundle, spec change -> all nodes serving, with and
without pre-staging, in the same run.

Where it sits: ``make bench`` (``python -m tests.bench prestage``). Starts the multi-node
local cluster and installs ``deploy/`` as the multi-node tests do
(``tests.multinode_helpers.install_system``; the node plugins run ``--prestage=follow``).
The scenario is ``tests.prestage_helpers``: a v1alpha2 BundleDeployment pinned to v1 of a
bundle carrying ``PAYLOAD`` random bytes, and a DaemonSet (rolling update, one node at a
time) mounting the same pin on every node. Each round pushes a fresh v2, changes the
BundleDeployment's spec to it and rolls the DaemonSet as soon as the BundleDeployment has
pivoted (``status.resolvedSource``).

Figures (median over ``ROUNDS`` rounds of each, alternating, on the same cluster), first
over the local bridge (a node fetches 100 MB in well under a second), then with each node's
link limited to ``NODE_LINK`` (``tc``), as a node pulling from a remote registry:

- **spec change -> all nodes serving**: the DaemonSet runs v2 on every node. Without
  pre-staging each node's pod fetches the 100 MB at its publish, one node after the other
  (the roll waits for each pod); with it the three nodes fetch at once before the pivot,
  and the roll finds the content cached;
- **spec change -> pinned**: what pre-staging adds before the pivot.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

from tests import install_helpers as inst
from tests import prestage_helpers as ph
from tests.bench import Result, bench_rollout, median, progress
from tests.cluster.localcluster import LocalCluster

NODES = 3
ROUNDS = 2
PAYLOAD = 100 * 1000 * 1000
TIMEOUT = 300.0
NODE_LINK = "200mbit"
"""Each node's link in the second half (``tc`` token bucket): 25 MB/s, 4 s per 100 MB."""


def _shape(cluster: LocalCluster, rate: str) -> None:
    """Limit what each node receives to ``rate`` (a token bucket on the host's end of its
    veth, which carries the node's ingress): a per-node link, as nodes pulling from a
    remote registry have, instead of the local bridge's memory speed."""
    assert cluster.network is not None
    for i in range(1, NODES + 1):
        subprocess.run(
            ["tc", "qdisc", "replace", "dev", f"{cluster.network.name}v{i}", "root", "tbf",
             "rate", rate, "burst", "1mb", "latency", "200ms"],
            check=True, capture_output=True,
        )  # fmt: skip


def _rounds(system: inst.RukpakSystem, workdir: Path, label: str) -> dict[bool, list[ph.Pivot]]:
    runs: dict[bool, list[ph.Pivot]] = {False: [], True: []}
    for index in range(ROUNDS):
        for prestaged in (False, True):
            name = f"bench-{label}-{'pre' if prestaged else 'direct'}-{index}"
            ns, _ = ph.prepare(
                system, workdir, name=name, payload=PAYLOAD, prestage=TIMEOUT if prestaged else 0
            )
            done = ph.pivot(system, workdir, name=name, ns=ns, payload=PAYLOAD)
            runs[prestaged].append(done)
            progress(
                f"prestage: {name}: pinned after {done.pinned:.1f}s, all {NODES} nodes serving "
                f"after {done.serving:.1f}s"
            )
            system.kubectl("delete", "namespace", ns, "--wait=false")
            system.kubectl(
                "delete", "bundledeployments.v1alpha2.core.rukpak.io", name, "--wait=false"
            )
    return runs


def _results(runs: dict[bool, list[ph.Pivot]], link: str) -> list[Result]:
    direct = median([p.serving for p in runs[False]])
    staged = median([p.serving for p in runs[True]])
    pinned = median([p.pinned for p in runs[True]])
    mb = PAYLOAD // 1000 // 1000
    name = f"{NODES}-node pivot of a {mb} MB bundle ({link}), spec change -> all nodes serving"
    return [
        Result(
            f"{name}, without pre-staging",
            direct,
            "s",
            note="the DaemonSet's roll fetches on each node in turn; pinned after "
            f"{median([p.pinned for p in runs[False]]):.1f} s",
        ),
        Result(
            f"{name}, with pre-staging",
            staged,
            "s",
            baseline=direct,
            target=1.0,
            note=f"baseline: the same pivot without, same run; pinned after {pinned:.1f} s "
            f"(the nodes fetched at once), the roll then took {staged - pinned:.1f} s",
        ),
    ]


def _measure(system: inst.RukpakSystem, workdir: Path) -> list[Result]:
    local = _rounds(system, workdir, "local")
    _shape(system.cluster, NODE_LINK)
    shaped = _rounds(system, workdir, "link")
    return [*_results(local, "local bridge"), *_results(shaped, f"{NODE_LINK} per node")]


def run(workdir: Path) -> list[Result]:
    return bench_rollout.measure_on_nodes("prestage", workdir, NODES, _measure)
