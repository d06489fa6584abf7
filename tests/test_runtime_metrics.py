"""The runtime's metrics (``provisioner.runtime.metrics``) with controller-runtime's and
client-go's names, fed by a real ``WorkQueue`` and ``Workers``: reconcile results and
errors, queue adds, retries, wait and work times, depth, and scrape-time families. The
manager serving them behind the API server's authorization is in ``test_e2e_v1alpha2``."""

from __future__ import annotations

import logging
import threading

from provisioner.runtime.metrics import Metrics, classify, object_conditions
from provisioner.runtime.queue import WorkQueue
from provisioner.runtime.workers import Workers
from rukpak.common import errors
from tests.metrics_helpers import exposed
from tests.polling import eventually


def test_results_are_classified_as_controller_runtime_does() -> None:
    assert [classify(a) for a in (None, 0.0, 5.0)] == ["success", "requeue", "requeue_after"]


def test_a_worker_reports_reconciles_errors_and_the_queue() -> None:
    metrics = Metrics()
    queue = WorkQueue(base=0.01, cap=0.01)
    queue.observer = metrics.queue("q", lambda: len(queue))
    seen: list[str] = []
    failed = threading.Event()

    def reconcile(key: str) -> float | None:
        seen.append(key)
        if key == "bad" and not failed.is_set():
            failed.set()
            raise errors.Unavailable("not yet")
        return None

    workers = Workers(
        queue,
        reconcile,
        log=logging.getLogger("test"),
        metrics=metrics,
        controller_of=lambda key: "widget",
        controllers=("widget",),
    )
    workers.start(2)
    try:
        queue.add("good")
        queue.add("bad")
        eventually(lambda: seen.count("bad") == 2 and "good" in seen, timeout=10, what="reconciles")
        eventually(
            lambda: (
                exposed(metrics).get(
                    (
                        "controller_runtime_reconcile_total",
                        (("controller", "widget"), ("result", "success")),
                    )
                )
                == 2.0
            ),
            timeout=10,
            what="two successes counted",
        )
    finally:
        workers.stop()
    got = exposed(metrics)
    widget = (("controller", "widget"),)
    assert (
        got[("controller_runtime_reconcile_total", (("controller", "widget"), ("result", "error")))]
        == 1
    )
    assert got[("controller_runtime_reconcile_errors_total", widget)] == 1
    assert got[("controller_runtime_reconcile_time_seconds_count", widget)] == 3
    assert got[("controller_runtime_max_concurrent_reconciles", widget)] == 2
    name = (("name", "q"),)
    assert got[("workqueue_adds_total", name)] == 3  # good, bad, bad again
    assert got[("workqueue_retries_total", name)] == 1
    assert got[("workqueue_queue_duration_seconds_count", name)] == 3
    assert got[("workqueue_work_duration_seconds_count", name)] == 3
    assert got[("workqueue_depth", name)] == 0


def test_scrape_time_families_read_their_source_each_time() -> None:
    metrics = Metrics()
    answers = {("GET", "200"): 3}
    metrics.requests_of(lambda: answers, host="https://api.example:6443")
    counts: dict[tuple[str, ...], float] = {("Installed", "True"): 2.0}
    metrics.gauge_of(
        "rukpak_bundledeployments", "by condition", ["condition", "status"], lambda: counts
    )
    key = (
        "rest_client_requests_total",
        (("code", "200"), ("host", "https://api.example:6443"), ("method", "GET")),
    )
    assert exposed(metrics)[key] == 3
    answers[("GET", "200")] = 5
    counts[("Installed", "True")] = 1.0
    got = exposed(metrics)
    assert got[key] == 5
    assert got[("rukpak_bundledeployments", (("condition", "Installed"), ("status", "True")))] == 1


class _Cache:
    def __init__(self, items: list[dict[str, object]]) -> None:
        self._items = items

    def items(self) -> list[dict[str, object]]:
        return self._items


