"""Revisions, rollbacks, progress deadlines and dependencies of BundleDeployments, pure:
``provisioner.manager.planning.revisions``, ``provisioner.manager.planning.dependencies`` and
what the v1alpha2 planner (``inline``) does with them. The same flows on the local kubelet are in
``test_e2e_lifecycle``."""

from __future__ import annotations

import json
from typing import Any

from provisioner.engine.apply import revisionlog
from provisioner.engine.health.health import Health
from provisioner.engine.objects import Obj
from provisioner.manager import model
from provisioner.manager.planning import (
    dependencies,
    generate,
    inline,
    plan,
    revisions,
    runs,
    sources,
)
from rukpak.sources import volume
from tests.plan_helpers import D1, D2, INLINE_SETTINGS, T0, bd_v2, installed, kinds, step

SETTINGS = INLINE_SETTINGS


def bd(*, generation: int = 1, digest: str = D1, status: Obj | None = None, **spec: Any) -> Obj:
    return bd_v2(generation=generation, pin=(generation, T0), digest=digest, status=status, **spec)


def upgrade(old: Obj, digest: str, generation: int, **spec: Any) -> Obj:
    new = bd(generation=generation, digest=digest, status=old["status"], **spec)
    new["status"]["resolvedSource"] = sources.pinned_image(digest)
    return new


# -- the history ---------------------------------------------------------------------------


def test_an_install_is_revision_1_with_its_digest_outcome_and_object_count() -> None:
    the_bd, _ = installed(bd())
    status = the_bd["status"]
    assert status["installedRevision"] == 1
    assert status.get("previousRevision") is None
    (rev,) = status["revisions"]
    assert rev["revision"] == 1
    assert rev["source"] == sources.pinned_image(D1)
    assert rev["outcome"] == "Installed"
    assert rev["objects"] == 2
    assert rev["generation"] == 1


def test_an_upgrade_is_revision_2_and_names_revision_1_previous() -> None:
    first, _ = installed(bd())
    second, _ = installed(upgrade(first, D2, 2), now="2026-11-25T12:01:00Z")
    status = second["status"]
    assert [r["revision"] for r in status["revisions"]] == [1, 2]
    assert status["installedRevision"] == 2
    assert status["previousRevision"] == 1


def test_a_configuration_change_is_a_revision_too() -> None:
    first, _ = installed(bd())
    second, _ = installed(upgrade(first, D1, 2, installNamespace="other"))
    assert [r["revision"] for r in second["status"]["revisions"]] == [1, 2]
    assert second["status"]["revisions"][1]["config"] == {"installNamespace": "other"}


def test_the_history_keeps_the_limit_and_never_drops_the_installed_one() -> None:
    current, _ = installed(bd(revisionHistoryLimit=2))
    for generation in range(2, 5):
        digest = "registry.example/hello@sha256:" + str(generation) * 64
        current, _ = installed(upgrade(current, digest, generation, revisionHistoryLimit=2))
    numbers = [r["revision"] for r in current["status"]["revisions"]]
    assert numbers == [3, 4]
    kept = revisions.track(
        revisions.of_status(current),
        name="new",
        resolved=sources.pinned_image(D1),
        generation=9,
        now=T0,
        limit=1,
        keep=revisions.of_status(current)[0].name,
    )
    assert [r.number for r in kept] == [3, 5]  # the installed (3) and the new one stay


def test_pins_survive_the_trip_through_a_revision() -> None:
    several = sources.several(
        [("a", sources.pinned_image(D1)), ("b", {**sources.pinned_configmaps([]), "x": 1})]
    )
    single = {**sources.pinned_configmaps([{"configMap": {"name": "c"}, "path": "m"}])}
    single[sources.ITEMS_KEY] = [["c", "k", "m/k"]]
    assert revisions.decode_pin(revisions.encode_pin(single)) == single
    assert revisions.decode_pin(revisions.encode_pin(sources.pinned_image(D1))) == (
        sources.pinned_image(D1)
    )
    assert revisions.decode_pin(revisions.encode_pin(several)) is None  # no items: not a pin
    assert revisions.decode_pin({"type": "image", "image": {}}) is None
    assert revisions.decode_pin({"sources": ["junk"]}) is None


