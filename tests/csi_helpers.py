"""Helpers shared by the CSI tests: build tar layers in memory from a small table.

An entry is ``(name, kind, payload)``: kind ``file`` (payload bytes), ``dir``,
``symlink`` / ``hardlink`` (payload: link name as str), ``fifo``, ``chr``; an
optional fourth item is the mode.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import gzip
import io
import itertools
import json
import os
import socket
import subprocess
import sys
import tarfile
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import grpc
import pytest
import zstandard

from csi import mounter
from csi.proto import csi_pb2, csi_pb2_grpc
from rukpak.oci import mediatypes
from rukpak.oci.auth import Credentials
from rukpak.oci.client import RegistryClient
from rukpak.oci.manifest import Manifest
from rukpak.oci.reference import Reference
from tests.derived import below
from tests.registry import RegistryServer

Entry = tuple[Any, ...]

_KINDS = {
    "file": tarfile.REGTYPE,
    "dir": tarfile.DIRTYPE,
    "symlink": tarfile.SYMTYPE,
    "hardlink": tarfile.LNKTYPE,
    "fifo": tarfile.FIFOTYPE,
    "chr": tarfile.CHRTYPE,
}


def tar_bytes(entries: list[Entry]) -> bytes:
    """A tar archive (PAX format) holding ``entries`` in order."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for entry in entries:
            name, kind, payload = entry[0], entry[1], entry[2] if len(entry) > 2 else None
            info = tarfile.TarInfo(name)
            info.type = _KINDS[kind]
            info.mode = entry[3] if len(entry) > 3 else (0o755 if kind == "dir" else 0o644)
            info.mtime = 1_700_000_000
            data = None
            if kind == "file":
                data = payload if isinstance(payload, bytes) else str(payload or "").encode()
                info.size = len(data)
            elif kind in ("symlink", "hardlink"):
                info.linkname = str(payload)
            tar.addfile(info, io.BytesIO(data) if data is not None else None)
    return buf.getvalue()


def compress(data: bytes, kind: str) -> bytes:
    if kind == "gzip":
        return gzip.compress(data, mtime=0)
    if kind == "zstd":
        return zstandard.ZstdCompressor().compress(data)
    return data


def write_layer(directory: Path, name: str, entries: list[Entry], *, kind: str = "gzip") -> Path:
    path = directory / name
    path.write_bytes(compress(tar_bytes(entries), kind))
    return path


def tree(root: Path) -> dict[str, str]:
    """A readable snapshot of a tree: path → ``file:<content>`` / ``dir`` / ``-> target``."""
    out: dict[str, str] = {}
    for path in sorted(root.rglob("*")):
        rel = path.relative_to(root).as_posix()
        if path.is_symlink():
            out[rel] = f"-> {path.readlink()}"
        elif path.is_dir():
            out[rel] = "dir"
        else:
            out[rel] = "file:" + path.read_bytes().decode(errors="replace")
    return out


# --- pushing small test images ----------------------------------------------------


@dataclass(frozen=True)
class PushedImage:
    ref: str  # host/repo:tag
    manifest_digest: str
    blob_digests: list[str]


_LAYER_MEDIA = {
    "gzip": mediatypes.OCI_LAYER_GZIP,
    "zstd": mediatypes.OCI_LAYER_ZSTD,
    "none": mediatypes.OCI_LAYER_TAR,
}


def push_image(
    host: str,
    repo: str,
    tag: str,
    layers: list[list[Entry]],
    *,
    kind: str = "gzip",
    credentials: Credentials | None = None,
) -> PushedImage:
    """Push an OCI image with one tar layer per table in ``layers``; return where it is."""
    ref = Reference.parse(f"{host}/{repo}:{tag}")
    with RegistryClient(credentials=credentials) as client:
        config = json.dumps(
            {"architecture": "amd64", "os": "linux", "rootfs": {"type": "layers", "diff_ids": []}}
        ).encode()
        config_desc = client.push_blob(ref, config, media_type=mediatypes.OCI_CONFIG)
        layer_descs = [
            client.push_blob(ref, compress(tar_bytes(entries), kind), media_type=_LAYER_MEDIA[kind])
            for entries in layers
        ]
        manifest = Manifest(mediatypes.OCI_MANIFEST, config_desc, layer_descs)
        digest = client.push_manifest(ref, manifest.to_json(), mediatypes.OCI_MANIFEST)
    return PushedImage(str(ref), digest, [config_desc.digest, *(d.digest for d in layer_descs)])


