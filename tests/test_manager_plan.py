"""The pure BundleDeployment planner: observed state in, actions out (no API).

Run-pod details (revisions, retries, slots) are pinned down in test_manager_runs.py;
here the flow of a BundleDeployment: Bundles, runs, records, repairs, conditions.
"""

from __future__ import annotations

import copy
from typing import Any

import pytest

from provisioner.engine.bundle import words
from provisioner.engine.objects import Obj
from provisioner.manager import model
from provisioner.manager.planning import generate as build
from provisioner.manager.planning import plan, runs, sources
from tests.plan_helpers import DIGEST, B, bd, bundle, cond, kinds, status_of

SETTINGS = model.Settings(image="registry.example/rukpak:v1", host_network=True)
NOW = "2026-01-01T00:00:00Z"


def with_ref(obj: Obj, ref: str) -> Obj:
    out = copy.deepcopy(obj)
    out["spec"]["template"]["spec"]["source"]["image"]["ref"] = ref
    return out


PINNED = sources.pinned_image(DIGEST)


def run_pod(
    of: Obj, number: int = 0, *, phase: str = "Running", failed: str = "", waiting: str = ""
) -> Obj:
    """Run ``number`` of ``of``'s instance, in ``phase`` (a failure carries its message)."""
    pod = build.instance_run_pod(of, model.bundle_name(of), PINNED, SETTINGS, number)
    state: Obj = {"running": {}} if phase == "Running" and not waiting else {}
    if waiting:
        state = {"waiting": {"reason": "ContainerCreating", "message": waiting}}
    if failed:
        phase = "Failed"
        state = {"terminated": {"exitCode": 1, "message": failed, "finishedAt": NOW}}
    pod["status"] = {
        "phase": "Pending" if waiting else phase,
        "containerStatuses": [{"name": "instance", "state": state}],
    }
    return pod


def record(of: Obj, number: int = 0) -> runs.InstallRecord:
    """The record run ``number`` of ``of`` left on the inventory."""
    return runs.InstallRecord(model.name_of(run_pod(of, number)), model.bundle_name(of), {})


B2 = with_ref(B, "registry.example/hello:v2")


@pytest.mark.parametrize(
    ("the_bd", "observed", "expected"),
    [
        (B, plan.Observed(), ["CreateBundle", "WriteStatus"]),
        (bd(paused=True), plan.Observed(), []),
        (
            {**B, "metadata": {**B["metadata"], "finalizers": []}},
            plan.Observed(),
            ["AddFinalizer", "CreateBundle", "WriteStatus"],
        ),
        (B, plan.Observed(bundles=(bundle(B),)), ["WriteStatus"]),
        (
            B,
            plan.Observed(bundles=(bundle(B, resolved=DIGEST, phase="Unpacking"),)),
            ["CreatePod", "WriteStatus"],
        ),
        (
            B,
            plan.Observed(bundles=(bundle(B, resolved=DIGEST),)),
            ["CreatePod", "WriteStatus"],
        ),
        (
            B,
            plan.Observed(bundles=(bundle(B, resolved=DIGEST),), record=record(B)),
            ["WriteStatus"],
        ),
        (
            B2,
            plan.Observed(bundles=(bundle(B, resolved=DIGEST),), record=record(B)),
            ["CreateBundle", "WriteStatus"],
        ),
        (
            B2,
            plan.Observed(
                bundles=(bundle(B, resolved=DIGEST), bundle(B2, resolved=DIGEST)),
                record=record(B),
            ),
            ["CreatePod", "WriteStatus"],
        ),
        (
            {**B2, "status": {"activeBundle": model.bundle_name(B)}},
            plan.Observed(
                bundles=(bundle(B, resolved=DIGEST), bundle(B2, resolved=DIGEST)),
                record=record(B),
                pods=(run_pod(B2),),
            ),
            ["WriteStatus"],
        ),
        (
            {**B2, "status": {"activeBundle": model.bundle_name(B)}},
            plan.Observed(
                bundles=(bundle(B, resolved=DIGEST), bundle(B2, resolved=DIGEST)),
                record=record(B2),
            ),
            ["DeleteBundle", "WriteStatus"],
        ),
        (B, plan.Observed(bundles=(bundle(B, failing="manifest unknown"),)), ["WriteStatus"]),
    ],
    ids=[
        "a new BD generates its Bundle",
        "a paused BD plans nothing",
        "the finalizer comes first",
        "a new Bundle waits for the Bundle controller",
        "an unpacking Bundle is waited for",
        "a resolved Bundle gets an instance run",
        "a converged BD only reports status",
        "a template change creates a new Bundle and keeps the old install",
        "the new Bundle resolved: a run pivots to it",
        "the old Bundle stays until the new one is installed",
        "once the new Bundle is installed the old one is deleted",
        "a Bundle that failed to unpack gets no instance",
    ],
)
def test_the_plan_for(the_bd: Obj, observed: plan.Observed, expected: list[str]) -> None:
    assert kinds(plan.plan(the_bd, observed, settings=SETTINGS)) == expected