def test_unreadable_history_entries_are_dropped_not_fatal() -> None:
    junk = bd(status={"revisions": ["x", {"revision": "1"}, {"revision": 2, "name": "n"}, 7]})
    assert revisionlog.of_status(junk) == []
    assert revisionlog.of_status(bd(status={"revisions": "nope"})) == []


# -- rollbacks -----------------------------------------------------------------------------


def test_a_rollback_installs_the_kept_pin_without_resolving_anything() -> None:
    first, _ = installed(bd())
    second, _ = installed(upgrade(first, D2, 2))
    second["metadata"]["annotations"][revisions.ROLLBACK_ANNOTATION] = (
        revisions.rollback_annotation(1, 2, revisions.MANUAL)
    )
    second["metadata"]["annotations"].pop(inline.PIN_ANNOTATION)  # even with no pin at all
    actions, after = step(second, plan.Observed(now=T0))
    assert "ResolveSource" not in kinds(actions)
    run = next(a.pod for a in actions if isinstance(a, plan.CreatePod))
    assert run["spec"]["volumes"][0]["csi"]["volumeAttributes"]["image"] == D1
    progressing = {c["type"]: c for c in after["status"]["conditions"]}["Progressing"]
    assert progressing["reason"] == "RolledBack"


def test_the_node_that_installed_a_revision_is_kept_and_a_rollback_prefers_it() -> None:
    """On several nodes only those whose run installed a revision hold it in their cache:
    an offline rollback's run should go there."""
    actions, the_bd = step(bd(), plan.Observed(now=T0))
    run = next(a.pod for a in actions if isinstance(a, plan.CreatePod))
    assert "affinity" not in run["spec"]  # an ordinary run goes wherever
    done = {**run, "spec": {**run["spec"], "nodeName": "node-2"}, "status": {"phase": "Succeeded"}}
    record = runs.InstallRecord(
        by=model.name_of(run),
        bundle=run["metadata"]["annotations"][model.BUNDLE_ANNOTATION],
        applied={"a": "x"},
    )
    seen = plan.Observed(record=record, health=Health(True), now=T0, pods=(done,))
    _, first = step(the_bd, seen)
    assert revisionlog.of_status(first)[0].nodes == ("node-2",)
    _, first = step(first, plan.Observed(record=record, health=Health(True), now=T0))
    assert revisionlog.of_status(first)[0].nodes == ("node-2",), "kept once the pod is gone"

    second, _ = installed(upgrade(first, D2, 2))
    second["metadata"]["annotations"][revisions.ROLLBACK_ANNOTATION] = (
        revisions.rollback_annotation(1, 2, revisions.MANUAL)
    )
    actions, _ = step(second, plan.Observed(now=T0))
    back = next(a.pod for a in actions if isinstance(a, plan.CreatePod))
    terms = back["spec"]["affinity"]["nodeAffinity"][
        "preferredDuringSchedulingIgnoredDuringExecution"
    ]
    assert terms[0]["preference"]["matchFields"] == [
        {"key": "metadata.name", "operator": "In", "values": ["node-2"]}
    ]