def simple_image(host: str, repo: str, tag: str = "v1", *, text: str = "hello") -> PushedImage:
    """An image holding ``manifests/cm.yaml`` with ``text`` in it."""
    return push_image(
        host, repo, tag, [[("manifests/", "dir"), ("manifests/cm.yaml", "file", text.encode())]]
    )


def private_image(
    registry: RegistryServer, repo: str, entries: list[Entry]
) -> tuple[dict[str, str], PushedImage]:
    """Push a one-layer image to a registry that asks for a login (``auth_registry``).

    Returns the pull Secret's data that logs in to it (see :func:`dockerconfig`) and
    the image.
    """
    assert registry.username and registry.password
    secret = dockerconfig(registry.host, registry.username, registry.password)
    creds = Credentials.from_dockerconfigjson(secret[".dockerconfigjson"])
    return secret, push_image(registry.host, repo, "v1", [entries], credentials=creds)


_private_repos = itertools.count()


def unique_private_image(
    registry: RegistryServer, prefix: str
) -> tuple[dict[str, str], PushedImage]:
    """A :func:`private_image` in a new repository ``PREFIX<n>`` whose content no other
    image has (so a digest of its own): ``secret.txt`` ("only for the owner") and
    ``repo``, the repository's name."""
    repo = f"{prefix}{next(_private_repos)}"
    files = [("secret.txt", "file", b"only for the owner"), ("repo", "file", repo.encode())]
    return private_image(registry, repo, files)


# --- running the plugin process -----------------------------------------------------


def terminate(process: subprocess.Popen[bytes], *, grace: float = 20.0) -> int | None:
    """SIGTERM, then SIGKILL after ``grace`` seconds; returns the exit code."""
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=grace)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)
    return process.returncode


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@dataclass
class PluginProcess:
    """``python -m csi.plugin`` on a unix socket in a temp dir; stopped by pid."""

    workdir: Path
    process: subprocess.Popen[bytes] | None = None
    metrics_port: int = 0
    extra_args: tuple[str, ...] = ()

    socket = below("workdir", "csi.sock")
    kubelet_dir = below("workdir", "kubelet")
    state_dir = below("workdir", "state")
    log_path = below("workdir", "plugin.log")

    def start(self) -> PluginProcess:
        self.kubelet_dir.mkdir(parents=True, exist_ok=True)
        self.metrics_port = self.metrics_port or free_port()
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    sys.executable, "-m", "csi.plugin",
                    "--endpoint", f"unix://{self.socket}",
                    "--node-id", "test-node",
                    "--state-dir", str(self.state_dir),
                    "--kubelet-dir", str(self.kubelet_dir),
                    "--metrics-port", str(self.metrics_port),
                    "--registry-timeout", "5",
                    *self.extra_args,
                ],
                stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            )  # fmt: skip
        channel = grpc.insecure_channel(f"unix://{self.socket}")
        try:
            grpc.channel_ready_future(channel).result(timeout=20)
        except grpc.FutureTimeoutError:
            raise RuntimeError(f"plugin did not start:\n{self.log()}") from None
        finally:
            channel.close()
        return self

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def kill(self) -> None:
        """SIGKILL: a crash."""
        if self.process is not None and self.process.poll() is None:
            self.process.kill()
            self.process.wait(timeout=10)

    def stop(self) -> int | None:
        """SIGTERM, then SIGKILL after a grace period; returns the exit code."""
        return None if self.process is None else terminate(self.process)

    def unmount_all(self) -> None:
        """Test cleanup: unmount everything still mounted under the kubelet dir (all of
        it, however many: a bench leaves hundreds; the newest first, then again for
        what was stacked)."""
        kubelet_dir = self.kubelet_dir.resolve()
        for _ in range(10):
            points = [
                m.mount_point
                for m in mounter.Mounter().mounts()
                if Path(m.mount_point).is_relative_to(kubelet_dir)
            ]
            if not points:
                return
            for point in reversed(points):
                subprocess.run(["umount", "-l", point], check=False)


