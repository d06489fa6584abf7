"""Where the local cluster's binaries come from.

``KUBEBUILDER_ASSETS`` (a directory of ready binaries, as envtest uses) wins for every
binary it holds; the rest come from the cache ``build.sh`` fills
(``$RUKPAK_CACHE/bin/<kubernetes version>/``), which ``ensure`` builds when needed.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

BUILD_SCRIPT = Path(__file__).with_name("build.sh")
CONTROL_PLANE = ("etcd", "kube-apiserver")
CLUSTER = (*CONTROL_PLANE, "kube-controller-manager", "kube-scheduler", "kubelet", "kubectl")
"""A cluster of one node in the host's network."""
NETWORKED = (*CLUSTER, "kube-proxy", "coredns")
"""Nodes in network namespaces of their own (``make run``, the multi-node tests)."""
ALL = (*CLUSTER, "csi-sanity")
MULTINODE = (*ALL, "kube-proxy", "coredns")
KIND = (*MULTINODE, "kubeadm")  # the kind node image (tests/kind)


def cache_dir() -> Path:
    """The directory ``build.sh`` writes into (it knows the pinned version)."""
    out = subprocess.run(
        ["bash", str(BUILD_SCRIPT), "--print-dir"], check=True, capture_output=True, text=True
    )
    return Path(out.stdout.strip())


def _assets() -> Path | None:
    value = os.environ.get("KUBEBUILDER_ASSETS")
    return Path(value) if value else None


def find(name: str) -> Path | None:
    """The path of binary ``name``, or None when neither the assets nor the cache hold it."""
    for directory in (_assets(), cache_dir()):
        if directory is not None and os.access(directory / name, os.X_OK):
            return directory / name
    return None


def ensure(names: tuple[str, ...] = ALL) -> dict[str, Path]:
    """Paths of ``names``; runs ``build.sh`` (a no-op when up to date) for missing ones."""
    assets = _assets()
    if assets is None or not all(os.access(assets / n, os.X_OK) for n in names):
        # build.sh prints its own progress; a stamp makes it return at once when built
        subprocess.run(["bash", str(BUILD_SCRIPT), "--quiet", *names], check=True)
    found = {n: find(n) for n in names}
    missing = [n for n, p in found.items() if p is None]
    if missing:
        raise RuntimeError(f"binaries {missing} not found after {BUILD_SCRIPT}")
    return {n: p for n, p in found.items() if p is not None}
