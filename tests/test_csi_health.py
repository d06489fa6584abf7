"""The plugin's ``/healthz`` and ``/metrics``, over its metrics port and unix sockets.

``/healthz`` must reflect whether the CSI socket answers Probe and whether kubelet
accepted the registration; ``/metrics`` is Prometheus text from ``prometheus_client``.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest
import requests

from csi.plugin import metrics
from csi.proto import pluginregistration_pb2, pluginregistration_pb2_grpc
from tests.csi_helpers import PluginProcess, running_plugin
from tests.metrics_helpers import scrape
from tests.polling import logged


def healthz(plugin: PluginProcess) -> requests.Response:
    return requests.get(f"http://127.0.0.1:{plugin.metrics_port}/healthz", timeout=10)


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[PluginProcess]:
    with running_plugin(tmp_path) as proc:
        yield proc


def test_healthz_is_ok_while_the_csi_socket_answers_probe(plugin: PluginProcess) -> None:
    answer = healthz(plugin)
    assert answer.status_code == 200 and answer.text == "ok\n"


def test_healthz_fails_when_the_csi_socket_no_longer_answers(plugin: PluginProcess) -> None:
    assert healthz(plugin).status_code == 200
    plugin.socket.unlink()  # kubelet can no longer reach the plugin either
    answer = healthz(plugin)
    assert answer.status_code == 503
    assert "does not answer Probe" in answer.text and str(plugin.socket) in answer.text


def test_metrics_have_latency_histograms(plugin: PluginProcess) -> None:
    assert healthz(plugin).status_code == 200  # one Probe over the socket
    values = scrape(plugin.metrics_port)
    assert values[("rukpak_csi_rpc_total", (("code", "OK"), ("method", "Probe")))] >= 1
    count = values[("rukpak_csi_rpc_duration_seconds_count", (("method", "Probe"),))]
    inf = values[("rukpak_csi_rpc_duration_seconds_bucket", (("le", "+Inf"), ("method", "Probe")))]
    assert count >= 1 and inf == count
    assert ("rukpak_csi_image_pull_duration_seconds_count", ()) in values
    # and under csi-lib-utils' name for a driver's calls, for kubernetes-csi dashboards
    probe = (
        ("driver_name", "csi.rukpak.io"),
        ("grpc_status_code", "OK"),
        ("method_name", "/csi.v1.Identity/Probe"),
    )
    assert values[("csi_plugin_operations_seconds_count", probe)] >= 1


def test_the_deprecated_sidecar_name_still_counts_the_same_calls(plugin: PluginProcess) -> None:
    """``csi_sidecar_operations_seconds`` is kept one release beside its successor."""
    assert healthz(plugin).status_code == 200
    text = requests.get(f"http://127.0.0.1:{plugin.metrics_port}/metrics", timeout=10).text
    assert (
        "# HELP csi_sidecar_operations_seconds Deprecated: use csi_plugin_operations_seconds"
        in text
    )
    values = scrape(plugin.metrics_port)
    calls = [labels for name, labels in values if name == "csi_plugin_operations_seconds_count"]
    assert calls
    for labels in calls:
        assert values[("csi_sidecar_operations_seconds_count", labels)] >= 1


def test_the_plugin_reports_its_process(plugin: PluginProcess) -> None:
    values = scrape(plugin.metrics_port)
    assert values[("process_resident_memory_bytes", ())] > 1024 * 1024
    assert values[("process_open_fds", ())] >= 3
    assert values[("process_start_time_seconds", ())] > 1.7e9


def test_codes_and_methods_read_as_the_sidecars_write_them() -> None:
    assert [metrics.go_code(c) for c in ("OK", "ALREADY_EXISTS", "INVALID_ARGUMENT")] == [
        "OK",
        "AlreadyExists",
        "InvalidArgument",
    ]
    assert metrics.full_method("NodePublishVolume") == "/csi.v1.Node/NodePublishVolume"
    assert metrics.full_method("CreateVolume") == "/csi.v1.Controller/CreateVolume"
    assert metrics.full_method("GetPluginInfo") == "/csi.v1.Identity/GetPluginInfo"


def test_a_refused_registration_is_logged_counted_and_fails_healthz(tmp_path: Path) -> None:
    reg_dir = tmp_path / "registry"
    with running_plugin(tmp_path, "--registration-dir", str(reg_dir)) as plugin:
        before = healthz(plugin)
        assert before.status_code == 503 and "not registered" in before.text
        reg_socket = reg_dir / "csi.rukpak.io-reg.sock"
        with grpc.insecure_channel(f"unix://{reg_socket}") as ch:
            stub = pluginregistration_pb2_grpc.RegistrationStub(ch)
            stub.NotifyRegistrationStatus(
                pluginregistration_pb2.RegistrationStatus(
                    plugin_registered=False, error="version 0.9 not supported"
                ),
                timeout=5,
            )
            logged(plugin.log, "kubelet refused registration")
            refused = healthz(plugin)
            assert refused.status_code == 503 and "refused" in refused.text
            values = scrape(plugin.metrics_port)
            assert values[("rukpak_csi_registration_failures_total", ())] == 1
            assert values[("rukpak_csi_registered", ())] == 0
            stub.NotifyRegistrationStatus(
                pluginregistration_pb2.RegistrationStatus(plugin_registered=True), timeout=5
            )
        assert healthz(plugin).status_code == 200
        assert scrape(plugin.metrics_port)[("rukpak_csi_registered", ())] == 1
