"""csi-sanity (kubernetes-csi/csi-test) against the real plugin process and registry.

The binary comes from the cluster build cache (``make k8s-bins``, which ``make
test`` runs first); a missing binary is a failure, not a skip, since a green run
without it would prove nothing. Volumes are created with ``image`` pointing at
a bundle pushed to the test registry, and sanity's mount dir lies under the
plugin's kubelet dir, which is the only place the plugin mounts.

The verdict comes from sanity's per-spec JSON report, never from a pass count:
no spec may fail, and every skipped or pending spec must be listed in
``ALLOWED_SKIPS`` / ``ALLOWED_PENDING`` below, each naming the capability the
plugin does not advertise (and the test checks it really is not advertised).
An unexpected skip fails the test and names the spec.
"""

from __future__ import annotations

import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
import pytest

from csi.proto import csi_pb2, csi_pb2_grpc
from tests.cluster import bins
from tests.csi_helpers import PluginProcess, simple_image
from tests.registry import RegistryServer

pytestmark = [pytest.mark.registry, pytest.mark.slow]


@dataclass(frozen=True)
class NotAdvertised:
    """A capability the plugin does not advertise: ``service`` is identity, controller or node.

    ``name`` is the capability's enum name in the CSI spec. Some names (the
    ``*_HEALTH`` ones) come from newer spec drafts that csi-test knows and our
    proto does not; those cannot be advertised at all.
    """

    service: str
    name: str


# Skip message (as csi-sanity v5.6.0 words it) → the capability whose absence causes it.
ALLOWED_SKIPS: dict[str, NotAdvertised] = {
    # Volumes are node-local bind mounts: no attach step, so no ControllerPublish.
    "ControllerPublishVolume not supported": NotAdvertised(
        "controller", "PUBLISH_UNPUBLISH_VOLUME"
    ),
    "ControllerUnpublishVolume not supported": NotAdvertised(
        "controller", "PUBLISH_UNPUBLISH_VOLUME"
    ),
    "Controller Publish, UnpublishVolume not supported": NotAdvertised(
        "controller", "PUBLISH_UNPUBLISH_VOLUME"
    ),
    # Bundle content is immutable and read-only: nothing to expand, modify, clone or snapshot.
    "ControllerExpandVolume not supported": NotAdvertised("controller", "EXPAND_VOLUME"),
    "NodeExpandVolume not supported": NotAdvertised("node", "EXPAND_VOLUME"),
    "ControllerModifyVolume not supported": NotAdvertised("controller", "MODIFY_VOLUME"),
    "Modify volume not supported": NotAdvertised("controller", "MODIFY_VOLUME"),
    "Modify Volume not supported": NotAdvertised("controller", "MODIFY_VOLUME"),
    "Volume Cloning not supported": NotAdvertised("controller", "CLONE_VOLUME"),
    "Snapshot not supported": NotAdvertised("controller", "CREATE_DELETE_SNAPSHOT"),
    "CreateSnapshot not supported": NotAdvertised("controller", "CREATE_DELETE_SNAPSHOT"),
    "DeleteSnapshot not supported": NotAdvertised("controller", "CREATE_DELETE_SNAPSHOT"),
    "ListSnapshots not supported": NotAdvertised("controller", "LIST_SNAPSHOTS"),
    "GetSnapshot not supported": NotAdvertised("controller", "GET_SNAPSHOT"),
    "GroupControllerService not supported": NotAdvertised("identity", "GROUP_CONTROLLER_SERVICE"),
    # The controller keeps no list for ListVolumes and has no storage pool to measure.
    "ListVolumes not supported": NotAdvertised("controller", "LIST_VOLUMES"),
    "GetCapacity not supported": NotAdvertised("controller", "GET_CAPACITY"),
    # The content lives in the node cache, not a device: no per-volume health or stats.
    "ControllerGetVolumeHealth not supported": NotAdvertised("controller", "GET_VOLUME_HEALTH"),
    "ControllerListVolumeHealth not supported": NotAdvertised("controller", "LIST_VOLUME_HEALTH"),
    "NodeGetVolumeHealth not supported": NotAdvertised("node", "GET_VOLUME_HEALTH"),
    "NodeGetStorageHealth not supported": NotAdvertised("node", "GET_STORAGE_HEALTH"),
    "NodeGetVolume not supported": NotAdvertised("node", "GET_VOLUME_STATS"),
    # Publishing is one bind mount per target; there is no global staging step.
    "NodeStageVolume not supported": NotAdvertised("node", "STAGE_UNSTAGE_VOLUME"),
    "NodeUnstageVolume not supported": NotAdvertised("node", "STAGE_UNSTAGE_VOLUME"),
    # The plugin offers no SINGLE_NODE_MULTI_WRITER access mode: volumes are read-only.
    "Service does not have single node multi writer capability": NotAdvertised(
        "node", "SINGLE_NODE_MULTI_WRITER"
    ),
}

# Pending specs carry no message; they are disabled upstream (XIt), so match by spec text.
ALLOWED_PENDING: dict[str, str] = {
    # csi-test disables it as flaky (csi-test#223); it needs LIST_VOLUMES anyway.
    "pagination should detect volumes added between pages and accept tokens when the last "
    "volume from a page is deleted": "upstream XIt; LIST_VOLUMES not advertised",
}


@dataclass(frozen=True)
class SpecResult:
    name: str
    state: str
    message: str


