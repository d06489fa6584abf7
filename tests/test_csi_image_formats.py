"""Image formats through the node plugin's socket, against the real registry.

Each test pushes an image in one of the shapes registries serve (zstd and plain
tar layers, a Docker schema-2 manifest, an OCI index and a Docker manifest list
whose platforms carry different files) and publishes it through NodePublishVolume,
then reads what the pod would see.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import grpc
import pytest

from csi.proto import csi_pb2, csi_pb2_grpc
from rukpak.oci import mediatypes
from rukpak.oci.client import RegistryClient
from rukpak.oci.manifest import Descriptor, Index, Manifest, Platform
from rukpak.oci.reference import Reference
from tests.csi_helpers import (
    PluginProcess,
    compress,
    mount_capability,
    node_fixture,
    plugin_fixture,
    push_image,
    tar_bytes,
)
from tests.registry import RegistryServer

pytestmark = [
    pytest.mark.registry,
]


plugin = plugin_fixture("formats")


node = node_fixture()


_targets = iter(range(10_000))


def publish(
    plugin: PluginProcess, node: csi_pb2_grpc.NodeStub, image: str, **attributes: str
) -> Path:
    parent = plugin.kubelet_dir / "pods" / f"fmt-{next(_targets)}" / "volumes"
    parent.mkdir(parents=True)
    target = parent / "mount"
    node.NodePublishVolume(
        csi_pb2.NodePublishVolumeRequest(
            volume_id=f"vol-{target.parent.parent.name}",
            target_path=str(target),
            volume_capability=mount_capability("SINGLE_NODE_READER_ONLY"),
            readonly=True,
            volume_context={"image": image, **attributes},
        )
    )
    return target


def manifest_file(text: str) -> list[tuple[object, ...]]:
    return [("manifests/", "dir"), ("manifests/cm.yaml", "file", text.encode())]


@pytest.mark.parametrize("kind", ["zstd", "none", "gzip"])
def test_zstd_plain_and_gzip_layers_publish_the_same_files(
    kind: str, plugin: PluginProcess, node: csi_pb2_grpc.NodeStub, registry: RegistryServer
) -> None:
    image = push_image(
        registry.host, f"formats/layer-{kind}", "v1", [manifest_file(kind)], kind=kind
    )
    target = publish(plugin, node, image.ref)
    assert (target / "manifests/cm.yaml").read_text() == kind


def push_platform_image(
    client: RegistryClient, ref: Reference, text: str, *, docker: bool
) -> Descriptor:
    """One single-layer image whose only file says ``text``; returns its manifest descriptor."""
    config_type = mediatypes.DOCKER_CONFIG if docker else mediatypes.OCI_CONFIG
    layer_type = mediatypes.DOCKER_LAYER_GZIP if docker else mediatypes.OCI_LAYER_GZIP
    manifest_type = mediatypes.DOCKER_MANIFEST if docker else mediatypes.OCI_MANIFEST
    config = json.dumps({"os": "linux", "architecture": text, "rootfs": {"type": "layers"}})
    config_desc = client.push_blob(ref, config.encode(), media_type=config_type)
    layer = compress(tar_bytes(manifest_file(text)), "gzip")
    layer_desc = client.push_blob(ref, layer, media_type=layer_type)
    body = Manifest(manifest_type, config_desc, [layer_desc]).to_json()
    digest = client.push_manifest(ref.with_digest(_digest_of(body)), body, manifest_type)
    return Descriptor(manifest_type, digest, len(body))


def _digest_of(body: bytes) -> str:
    return "sha256:" + hashlib.sha256(body).hexdigest()


def push_multi_platform(registry: RegistryServer, repo: str, *, docker: bool) -> str:
    """An index (or Docker list) whose amd64 and arm64 images carry different files."""
    ref = Reference.parse(f"{registry.host}/{repo}:v1")
    with RegistryClient() as client:
        entries = []
        for platform in (Platform("linux", "amd64"), Platform("linux", "arm64", "v8")):
            desc = push_platform_image(client, ref, platform.architecture, docker=docker)
            desc.platform = platform
            entries.append(desc)
        index_type = mediatypes.DOCKER_LIST if docker else mediatypes.OCI_INDEX
        client.push_manifest(ref, Index(index_type, entries).to_json(), index_type)
    return str(ref)


@pytest.mark.parametrize("docker", [False, True], ids=["oci-index", "docker-manifest-list"])
def test_the_platform_attribute_picks_that_platforms_files(
    docker: bool, plugin: PluginProcess, node: csi_pb2_grpc.NodeStub, registry: RegistryServer
) -> None:
    image = push_multi_platform(registry, f"formats/multi-{int(docker)}", docker=docker)
    arm = publish(plugin, node, image, platform="linux/arm64")
    amd = publish(plugin, node, image, platform="linux/amd64")
    assert (arm / "manifests/cm.yaml").read_text() == "arm64"
    assert (amd / "manifests/cm.yaml").read_text() == "amd64"


def test_without_a_platform_attribute_the_nodes_platform_is_chosen(
    plugin: PluginProcess, node: csi_pb2_grpc.NodeStub, registry: RegistryServer
) -> None:
    image = push_multi_platform(registry, "formats/default-platform", docker=False)
    target = publish(plugin, node, image)
    assert (target / "manifests/cm.yaml").read_text() == Platform.current().architecture


def test_a_platform_the_index_lacks_is_not_found_and_lists_what_it_offers(
    plugin: PluginProcess, node: csi_pb2_grpc.NodeStub, registry: RegistryServer
) -> None:
    image = push_multi_platform(registry, "formats/missing-platform", docker=True)
    with pytest.raises(grpc.RpcError) as info:
        publish(plugin, node, image, platform="linux/s390x")
    assert info.value.code() == grpc.StatusCode.NOT_FOUND
    assert "linux/s390x" in str(info.value.details())
    assert "linux/amd64" in str(info.value.details())
