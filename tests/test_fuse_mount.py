"""FUSE publishing mode through the real plugin process, a real registry and a real mount.

The plugin runs with ``FUSE_OVERLAY=false``: these tests are about the FUSE view,
which fully fetched trees otherwise leave for linked trees (``test_fuse_linked``) or
overlays (``test_fuse_kernelspeed``).
Reads go through the kernel (``/dev/fuse``, ``allow_other``, read-only binds of
tree directories on kubelet-style targets); the /dev/fuse holder is started by
the test so it can be stopped by pid. The restart test kills the plugin with
SIGKILL while a reader loops over every file, starts a new plugin and waits
until the reader has completed whole passes on the new daemon.
"""

from __future__ import annotations

import errno
import os
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import requests

from csi.fuse.session import HolderClient
from csi.proto import csi_pb2_grpc
from provisioner.cli import main as cli
from tests.csi_helpers import (
    Entry,
    PluginProcess,
    assert_read_only,
    code_of,
    dockerconfig,
    node_fixture,
    publish_request,
    push_image,
    simple_image,
    target,
    terminate,
    tree,
    unpublish,
)
from tests.fuse_helpers import publish_bind_and_fuse, publish_fuse, start_holder
from tests.polling import logged
from tests.registry import RegistryServer

pytestmark = [pytest.mark.registry]


@pytest.fixture(autouse=True)
def _dev_fuse() -> None:
    if not os.path.exists("/dev/fuse"):
        pytest.fail("no /dev/fuse: FUSE mode needs the fuse kernel module (modprobe fuse)")


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[Path]:
    """A /dev/fuse holder process; yields its socket."""
    sock = tmp_path / "holder.sock"
    proc = start_holder(tmp_path / "fusemnt", sock)
    try:
        yield sock
    finally:
        terminate(proc)


@pytest.fixture
def plugin(
    tmp_path: Path, holder: Path, monkeypatch: pytest.MonkeyPatch
) -> Iterator[PluginProcess]:
    # The FUSE view itself: fully fetched trees would otherwise be linked trees or
    # overlays (tests/test_fuse_linked.py, tests/test_fuse_kernelspeed.py).
    monkeypatch.setenv("FUSE_OVERLAY", "false")
    proc = PluginProcess(
        tmp_path / "plugin", extra_args=("--fuse", "--fuse-holder-socket", str(holder))
    ).start()
    try:
        yield proc
    finally:
        proc.stop()
        proc.unmount_all()


node = node_fixture(scope="function")


def _bundle(registry: RegistryServer, repo: str, files: int = 40) -> str:
    entries: list[Entry] = [("manifests/", "dir")]
    for i in range(files):
        entries.append(
            (f"manifests/{i:03}.yaml", "file", f"kind: ConfigMap # {i}\n".encode() * (i + 1))
        )
    entries += [("manifests/link.yaml", "symlink", "000.yaml"), ("bin/run", "file", b"#!/bin/sh\n")]
    return push_image(registry.host, repo, "v1", [entries]).ref


def _push_lazy_bundle(tmp_path: Path, ref: str, count: int, *cli_args: str) -> dict[str, bytes]:
    """``rukpak bundle build --estargz --push`` of ``count`` ConfigMaps as ``ref``; returns
    each file's content by path in the bundle."""
    bundle = tmp_path / "bundle"
    (bundle / "manifests").mkdir(parents=True)
    texts = {}
    for n in range(count):
        path = f"manifests/{n:02}.yaml"
        texts[path] = f"apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c{n}\n".encode()
        (bundle / path).write_bytes(texts[path])
    argv = ["bundle", "build", str(bundle), "--tag", ref, "--estargz", "--push", *cli_args]
    assert cli.main(argv) == 0
    return texts


def _assert_serves(fuse_target: str, texts: dict[str, bytes]) -> None:
    for path, text in texts.items():
        assert Path(fuse_target, path).read_bytes() == text


def _restart(plugin: PluginProcess) -> None:
    """Start a new plugin process on ``plugin``'s work dir and arguments (after a kill);
    the fixture stops it at the end of the test."""
    plugin.process = PluginProcess(plugin.workdir, extra_args=plugin.extra_args).start().process


