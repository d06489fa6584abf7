"""Probe never waits on source I/O.

kubelet's liveness probe (``/healthz``, which calls Identity.Probe over the CSI socket
with a 2 s timeout) must keep answering while publishes hang on servers that never
answer; otherwise the plugin is restarted exactly when it is busy. Here more publishes
than the plugin fetches at once hang on a silent server while Probe and ``/healthz``
are asked.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from concurrent import futures

import grpc
import pytest
import requests

from csi.node.publish import PUBLISH_SLOTS
from csi.proto import csi_pb2, csi_pb2_grpc
from tests.csi_helpers import PluginProcess, publish_request, running_plugin, target
from tests.deadline_helpers import PIN, SilentServer, silent_server

HANGING = PUBLISH_SLOTS + 4  # every fetch slot taken, and publishes waiting for one
QUICK = 0.1  # seconds


@pytest.fixture
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PluginProcess]:
    """A plugin whose publishes hang for long (the deadline is far away)."""
    with running_plugin(tmp_path_factory.mktemp("probe"), "--publish-deadline", "60") as proc:
        yield proc


def quickest(call: Callable[[], object], *, tries: int = 3) -> float:
    """The shortest of ``tries`` timed calls: scheduler noise aside, how long it waits."""
    best = float("inf")
    for _ in range(tries):
        started = time.monotonic()
        call()
        best = min(best, time.monotonic() - started)
    return best


@pytest.fixture
def hanging(plugin: PluginProcess) -> Iterator[SilentServer]:
    """``HANGING`` http publishes in flight against a silent server, PUBLISH_SLOTS of them
    connected to it; they end when the server stops."""
    with (
        silent_server() as server,
        grpc.insecure_channel(f"unix://{plugin.socket}") as channel,
        futures.ThreadPoolExecutor(HANGING) as pool,
    ):
        node = csi_pb2_grpc.NodeStub(channel)
        calls = [
            pool.submit(
                _publish_quietly,
                node,
                publish_request(
                    target(plugin), None, url=f"http://{server.host}/b{i}.tgz", digest=PIN
                ),
            )
            for i in range(HANGING)
        ]
        server.wait_for(PUBLISH_SLOTS, timeout=30)
        assert not any(call.done() for call in calls)
        yield server
        server.stop()  # connections close: the publishes fail at once
        futures.wait(calls, timeout=60)


def _publish_quietly(node: csi_pb2_grpc.NodeStub, request: csi_pb2.NodePublishVolumeRequest) -> str:
    try:
        node.NodePublishVolume(request, timeout=120)
    except grpc.RpcError as exc:
        return str(exc.code())
    return "OK"


def test_probe_answers_at_once_while_publishes_hang(
    plugin: PluginProcess, hanging: SilentServer
) -> None:
    with grpc.insecure_channel(f"unix://{plugin.socket}") as channel:
        identity = csi_pb2_grpc.IdentityStub(channel)
        answer = identity.Probe(csi_pb2.ProbeRequest(), timeout=10)
        assert answer.ready.value
        seconds = quickest(lambda: identity.Probe(csi_pb2.ProbeRequest(), timeout=10))
    assert seconds < QUICK, seconds


def test_healthz_answers_at_once_while_publishes_hang(
    plugin: PluginProcess, hanging: SilentServer
) -> None:
    url = f"http://127.0.0.1:{plugin.metrics_port}/healthz"
    with requests.Session() as session:
        answer = session.get(url, timeout=10)
        assert answer.status_code == 200, answer.text
        seconds = quickest(lambda: session.get(url, timeout=10).raise_for_status())
    assert seconds < QUICK, seconds
