"""The manager's disruption budget, and the optional monitoring component
(``deploy/components/monitoring``): it renders with the real kubectl on top of
``deploy/``, and every metric its alerts and dashboard panels read is one the manager
(``provisioner.runtime.metrics``) or the node plugin (``csi.plugin.metrics``) exports,
under the exact name a scrape shows (``_total``, ``_bucket``)."""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from csi.plugin import metrics as plugin_metrics
from provisioner.manager import cli as manager_cli
from provisioner.runtime.metrics import Metrics
from provisioner.storage import metrics as storage_metrics
from tests import install_helpers as inst

COMPONENT = inst.DEPLOY / "components" / "monitoring"
OURS = re.compile(
    r"\b((?:controller_runtime|workqueue|rest_client|leader_election|rukpak|csi_plugin"
    r"|csi_sidecar|controller_persistentvolume(?:claim)?|process)_[a-z0-9_]+)"
)


def exported() -> set[str]:
    """Every sample name a scrape of the manager and a node plugin can show."""
    manager = Metrics()
    manager.requests_of(lambda: {}, host="h")
    manager_cli.cache_gauges(manager, lambda: None)
    plugin = plugin_metrics.Metrics()
    plugin.track_cache(lambda: 0, 1)
    volumes = storage_metrics.Metrics()
    names: set[str] = set()
    for registry in (manager.registry, plugin.registry, volumes.registry):
        for family in registry.collect():
            suffixes = {
                "counter": ("_total",),
                "histogram": ("_bucket", "_sum", "_count"),
                "gauge": ("",),
            }.get(family.type, ("",))
            names.update(family.name + s for s in suffixes)
    return names


def exprs() -> list[str]:
    rules = yaml.safe_load((COMPONENT / "prometheusrule.yaml").read_text())
    out = [r["expr"] for g in rules["spec"]["groups"] for r in g["rules"]]
    dashboard: Any = json.loads((COMPONENT / "dashboard.json").read_text())
    out += [t["expr"] for p in dashboard["panels"] for t in p["targets"]]
    return out


def test_every_metric_an_alert_or_panel_reads_is_exported() -> None:
    names = exported()
    used = {m for e in exprs() for m in OURS.findall(e)}
    assert len(used) >= 10, used
    assert used - names == set(), f"read but not exported: {sorted(used - names)}"


@pytest.mark.parametrize(
    "alert",
    [
        "RukpakBundleDeploymentNotInstalled",
        "RukpakBundleDeploymentNotHealthy",
        "RukpakNodePublishErrors",
        "RukpakManagerWithoutLeader",
        "RukpakNodeCacheNearBudget",
        "RukpakNodePluginDown",
        "RukpakNodePluginNotRegistered",
        "RukpakWebhookCertificateExpiring",
        "RukpakVolumeProvisioningFailures",
    ],
)
def test_the_alerts_the_issue_names_are_there(alert: str) -> None:
    rules = yaml.safe_load((COMPONENT / "prometheusrule.yaml").read_text())
    alerts = {r["alert"]: r for g in rules["spec"]["groups"] for r in g["rules"]}
    assert alerts[alert]["annotations"]["summary"]
    assert alerts[alert]["for"]


def test_no_rule_or_panel_reads_the_deprecated_sidecar_name_of_the_plugins_calls() -> None:
    """The node plugin's own calls are ``csi_plugin_operations_seconds``; the old name is
    kept one release for others' dashboards, never read here."""
    assert not [e for e in exprs() if plugin_metrics.DEPRECATED_SIDECAR_OPERATIONS in e]
    assert [e for e in exprs() if plugin_metrics.PLUGIN_OPERATIONS in e]


def test_the_component_renders_on_deploy_with_kubectl(tmp_path: Path) -> None:
    objects = inst.render_overlay(tmp_path, COMPONENT)
    docs = list(objects.values())
    for expected in (
        ("ServiceMonitor", "rukpak-manager"),
        ("PodMonitor", "rukpak-csi-node"),
        ("PodMonitor", "rukpak-csi-controller"),
        ("ServiceAccount", "rukpak-metrics-scraper"),
        ("Secret", "rukpak-metrics-scraper-token"),
        ("ClusterRoleBinding", "rukpak-metrics-scraper"),
        ("PrometheusRule", "rukpak"),
        ("ConfigMap", "rukpak-dashboard"),
        ("ClusterRole", "rukpak-metrics-reader"),
    ):
        assert expected in objects, expected
    daemonset = next(d for d in docs if d["kind"] == "DaemonSet")
    assert (
        "--metrics-bind=0.0.0.0" in daemonset["spec"]["template"]["spec"]["containers"][0]["args"]
    )
    # every port a PodMonitor scrapes is a named port of the pods it selects
    for monitor in (d for d in docs if d["kind"] == "PodMonitor"):
        wanted = monitor["spec"]["selector"]["matchLabels"]
        pods = [
            d["spec"]["template"]
            for d in docs
            if d["kind"] in ("DaemonSet", "Deployment")
            and wanted.items() <= d["spec"]["template"]["metadata"]["labels"].items()
        ]
        assert pods, monitor["metadata"]["name"]
        ports = {
            p["name"] for t in pods for c in t["spec"]["containers"] for p in c.get("ports", [])
        }
        for endpoint in monitor["spec"]["podMetricsEndpoints"]:
            assert endpoint["port"] in ports, (monitor["metadata"]["name"], endpoint["port"])
    # the ServiceMonitor presents the scraper's token from its Secret, not a token file
    endpoint = objects[("ServiceMonitor", "rukpak-manager")]["spec"]["endpoints"][0]
    assert "bearerTokenFile" not in endpoint
    secret = objects[("Secret", "rukpak-metrics-scraper-token")]
    assert endpoint["authorization"]["credentials"]["name"] == secret["metadata"]["name"]
    assert secret["metadata"]["annotations"]["kubernetes.io/service-account.name"] == (
        "rukpak-metrics-scraper"
    )
    binding = objects[("ClusterRoleBinding", "rukpak-metrics-scraper")]
    assert binding["roleRef"]["name"] == "rukpak-metrics-reader"
    dashboard = next(
        d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "rukpak-dashboard"
    )
    assert dashboard["metadata"]["labels"]["grafana_dashboard"] == "1"
    assert json.loads(dashboard["data"]["rukpak.json"])["uid"] == "rukpak"


def test_the_manager_keeps_a_replica_through_voluntary_disruptions(tmp_path: Path) -> None:
    rendered = inst.run_kubectl(tmp_path / "no-kubeconfig", "kustomize", str(inst.DEPLOY))
    docs = [d for d in yaml.safe_load_all(rendered) if d]
    budget = next(d for d in docs if d["kind"] == "PodDisruptionBudget")
    manager = next(
        d for d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == inst.MANAGER
    )
    assert budget["spec"]["minAvailable"] == 1 < manager["spec"]["replicas"]
    labels = manager["spec"]["template"]["metadata"]["labels"]
    assert budget["spec"]["selector"]["matchLabels"].items() <= labels.items()