def test_fuse_volume_serves_the_same_tree_as_bind_mode(
    plugin: PluginProcess, node: csi_pb2_grpc.NodeStub, registry: RegistryServer
) -> None:
    image = _bundle(registry, "fuse/same")
    bind_target, fuse_target = publish_bind_and_fuse(plugin, node, image)
    assert tree(Path(fuse_target)) == tree(Path(bind_target))
    run = Path(fuse_target, "bin/run")
    assert os.stat(run).st_mode & 0o777 == 0o444
    assert os.readlink(Path(fuse_target, "manifests/link.yaml")) == "000.yaml"
    assert "fuse.rukpak-csi" in Path("/proc/self/mountinfo").read_text()
    assert_read_only(Path(fuse_target, "manifests/new.yaml"))
    with pytest.raises(OSError) as raised:
        os.open(Path(fuse_target, "manifests/000.yaml"), os.O_WRONLY)
    assert raised.value.errno == errno.EROFS
    # Publishing twice is OK; unpublishing removes the target and the record.
    node.NodePublishVolume(publish_request(fuse_target, image, publishMode="fuse"))
    unpublish(node, fuse_target)
    assert not Path(fuse_target).exists()


def test_other_users_can_read_a_fuse_volume(
    plugin: PluginProcess, node: csi_pb2_grpc.NodeStub, registry: RegistryServer
) -> None:
    image = simple_image(registry.host, "fuse/others", text="shared").ref
    fuse_target = publish_fuse(plugin, node, image)
    parents = [
        p for p in Path(fuse_target).parents if p.is_relative_to("/tmp") and p != Path("/tmp")
    ]
    modes = {p: p.stat().st_mode & 0o7777 for p in parents}
    for p in parents:  # pytest's temp dirs are 0700: let "nobody" walk to the target
        os.chmod(p, 0o755)
    try:
        out = subprocess.run(
            ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", "cat",
             f"{fuse_target}/manifests/cm.yaml"],
            capture_output=True, check=False,
        )  # fmt: skip
    finally:
        for p, mode in modes.items():
            os.chmod(p, mode)
    assert out.returncode == 0, out.stderr
    assert out.stdout == b"shared"


def test_a_file_that_does_not_match_its_digest_is_eio_and_logged(
    plugin: PluginProcess, node: csi_pb2_grpc.NodeStub, registry: RegistryServer
) -> None:
    image = simple_image(registry.host, "fuse/corrupt", text="the real content").ref
    fuse_target = publish_fuse(plugin, node, image)
    files = plugin.state_dir / "fuse" / "store" / "files" / "sha256"
    (stored,) = [p for p in files.iterdir() if p.read_bytes() == b"the real content"]
    stored.chmod(0o644)
    stored.write_bytes(b"the evil content")
    with pytest.raises(OSError) as raised:
        Path(fuse_target, "manifests/cm.yaml").read_bytes()
    assert raised.value.errno == errno.EIO
    logged(plugin.log, "does not match its digest")
    # Nothing of the failure is kept (no verdict, no open descriptor): the repaired
    # file is checked again and served.
    stored.unlink()
    stored.write_bytes(b"the real content")
    assert Path(fuse_target, "manifests/cm.yaml").read_bytes() == b"the real content"


def test_publish_mode_is_checked(
    plugin: PluginProcess, node: csi_pb2_grpc.NodeStub, registry: RegistryServer
) -> None:
    image = simple_image(registry.host, "fuse/mode").ref
    bad = publish_request(target(plugin), image, publishMode="nfs")
    assert code_of(lambda: node.NodePublishVolume(bad)) == grpc.StatusCode.INVALID_ARGUMENT


