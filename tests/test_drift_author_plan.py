"""The ``Drifted`` condition's lifecycle in the planner (``plan.drifted``), pure: True
with who changed what once drift is restored, ``Fighting`` at the fight threshold, False
after a quiet window, absent for a BundleDeployment that never drifted; one event per
transition, so a fight writes one event however many times the other writer writes."""

from __future__ import annotations

from typing import Any

from provisioner.engine.objects import Obj
from provisioner.manager.planning import plan
from tests.plan_helpers import B, cond, status_of
from tests.test_manager_plan import SETTINGS, _ready, record

BODY: Obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {}}
SAID = plan.drift_message(['field manager "kubectl-edit" changed data.k of ConfigMap ns/c'])


def step(the_bd: Obj, **observed: Any) -> tuple[Obj, list[plan.Action]]:
    """One pass: the BD with the status the plan wrote, and the plan."""
    actions = plan.plan(the_bd, _ready(B, record=record(B), **observed), settings=SETTINGS)
    written = [a for a in actions if isinstance(a, plan.WriteStatus)]
    return ({**the_bd, "status": written[0].status} if written else the_bd), actions


def drift_events(actions: list[plan.Action]) -> list[str]:
    return [
        a.reason
        for a in actions
        if isinstance(a, plan.RecordEvent) and a.message.startswith(f"{plan.DRIFTED}=")
    ]


def test_the_message_names_the_writer_the_field_and_the_object() -> None:
    assert SAID == 'field manager "kubectl-edit" changed data.k of ConfigMap ns/c; restored'
    many = plan.drift_message([f"x{i}" for i in range(5)])
    assert many == "x0; x1; x2 (and 2 more); restored"


def test_a_fight_is_one_event_per_transition_not_one_per_write() -> None:
    repair = plan.Repair((BODY,), ("ns/c: changed",))
    the_bd, first = step(B, repair=repair, drifted=SAID)
    assert cond(first, plan.DRIFTED) == ("True", "DriftCorrected")
    assert status_of(first)["conditions"][-1]["message"] == SAID
    reported = drift_events(first)
    for fights in (1, 2):  # more writes, more restores, the same condition: no event
        the_bd, again = step(the_bd, repair=repair, drifted=SAID, fights=fights)
        reported += drift_events(again)
    for fights in range(plan.FIGHT_THRESHOLD, plan.FIGHT_THRESHOLD + 3):  # the fight
        the_bd, fighting = step(the_bd, repair=repair, drifted=SAID, fights=fights)
        reported += drift_events(fighting)
    assert reported == ["DriftCorrected", "Fighting"]
    (cond_now,) = [c for c in the_bd["status"]["conditions"] if c["type"] == plan.DRIFTED]
    assert cond_now["reason"] == "Fighting" and SAID in cond_now["message"]

    # quiet for the damper's window: False once, then nothing more
    the_bd, calm = step(the_bd)
    assert cond(calm, plan.DRIFTED) == ("False", "NoDrift")
    assert drift_events(calm) == ["NoDrift"]
    _, later = step(the_bd)
    assert drift_events(later) == []


def test_a_bundledeployment_that_never_drifted_has_no_drifted_condition() -> None:
    _, actions = step(B)
    assert plan.DRIFTED not in [c["type"] for c in status_of(actions)["conditions"]]


def test_fighting_is_a_warning_and_a_correction_is_normal() -> None:
    repair = plan.Repair((BODY,), ("ns/c: changed",))
    _, first = step(B, repair=repair, drifted=SAID)
    _, fight = step(B, repair=repair, drifted=SAID, fights=plan.FIGHT_THRESHOLD)
    kinds = {
        a.reason: a.type
        for a in [*first, *fight]
        if isinstance(a, plan.RecordEvent) and a.reason in ("DriftCorrected", "Fighting")
    }
    assert kinds == {"DriftCorrected": "Normal", "Fighting": "Warning"}