def test_the_record_names_the_node_even_when_the_pod_is_gone() -> None:
    """The run writes its node (env NODE_NAME from spec.nodeName) into the install record:
    the revision keeps it although the manager never saw the pod on that node."""
    actions, the_bd = step(bd(), plan.Observed(now=T0))
    run = next(a.pod for a in actions if isinstance(a, plan.CreatePod))
    env = {e["name"]: e for e in run["spec"]["containers"][0]["env"]}
    assert env["NODE_NAME"]["valueFrom"]["fieldRef"]["fieldPath"] == "spec.nodeName"
    record = runs.InstallRecord(
        by=model.name_of(run),
        bundle=run["metadata"]["annotations"][model.BUNDLE_ANNOTATION],
        applied={"a": "x"},
        node="node-3",
    )
    _, after = step(the_bd, plan.Observed(record=record, health=Health(True), now=T0))
    assert revisionlog.of_status(after)[0].nodes == ("node-3",)
    cm = {"data": {"install-record": json.dumps(record.document())}}
    back = runs.InstallRecord.of_inventory(cm)
    assert back is not None and (back.by, back.node) == (record.by, "node-3")


def test_a_revisions_nodes_are_newest_first_without_repeats_and_bounded() -> None:
    kept = [revisionlog.Revision(1, "r", {}, 1, T0)]
    for node in ("a", "b", "a", "c", "d", ""):
        kept = revisions.settle(
            kept, name="r", outcome=revisions.INSTALLED, objects=None, installed=True,
            was_installed=None, now=T0, node=node,
        )  # fmt: skip
    assert kept[0].nodes == ("d", "c", "a")
    back = revisionlog.Revision.of(kept[0].document())
    assert back is not None and back.nodes == ("d", "c", "a")
    hostile = revisionlog.Revision.of({**kept[0].document(), "nodes": [1, "", "x", None]})
    assert hostile is not None and hostile.nodes == ("x",)
    assert revisionlog.Revision.of({**kept[0].document(), "nodes": "x"}).nodes == ()  # type: ignore[union-attr]


def test_a_rollback_reinstalls_even_when_the_record_names_that_revision() -> None:
    """A failed run of the newer revision may have applied part of it: a new run."""
    first, record = installed(bd())
    failing = upgrade(first, D2, 2)
    failing["metadata"]["annotations"][revisions.ROLLBACK_ANNOTATION] = (
        revisions.rollback_annotation(1, 2, revisions.MANUAL)
    )
    actions, _ = step(failing, plan.Observed(record=record, now=T0))
    assert "CreatePod" in kinds(actions)


def test_a_rollback_for_an_older_generation_is_over() -> None:
    first, _ = installed(bd())
    later = upgrade(first, D2, 3)
    later["metadata"]["annotations"][revisions.ROLLBACK_ANNOTATION] = revisions.rollback_annotation(
        1, 2, revisions.MANUAL
    )
    assert revisions.rollback_of(later) is None
    run = next(
        a.pod for a in step(later, plan.Observed(now=T0))[0] if isinstance(a, plan.CreatePod)
    )
    assert run["spec"]["volumes"][0]["csi"]["volumeAttributes"]["image"] == D2


def test_a_rollback_restores_the_configuration_of_its_revision() -> None:
    first, _ = installed(bd())
    second = upgrade(first, D1, 2, installNamespace="elsewhere")
    second["metadata"]["annotations"][revisions.ROLLBACK_ANNOTATION] = (
        revisions.rollback_annotation(1, 2, revisions.MANUAL)
    )
    run = next(
        a.pod for a in step(second, plan.Observed(now=T0))[0] if isinstance(a, plan.CreatePod)
    )
    command = run["spec"]["containers"][0]["command"]
    assert command[command.index("--namespace") + 1] == "apps"


# -- progress deadlines --------------------------------------------------------------------


def test_progress_is_true_while_within_the_deadline_and_requeues_for_it() -> None:
    first, record = installed(bd())
    actions, after = step(
        upgrade(first, D2, 2, progressDeadlineSeconds=60), plan.Observed(record=record, now=T0)
    )
    progressing = {c["type"]: c for c in after["status"]["conditions"]}["Progressing"]
    assert (progressing["status"], progressing["reason"]) == ("True", "Progressing")
    waits = [a.after for a in actions if isinstance(a, plan.Requeue)]
    assert 60.0 in waits