def test_the_generated_bundle_is_named_by_the_template_hash_and_owned_by_the_bd() -> None:
    b = build.desired_bundle(B)
    assert b["metadata"]["name"].startswith("hello-")
    assert b["metadata"]["name"] != build.desired_bundle(B2)["metadata"]["name"]
    assert b["metadata"]["labels"] == {
        "app": "hello",
        "core.rukpak.io/owner-kind": "BundleDeployment",
        "core.rukpak.io/owner-name": "hello",
        "core.rukpak.io/bundle-template-hash": model.template_hash(B),
        model.BD_LABEL: "hello",
    }
    assert len(b["metadata"]["name"]) <= 52
    # as upstream's metav1.NewControllerRef builds it
    assert b["metadata"]["ownerReferences"] == [
        {
            "apiVersion": model.API_VERSION,
            "kind": model.BUNDLE_DEPLOYMENT,
            "name": "hello",
            "uid": "uid-1",
            "controller": True,
            "blockOwnerDeletion": True,
        }
    ]
    assert b["spec"] == B["spec"]["template"]["spec"]


def test_the_instance_run_mounts_the_resolved_digest_and_runs_the_instance() -> None:
    the_pod = run_pod(bd(installNamespace="team-a", serviceAccountName="installer"))
    pod_spec = the_pod["spec"]
    assert pod_spec["restartPolicy"] == "Never"
    assert pod_spec["hostNetwork"] is True
    assert pod_spec["serviceAccountName"] == "installer"
    (volume,) = pod_spec["volumes"]
    assert volume["csi"]["driver"] == "csi.rukpak.io"
    assert volume["csi"]["volumeAttributes"] == {"image": DIGEST, "pullPolicy": "IfNotPresent"}
    (container,) = pod_spec["containers"]
    assert container["image"] == SETTINGS.image
    assert container["terminationMessagePolicy"] == "FallbackToLogsOnError"
    assert container["command"][1:] == [
        "instance",
        "--bundle-dir",
        "/bundle",
        "--format",
        "plain+v0",
        "--name",
        "hello",
        "--namespace",
        "team-a",
        "--system-namespace",
        "rukpak-system",
        "--bundle",
        model.bundle_name(B),
        "--lease-timeout",
        str(build.RUN_LEASE_TIMEOUT),
    ]
    assert {"name": "POD_NAME", "valueFrom": {"fieldRef": {"fieldPath": "metadata.name"}}} in (
        container["env"]
    )
    assert container["volumeMounts"][0]["mountPath"] == "/bundle"


def registry_bd(*, bd_class: str = model.PLAIN_CLASS) -> Obj:
    out = bd(provisionerClassName=bd_class)
    out["spec"]["template"]["spec"]["provisionerClassName"] = model.REGISTRY_CLASS
    return out


def test_each_provisioner_class_has_one_bundle_format() -> None:
    assert model.bundle_format(model.PLAIN_CLASS) == "plain+v0"
    assert model.bundle_format(model.REGISTRY_CLASS) == "registry+v1"
    assert model.bundle_format("core-rukpak-io-helm") is None
    assert model.bundle_format(None) is None


@pytest.mark.parametrize(
    "bd_class", [model.PLAIN_CLASS, model.REGISTRY_CLASS], ids=["plain BD", "registry BD"]
)
def test_a_registry_bundle_is_installed_by_an_instance_loading_registry_v1(bd_class: str) -> None:
    of = registry_bd(bd_class=bd_class)
    observed = plan.Observed(bundles=(bundle(of, resolved=DIGEST),), now=NOW)
    actions = plan.plan(of, observed, settings=SETTINGS)
    (run,) = [a for a in actions if isinstance(a, plan.CreatePod)]
    (container,) = run.pod["spec"]["containers"]
    at = container["command"].index("--format")
    assert container["command"][at + 1] == "registry+v1"
    assert cond(actions, plan.HAS_VALID_BUNDLE) == ("True", "UnpackSuccessful")