def _with_revisions(installed: int, *outcomes: str) -> dict[str, object]:
    kept = [
        {"revision": n, "name": f"r{n}", "source": {}, "generation": n, "time": "t", "outcome": o}
        for n, o in enumerate(outcomes, start=1)
    ]
    return {"status": {"revisions": kept, "installedRevision": installed}}


def test_revisions_are_counted_by_outcome_and_rollbacks_in_force_apart() -> None:
    """The samples of ``rukpak_revisions`` and ``rukpak_bundledeployments_rolled_back``,
    from the leader's cache (the manager's ``Controller``)."""
    from provisioner.manager.controller import Controller

    cache = _Cache(
        [
            _with_revisions(2, "Installed", "Installed"),
            _with_revisions(1, "Installed", "Failed"),  # went back to 1
            {"status": {}},  # created as v1alpha1, or nothing installed yet
        ]
    )
    leader = type("Leader", (), {"bds": cache})()
    assert Controller.by_revision_outcome(leader) == {("Installed",): 3.0, ("Failed",): 1.0}  # type: ignore[arg-type]
    assert Controller.rolled_back(leader) == {(): 1.0}  # type: ignore[arg-type]
    metrics = Metrics()
    metrics.gauge_of("rukpak_bundledeployments_rolled_back", "x", [], lambda: {(): 1.0})
    assert exposed(metrics)[("rukpak_bundledeployments_rolled_back", ())] == 1


def _bd(name: str, *conditions: tuple[str, str, str]) -> dict[str, object]:
    return {
        "metadata": {"name": name},
        "status": {"conditions": [{"type": t, "status": s, "reason": r} for t, s, r in conditions]},
    }


def test_each_object_has_one_series_per_condition_with_status_and_reason() -> None:
    """``rukpak_bundledeployment_status_condition``: bounded by objects x condition types,
    and an object gone from the cache is gone from the next scrape."""
    cache = _Cache(
        [
            _bd(
                "good",
                ("Installed", "True", "InstallationSucceeded"),
                ("Healthy", "True", "Healthy"),
            ),
            _bd("bad", ("Installed", "False", "InstallFailed")),
            {"metadata": {"name": "new"}},  # no status yet: no series
        ]
    )
    metrics = Metrics()
    metrics.object_gauge(
        "rukpak_bundledeployment_status_condition",
        "x",
        ["bundledeployment", "condition", "status", "reason"],
        lambda: object_conditions(cache.items()),
    )
    got = {k: v for k, v in exposed(metrics).items() if k[0].endswith("_status_condition")}
    bad = (
        "rukpak_bundledeployment_status_condition",
        (
            ("bundledeployment", "bad"),
            ("condition", "Installed"),
            ("reason", "InstallFailed"),
            ("status", "False"),
        ),
    )
    assert got[bad] == 1 and len(got) == 3
    cache._items.pop(1)  # deleted
    assert bad not in exposed(metrics)


def test_a_repeated_condition_type_is_one_series_and_namespaces_are_kept_when_asked() -> None:
    obj = {
        "metadata": {"name": "a", "namespace": "ns"},
        "status": {
            "conditions": [
                {"type": "Ready", "status": "True", "reason": "Fine"},
                {"type": "Ready", "status": "False", "reason": "Dup"},
                "not a condition",
            ]
        },
    }
    assert list(object_conditions([obj])) == [(("a", "Ready", "True", "Fine"), 1.0)]
    assert list(object_conditions([obj], namespaced=True)) == [
        (("a", "ns", "Ready", "True", "Fine"), 1.0)
    ]


def test_rollbacks_in_force_are_one_series_per_bundledeployment() -> None:
    from provisioner.manager.controller import Controller

    back = {"metadata": {"name": "back"}, **_with_revisions(1, "Installed", "Failed")}
    current = {"metadata": {"name": "current"}, **_with_revisions(2, "Installed", "Installed")}
    leader = type("Leader", (), {"bds": _Cache([back, current])})()
    assert Controller.rolled_back_by_name(leader) == {("back",): 1.0, ("current",): 0.0}  # type: ignore[arg-type]
