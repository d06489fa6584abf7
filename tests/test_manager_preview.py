"""A paused v1alpha2 BundleDeployment previews instead of installing (``inline``'s paused
branch): one preview run per content and configuration, its summary copied from the
run's termination message into ``status.preview``, an event saying what to review, and
nothing applied. What the preview holds is ``engine.preview``'s (``test_engine_preview``);
on the local kubelet, ``test_e2e_lifecycle``."""

from __future__ import annotations

import json
from typing import Any

from provisioner.engine.objects import Obj
from provisioner.manager import model
from provisioner.manager.planning import approval, generate, inline, plan, runs
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
    event = next(
        a for a in actions if isinstance(a, plan.RecordEvent) and a.reason != "AwaitingApproval"
    )
    assert (event.type, event.reason) == ("Warning", "PreviewReady")
    assert "1 escalation(s) to review" in event.message
    assert "CreatePod" not in kinds(actions)


def test_a_shown_preview_is_not_run_again_and_its_pod_goes() -> None:
    first = paused_bd()
    pod = preview_pod(first)
    spec_hash = approval.spec_hash(first["spec"])
    revision = pod["metadata"]["annotations"][model.BUNDLE_ANNOTATION]
    shown = paused_bd(
        preview={"pod": model.name_of(pod), "revision": revision, "specHash": spec_hash}
    )
    done = finished(pod, "Succeeded", "{}")
    actions = inline.plan_inline(shown, plan.Observed(pods=(done,), now=NOW), settings=SETTINGS)
    assert kinds(actions) == ["DeletePod", "WriteStatus"]  # and Approved: AwaitingApproval
    status = next(a.status for a in actions if isinstance(a, plan.WriteStatus))
    assert [c["reason"] for c in status["conditions"]] == ["AwaitingApproval"]


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
        assert "Approved" not in [c["type"] for c in status["conditions"]]  # nothing to approve


def test_a_configuration_change_while_paused_is_a_new_preview() -> None:
    first = preview_pod(paused_bd())
    changed = paused_bd()
    changed["spec"]["installNamespace"] = "elsewhere"
    assert model.name_of(preview_pod(changed)) != model.name_of(first)


# -- approval bound to the preview (``approval``) -------------------------------------------


def reviewed_bd(
    *, generation: int = 1, approved: str | None = None, before: Obj | None = None, **spec: Any
) -> Obj:
    """``paused_bd`` (with ``before`` in its spec) once its preview is recorded (with what
    binds an approval to it), then at ``generation`` with ``spec`` changes and an approval
    annotation."""
    first = paused_bd()
    first["spec"].update(before or {})
    pod = preview_pod(first)
    done = finished(pod, "Succeeded", json.dumps({"objects": 2}))
    actions = inline.plan_inline(first, plan.Observed(pods=(done,), now=NOW), settings=SETTINGS)
    status = next(a.status for a in actions if isinstance(a, plan.WriteStatus))
    shown = bd_v2(pin=(1, NOW), digest=DIGEST, status=status, paused=True)
    shown["metadata"]["generation"] = generation
    shown["spec"].update({**(before or {}), **spec})
    if approved is not None:
        shown["metadata"]["annotations"][approval.APPROVED_ANNOTATION] = approved
    return shown


def install_runs(actions: list[plan.Action]) -> list[Obj]:
    return [
        a.pod
        for a in actions
        if isinstance(a, plan.CreatePod)
        and generate.PREVIEW_ANNOTATION not in a.pod["metadata"]["annotations"]
    ]


def test_the_preview_records_the_digests_it_reviewed_and_the_spec_but_paused() -> None:
    shown = reviewed_bd()["status"]["preview"]
    assert shown["digests"] == ["sha256:" + "a" * 64]
    assert shown["specHash"] == approval.spec_hash({**paused_bd()["spec"], "paused": False})