def test_a_template_of_another_provisioner_class_is_refused() -> None:
    of = bd()
    of["spec"]["template"]["spec"]["provisionerClassName"] = "core-rukpak-io-helm"
    actions = plan.plan(of, plan.Observed(), settings=SETTINGS)
    assert kinds(actions) == ["WriteStatus"]
    assert cond(actions, plan.HAS_VALID_BUNDLE) == ("False", "UnsupportedProvisionerClass")


def test_without_host_network_the_instance_uses_the_pod_network() -> None:
    settings = model.Settings(image="x")
    the_pod = build.instance_run_pod(B, "b", sources.pinned_image(DIGEST), settings, 0)
    assert "hostNetwork" not in the_pod["spec"]


def _ready(of: Obj, **kw: Any) -> plan.Observed:
    base: dict[str, Any] = {"bundles": (bundle(of, resolved=DIGEST),), "now": NOW}
    base.update(kw)
    return plan.Observed(**base)


@pytest.mark.parametrize(
    ("observed", "installed", "healthy"),
    [
        (
            _ready(B, pods=(run_pod(B, waiting="MountVolume failed"),)),
            ("False", "InstallPending"),
            ("Unknown", "NotInstalled"),
        ),
        (_ready(B, pods=(run_pod(B),)), ("False", "InstallPending"), ("Unknown", "NotInstalled")),
        (  # finished, but its record is not in the cache yet
            _ready(B, pods=(run_pod(B, phase="Succeeded"),)),
            ("False", "InstallPending"),
            ("Unknown", "NotInstalled"),
        ),
        (
            _ready(B, record=record(B), health=plan.Health(True, "ok")),
            ("True", "InstallationSucceeded"),
            ("True", "Healthy"),
        ),
        (
            _ready(B, record=record(B), health=plan.Health(False, "cm gone")),
            ("True", "InstallationSucceeded"),
            ("False", "Unhealthy"),
        ),
        (
            _ready(B, pods=(run_pod(B, failed="phase 'crds': 1 object(s) failed"),)),
            ("False", "InstallFailed"),
            ("False", "InstallationStatusFalse"),  # upstream sets both
        ),
        (
            _ready(B, record=record(B), health_unreadable="cannot read the ConfigMap objects"),
            ("True", "InstallationSucceeded"),
            ("Unknown", "HealthUnreadable"),
        ),
        (  # not installed yet: nothing to read, whatever the watches say
            _ready(B, health_unreadable="cannot read the ConfigMap objects"),
            ("False", "InstallPending"),
            ("Unknown", "NotInstalled"),
        ),
    ],
    ids=[
        "run pod cannot mount",
        "run pod installing",
        "run pod finished, record not seen yet",
        "recorded, objects ready",
        "recorded, an object unhealthy",
        "run pod failed",
        "recorded, a kind its account may not read",
        "not installed, a kind unreadable",
    ],
)
def test_conditions_follow_the_runs_and_the_record(
    observed: plan.Observed, installed: tuple[str, str], healthy: tuple[str, str]
) -> None:
    actions = plan.plan(B, observed, settings=SETTINGS)
    assert cond(actions, plan.HAS_VALID_BUNDLE) == ("True", "UnpackSuccessful")
    assert cond(actions, plan.INSTALLED) == installed
    assert cond(actions, plan.HEALTHY) == healthy


def test_an_unreadable_kind_says_why_health_is_unknown() -> None:
    why = "cannot read the ConfigMap objects it installed as system:serviceaccount:x:y: forbidden"
    actions = plan.plan(B, _ready(B, record=record(B), health_unreadable=why), settings=SETTINGS)
    healthy = next(c for c in status_of(actions)["conditions"] if c["type"] == "Healthy")
    assert (healthy["status"], healthy["message"]) == ("Unknown", why)


