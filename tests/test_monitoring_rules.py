"""The monitoring component's alerting rules under Prometheus's own checker: ``promtool
check rules`` (syntax, templates) and ``promtool test rules`` (the unit tests in
``deploy/components/monitoring/prometheusrule.test.yaml``: each alert fires on the series
that should fire it, with the object's name, the reason and its runbook in its labels and
annotations, and stays quiet on the others), and each ``runbook_url`` against the headings
of docs/operations.md.

promtool is built from its Go module by ``hack/gotool.sh promtool`` (``make promtool``,
which ``make test`` runs first); these tests fail, not skip, when it is missing.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests import install_helpers as inst
from tests.test_docs import anchors

ROOT = Path(__file__).resolve().parent.parent
COMPONENT = inst.DEPLOY / "components" / "monitoring"
RULE = COMPONENT / "prometheusrule.yaml"
UNIT_TESTS = COMPONENT / "prometheusrule.test.yaml"
RUNBOOK_PAGE = "docs/operations.md"


def promtool() -> Path:
    path = subprocess.run(
        ["bash", str(ROOT / "hack" / "gotool.sh"), "promtool", "--print-path"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    if not Path(path).is_file():
        pytest.fail(f"promtool is not built at {path}: run `make promtool` (make test does)")
    return Path(path)


def alerts() -> list[dict[str, Any]]:
    spec = yaml.safe_load(RULE.read_text())["spec"]
    return [r for g in spec["groups"] for r in g["rules"] if "alert" in r]


@pytest.fixture
def rules_dir(tmp_path: Path) -> Path:
    """The PrometheusRule's spec as a Prometheus rule file, beside a copy of the unit tests
    (which name it as ``rukpak.rules.yaml``)."""
    spec = yaml.safe_load(RULE.read_text())["spec"]
    (tmp_path / "rukpak.rules.yaml").write_text(yaml.safe_dump(spec, sort_keys=False))
    shutil.copy(UNIT_TESTS, tmp_path / UNIT_TESTS.name)
    return tmp_path


def run(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(promtool()), *args], cwd=cwd, capture_output=True, text=True, timeout=120
    )


def test_promtool_checks_the_rules(rules_dir: Path) -> None:
    done = run("check", "rules", "rukpak.rules.yaml", cwd=rules_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    assert f"SUCCESS: {len(alerts())} rules found" in done.stdout + done.stderr


def test_promtool_runs_the_rule_unit_tests(rules_dir: Path) -> None:
    done = run("test", "rules", UNIT_TESTS.name, cwd=rules_dir)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "SUCCESS" in done.stdout + done.stderr


def test_promtool_fails_a_unit_test_whose_alert_does_not_fire(rules_dir: Path) -> None:
    """The unit tests can fail: the same file with an alert's expected reason changed."""
    text = (rules_dir / UNIT_TESTS.name).read_text()
    (rules_dir / UNIT_TESTS.name).write_text(
        text.replace("reason: InstallFailed", "reason: SomethingElse", 1)
    )
    done = run("test", "rules", UNIT_TESTS.name, cwd=rules_dir)
    assert done.returncode != 0
    assert "RukpakBundleDeploymentNotInstalled" in done.stdout + done.stderr


def test_every_alert_has_a_unit_test() -> None:
    tested = {
        case["alertname"]
        for group in yaml.safe_load(UNIT_TESTS.read_text())["tests"]
        for case in group.get("alert_rule_test") or []
        if case.get("exp_alerts")
    }
    assert {a["alert"] for a in alerts()} - tested == set()


def test_every_alert_has_a_runbook_that_is_a_heading_of_the_operations_page() -> None:
    headings = anchors(ROOT / RUNBOOK_PAGE)
    for alert in alerts():
        url = alert["annotations"].get("runbook_url", "")
        page, _, anchor = url.partition("#")
        assert page == RUNBOOK_PAGE and anchor in headings, (alert["alert"], url)


def test_the_per_object_alerts_name_the_object_and_the_reason() -> None:
    by_name = {a["alert"]: a for a in alerts()}
    for name in ("RukpakBundleDeploymentNotInstalled", "RukpakBundleDeploymentNotHealthy"):
        expr, summary = by_name[name]["expr"], by_name[name]["annotations"]["summary"]
        assert "sum(" not in expr and "rukpak_bundledeployment_status_condition" in expr, name
        assert "$labels.bundledeployment" in summary and "$labels.reason" in summary, name