def read_report(path: Path) -> list[SpecResult]:
    """Per-spec outcomes from a ginkgo ``--ginkgo.json-report`` file."""
    suites: list[dict[str, Any]] = json.loads(path.read_text())
    results = []
    for suite in suites:
        for spec in suite.get("SpecReports") or []:
            # Suite-level nodes (BeforeSuite...) only matter when they fail.
            if spec.get("LeafNodeType") != "It" and spec.get("State") in ("passed", "skipped"):
                continue
            texts = [*(spec.get("ContainerHierarchyTexts") or []), spec.get("LeafNodeText", "")]
            failure = spec.get("Failure") or {}
            results.append(
                SpecResult(
                    name=" > ".join(t for t in texts if t),
                    state=str(spec.get("State")),
                    message=str(failure.get("Message", "")).strip(),
                )
            )
    return results


def advertised(socket: Path) -> dict[str, set[str]]:
    """Capability names the plugin advertises, by service."""
    with grpc.insecure_channel(f"unix://{socket}") as channel:
        identity = csi_pb2_grpc.IdentityStub(channel)
        plugin = identity.GetPluginCapabilities(csi_pb2.GetPluginCapabilitiesRequest(), timeout=10)
        node = csi_pb2_grpc.NodeStub(channel).NodeGetCapabilities(
            csi_pb2.NodeGetCapabilitiesRequest(), timeout=10
        )
        ctrl = csi_pb2_grpc.ControllerStub(channel).ControllerGetCapabilities(
            csi_pb2.ControllerGetCapabilitiesRequest(), timeout=10
        )
    service_name = csi_pb2.PluginCapability.Service.Type.Name
    node_name = csi_pb2.NodeServiceCapability.RPC.Type.Name
    ctrl_name = csi_pb2.ControllerServiceCapability.RPC.Type.Name
    return {
        "identity": {service_name(c.service.type) for c in plugin.capabilities},
        "node": {node_name(c.rpc.type) for c in node.capabilities},
        "controller": {ctrl_name(c.rpc.type) for c in ctrl.capabilities},
    }


@pytest.fixture
def sanity_binary() -> Path:
    path = bins.find("csi-sanity")
    if path is None:
        pytest.fail(
            "csi-sanity is not built: run `make k8s-bins` (make test does it first) or set "
            "KUBEBUILDER_ASSETS to a directory holding csi-sanity"
        )
    return path


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[PluginProcess]:
    if os.geteuid() != 0:
        pytest.fail("csi-sanity publishes volumes with bind mounts, which need root: run as root")
    proc = PluginProcess(tmp_path / "plugin").start()
    try:
        yield proc
    finally:
        proc.stop()
        proc.unmount_all()


def test_csi_sanity_passes_with_only_documented_skips(
    sanity_binary: Path, plugin: PluginProcess, registry: RegistryServer, tmp_path: Path
) -> None:
    image = simple_image(registry.host, "sanity/bundle", text="kind: ConfigMap")
    params = tmp_path / "params.yaml"
    params.write_text(f"image: {image.ref}\npullPolicy: IfNotPresent\n")
    report = tmp_path / "sanity-report.json"
    sanity_dir = plugin.kubelet_dir / "sanity"
    sanity_dir.mkdir()
    result = subprocess.run(
        [
            str(sanity_binary),
            f"--csi.endpoint=unix://{plugin.socket}",
            f"--csi.mountdir={sanity_dir / 'mount'}",
            f"--csi.stagingdir={sanity_dir / 'staging'}",
            f"--csi.testvolumeparameters={params}",
            "--csi.testvolumesize=1048576",
            "--ginkgo.no-color",
            f"--ginkgo.json-report={report}",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    tail = "\n".join(result.stdout.splitlines()[-60:]) + "\n" + result.stderr[-3000:]
    assert report.is_file(), f"csi-sanity wrote no report (exit {result.returncode}):\n{tail}"
    specs = read_report(report)
    assert specs, f"csi-sanity reported no specs:\n{tail}"

    failed = [s for s in specs if s.state not in ("passed", "skipped", "pending")]
    assert not failed, (
        "csi-sanity specs failed:\n"
        + "\n".join(f"- [{s.state}] {s.name}: {s.message[:500]}" for s in failed)
        + f"\n\nplugin log tail:\n{plugin.log()[-3000:]}"
    )

    unexpected = [
        s
        for s in specs
        if (s.state == "skipped" and s.message not in ALLOWED_SKIPS)
        or (s.state == "pending" and not any(s.name.endswith(text) for text in ALLOWED_PENDING))
    ]
    assert not unexpected, (
        "csi-sanity skipped specs for reasons not in ALLOWED_SKIPS (fix the plugin, or add "
        "the reason with the capability it stands for):\n"
        + "\n".join(f"- [{s.state}] {s.name}: {s.message!r}" for s in unexpected)
    )

    caps = advertised(plugin.socket)
    contradicted = sorted(
        f"{message!r} allowed, yet {cap.service} advertises {cap.name}"
        for message, cap in ALLOWED_SKIPS.items()
        if cap.name in caps[cap.service]
    )
    assert not contradicted, "allow-list entries contradict the plugin:\n" + "\n".join(contradicted)
    assert result.returncode == 0, f"csi-sanity exited {result.returncode}:\n{tail}"

    counts = {state: sum(s.state == state for s in specs) for state in ("passed", "skipped")}
    print(f"csi-sanity: {counts} pending={sum(s.state == 'pending' for s in specs)}")
