"""Helpers for tests that run the plugin in FUSE mode: the /dev/fuse holder process, a
plugin started with one of its own, and an image published in both modes to compare."""

from __future__ import annotations

import contextlib
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from csi.fuse.service import unmount_meta
from csi.proto import csi_pb2_grpc
from tests.csi_helpers import PluginProcess, publish_request, target, terminate


def start_holder(mountpoint: Path, sock: Path) -> subprocess.Popen[bytes]:
    """A /dev/fuse holder process, once it says it is ready (stop it with
    ``tests.csi_helpers.terminate``)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "csi.fuse.holder", "--mountpoint", str(mountpoint),
         "--socket", str(sock)],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == b"ready"
    return proc


@contextlib.contextmanager
def fuse_plugin(workdir: Path, *args: str) -> Iterator[PluginProcess]:
    """A started plugin with FUSE mode on (``args`` added to its flags) and a /dev/fuse
    holder of its own; after it, the plugin stopped, its mounts and FUSE metadata removed
    (after a kill -9 nobody else does) and the holder stopped."""
    holder = start_holder(workdir / "fusemnt", workdir / "holder.sock")
    try:
        proc = PluginProcess(
            workdir / "plugin",
            extra_args=("--fuse", "--fuse-holder-socket", str(workdir / "holder.sock"), *args),
        )
        try:
            yield proc.start()
        finally:
            proc.stop()
            proc.unmount_all()
            unmount_meta(proc.state_dir / "fuse" / "meta")
    finally:
        terminate(holder)


def fuse_plugin_fixture() -> Any:
    """A ``plugin`` fixture: a :func:`fuse_plugin` of the test's own (function scope)."""

    def plugin(tmp_path: Path) -> Iterator[PluginProcess]:
        with fuse_plugin(tmp_path) as proc:
            yield proc

    return pytest.fixture(name="plugin")(plugin)


def publish_fuse(plugin: PluginProcess, node: csi_pb2_grpc.NodeStub, image: str) -> str:
    """Publish ``image`` in FUSE mode at a fresh target; the target's path."""
    fuse_target = target(plugin)
    node.NodePublishVolume(publish_request(fuse_target, image, publishMode="fuse"))
    return fuse_target


def publish_bind_and_fuse(
    plugin: PluginProcess, node: csi_pb2_grpc.NodeStub, image: str
) -> tuple[str, str]:
    """Publish ``image`` twice, in bind mode and in FUSE mode, at fresh targets: the
    (bind, FUSE) targets."""
    bind_target = target(plugin)
    node.NodePublishVolume(publish_request(bind_target, image, publishMode="bind"))
    return bind_target, publish_fuse(plugin, node, image)
