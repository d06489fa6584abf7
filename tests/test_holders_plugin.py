"""The holder registry and the metrics in a real plugin process (real registry, real bind
mounts, a real FUSE mount): a FUSE publish moves the metric families a bind publish moves,
and a node upgraded in place from ``state.json`` and ``publishes.json`` keeps its volumes."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import grpc
import pytest

from csi.proto import csi_pb2_grpc
from tests.csi_helpers import (
    PluginProcess,
    publish_request,
    simple_image,
    target,
    unpublish,
)
from tests.fuse_helpers import fuse_plugin_fixture
from tests.metrics_helpers import Samples, scrape
from tests.registry import RegistryServer

pytestmark = [pytest.mark.registry]


plugin = fuse_plugin_fixture()


CACHE_FAMILIES = (
    "rukpak_csi_image_cache_total",
    "rukpak_csi_image_pulls_total",
    "rukpak_csi_image_pull_seconds_total",
    "rukpak_csi_image_pull_duration_seconds_count",
    "rukpak_csi_image_pull_bytes_total",
    "rukpak_csi_published_volumes",
    "rukpak_csi_cache_bytes",
    "rukpak_csi_rpc_duration_seconds_count",
)


def moved(
    before: Samples,
    after: Samples,
) -> Samples:
    """The samples of ``CACHE_FAMILIES`` that grew between two scrapes, by how much."""
    return {
        key: after[key] - before.get(key, 0.0)
        for key in after
        if key[0] in CACHE_FAMILIES and after[key] > before.get(key, 0.0)
    }


def test_a_fuse_publish_moves_the_metric_families_a_bind_publish_moves(
    plugin: PluginProcess, registry: RegistryServer
) -> None:
    bound = simple_image(registry.host, "holders-plugin/metrics-bind", text="bind")
    fused = simple_image(registry.host, "holders-plugin/metrics-fuse", text="fuse")
    with grpc.insecure_channel(f"unix://{plugin.socket}") as channel:
        node = csi_pb2_grpc.NodeStub(channel)
        grew = {}
        for mode, image in (("bind", bound), ("fuse", fused)):
            before = scrape(plugin.metrics_port)
            for n in range(2):  # a miss, then a hit
                request = publish_request(
                    target(plugin), image.ref, volume_id=f"{mode}-{n}", publishMode=mode
                )
                node.NodePublishVolume(request)
            grew[mode] = moved(before, scrape(plugin.metrics_port))
    assert grew["fuse"].keys() == grew["bind"].keys(), "the same samples moved"
    for mode in ("bind", "fuse"):
        assert grew[mode][("rukpak_csi_image_cache_total", (("result", "hit"),))] == 1
        assert grew[mode][("rukpak_csi_image_cache_total", (("result", "miss"),))] == 1
        assert grew[mode][("rukpak_csi_image_pulls_total", ())] == 1
        assert grew[mode][("rukpak_csi_image_pull_bytes_total", ())] > 0
        assert grew[mode][("rukpak_csi_published_volumes", ())] == 2
        assert grew[mode][("rukpak_csi_cache_bytes", ())] > 0


def test_a_node_upgraded_in_place_keeps_its_bind_and_fuse_volumes(
    plugin: PluginProcess, registry: RegistryServer
) -> None:
    image = simple_image(registry.host, "holders-plugin/upgrade", text="kept")
    bind_path, fuse_path = target(plugin), target(plugin)
    requests_ = {
        bind_path: publish_request(bind_path, image.ref, volume_id="vol-b", publishMode="bind"),
        fuse_path: publish_request(fuse_path, image.ref, volume_id="vol-f", publishMode="fuse"),
    }
    with grpc.insecure_channel(f"unix://{plugin.socket}") as channel:
        node = csi_pb2_grpc.NodeStub(channel)
        for request in requests_.values():
            node.NodePublishVolume(request)
    plugin.stop()
    # Rewrite the node's records as an older plugin kept them: state.json and publishes.json.
    records = {
        r["target"]: r
        for r in (json.loads(p.read_text()) for p in (plugin.state_dir / "holders").iterdir())
    }
    assert set(records) == {bind_path, fuse_path}
    shutil.rmtree(plugin.state_dir / "holders")
    state_path = plugin.state_dir / "images/state.json"
    state = json.loads(state_path.read_text())
    b = records[bind_path]
    state["holders"] = {
        bind_path: {"digest": b["digest"], "volume_id": "vol-b", "image": image.ref}
    }
    state_path.write_text(json.dumps(state))
    f = records[fuse_path]
    old_fuse = {"volume_id": "vol-f", "image": image.ref, "tree": f["digest"][7:], **f["meta"]}
    (plugin.state_dir / "fuse/publishes.json").write_text(json.dumps({fuse_path: old_fuse}))

    plugin.start()
    assert "holders taken over from an older state file" in plugin.log()
    assert not (plugin.state_dir / "fuse/publishes.json").exists()
    assert "holders" not in json.loads(state_path.read_text())
    with grpc.insecure_channel(f"unix://{plugin.socket}") as channel:
        node = csi_pb2_grpc.NodeStub(channel)
        for path, request in requests_.items():
            node.NodePublishVolume(request)  # the same volume again: OK, its record is known
            assert (Path(path) / "manifests/cm.yaml").read_text() == "kept"
        other = publish_request(bind_path, image.ref, volume_id="vol-x")
        with pytest.raises(grpc.RpcError) as refused:
            node.NodePublishVolume(other)
        assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert "vol-b" in str(refused.value.details())
        bind_over_fuse = publish_request(fuse_path, image.ref, volume_id="vol-x")
        with pytest.raises(grpc.RpcError) as refused:
            node.NodePublishVolume(bind_over_fuse)
        assert refused.value.code() == grpc.StatusCode.ALREADY_EXISTS
        assert "vol-f" in str(refused.value.details())
        node.NodePublishVolume(requests_[fuse_path])  # its FUSE holder is intact: OK
        for path in requests_:
            unpublish(node, path)
    assert list((plugin.state_dir / "holders").iterdir()) == []