def test_a_failed_install_carries_the_termination_message() -> None:
    observed = _ready(B, pods=(run_pod(B, failed="bundle invalid: manifests/x.yaml"),))
    actions = plan.plan(B, observed, settings=SETTINGS)
    installed = next(c for c in status_of(actions)["conditions"] if c["type"] == "Installed")
    assert "bundle invalid: manifests/x.yaml" in installed["message"]
    warnings = [a for a in actions if isinstance(a, plan.RecordEvent) and a.type == "Warning"]
    assert [w.reason for w in warnings] == ["InstallFailed"]


def test_unchanged_status_is_not_written_again_and_raises_no_events() -> None:
    observed = _ready(B, record=record(B), health=plan.Health(True, "ok"))
    first = plan.plan(B, observed, settings=SETTINGS)
    assert any(isinstance(a, plan.RecordEvent) for a in first)
    converged = {**B, "status": status_of(first)}
    later = plan.Observed(**{**observed.__dict__, "now": "2026-01-02T00:00:00Z"})
    assert plan.plan(converged, later, settings=SETTINGS) == []


def test_a_transition_keeps_the_time_of_unchanged_conditions() -> None:
    observed = _ready(B, pods=(run_pod(B),))
    first = status_of(plan.plan(B, observed, settings=SETTINGS))
    later = _ready(B, record=record(B), health=plan.Health(True, ""), now="T2")
    second = status_of(plan.plan({**B, "status": first}, later, settings=SETTINGS))
    times = {c["type"]: c["lastTransitionTime"] for c in second["conditions"]}
    assert times == {"HasValidBundle": NOW, "Installed": "T2", "Healthy": "T2"}
    assert second["activeBundle"] == model.bundle_name(B)


@pytest.mark.parametrize(
    ("spec", "reason"),
    [
        (
            {"provisionerClassName": "core-rukpak-io-helm"},
            "UnsupportedProvisionerClass",
        ),  # a BD of another class that carries our finalizer (it was ours before)
        (
            {
                "template": {
                    "spec": {
                        "provisionerClassName": model.PLAIN_CLASS,
                        "source": {"type": "upload", "upload": {}},
                    }
                }
            },
            "UnsupportedSource",
        ),
    ],
    ids=["another provisioner class", "an upload source"],
)
def test_what_this_manager_cannot_install_becomes_a_condition(spec: Obj, reason: str) -> None:
    actions = plan.plan(bd(**spec), plan.Observed(), settings=SETTINGS)
    assert kinds(actions) == ["WriteStatus"]
    assert cond(actions, plan.HAS_VALID_BUNDLE) == ("False", reason)


def deleting(of: Obj, **spec: Any) -> Obj:
    out = copy.deepcopy(of)
    out["spec"].update(spec)
    out["metadata"]["deletionTimestamp"] = NOW
    return out


@pytest.mark.parametrize(
    ("the_bd", "observed", "expected"),
    [
        pytest.param(
            deleting(B),
            plan.Observed(pods=(run_pod(B),)),
            ["DeletePod", "Requeue"],
            id="the runs stop first",
        ),
        pytest.param(
            deleting(B),
            plan.Observed(bundles=(bundle(B),)),
            ["DeleteBundle", "MarkUninstall", "RemoveFinalizer", "Uninstall", "DeleteLease"],
            id="then the Bundles, the mark, the finalizer: the BD goes before its objects",
        ),
        pytest.param(
            deleting(B, paused=True),
            plan.Observed(),
            ["MarkUninstall", "RemoveFinalizer", "Uninstall", "DeleteLease"],
            id="deletion runs even when paused",
        ),
        pytest.param(
            {**deleting(B), "metadata": {"name": "hello", "deletionTimestamp": NOW}},
            plan.Observed(),
            [],
            id="without our finalizer nothing is left to do",
        ),
    ],
)
def test_deletion(the_bd: Obj, observed: plan.Observed, expected: list[str]) -> None:
    assert kinds(plan.plan(the_bd, observed, settings=SETTINGS)) == expected


@pytest.mark.parametrize("policy", ["Delete", "Orphan"])
def test_uninstall_uses_the_deletion_policy(policy: str) -> None:
    actions = plan.plan(deleting(B, deletionPolicy=policy), plan.Observed(), settings=SETTINGS)
    default = f"system:serviceaccount:{SETTINGS.system_namespace}:{SETTINGS.service_account}"
    assert plan.Uninstall(policy, default) in actions  # type: ignore[arg-type]
    assert plan.MarkUninstall(policy, (), default) in actions  # type: ignore[arg-type]