def test_unpausing_installs_the_reviewed_pin_without_pinning_again() -> None:
    unpaused = reviewed_bd(generation=2, paused=False)
    actions = inline.plan_inline(unpaused, plan.Observed(now=NOW), settings=SETTINGS)
    assert "ResolveSource" not in kinds(actions)
    (run,) = install_runs(actions)
    assert run["spec"]["volumes"][0]["csi"]["volumeAttributes"]["image"] == DIGEST


def test_a_spec_changed_beyond_paused_is_pinned_again() -> None:
    changed = reviewed_bd(generation=2, paused=False, installNamespace="elsewhere")
    actions = inline.plan_inline(changed, plan.Observed(now=NOW), settings=SETTINGS)
    assert kinds(actions) == ["ResolveSource"]


def test_poll_interval_moves_a_reviewed_pin_only_once_it_is_installed() -> None:
    later = "2026-11-25T13:00:00Z"  # an hour after the pin: past its pollInterval
    unpaused = reviewed_bd(generation=2, paused=False, before={"pollInterval": "1m"})
    actions = inline.plan_inline(unpaused, plan.Observed(now=later), settings=SETTINGS)
    (run,) = install_runs(actions)
    revision = run["metadata"]["annotations"][model.BUNDLE_ANNOTATION]
    record = runs.InstallRecord(by=model.name_of(run), bundle=revision)
    installed = inline.plan_inline(
        unpaused, plan.Observed(record=record, now=later), settings=SETTINGS
    )
    assert kinds(installed) == ["ResolveSource"]


def test_an_approval_of_the_previewed_digest_installs_it_while_paused() -> None:
    approved = reviewed_bd(approved="sha256:" + "a" * 64)
    actions = inline.plan_inline(approved, plan.Observed(now=NOW), settings=SETTINGS)
    (run,) = install_runs(actions)
    assert run["spec"]["volumes"][0]["csi"]["volumeAttributes"]["image"] == DIGEST
    status = next(a.status for a in actions if isinstance(a, plan.WriteStatus))
    conds = {c["type"]: c for c in status["conditions"]}
    assert (conds["Approved"]["status"], conds["Approved"]["reason"]) == ("True", "Approved")


def test_an_approval_of_another_digest_installs_nothing_and_says_the_source_moved() -> None:
    other = "sha256:" + "b" * 64
    moved = reviewed_bd(approved=other)
    actions = inline.plan_inline(moved, plan.Observed(now=NOW), settings=SETTINGS)
    assert install_runs(actions) == []
    status = next(a.status for a in actions if isinstance(a, plan.WriteStatus))
    (cond,) = status["conditions"]
    assert (cond["type"], cond["status"], cond["reason"]) == ("Approved", "False", "PreviewChanged")
    assert cond["message"].startswith(
        f"approved {other}, but the source now pins sha256:{'a' * 64} (it moved since the "
        "preview that was approved): nothing installed; review the new preview (rukpak "
        f"preview hello) and approve it (rukpak approve hello --preview-digest sha256:{'a' * 64})"
    )


# -- upgradePolicy: ApproveEscalations ------------------------------------------------------

OLD = runs.InstallRecord(by="hello-run-old", bundle="hello-0123456789")
"""An installed revision other than the pin's: the pin is an upgrade."""


def upgrade_previewed(new_rules: list[str], **annotations: str) -> Obj:
    """An installed BD under ApproveEscalations whose upgrade's preview says ``new_rules``."""
    first = bd_v2(pin=(1, NOW), digest=DIGEST, upgradePolicy="ApproveEscalations")
    actions = inline.plan_inline(first, plan.Observed(record=OLD, now=NOW), settings=SETTINGS)
    (pod,) = [a.pod for a in actions if isinstance(a, plan.CreatePod)]
    assert pod["metadata"]["annotations"][generate.PREVIEW_ANNOTATION] == "true"
    assert install_runs(actions) == []  # previewed before anything is installed
    summary = {"objects": 3, "newRules": new_rules}
    done = finished(pod, "Succeeded", json.dumps(summary))
    observed = plan.Observed(pods=(done,), record=OLD, now=NOW)
    actions = inline.plan_inline(first, observed, settings=SETTINGS)
    status = next(a.status for a in actions if isinstance(a, plan.WriteStatus))
    shown = bd_v2(pin=(1, NOW), digest=DIGEST, status=status, upgradePolicy="ApproveEscalations")
    shown["metadata"]["annotations"].update(annotations)
    return shown