@contextlib.contextmanager
def running_plugin(workdir: Path, *extra_args: str) -> Iterator[PluginProcess]:
    """A started plugin process for a ``with`` block; stopped and unmounted after it."""
    if os.geteuid() != 0:
        raise RuntimeError("the plugin's bind mounts need root: run the suite as root")
    proc = PluginProcess(workdir, extra_args=extra_args).start()
    try:
        yield proc
    finally:
        proc.stop()
        proc.unmount_all()


def plugin_fixture(name: str) -> Any:
    """A module-scoped ``plugin`` fixture: one plugin process for the test module."""

    def plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PluginProcess]:
        with running_plugin(tmp_path_factory.mktemp(name)) as proc:
            yield proc

    return pytest.fixture(scope="module", name="plugin")(plugin)


def node_fixture(scope: Literal["module", "function"] = "module") -> Any:
    """A ``node`` fixture: a Node stub on the ``plugin`` fixture's socket (``scope``: the
    plugin fixture's, ``module`` or ``function``)."""

    def node(plugin: PluginProcess) -> Iterator[csi_pb2_grpc.NodeStub]:
        with grpc.insecure_channel(f"unix://{plugin.socket}") as channel:
            yield csi_pb2_grpc.NodeStub(channel)

    return pytest.fixture(scope=scope, name="node")(node)


def mount_capability(mode: str = "MULTI_NODE_READER_ONLY") -> csi_pb2.VolumeCapability:
    return csi_pb2.VolumeCapability(
        mount=csi_pb2.VolumeCapability.MountVolume(),
        access_mode=csi_pb2.VolumeCapability.AccessMode(
            mode=csi_pb2.VolumeCapability.AccessMode.Mode.Name(
                csi_pb2.VolumeCapability.AccessMode.Mode.Value(mode)
            )
        ),
    )


_counter = iter(range(10_000))


def target(plugin: PluginProcess) -> str:
    """A fresh target path as kubelet would pass it (parent exists, target does not)."""
    parent = plugin.kubelet_dir / "pods" / f"pod-{next(_counter)}" / "volumes"
    parent.mkdir(parents=True)
    return str(parent / "mount")


def publish_request(
    target_path: str,
    image: str | None,
    *,
    volume_id: str = "vol-1",
    secrets: dict[str, str] | None = None,
    **attributes: str,
) -> csi_pb2.NodePublishVolumeRequest:
    context = dict(attributes)
    if image is not None:
        context["image"] = image
    context.setdefault("csi.storage.k8s.io/ephemeral", "true")
    return csi_pb2.NodePublishVolumeRequest(
        volume_id=volume_id,
        target_path=target_path,
        volume_capability=mount_capability("SINGLE_NODE_WRITER"),
        volume_context=context,
        secrets=secrets or {},
    )


def code_of(call: Callable[[], object]) -> grpc.StatusCode:
    """The gRPC status code ``call`` fails with (AssertionError when it succeeds)."""
    try:
        call()
    except grpc.RpcError as exc:
        return exc.code()  # type: ignore[no-any-return,attr-defined]
    raise AssertionError("the call succeeded; an error was expected")


def unpublish(node: csi_pb2_grpc.NodeStub, path: str, *, volume_id: str = "vol-1") -> None:
    """NodeUnpublishVolume of the target ``path``."""
    node.NodeUnpublishVolume(
        csi_pb2.NodeUnpublishVolumeRequest(volume_id=volume_id, target_path=path)
    )


def assert_read_only(path: Path) -> None:
    """Writing a new file at ``path`` (in a published volume) fails with EROFS."""
    with pytest.raises(OSError) as info:
        path.write_text("x")
    assert info.value.errno == errno.EROFS


def dockerconfig(host: str, user: str, password: str) -> dict[str, str]:
    """A kubernetes.io/dockerconfigjson Secret's data, as NodePublishVolume gets it."""
    auth = base64.b64encode(f"{user}:{password}".encode()).decode()
    return {".dockerconfigjson": json.dumps({"auths": {host: {"auth": auth}}})}
