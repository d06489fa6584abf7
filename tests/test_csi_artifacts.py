"""Any OCI artifact as a volume (``rukpak.image.artifact``), through the real node plugin
and a real registry: files pushed by the ``oras`` library appear at their titles, a Helm
chart artifact appears unpacked, tar layers and titled files mix; an untitled blob, two
files titled alike, a title that climbs out, a file over the unpack budget and a FUSE
publish are refused by name, and nothing is left mounted or written outside the tree. A
file large enough to be hashed in a thread beside the download (``rukpak.oci.handoff``)
follows the same rules: placed whole, or, tampered, DATA_LOSS with nothing kept.
"""

from __future__ import annotations

import contextlib
import dataclasses
import hashlib
import io
import json
import os
import tarfile
from pathlib import Path

import grpc
import oras.client
import pytest

from csi.proto import csi_pb2_grpc
from rukpak.oci import handoff, mediatypes
from rukpak.oci.client import RegistryClient
from rukpak.oci.manifest import Manifest
from rukpak.oci.reference import Reference
from tests import csi_helpers
from tests.fuse_helpers import start_holder
from tests.registry import RegistryServer

pytestmark = [pytest.mark.registry]

plugin = csi_helpers.plugin_fixture("artifacts")
node = csi_helpers.node_fixture()
TITLE = "org.opencontainers.image.title"
HELM_CONFIG = "application/vnd.cncf.helm.config.v1+json"


def publish(node: csi_pb2_grpc.NodeStub, plugin: csi_helpers.PluginProcess, ref: str) -> Path:
    path = csi_helpers.target(plugin)
    request = csi_helpers.publish_request(path, ref)
    request.volume_capability.CopyFrom(csi_helpers.mount_capability())
    request.readonly = True
    node.NodePublishVolume(request)
    return Path(path)


def push_artifact(
    host: str, repo: str, tag: str, layers: list[tuple[bytes, str, dict[str, str]]],
    *, config_type: str = mediatypes.OCI_EMPTY, artifact_type: str = "",
) -> str:  # fmt: skip
    """Push a manifest of ``layers`` (bytes, media type, annotations) with our own client;
    the ref pinned by digest."""
    ref = Reference.parse(f"{host}/{repo}:{tag}")
    with RegistryClient() as client:
        config = client.push_blob(ref, b"{}", media_type=config_type)
        descs = [
            dataclasses.replace(client.push_blob(ref, data, media_type=mt), annotations=ann)
            for data, mt, ann in layers
        ]
        manifest = Manifest(mediatypes.OCI_MANIFEST, config, descs)
        body = manifest.to_json()
        if artifact_type:
            doc = json.loads(body)
            doc["artifactType"] = artifact_type
            body = json.dumps(doc).encode()
        digest = client.push_manifest(ref, body, mediatypes.OCI_MANIFEST)
    return f"{host}/{repo}@{digest}"


def tgz(files: dict[str, bytes]) -> bytes:
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w:gz") as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
    return out.getvalue()


def test_files_pushed_by_oras_appear_at_their_titles_read_only(
    node: csi_pb2_grpc.NodeStub,
    plugin: csi_helpers.PluginProcess,
    registry: RegistryServer,
    tmp_path: Path,
) -> None:
    work = tmp_path / "files"
    work.mkdir()
    # past the size a stream hashes in a thread of its own (README.md is hashed inline)
    (work / "model.safetensors").write_bytes(os.urandom(handoff.WORTH + 300_000))
    (work / "README.md").write_text("a model\n")
    client = oras.client.OrasClient(hostname=registry.host, insecure=True)
    with contextlib.chdir(work):  # oras titles a file by the path it was given
        client.push(
            target=f"{registry.host}/artifacts/model:v1",
            files=["model.safetensors:application/vnd.example.weights", "README.md:text/markdown"],
            quiet=True,
        )
    path = publish(node, plugin, f"{registry.host}/artifacts/model:v1")
    assert sorted(os.listdir(path)) == ["README.md", "model.safetensors"]
    assert (path / "model.safetensors").read_bytes() == (work / "model.safetensors").read_bytes()
    assert (path / "README.md").read_text() == "a model\n"
    assert (path / "README.md").stat().st_mode & 0o222 == 0
    assert (path / "model.safetensors").stat().st_nlink >= 2, "one copy: linked from the store"
    csi_helpers.assert_read_only(path / "new.txt")


def test_a_helm_chart_artifact_appears_unpacked(
    node: csi_pb2_grpc.NodeStub, plugin: csi_helpers.PluginProcess, registry: RegistryServer
) -> None:
    chart = tgz({"hello/Chart.yaml": b"apiVersion: v2\nname: hello\nversion: 0.1.0\n",
                 "hello/templates/cm.yaml": b"kind: ConfigMap\n"})  # fmt: skip
    ref = push_artifact(
        registry.host, "artifacts/chart", "0.1.0",
        [(chart, mediatypes.HELM_CHART_CONTENT, {})], config_type=HELM_CONFIG,
    )  # fmt: skip
    path = publish(node, plugin, ref)
    assert (path / "hello" / "Chart.yaml").read_text().startswith("apiVersion: v2")
    assert (path / "hello" / "templates" / "cm.yaml").read_text() == "kind: ConfigMap\n"


