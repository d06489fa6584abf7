"""A paused v1alpha2 BundleDeployment previews instead of installing (``inline``'s paused
branch): one preview run per content and configuration, its summary copied from the
run's termination message into ``status.preview``, an event saying what to review, and
nothing applied. What the preview holds is ``engine.preview``'s (``test_engine_preview``);
on the local kubelet, ``test_e2e_lifecycle``."""

from __future__ import annotations

import json
from typing import Any

from provisioner.engine.objects import Obj
from provisioner.manager import generate, inline, model, plan
from tests.plan_helpers import bd_v2, kinds

SETTINGS = model.Settings(image="registry.example/rukpak:1", system_namespace="rukpak-system")
NOW = "2026-11-25T12:00:00Z"
DIGEST = "registry.example/hello@sha256:" + "a" * 64


def paused_bd(**status: Any) -> Obj:
    return bd_v2(pin=(1, NOW), digest=DIGEST, status=status, paused=True)


def preview_pod(the_bd: Obj) -> Obj:
    actions = inline.plan_inline(the_bd, plan.Observed(now=NOW), settings=SETTINGS)
    (run,) = [a.pod for a in actions if isinstance(a, plan.CreatePod)]
    return run


def finished(pod: Obj, phase: str, message: str) -> Obj:
    return {
        **pod,
        "status": {
            "phase": phase,
            "containerStatuses": [{"state": {"terminated": {"message": message}}}],
        },
    }


def test_a_paused_bd_runs_a_preview_that_applies_nothing() -> None:
    pod = preview_pod(paused_bd())
    assert pod["metadata"]["annotations"][generate.PREVIEW_ANNOTATION] == "true"
    assert pod["spec"]["containers"][0]["command"][-1] == "--preview"
    assert pod["spec"]["volumes"][0]["csi"]["volumeAttributes"]["image"] == DIGEST


def test_the_summary_goes_to_status_with_an_event_naming_escalations() -> None:
    the_bd = paused_bd()
    pod = preview_pod(the_bd)
    summary = {"objects": 3, "escalations": ['ClusterRole/x: verb "*" on secrets']}
    done = finished(pod, "Succeeded", json.dumps(summary))
    actions = inline.plan_inline(the_bd, plan.Observed(pods=(done,), now=NOW), settings=SETTINGS)
    status = next(a.status for a in actions if isinstance(a, plan.WriteStatus))
    assert status["preview"]["objects"] == 3
    assert status["preview"]["pod"] == model.name_of(pod)
    assert status["preview"]["revision"].startswith("hello-")
    event = next(a for a in actions if isinstance(a, plan.RecordEvent))
    assert (event.type, event.reason) == ("Warning", "PreviewReady")
    assert "1 escalation(s) to review" in event.message
    assert "CreatePod" not in kinds(actions)


def test_a_shown_preview_is_not_run_again_and_its_pod_goes() -> None:
    first = paused_bd()
    pod = preview_pod(first)
    shown = paused_bd(preview={"pod": model.name_of(pod), "objects": 1})
    done = finished(pod, "Succeeded", "{}")
    actions = inline.plan_inline(shown, plan.Observed(pods=(done,), now=NOW), settings=SETTINGS)
    assert kinds(actions) == ["DeletePod"]


def test_a_failed_or_silent_preview_says_so() -> None:
    the_bd = paused_bd()
    pod = preview_pod(the_bd)
    for phase, message, words in (
        ("Failed", "bundle invalid: x.yaml", "bundle invalid: x.yaml"),
        ("Succeeded", "not json", "left no summary"),
    ):
        done = finished(pod, phase, message)
        actions = inline.plan_inline(
            the_bd, plan.Observed(pods=(done,), now=NOW), settings=SETTINGS
        )
        status = next(a.status for a in actions if isinstance(a, plan.WriteStatus))
        assert words in status["preview"]["error"]


def test_a_configuration_change_while_paused_is_a_new_preview() -> None:
    first = preview_pod(paused_bd())
    changed = paused_bd()
    changed["spec"]["installNamespace"] = "elsewhere"
    assert model.name_of(preview_pod(changed)) != model.name_of(first)