def test_uninstall_acts_as_the_instances_own_service_account() -> None:
    """What the instance installed, its identity deletes: the manager holds no delete of
    arbitrary kinds, and the mark keeps the user for an uninstall finished later."""
    actions = plan.plan(
        deleting(B, serviceAccountName="team-a"), plan.Observed(), settings=SETTINGS
    )
    user = f"system:serviceaccount:{SETTINGS.system_namespace}:team-a"
    assert plan.Uninstall("Delete", user) in actions
    assert plan.MarkUninstall("Delete", (), user) in actions


def test_a_long_bd_name_still_fits_upstreams_bundle_name_limit() -> None:
    long_bd = {**B, "metadata": {**B["metadata"], "name": "x" * 45}}
    name = model.bundle_name(long_bd)
    assert len(name) == 52
    assert name.startswith("x" * 45 + "-")


def test_has_valid_bundle_follows_the_unpack_result_in_upstreams_words() -> None:
    wanted = model.bundle_name(B)
    pending = plan.plan(B, plan.Observed(bundles=(bundle(B),)), settings=SETTINGS)
    assert cond(pending, plan.HAS_VALID_BUNDLE) == ("True", "UnpackPending")
    failed = plan.plan(B, plan.Observed(bundles=(bundle(B, failing="boom"),)), settings=SETTINGS)
    valid = next(c for c in status_of(failed)["conditions"] if c["type"] == "HasValidBundle")
    assert (valid["status"], valid["reason"]) == ("False", "UnpackFailed")
    assert valid["message"] == f"Failed to unpack the {wanted} Bundle: boom"
    done = plan.plan(B, _ready(B), settings=SETTINGS)
    valid = next(c for c in status_of(done)["conditions"] if c["type"] == "HasValidBundle")
    assert valid["message"] == f"Successfully unpacked the {wanted} Bundle"


def test_a_failed_new_bundle_keeps_the_active_one_installed() -> None:
    active = model.bundle_name(B)
    observed = plan.Observed(
        bundles=(bundle(B, resolved=DIGEST), bundle(B2, failing="found zero objects")),
        record=record(B),
        health=plan.Health(True, "ok"),
    )
    actions = plan.plan({**B2, "status": {"activeBundle": active}}, observed, settings=SETTINGS)
    assert kinds(actions) == ["WriteStatus"]  # no DeleteBundle, no CreatePod
    assert status_of(actions)["activeBundle"] == active
    assert cond(actions, plan.HAS_VALID_BUNDLE) == ("False", "UnpackFailed")
    assert cond(actions, plan.INSTALLED) == ("True", "InstallationSucceeded")


def test_active_bundle_is_named_only_once_installed() -> None:
    actions = plan.plan(B, _ready(B, pods=(run_pod(B),)), settings=SETTINGS)
    assert "activeBundle" not in status_of(actions)
    installed = plan.plan(B, _ready(B, record=record(B)), settings=SETTINGS)
    status = status_of(installed)
    assert status["activeBundle"] == model.bundle_name(B)
    message = next(c["message"] for c in status["conditions"] if c["type"] == "Installed")
    assert message == f"Instantiated bundle {model.bundle_name(B)} successfully"


def test_a_bundledeployment_of_another_class_is_left_to_its_provisioner() -> None:
    theirs = copy.deepcopy(B)
    theirs["spec"]["provisionerClassName"] = "core-rukpak-io-helm"
    theirs["metadata"]["finalizers"] = ["core.rukpak.io/helm-uninstall"]
    assert plan.plan(theirs, plan.Observed(now=NOW), settings=SETTINGS) == []
    theirs["metadata"]["deletionTimestamp"] = NOW
    assert plan.plan(theirs, plan.Observed(now=NOW), settings=SETTINGS) == []


# -- drift restored by the manager, and fights ---------------------------------------------

BODY: Obj = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "c"}, "data": {}}


def test_restorable_drift_is_re_applied_as_the_instance_not_by_a_run() -> None:
    repair = plan.Repair((BODY,), ("v1/ConfigMap default/c: data.k changed",))
    the_bd = bd(serviceAccountName="installer")
    actions = plan.plan(
        the_bd, _ready(the_bd, record=record(the_bd), repair=repair), settings=SETTINGS
    )
    (restore,) = [a for a in actions if isinstance(a, plan.RestoreDrift)]
    assert restore.bodies == (BODY,)
    assert restore.user == "system:serviceaccount:rukpak-system:installer"
    assert not [a for a in actions if isinstance(a, plan.CreatePod)]
    (event,) = [
        a for a in actions if isinstance(a, plan.RecordEvent) and a.reason == "DriftRestored"
    ]
    assert "data.k changed" in event.message