def test_tar_layers_and_titled_files_mix_in_order(
    node: csi_pb2_grpc.NodeStub, plugin: csi_helpers.PluginProcess, registry: RegistryServer
) -> None:
    ref = push_artifact(
        registry.host, "artifacts/mixed", "v1",
        [
            (tgz({"manifests/cm.yaml": b"kind: ConfigMap\n"}), mediatypes.OCI_LAYER_GZIP, {}),
            (b"\x00\x01\x02", "application/octet-stream", {TITLE: "data/blob.bin"}),
        ],
        artifact_type="application/vnd.example.bundle",
    )  # fmt: skip
    path = publish(node, plugin, ref)
    assert (path / "manifests" / "cm.yaml").read_text() == "kind: ConfigMap\n"
    assert (path / "data" / "blob.bin").read_bytes() == b"\x00\x01\x02"


@pytest.mark.parametrize(
    ("layers", "words"),
    [
        ([(b"x", "application/octet-stream", {})], "no org.opencontainers.image.title"),
        (
            [(b"x", "application/octet-stream", {TITLE: "a.bin"}),
             (b"y", "application/octet-stream", {TITLE: "a.bin"})],
            "are both titled 'a.bin'",
        ),
        ([(b"x", "application/octet-stream", {TITLE: "../escape.bin"})], "cannot be placed"),
        ([(b"x", "application/octet-stream", {TITLE: "a/../../escape.bin"})], "cannot be placed"),
    ],
    ids=["untitled", "same-title", "climbs-out", "climbs-out-deeper"],
)  # fmt: skip
def test_a_broken_or_hostile_artifact_is_refused_by_name(
    node: csi_pb2_grpc.NodeStub,
    plugin: csi_helpers.PluginProcess,
    registry: RegistryServer,
    layers: list[tuple[bytes, str, dict[str, str]]],
    words: str,
) -> None:
    ref = push_artifact(registry.host, "artifacts/bad", f"t{abs(hash(words)) % 10_000}", layers)
    path = csi_helpers.target(plugin)
    with pytest.raises(grpc.RpcError) as info:
        node.NodePublishVolume(csi_helpers.publish_request(path, ref))
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert words in str(info.value.details())
    assert not Path(path).exists() or not os.listdir(path)
    assert not list(plugin.kubelet_dir.rglob("escape.bin"))
    assert not list(plugin.state_dir.rglob("escape.bin"))


def test_a_fuse_publish_of_files_says_to_use_bind(registry: RegistryServer, tmp_path: Path) -> None:
    ref = push_artifact(
        registry.host, "artifacts/fuse", "v1",
        [(b"weights", "application/octet-stream", {TITLE: "w.bin"})],
    )  # fmt: skip
    sock = tmp_path / "holder.sock"
    holder = start_holder(tmp_path / "fusemnt", sock)  # ours: stopped by pid below
    try:
        with (
            csi_helpers.running_plugin(
                tmp_path / "fuse", "--fuse", "--fuse-holder-socket", str(sock)
            ) as proc,
            grpc.insecure_channel(f"unix://{proc.socket}") as channel,
        ):
            stub = csi_pb2_grpc.NodeStub(channel)
            with pytest.raises(grpc.RpcError) as info:
                stub.NodePublishVolume(
                    csi_helpers.publish_request(csi_helpers.target(proc), ref, publishMode="fuse")
                )
    finally:
        csi_helpers.terminate(holder)
    assert info.value.code() == grpc.StatusCode.INVALID_ARGUMENT
    assert "publishMode: bind" in str(info.value.details())


def test_a_file_over_the_unpack_budget_is_resource_exhausted(
    registry: RegistryServer, tmp_path: Path
) -> None:
    ref = push_artifact(
        registry.host, "artifacts/big", "v1",
        [(os.urandom(200_000), "application/octet-stream", {TITLE: "big.bin"})],
    )  # fmt: skip
    with csi_helpers.running_plugin(tmp_path / "small", "--max-unpacked-bytes", "100000") as proc:
        with grpc.insecure_channel(f"unix://{proc.socket}") as channel:
            stub = csi_pb2_grpc.NodeStub(channel)
            with pytest.raises(grpc.RpcError) as info:
                stub.NodePublishVolume(csi_helpers.publish_request(csi_helpers.target(proc), ref))
        assert info.value.code() == grpc.StatusCode.RESOURCE_EXHAUSTED
        assert "100000 bytes" in str(info.value.details())
        assert not list((proc.state_dir).rglob("big.bin"))


@pytest.mark.parametrize(
    "size",
    [
        pytest.param(64_000, id="hashed-inline"),
        pytest.param(handoff.WORTH + 64_000, id="hashed-in-a-thread"),
    ],
)
def test_a_tampered_file_blob_is_data_loss_and_nothing_is_kept(
    node: csi_pb2_grpc.NodeStub,
    plugin: csi_helpers.PluginProcess,
    registry: RegistryServer,
    size: int,
) -> None:
    data = os.urandom(size)
    ref = push_artifact(
        registry.host, f"artifacts/tampered-{size}", "v1",
        [(data, "application/octet-stream", {TITLE: "weights.bin"})],
    )  # fmt: skip
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    blob = registry.blob_path(digest)
    blob.chmod(0o644)
    blob.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))  # same size, the last byte other
    path = csi_helpers.target(plugin)
    with pytest.raises(grpc.RpcError) as info:
        node.NodePublishVolume(csi_helpers.publish_request(path, ref))
    assert info.value.code() == grpc.StatusCode.DATA_LOSS
    assert digest in str(info.value.details())
    assert not list(plugin.state_dir.rglob(digest.removeprefix("sha256:")))
    assert not list(plugin.state_dir.rglob("weights.bin"))