def test_a_revision_past_its_deadline_is_reported_and_rolled_back_when_asked() -> None:
    first, record = installed(bd())
    failing = upgrade(first, D2, 2, progressDeadlineSeconds=60, rollbackOnFailure=True)
    _, failing = step(failing, plan.Observed(record=record, now=T0))
    actions, after = step(failing, plan.Observed(record=record, now="2026-11-25T12:01:01Z"))
    progressing = {c["type"]: c for c in after["status"]["conditions"]}["Progressing"]
    assert (progressing["status"], progressing["reason"]) == ("False", "ProgressDeadlineExceeded")
    rollback = [a for a in actions if isinstance(a, plan.SetRollback)]
    assert rollback == [plan.SetRollback(1, 2, revisions.DEADLINE)]
    outcomes = [r["outcome"] for r in after["status"]["revisions"]]
    assert outcomes == ["Installed", "ProgressDeadlineExceeded"]
    assert any(isinstance(a, plan.RecordEvent) and a.reason == "RollingBack" for a in actions)
    # then the kept revision is reinstalled, and Progressing keeps saying why
    actions, after = step(after, plan.Observed(record=record, now="2026-11-25T12:01:02Z"))
    run = next(a.pod for a in actions if isinstance(a, plan.CreatePod))
    assert run["spec"]["volumes"][0]["csi"]["volumeAttributes"]["image"] == D1
    progressing = {c["type"]: c for c in after["status"]["conditions"]}["Progressing"]
    assert progressing["reason"] == "ProgressDeadlineExceeded"
    assert "rolled back to revision 1" in progressing["message"]


def test_without_rollback_on_failure_a_deadline_only_reports() -> None:
    first, record = installed(bd())
    failing = upgrade(first, D2, 2, progressDeadlineSeconds=60)
    _, failing = step(failing, plan.Observed(record=record, now=T0))
    actions, _ = step(failing, plan.Observed(record=record, now="2026-11-25T12:05:00Z"))
    assert not [a for a in actions if isinstance(a, plan.SetRollback)]


def test_an_installed_and_healthy_revision_succeeded() -> None:
    the_bd, _ = installed(bd())
    progressing = {c["type"]: c for c in the_bd["status"]["conditions"]}["Progressing"]
    assert (progressing["status"], progressing["reason"]) == ("True", "Succeeded")


# -- dependencies --------------------------------------------------------------------------


def dep(name: str, *needs: str, ready: bool = True) -> Obj:
    state = "True" if ready else "False"
    return {
        "metadata": {"name": name},
        "spec": {"dependsOn": [{"name": n} for n in needs]},
        "status": {
            "conditions": [
                {"type": "Installed", "status": state, "reason": "R"},
                {"type": "Healthy", "status": "True"},
            ]
        },
    }


def test_unmet_dependencies_name_each_one_and_why() -> None:
    found = {"a": dep("a"), "b": dep("b", ready=False)}
    unmet = dependencies.unmet(dep("c", "a", "b", "z", "a"), found.get)
    assert unmet == ("b: Installed=False (R)", "z: not found")


def test_a_cycle_is_found_through_a_chain() -> None:
    found = {"a": dep("a", "b"), "b": dep("b", "c"), "c": dep("c", "a")}
    assert dependencies.cycle(found["a"], found.get) == "a -> b -> c -> a"
    assert dependencies.cycle(dep("d", "a"), found.get) == ""  # d is not on the cycle
    assert dependencies.cycle(dep("e", "e"), found.get) == "e -> e"


def test_dependents_are_who_names_it() -> None:
    everything = [dep("a"), dep("b", "a"), dep("c", "b", "a")]
    assert dependencies.dependents("a", everything) == ("b", "c")


def test_hostile_depends_on_entries_are_ignored() -> None:
    odd = {"metadata": {"name": "x"}, "spec": {"dependsOn": ["a", {"name": 3}, {"name": ""}]}}
    assert dependencies.depends_on(odd) == ()
    assert dependencies.depends_on({"spec": {"dependsOn": "a"}}) == ()