def test_reads_continue_across_a_kill_9_of_the_plugin(
    plugin: PluginProcess, node: csi_pb2_grpc.NodeStub, registry: RegistryServer
) -> None:
    image = _bundle(registry, "fuse/restart", files=200)
    fuse_target = publish_fuse(plugin, node, image)
    expected = tree(Path(fuse_target))
    files = sorted(Path(fuse_target).rglob("*.yaml"))
    errors: list[str] = []
    passes = [0]
    stop = threading.Event()
    first_pass = threading.Event()
    after_restart = threading.Event()
    restarted = threading.Event()

    def reader() -> None:
        while not stop.is_set():
            for path in files:
                # Every open and release is a request to the daemon, cached pages or not.
                fd = os.open(path, os.O_RDONLY)
                try:
                    data = os.read(fd, 1 << 20)
                except OSError as exc:
                    errors.append(f"{path}: {exc}")
                    data = b""
                finally:
                    os.close(fd)
                rel = str(path.relative_to(fuse_target))
                if expected[rel].startswith("file:") and "file:" + data.decode() != expected[rel]:
                    errors.append(f"{rel}: wrong content")
            passes[0] += 1
            first_pass.set()
            if restarted.is_set():
                after_restart.set()

    thread = threading.Thread(target=reader, daemon=True)
    thread.start()
    assert first_pass.wait(60)
    with open("/proc/sys/vm/drop_caches", "w") as f:  # reads, too, go to the daemon again
        f.write("3")
    plugin.kill()
    _restart(plugin)
    restarted.set()
    assert after_restart.wait(60), "the reader made no progress after the restart"
    stop.set()
    thread.join(60)
    assert errors == []
    assert "resumed=True" in plugin.log()


def test_an_estargz_bundle_is_published_from_its_toc_and_read_lazily(
    tmp_path: Path, plugin: PluginProcess, node: csi_pb2_grpc.NodeStub, registry: RegistryServer
) -> None:
    ref = f"{registry.host}/fuse/lazy:v1"
    texts = _push_lazy_bundle(tmp_path, ref, 30)
    fuse_target = publish_fuse(plugin, node, ref)
    logged(plugin.log, "image indexed from its TOC")
    _assert_serves(fuse_target, texts)
    # The whole layer is then fetched in the background and checked against its digest.
    logged(plugin.log, "lazy tree complete, layers verified", timeout=60)


def test_a_private_lazy_bundle_is_still_fetched_after_a_plugin_restart(
    tmp_path: Path,
    plugin: PluginProcess,
    node: csi_pb2_grpc.NodeStub,
    auth_registry: RegistryServer,
) -> None:
    assert auth_registry.username and auth_registry.password
    secret = dockerconfig(auth_registry.host, auth_registry.username, auth_registry.password)
    config = tmp_path / "docker-config.json"
    config.write_text(secret[".dockerconfigjson"])
    ref = f"{auth_registry.host}/fuse/private-lazy:v1"
    texts = _push_lazy_bundle(tmp_path, ref, 10, "--registry-config", str(config))
    fuse_target = target(plugin)
    node.NodePublishVolume(publish_request(fuse_target, ref, publishMode="fuse", secrets=secret))
    logged(plugin.log, "image indexed from its TOC")
    plugin.kill()
    # Whatever arrived before the crash goes: every file must come from the registry again,
    # which answers only with the volume's credentials.
    for stored in (plugin.state_dir / "fuse" / "store" / "files" / "sha256").iterdir():
        stored.unlink()
    _restart(plugin)
    logged(plugin.log, "lazy trees' credentials taken back")
    _assert_serves(fuse_target, texts)
    assert auth_registry.password not in plugin.log()


def test_a_replaced_holder_fails_the_plugins_healthz(tmp_path: Path) -> None:
    """A fuse-holder container that restarted has a new mount no daemon serves: /healthz
    must fail so kubelet restarts the plugin, which then attaches to the new holder."""
    sock = tmp_path / "holder.sock"
    first = start_holder(tmp_path / "fusemnt", sock)
    second: subprocess.Popen[bytes] | None = None
    plugin = PluginProcess(
        tmp_path / "plugin", extra_args=("--fuse", "--fuse-holder-socket", str(sock))
    ).start()
    try:
        url = f"http://127.0.0.1:{plugin.metrics_port}/healthz"
        assert requests.get(url, timeout=10).status_code == 200
        ident = HolderClient(sock).ident()
        assert ident and HolderClient(sock).ident() == ident
        terminate(first)
        second = start_holder(tmp_path / "fusemnt", sock)
        assert HolderClient(sock).ident() not in ("", ident)
        answer = requests.get(url, timeout=10)
        assert answer.status_code != 200
        assert "holder was replaced" in answer.text
    finally:
        plugin.stop()
        plugin.unmount_all()
        for proc in (first, second):
            if proc is not None:
                terminate(proc)