def test_an_upgrade_granting_more_waits_for_approval_listing_the_new_rules() -> None:
    rule = "cluster: create on pods/exec"
    waiting = upgrade_previewed([rule])
    actions = inline.plan_inline(waiting, plan.Observed(record=OLD, now=NOW), settings=SETTINGS)
    assert install_runs(actions) == []
    cond = next(c for c in waiting["status"]["conditions"] if c["type"] == "Approved")
    assert (cond["status"], cond["reason"]) == ("False", "EscalationNeedsApproval")
    assert cond["message"].startswith(
        f"the upgrade to sha256:{'a' * 64} grants permissions the installed revision lacks: "
        f"{rule}; nothing installed: review it (rukpak preview hello --diff)"
    )
    approved = upgrade_previewed([rule], **{approval.APPROVED_ANNOTATION: "sha256:" + "a" * 64})
    actions = inline.plan_inline(approved, plan.Observed(record=OLD, now=NOW), settings=SETTINGS)
    (run,) = install_runs(actions)
    assert run["spec"]["volumes"][0]["csi"]["volumeAttributes"]["image"] == DIGEST


def test_an_upgrade_granting_nothing_new_installs_at_once_and_a_first_install_is_not_held() -> None:
    same = upgrade_previewed([])
    actions = inline.plan_inline(same, plan.Observed(record=OLD, now=NOW), settings=SETTINGS)
    assert len(install_runs(actions)) == 1
    status = next(a.status for a in actions if isinstance(a, plan.WriteStatus))
    conds = {c["type"]: c for c in status["conditions"]}
    assert conds["Approved"]["reason"] == "NoNewPermissions"
    first = bd_v2(pin=(1, NOW), digest=DIGEST, upgradePolicy="ApproveEscalations")
    assert (
        len(install_runs(inline.plan_inline(first, plan.Observed(now=NOW), settings=SETTINGS))) == 1
    )


def test_a_spec_change_the_preview_pod_does_not_show_is_recorded_again() -> None:
    shown = reviewed_bd()
    pod = preview_pod(paused_bd())
    done = finished(pod, "Succeeded", json.dumps({"objects": 2}))
    shown["spec"]["pollInterval"] = "1h"  # the same pod, another spec
    actions = inline.plan_inline(shown, plan.Observed(pods=(done,), now=NOW), settings=SETTINGS)
    status = next(a.status for a in actions if isinstance(a, plan.WriteStatus))
    assert status["preview"]["specHash"] == approval.spec_hash(shown["spec"])


def test_a_held_upgrade_is_polled_on_for_a_tag_that_moves_to_a_fix() -> None:
    first = bd_v2(pin=(1, NOW), digest=DIGEST, upgradePolicy="ApproveEscalations")
    first["spec"]["pollInterval"] = "1m"
    pod = next(
        a.pod
        for a in inline.plan_inline(first, plan.Observed(record=OLD, now=NOW), settings=SETTINGS)
        if isinstance(a, plan.CreatePod)
    )
    done = finished(pod, "Succeeded", json.dumps({"objects": 3, "newRules": ["cluster: * on *"]}))
    observed = plan.Observed(pods=(done,), record=OLD, now=NOW)
    actions = inline.plan_inline(first, observed, settings=SETTINGS)
    status = next(a.status for a in actions if isinstance(a, plan.WriteStatus))
    held = bd_v2(pin=(1, NOW), digest=DIGEST, status=status, upgradePolicy="ApproveEscalations")
    held["spec"]["pollInterval"] = "1m"
    later = plan.Observed(record=OLD, now="2026-11-25T13:00:00Z")
    assert kinds(inline.plan_inline(held, later, settings=SETTINGS)) == ["ResolveSource"]