def test_an_install_waits_for_its_dependencies_and_says_for_which() -> None:
    actions, after = step(bd(), plan.Observed(dependencies=("a: not found",), now=T0))
    assert "CreatePod" not in kinds(actions)
    installed_cond = {c["type"]: c for c in after["status"]["conditions"]}["Installed"]
    assert installed_cond["reason"] == "DependencyNotReady"
    assert "a: not found" in installed_cond["message"]


def test_a_cycle_is_refused_with_the_path() -> None:
    _, after = step(bd(), plan.Observed(cycle="hello -> a -> hello", now=T0))
    installed_cond = {c["type"]: c for c in after["status"]["conditions"]}["Installed"]
    assert installed_cond["reason"] == "DependencyCycle"
    assert "hello -> a -> hello" in installed_cond["message"]


def test_an_installed_bundle_is_not_held_back_by_a_dependency_going_unready() -> None:
    the_bd, record = installed(bd())
    _, after = step(the_bd, plan.Observed(record=record, dependencies=("a: x",), now=T0))
    installed_cond = {c["type"]: c for c in after["status"]["conditions"]}["Installed"]
    assert installed_cond["status"] == "True"


def test_deletion_waits_for_dependents_and_then_uninstalls() -> None:
    doomed = bd()
    doomed["metadata"]["deletionTimestamp"] = T0
    actions = inline.plan_inline(
        doomed, plan.Observed(dependents=("b",), now=T0), settings=SETTINGS
    )
    assert "Uninstall" not in kinds(actions)
    status = next(a.status for a in actions if isinstance(a, plan.WriteStatus))
    deleting = {c["type"]: c for c in status["conditions"]}["Deleting"]
    assert "b" in deleting["message"]
    actions = inline.plan_inline(doomed, plan.Observed(now=T0), settings=SETTINGS)
    assert "Uninstall" in kinds(actions)


def test_a_deletion_marks_the_deployments_it_depended_on_for_them_to_wait() -> None:
    """The mark names them: they wait until this uninstall is done, not only until the
    BundleDeployment is gone (its finalizer goes first)."""
    doomed = bd(dependsOn=[{"name": "a"}, {"name": "b"}])
    doomed["metadata"]["deletionTimestamp"] = T0
    doomed["metadata"]["finalizers"] = [model.FINALIZER]
    actions = inline.plan_inline(doomed, plan.Observed(now=T0), settings=SETTINGS)
    user = f"system:serviceaccount:{SETTINGS.system_namespace}:{SETTINGS.service_account}"
    assert plan.MarkUninstall("Delete", ("a", "b"), user) in actions
    order = kinds(actions)
    assert order.index("MarkUninstall") < order.index("RemoveFinalizer") < order.index("Uninstall")


# -- the node cache keeps the kept revisions -------------------------------------------------


def test_instance_runs_ask_the_node_to_keep_every_kept_revisions_image() -> None:
    first, _ = installed(bd())
    second = upgrade(first, D2, 2)
    actions, _ = step(second, plan.Observed(now=T0))
    run = next(a.pod for a in actions if isinstance(a, plan.CreatePod))
    attributes = run["spec"]["volumes"][0]["csi"]["volumeAttributes"]
    assert attributes["image"] == D2
    assert attributes["retainFor"] == "bundledeployment/hello/u-1"
    assert attributes["retain"].split() == [D1, D2]
    # what the node parses: both attributes, every ref pinned by digest
    parsed = volume.VolumeSource.from_attributes(attributes)
    assert parsed.retain_for == "bundledeployment/hello/u-1"
    assert set(parsed.retain) == {D1, D2}


