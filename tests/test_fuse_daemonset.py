"""End to end: FUSE volumes of the shipped DaemonSet keep serving across a plugin kill -9.

The ``rukpak_system`` fixture (``tests.install_helpers``) installs the whole system from
``deploy/``; its DaemonSet runs the plugin with ``--fuse`` beside the ``fuse-holder``
container that owns the FUSE mount. A pod reads every manifest of a ``publishMode: fuse``
inline volume in a loop, printing one line per pass and a ``FAIL`` line for any failed
read. The test kills the plugin's main process with SIGKILL (found by its container's
cgroup, killed by pid), waits until the kubelet has restarted that container, and then
until the reader has completed further passes: none may fail, and the restarted
plugin must say it resumed the holder's mount.
"""

from __future__ import annotations

import os
import signal
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from kubernetes import client

from tests import e2e_helpers as e2e
from tests import install_helpers as inst
from tests.polling import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

NAMESPACE = inst.NAMESPACE
SELECTOR = "app.kubernetes.io/name=rukpak-csi,app.kubernetes.io/component=node-plugin"
READER = (
    "i=0; while true; do for f in /bundle/manifests/*; do "
    'cat "$f" >/dev/null || echo "FAIL $f"; done; '
    'i=$((i+1)); echo "pass $i"; sleep 0.2; done'
)


@pytest.fixture(scope="module")
def namespace(core: client.CoreV1Api) -> Iterator[str]:
    with e2e.temporary_namespace(core, "e2e-fuse") as name:
        yield name


def _plugin_pod(core: client.CoreV1Api) -> Any:
    def ready() -> Any:
        pods = core.list_namespaced_pod(NAMESPACE, label_selector=SELECTOR).items
        if len(pods) != 1 or pods[0].status.phase != "Running":
            return None
        statuses = pods[0].status.container_statuses or []
        return pods[0] if statuses and all(s.ready for s in statuses) else None

    return eventually(ready, timeout=150, what="the DaemonSet's pod to be Running and ready")


def _status(pod: Any, container: str) -> Any:
    (status,) = [s for s in pod.status.container_statuses if s.name == container]
    return status


def _main_process(container_id: str) -> int:
    """The host pid of the container's first process (pid 1 in its namespace)."""
    short = container_id.split("://", 1)[-1]
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            if short not in (entry / "cgroup").read_text():
                continue
            status = (entry / "status").read_text()
        except OSError:
            continue
        nspid = [line.split()[1:] for line in status.splitlines() if line.startswith("NSpid:")]
        if nspid and nspid[0][-1] == "1":
            return int(entry.name)
    raise AssertionError(f"no process of container {short} found under /proc")


def _passes(log: str) -> int:
    return sum(1 for line in log.splitlines() if line.startswith("pass "))


def test_fuse_reads_continue_across_a_kill_9_of_the_plugin_container(
    kube_cluster: Any,
    core: client.CoreV1Api,
    rukpak_system: inst.RukpakSystem,
    namespace: str,
) -> None:
    plugin = _plugin_pod(core)
    assert "fuse-holder" in [c.name for c in plugin.spec.containers]
    bundle = f"{kube_cluster.registry_host}/rukpak-e2e/hello-fuse:v1"
    e2e.push_bundle(e2e.HELLO_BUNDLE, bundle)
    volume = client.V1Volume(
        name="bundle",
        csi=client.V1CSIVolumeSource(
            driver=e2e.DRIVER,
            read_only=True,
            volume_attributes={"image": bundle, "publishMode": "fuse"},
        ),
    )
    name = f"fuse-reader-{uuid.uuid4().hex[:6]}"
    e2e.start_bundle_pod(
        core, namespace, name, image=kube_cluster.busybox_image, command=READER, volume=volume
    )
    e2e.wait_phase(core, namespace, name, ("Running",), timeout=90)

    def log() -> str:
        return str(core.read_namespaced_pod_log(name, namespace))

    eventually(lambda: _passes(log()) >= 3, timeout=60, what="the reader's first passes")
    restarts = _status(plugin, "plugin").restart_count
    with open("/proc/sys/vm/drop_caches", "w") as f:  # reads, too, need the daemon again
        f.write("3")
    os.kill(_main_process(_status(plugin, "plugin").container_id), signal.SIGKILL)

    def restarted() -> Any:
        pod = _plugin_pod(core)
        return pod if _status(pod, "plugin").restart_count > restarts else None

    pod = eventually(restarted, timeout=150, what="the kubelet to restart the plugin container")
    assert _status(pod, "fuse-holder").restart_count == _status(plugin, "fuse-holder").restart_count
    seen = _passes(log())
    eventually(
        lambda: _passes(log()) >= seen + 5, timeout=90, what="reader passes after the restart"
    )
    assert "FAIL" not in log(), log()
    plugin_log = str(core.read_namespaced_pod_log(pod.metadata.name, NAMESPACE, container="plugin"))
    assert "resumed=True" in plugin_log, plugin_log
    e2e.delete_pod_and_wait(core, namespace, name)
