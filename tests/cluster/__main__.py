"""``python -m tests.cluster up|down|status``: the local cluster for people (``make run``,
``make cluster-up``), detached from the command that started it.

The cluster lives in ``$RUKPAK_CLUSTER_DIR`` (default ``$RUKPAK_CACHE/cluster``, i.e.
``~/.cache/rukpak/cluster``); ``state.json`` there records the pids ``down`` stops.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
from pathlib import Path

from tests.cluster import bins
from tests.cluster.localcluster import STATE_FILE, LocalCluster
from tests.cluster.process import ComponentError


def state_dir() -> Path:
    explicit = os.environ.get("RUKPAK_CLUSTER_DIR")
    if explicit:
        return Path(explicit)
    cache = Path(os.environ.get("RUKPAK_CACHE", Path.home() / ".cache" / "rukpak"))
    return cache / "cluster"


def _running(workdir: Path) -> LocalCluster | None:
    if not (workdir / STATE_FILE).exists():
        return None
    return LocalCluster.load(workdir)


def _found(workdir: Path) -> LocalCluster | None:
    """The cluster recorded in ``workdir``; None, saying so, when there is none."""
    cluster = _running(workdir)
    if cluster is None:
        print(f"no cluster in {workdir}")
    return cluster


def up(workdir: Path, *, node: bool, nodes: int = 1, networked: bool = False) -> int:
    existing = _running(workdir)
    if existing is not None and existing.components:
        print(f"cluster already running in {workdir} (`python -m tests.cluster down` first)")
        print(f"export KUBECONFIG={existing.kubeconfig}")
        return 0
    if existing is not None:
        existing.stop(remove=True)  # leftovers of a cluster whose processes are gone
    started = time.monotonic()
    try:
        cluster = LocalCluster.start(workdir, node=node, nodes=nodes, networked=networked)
    except ComponentError as e:
        print(f"cluster-up failed: {e}", file=sys.stderr)
        return 1
    took = time.monotonic() - started
    names = ", ".join(cluster.node_names)
    what = (
        (f"nodes {names} Ready" if nodes > 1 else f"node {names} Ready")
        if node
        else "apiserver ready"
    )
    print(f"cluster up in {took:.1f}s ({what}); logs in {cluster.logs_dir}")
    if cluster.registry_host:
        print(f"registry: {cluster.registry_host}  test image: {cluster.busybox_image}")
        print(f"kubelet dir: {cluster.kubelet_dir}")
    print(f"kubectl: {bins.find('kubectl')}")
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    return 0


def down(workdir: Path) -> int:
    if (cluster := _found(workdir)) is None:
        return 0
    pids = cluster.pids()
    cluster.stop(remove=True)
    print(f"cluster stopped (pids {' '.join(map(str, pids)) or 'none left'})")
    return 0


def status(workdir: Path) -> int:
    if (cluster := _found(workdir)) is None:
        return 1
    for c in [*cluster.components, *(c for m in cluster.machines for c in m.components)]:
        print(f"{c.name:<24} pid {c.pid:<8} log {c.log}")
    ready = False
    for name in cluster.node_names:
        try:
            ready = cluster.node_ready(name)
        except OSError:
            ready = False
        print(f"node {name}: {'Ready' if ready else 'not Ready'}")
    print(f"export KUBECONFIG={cluster.kubeconfig}")
    return 0 if cluster.components else 1


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.cluster", description=__doc__)
    parser.add_argument("command", choices=["up", "down", "status"])
    parser.add_argument(
        "--no-node", action="store_true", help="up: etcd + kube-apiserver only (no kubelet)"
    )
    parser.add_argument(
        "--nodes",
        type=int,
        default=int(os.environ.get("NODES") or 1),
        help="up: how many nodes (default $NODES or 1); more than one gives each node its "
        "own network namespace, with kube-proxy and CoreDNS",
    )
    parser.add_argument(
        "--networked",
        action="store_true",
        help="up: one node too in its own namespaces, with kube-proxy and CoreDNS",
    )
    parser.add_argument("--dir", type=Path, default=None, help="state directory")
    args = parser.parse_args(argv)
    workdir = args.dir or state_dir()
    if args.command == "up":
        if args.nodes < 1:
            parser.error("--nodes must be at least 1")
        return up(workdir, node=not args.no_node, nodes=args.nodes, networked=args.networked)
    if args.command == "down":
        return down(workdir)
    return status(workdir)


if __name__ == "__main__":
    sys.exit(main())