def test_kept_git_and_http_revisions_are_retained_as_the_node_labels_their_trees() -> None:
    """Each kept revision's pin becomes the ``retain`` entry the node plugin computes for
    that volume (``volume.retain_entry``); configMaps need nothing, tags are not kept."""
    repo, commit = "https://git.example.com/app.git", "c" * 40
    tgz, digest = "https://files.example.com/app.tgz", "sha256:" + "d" * 64
    git_pin = sources.pinned_git({"repository": repo, "directory": "./deploy"}, commit)
    http_pin = sources.pinned_http({"url": tgz, "auth": {"secret": {"name": "s"}}}, digest)
    several = revisions.encode_pin(
        sources.several([("a", sources.pinned_image(D1)), ("b", http_pin)])
    )
    kept = [
        revisions.Revision(n, f"hello-{n}", source, n, T0).document()
        for n, source in enumerate(
            [git_pin, several, sources.pinned_configmaps([]), sources.pinned_image("r.io/a:v1")],
            start=1,
        )
    ]
    the_bd = bd(status={"revisions": kept})
    git_label = f"git+{repo}@{commit}:./deploy"
    entries = generate.retained_content(the_bd)
    assert entries == sorted([git_label, f"{tgz}@{digest}", D1])

    pod = {"spec": {"volumes": [sources.volume(git_pin), {"name": "cm", "configMap": {}}]}}
    generate._retain(pod, the_bd)
    attributes = pod["spec"]["volumes"][0]["csi"]["volumeAttributes"]
    assert attributes["retain"].split()[-1] == git_label, "the current content last"
    parsed = volume.VolumeSource.from_attributes(attributes)
    assert parsed.image == git_label and set(parsed.retain) == set(entries)
    assert "csi" not in pod["spec"]["volumes"][1]


def test_the_kept_set_moving_does_not_restart_a_run() -> None:
    first, _ = installed(bd())
    second = upgrade(first, D2, 2)
    before = next(
        a.pod for a in step(second, plan.Observed(now=T0))[0] if isinstance(a, plan.CreatePod)
    )
    fewer = {**second, "status": {**second["status"], "revisions": []}}
    after = next(
        a.pod for a in step(fewer, plan.Observed(now=T0))[0] if isinstance(a, plan.CreatePod)
    )
    assert model.name_of(before) == model.name_of(after)
    assert "retain" not in after["spec"]["volumes"][0]["csi"]["volumeAttributes"]


# -- what the metrics count -------------------------------------------------------------------


def written_status(actions: list[plan.Action]) -> Obj:
    return next(a.status for a in actions if isinstance(a, plan.WriteStatus))


def test_the_first_install_a_pivot_and_a_rollback_are_told_apart_with_their_time() -> None:
    first = bd()
    actions, first = step(first, plan.Observed(now=T0))
    run = next(a.pod for a in actions if isinstance(a, plan.CreatePod))
    record = runs.InstallRecord(
        by=model.name_of(run), bundle=run["metadata"]["annotations"][model.BUNDLE_ANNOTATION]
    )
    later = "2026-11-25T12:00:07Z"
    actions = inline.plan_inline(
        first, plan.Observed(record=record, health=Health(True), now=later), settings=SETTINGS
    )
    assert revisions.newly_installed(first, written_status(actions), later) == ("install", 7.0)
    installed_once, _ = installed(bd())
    pivot, _ = installed(upgrade(installed_once, D2, 2))
    assert pivot["status"]["installedRevision"] == 2
    assert revisions.newly_installed(installed_once, pivot["status"], T0) == ("pivot", 0.0)
    back = upgrade(pivot, D2, 2)
    back["metadata"]["annotations"][revisions.ROLLBACK_ANNOTATION] = revisions.rollback_annotation(
        1, 2, revisions.MANUAL
    )
    assert revisions.newly_installed(back, {**back["status"], "installedRevision": 1}, T0) == (
        "rollback",
        0.0,
    )


def test_an_unchanged_installed_revision_counts_nothing() -> None:
    the_bd, _ = installed(bd())
    assert revisions.newly_installed(the_bd, the_bd["status"], T0) is None
    assert revisions.newly_installed(the_bd, {"installedRevision": 9}, T0) is None  # unkept
