"""Undoing what the local cluster's node did to the host: container processes (found by
their shim's ``-address``, our containerd socket), mounts under the work directory, the
CNI bridge and the kubelet's links in /var/log/containers.

Works from the work directory alone, so ``python -m tests.cluster down`` can use it after
the process that started the cluster is gone; ``LocalCluster.stop`` calls ``cleanup``.
"""

from __future__ import annotations

import contextlib
import ctypes
import json
import os
import signal
import subprocess
from pathlib import Path
from typing import TYPE_CHECKING

from tests.cluster.process import pid_alive

if TYPE_CHECKING:
    from tests.cluster.node import NodeLayout

MNT_DETACH = 2
CONTAINER_LOG_LINKS = "/var/log/containers"  # hard-coded in the kubelet


def _cmdline(pid: int) -> list[str]:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return [a.decode(errors="replace") for a in f.read().split(b"\0") if a]
    except OSError:
        return []


def _children() -> dict[int, list[int]]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        children.setdefault(ppid, []).append(int(entry))
    return children


def shim_pids(layout: NodeLayout) -> list[int]:
    """containerd shims started by this node's containerd (their -address is our socket)."""
    address = str(layout.containerd_socket)
    pids = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        argv = _cmdline(int(entry))
        if argv and "containerd-shim" in Path(argv[0]).name and address in argv:
            pids.append(int(entry))
    return pids


def kill_containers(layout: NodeLayout) -> None:
    """SIGKILL every shim of this node and every process under it."""
    shims = shim_pids(layout)
    if not shims:
        return
    children = _children()
    doomed: list[int] = []
    todo = list(shims)
    while todo:
        pid = todo.pop()
        doomed.append(pid)
        todo.extend(children.get(pid, []))
    for pid in reversed(doomed):
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
    for pid in doomed:
        for _ in range(100):
            if not pid_alive(pid):
                break
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            os.sched_yield()


def mounts_under(root: Path) -> list[str]:
    """Mount points at or below ``root``, deepest first."""
    prefix = str(root.resolve())
    points = []
    with open("/proc/self/mountinfo") as f:
        for line in f:
            point = line.split()[4].replace("\\040", " ")
            if point == prefix or point.startswith(prefix + "/"):
                points.append(point)
    return sorted(set(points), key=len, reverse=True)


def unmount_all(root: Path) -> list[str]:
    """Lazily unmount everything mounted under ``root``; return what is still mounted."""
    libc = ctypes.CDLL(None, use_errno=True)
    for _ in range(3):
        points = mounts_under(root)
        if not points:
            return []
        for point in points:
            libc.umount2(point.encode(), MNT_DETACH)
    return mounts_under(root)


def delete_bridge(layout: NodeLayout) -> None:
    """Remove the node's CNI bridge (pods' veths went with their network namespaces)."""
    try:
        bridge = json.loads(layout.network_file.read_text())["bridge"]
    except (OSError, ValueError, KeyError):
        return
    subprocess.run(["ip", "link", "del", bridge], capture_output=True)


def remove_log_links(layout: NodeLayout) -> None:
    """Remove the kubelet's links in /var/log/containers (a fixed path) into our pod logs."""
    ours = str(layout.workdir / "pod-logs") + "/"
    with contextlib.suppress(FileNotFoundError):
        for entry in os.scandir(CONTAINER_LOG_LINKS):
            with contextlib.suppress(OSError):
                if entry.is_symlink() and os.readlink(entry.path).startswith(ours):
                    os.unlink(entry.path)


def cleanup(layout: NodeLayout) -> list[str]:
    """Undo the node's effects on the host; returns mount points that could not be removed."""
    kill_containers(layout)
    left = unmount_all(layout.workdir)
    delete_bridge(layout)
    remove_log_links(layout)
    return left
