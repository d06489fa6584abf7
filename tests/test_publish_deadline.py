"""One deadline per NodePublishVolume, retries included, for every source and both modes.

A server that accepts connections and never answers (``SilentServer``, on loopback) must
not keep a publish past ``--publish-deadline``: the plugin answers DEADLINE_EXCEEDED with
a message naming the server, before kubelet (2 minutes) gives up on its own. The elapsed
times asserted here are upper bounds derived from the configured deadline, not
performance claims.
"""

from __future__ import annotations

import socket
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from csi.proto import csi_pb2, csi_pb2_grpc
from tests.csi_helpers import PluginProcess, node_fixture, publish_request, target, terminate
from tests.deadline_helpers import COMMIT, MARGIN, PIN, SilentServer, silent_server
from tests.fuse_helpers import start_holder

DEADLINE = 3.0


@pytest.fixture(scope="module")
def silent() -> Iterator[SilentServer]:
    with silent_server() as server:
        yield server


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PluginProcess]:
    """A plugin with a short publish deadline, the default 30 s registry timeout (longer
    than the deadline: the deadline must cut it) and FUSE mode on, with its holder."""
    work = tmp_path_factory.mktemp("deadline")
    holder_socket = work / "holder.sock"
    holder = start_holder(work / "fusemnt", holder_socket)
    try:
        proc = PluginProcess(
            work / "plugin",
            extra_args=(
                "--publish-deadline", str(DEADLINE),
                "--registry-timeout", "30",
                "--fuse", "--fuse-holder-socket", str(holder_socket),
            ),
        ).start()  # fmt: skip
        try:
            yield proc
        finally:
            proc.stop()
            proc.unmount_all()
    finally:
        terminate(holder)


node = node_fixture()


def attributes(kind: str, host: str) -> dict[str, str]:
    """Volume attributes of a ``kind`` volume whose server is ``host``."""
    return {
        "image": {"image": f"{host}/bundles/silent:v1"},
        "image-fuse": {"image": f"{host}/bundles/silent:v1", "publishMode": "fuse"},
        "git-http": {"git": f"http://{host}/bundles/silent.git", "commit": COMMIT},
        "git-tcp": {"git": f"git://{host}/bundles/silent.git", "commit": COMMIT},
        "http": {"url": f"http://{host}/bundles/silent.tgz", "digest": PIN},
    }[kind]


def request_for(plugin: PluginProcess, attrs: dict[str, str]) -> csi_pb2.NodePublishVolumeRequest:
    """A NodePublishVolumeRequest with ``attrs`` on a fresh target."""
    request = publish_request(target(plugin), attrs.get("image"))
    request.volume_context.update({k: v for k, v in attrs.items() if k != "image"})
    return request


@pytest.mark.parametrize("kind", ["image", "image-fuse", "git-http", "git-tcp", "http"])
def test_a_publish_from_a_silent_server_answers_deadline_exceeded_naming_it(
    plugin: PluginProcess, node: csi_pb2_grpc.NodeStub, silent: SilentServer, kind: str
) -> None:
    request = request_for(plugin, attributes(kind, silent.host))
    started = time.monotonic()
    with pytest.raises(grpc.RpcError) as info:
        node.NodePublishVolume(request, timeout=120)  # kubelet's own deadline
    elapsed = time.monotonic() - started
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, info.value.details()
    message = info.value.details() or ""
    assert silent.host in message, message
    assert f"publish deadline (--publish-deadline) of {DEADLINE:g}s" in message, message
    assert elapsed < DEADLINE + MARGIN, (elapsed, message)


def test_the_message_names_what_was_being_done(
    plugin: PluginProcess, node: csi_pb2_grpc.NodeStub, silent: SilentServer
) -> None:
    request = request_for(plugin, attributes("image", silent.host))
    with pytest.raises(grpc.RpcError) as info:
        node.NodePublishVolume(request, timeout=120)
    message = info.value.details() or ""
    assert f"registry {silent.host} at http://{silent.host}, fetching image" in message
    assert "bundles/silent:v1" in message and "no answer within the read timeout" in message


def test_a_credential_in_a_git_url_stays_out_of_the_message(
    plugin: PluginProcess, node: csi_pb2_grpc.NodeStub, silent: SilentServer
) -> None:
    repository = f"http://someone:hunter2@{silent.host}/bundles/silent.git"
    request = publish_request(target(plugin), None, git=repository, commit=COMMIT)
    with pytest.raises(grpc.RpcError) as info:
        node.NodePublishVolume(request, timeout=120)
    message = info.value.details() or ""
    assert info.value.code() == grpc.StatusCode.DEADLINE_EXCEEDED, message
    assert f"http://{silent.host}/bundles/silent.git" in message
    assert "hunter2" not in message


def test_the_plugin_still_publishes_after_deadlines_passed(
    plugin: PluginProcess, node: csi_pb2_grpc.NodeStub, tmp_path: Path
) -> None:
    """Nothing is left holding a publish slot or a lock: a refused connection (nothing
    listens) is answered at once, as before, with UNAVAILABLE."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        closed = f"127.0.0.1:{s.getsockname()[1]}"
    request = publish_request(target(plugin), None, url=f"http://{closed}/b.tgz", digest=PIN)
    with pytest.raises(grpc.RpcError) as info:
        node.NodePublishVolume(request, timeout=120)
    assert info.value.code() == grpc.StatusCode.UNAVAILABLE, info.value.details()