def test_drift_that_cannot_be_restored_starts_a_run_beside_the_restore() -> None:
    repair = plan.Repair((BODY,), ("c: changed",))
    observed = _ready(B, record=record(B), repair=repair, drift=("v1/Secret x: gone",))
    actions = plan.plan(B, observed, settings=SETTINGS)
    assert kinds(actions)[:2] == ["RestoreDrift", "CreatePod"]


def test_a_damped_repair_waits_and_a_fight_becomes_a_condition_naming_the_writer() -> None:
    repair = plan.Repair((BODY,), ("c: changed",), wait=4.0)
    observed = _ready(
        B,
        record=record(B),
        repair=repair,
        fights=plan.FIGHT_THRESHOLD,
        conflict="another writer took spec.replicas of apps/v1/Deployment default/web (by hpa)",
    )
    actions = plan.plan(B, observed, settings=SETTINGS)
    assert not [a for a in actions if isinstance(a, plan.RestoreDrift)]
    (wait,) = [a for a in actions if isinstance(a, plan.Requeue)]
    assert wait.after == 4.0
    status = status_of(actions)
    (conflict,) = [c for c in status["conditions"] if c["type"] == plan.FIELD_CONFLICT]
    assert (conflict["status"], conflict["reason"]) == ("True", "AnotherWriter")
    assert "spec.replicas" in conflict["message"] and "(by hpa)" in conflict["message"]
    warnings = [a for a in actions if isinstance(a, plan.RecordEvent) and a.type == "Warning"]
    # (FieldConflict and Drifted each turn once: one warning each for the fight)
    assert [w.reason for w in warnings] == ["AnotherWriter", "Fighting"]
    # the fight ends: the condition turns False, and is not there for a BD that never fought
    calm = plan.plan({**B, "status": status}, _ready(B, record=record(B)), settings=SETTINGS)
    assert cond(calm, plan.FIELD_CONFLICT) == ("False", "NoConflict")
    never = plan.plan(B, _ready(B, record=record(B)), settings=SETTINGS)
    assert plan.FIELD_CONFLICT not in [c["type"] for c in status_of(never)["conditions"]]


def test_a_repair_of_an_old_install_waits_for_the_pivot() -> None:
    repair = plan.Repair((BODY,), ("c: changed",))
    observed = plan.Observed(
        bundles=(bundle(B, resolved=DIGEST), bundle(B2, resolved=DIGEST)),
        record=record(B),
        repair=repair,
        now=NOW,
    )
    actions = plan.plan(B2, observed, settings=SETTINGS)
    assert not [a for a in actions if isinstance(a, plan.RestoreDrift)]
    assert "CreatePod" in kinds(actions)


# -- the early run: it starts once the content is pinned, while the unpack pod checks it --


def test_an_early_run_starts_while_the_bundle_unpacks_and_the_conditions_wait_for_it() -> None:
    unpacking = bundle(B, resolved=DIGEST, phase="Unpacking")
    actions = plan.plan(B, plan.Observed(bundles=(unpacking,), now=NOW), settings=SETTINGS)
    (run,) = [a.pod for a in actions if isinstance(a, plan.CreatePod)]
    assert run["metadata"]["annotations"][model.BUNDLE_ANNOTATION] == model.bundle_name(B)
    assert cond(actions, plan.HAS_VALID_BUNDLE) == ("True", "UnpackPending")
    assert cond(actions, plan.INSTALLED) == ("False", "InstallPending")
    # while it runs, nothing more starts, and a pivot keeps the old install reported
    observed = plan.Observed(
        bundles=(bundle(B, resolved=DIGEST), bundle(B2, resolved=DIGEST, phase="Unpacking")),
        record=record(B),
        pods=(run_pod(B2),),
        now=NOW,
    )
    active = {**B2, "status": {"activeBundle": model.bundle_name(B)}}
    actions = plan.plan(active, observed, settings=SETTINGS)
    assert "CreatePod" not in kinds(actions) and "DeletePod" not in kinds(actions)
    assert cond(actions, plan.INSTALLED) == ("True", "InstallationSucceeded")
    assert "activeBundle" not in status_of(actions) or status_of(actions)[
        "activeBundle"
    ] == model.bundle_name(B)


