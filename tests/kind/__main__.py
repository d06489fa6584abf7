"""``python -m tests.kind up|down|node-image|registry``: the kind cluster for people and
for ``hack/run.sh`` (``make kind-run``, ``make kind-down``); see ``tests.kind.cluster``.

``up --dir DIR`` prints one line, ``NAME KUBECONFIG REGISTRY BUSYBOX``; ``registry start
SUFFIX`` starts ``<cluster>-registry-SUFFIX`` and prints its ``host:port``.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

from tests.kind import cluster, engine, nodeimage


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m tests.kind", description=__doc__)
    commands = parser.add_subparsers(dest="command", required=True)
    up = commands.add_parser("up", help="create (or reuse) the cluster and its registry")
    up.add_argument("--dir", type=Path, required=True, help="where the kubeconfig goes")
    commands.add_parser("down", help="delete the cluster and registries, stop our dockerd")
    commands.add_parser("node-image", help="build the node image (cached)")
    reg = commands.add_parser("registry", help="start or stop a registry on kind's network")
    reg.add_argument("action", choices=("start", "stop"))
    reg.add_argument("suffix", help="the registry is <cluster>-registry-SUFFIX")
    args = parser.parse_args(argv)
    try:
        if args.command == "up":
            done = cluster.up(args.dir, existing=os.environ.get("KIND_CLUSTER", ""))
            print(done.name, done.kubeconfig, done.registry, done.busybox)
        elif args.command == "down":
            cluster.down()
        elif args.command == "node-image":
            print(nodeimage.ensure(engine.ensure()))
        elif args.action == "start":
            print(cluster.start_registry(engine.ensure(), f"{cluster.REGISTRY}-{args.suffix}"))
        else:
            cluster.stop_registry(engine.ensure(), f"{cluster.REGISTRY}-{args.suffix}")
    except engine.EngineUnavailable as exc:
        print(f"kind: no container engine: {exc}", file=sys.stderr)
        return 3
    except RuntimeError as exc:  # a step that failed says why; no traceback
        print(f"kind: {exc}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
