"""``spec.healthChecks`` probed per BundleDeployment (``provisioner.manager.watching.probes``):
parsed once per generation, restarted by a new install, folded into the per-kind health, and the
wait until the next probe. A fake clock stands in for time; the checks themselves are
``engine.healthchecks``' (``test_engine_healthchecks``)."""

from __future__ import annotations

from provisioner.engine.health.health import Health
from provisioner.engine.objects import Obj
from provisioner.manager.watching import probes

DEPLOYMENT: Obj = {
    "apiVersion": "apps/v1",
    "kind": "Deployment",
    "metadata": {"name": "web", "namespace": "apps"},
    "status": {"readyReplicas": 1},
}
CHECK: Obj = {
    "name": "three-ready",
    "selector": {"kind": "Deployment"},
    "assertions": [{"field": {"path": ".status.readyReplicas", "equals": 3}}],
    "periodSeconds": 5,
    "failureThreshold": 2,
}


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def judge(
    p: probes.Probes, objects: list[Obj], *, install: str = "run-1", generation: int = 1
) -> tuple[Health | None, float | None]:
    return p.judge(
        "bd",
        {"healthChecks": [CHECK]},
        generation=generation,
        install=install,
        objects=objects,
        base=Health(True, "all 1 installed objects are ready"),
    )


def test_a_failing_check_turns_healthy_false_after_its_failure_threshold() -> None:
    clock = Clock()
    p = probes.Probes(clock)
    first, wait = judge(p, [DEPLOYMENT])
    assert first is not None and not first.ready
    assert "failure 1 of 2" in first.reason
    assert wait == 5.0
    clock.now += 5
    second, _ = judge(p, [DEPLOYMENT])
    assert second is not None and not second.ready
    assert "three-ready" in second.reason and "is 1 (want 3)" in second.reason


def test_a_passing_check_keeps_the_per_kind_reason_and_says_so() -> None:
    p = probes.Probes(Clock())
    ready = {**DEPLOYMENT, "status": {"readyReplicas": 3}}
    verdict, _ = judge(p, [ready])
    assert verdict == Health(True, "all 1 installed objects are ready; 1 health check(s) pass")


def test_a_new_install_restarts_the_probes() -> None:
    clock = Clock()
    p = probes.Probes(clock)
    judge(p, [DEPLOYMENT])
    clock.now += 5
    judge(p, [DEPLOYMENT])  # failing now
    fresh, _ = judge(p, [{**DEPLOYMENT, "status": {"readyReplicas": 3}}], install="run-2")
    assert fresh is not None and fresh.ready


def test_a_broken_check_is_reported_not_run() -> None:
    p = probes.Probes(Clock())
    verdict, wait = p.judge(
        "bd",
        {"healthChecks": [{"assertions": [{"cel": "object.status.("}]}]},
        generation=1,
        install="run-1",
        objects=[DEPLOYMENT],
        base=Health(True),
    )
    assert verdict is not None and not verdict.ready
    assert "spec.healthChecks[0]" in verdict.reason
    assert wait is None


def test_unhealthy_objects_win_over_passing_checks_and_unknown_stays_unknown() -> None:
    p = probes.Probes(Clock())
    bad = Health(False, "Deployment apps/web: 1 of 3 replicas updated")
    ready = {**DEPLOYMENT, "status": {"readyReplicas": 3}}
    verdict, _ = p.judge(
        "bd", {"healthChecks": [CHECK]}, generation=1, install="r", objects=[ready], base=bad
    )
    assert verdict == bad
    unknown, _ = p.judge(
        "bd", {"healthChecks": [CHECK]}, generation=1, install="r", objects=None, base=None
    )
    assert unknown is None


def test_without_checks_the_base_health_passes_through() -> None:
    p = probes.Probes(Clock())
    base = Health(True, "fine")
    assert p.judge("bd", {}, generation=1, install="r", objects=[], base=base) == (base, None)