def test_a_bundle_without_its_pin_gets_no_early_run() -> None:
    actions = plan.plan(B, plan.Observed(bundles=(bundle(B),), now=NOW), settings=SETTINGS)
    assert "CreatePod" not in kinds(actions)


@pytest.mark.parametrize("installed_before", [False, True], ids=["first install", "pivot"])
def test_an_early_run_goes_when_its_bundle_fails_to_unpack(installed_before: bool) -> None:
    """The instance refuses what the unpack pod refuses; whatever state its run is in, it
    goes, and the previous install (if any) stays."""
    wanted = B2 if installed_before else B
    failing = bundle(wanted, failing="found zero objects")
    for early in (run_pod(wanted), run_pod(wanted, failed="found zero objects")):
        observed = plan.Observed(
            bundles=(bundle(B, resolved=DIGEST), failing) if installed_before else (failing,),
            record=record(B) if installed_before else None,
            pods=(early,),
            now=NOW,
        )
        actions = plan.plan(wanted, observed, settings=SETTINGS)
        deleted = [a.name for a in actions if isinstance(a, plan.DeletePod)]
        assert deleted == [early["metadata"]["name"]]
        assert "CreatePod" not in kinds(actions)
        assert cond(actions, plan.HAS_VALID_BUNDLE) == ("False", "UnpackFailed")


def test_an_early_install_is_reported_once_its_bundle_is_unpacked() -> None:
    """Upstream's order holds: ``Installed`` and ``activeBundle`` move after ``Unpacked``,
    even when the early run has recorded its install already."""
    before = {**B2, "status": {"activeBundle": model.bundle_name(B)}}
    before["status"]["conditions"] = [
        {"type": "Installed", "status": "True", "reason": "InstallationSucceeded", "message": "m"}
    ]
    unpacking = plan.Observed(
        bundles=(bundle(B, resolved=DIGEST), bundle(B2, resolved=DIGEST, phase="Unpacking")),
        record=record(B2),
        now=NOW,
    )
    actions = plan.plan(before, unpacking, settings=SETTINGS)
    assert "CreatePod" not in kinds(actions) and "DeleteBundle" not in kinds(actions)
    assert cond(actions, plan.INSTALLED) == ("True", "InstallationSucceeded")
    assert status_of(actions).get("activeBundle", model.bundle_name(B)) == model.bundle_name(B)
    first = plan.Observed(
        bundles=(bundle(B, resolved=DIGEST, phase="Unpacking"),), record=record(B), now=NOW
    )
    assert cond(plan.plan(B, first, settings=SETTINGS), plan.INSTALLED) == (
        "False",
        "InstallPending",
    )
    unpacked = plan.Observed(
        bundles=(bundle(B, resolved=DIGEST), bundle(B2, resolved=DIGEST)),
        record=record(B2),
        now=NOW,
    )
    actions = plan.plan(before, unpacked, settings=SETTINGS)
    assert status_of(actions)["activeBundle"] == model.bundle_name(B2)
    assert "DeleteBundle" in kinds(actions)


def test_kinds_nobody_serves_read_as_v0_16_reports_them() -> None:
    """A v1alpha1 BundleDeployment whose CRD's provider does not exist: upstream v0.16's
    InstallFailed with ``required resource not found``, each missing kind named after it."""
    failure = words.unknown_kinds(
        {
            ("operators.coreos.com/v1alpha1", "CatalogSource"): "manifests/a.yaml document 1",
            ("operators.coreos.com/v1", "OperatorGroup"): "manifests/b.yaml document 1",
        }
    )
    actions = plan.plan(B, _ready(B, pods=(run_pod(B, failed=failure),)), settings=SETTINGS)
    installed = next(c for c in status_of(actions)["conditions"] if c["type"] == "Installed")
    assert (installed["status"], installed["reason"]) == ("False", "InstallFailed")
    assert "required resource not found" in installed["message"]
    assert (
        'no matches for kind "CatalogSource" in version "operators.coreos.com/v1alpha1"'
        in installed["message"]
    )
    assert (
        'no matches for kind "OperatorGroup" in version "operators.coreos.com/v1"'
        in (installed["message"])
    )
    assert cond(actions, plan.HEALTHY) == ("False", "InstallationStatusFalse")
