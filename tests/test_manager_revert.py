"""Going back to a kept revision without an instance run (``runwatch.revert_to``, then
``plan.revert_actions``), pure: a health watch stand-in answers lookups and good
versions. The run-free rollback on a real cluster is in tests/test_e2e_lifecycle.py."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

from provisioner.engine.apply import appliedrecord
from provisioner.engine.objects import OWNER_LABEL, Obj, ObjectRef
from provisioner.manager import model
from provisioner.manager.planning import plan, runs
from provisioner.manager.planning.generate import instance_run_pod
from provisioner.manager.watching import runwatch
from tests.plan_helpers import bd_v2

SETTINGS = model.Settings(image="registry.example/rukpak:1", system_namespace="rukpak-system")
NOW = "2026-01-01T00:00:00Z"


def cm(name: str, value: str, *, kind: str = "ConfigMap", api: str = "v1") -> Obj:
    """An object as the cluster holds it: our fields recorded for manager ``rukpak``."""
    return {
        "apiVersion": api,
        "kind": kind,
        "metadata": {
            "name": name,
            "namespace": "" if kind == "CustomResourceDefinition" else "demo",
            "labels": {OWNER_LABEL: "hello"},
            "managedFields": [
                {
                    "manager": "rukpak",
                    "operation": "Apply",
                    "apiVersion": api,
                    "fieldsV1": {
                        "f:metadata": {"f:labels": {f"f:{OWNER_LABEL}": {}}},
                        "f:data": {f"f:{value}": {}},
                    },
                }
            ],
        },
        "data": {value: "x"},
    }


def key(obj: Obj) -> str:
    return appliedrecord.key_of(ObjectRef.of(obj))


def record_of(bundle: str, *objs: Obj) -> runs.InstallRecord:
    applied = {key(o): appliedrecord.fields_hash(o) for o in objs}
    return runs.InstallRecord(f"rukpak-instance-hello-{bundle}-0", bundle, applied)


@dataclass
class Health:
    """What the health watch's cache answers: live objects by ref."""

    live: dict[ObjectRef, Obj | None] = field(default_factory=dict)
    unknown: set[str] = field(default_factory=set)

    def lookup(self, ref: ObjectRef, *, owner: str) -> Any:
        assert owner == "hello", owner  # read as the deployment's own identity
        if ref.kind in self.unknown:
            return appliedrecord.UNKNOWN
        return self.live.get(ref)

    def get(self, ref: ObjectRef) -> Obj | None:  # as ``Kube.get``: a fresh read
        return self.live.get(ref)


def two_revisions() -> tuple[Health, runwatch.Kept, Obj, Obj, Obj]:
    """Revision one installed ``a`` (value one) and ``b``, and was kept then; revision two
    has ``a`` (value two, the same fields) and ``c``, and ``b`` went."""
    a1, b, c = cm("a", "one"), cm("b", "kept"), cm("c", "new")
    at_one = Health(live={ObjectRef.of(a1): a1, ObjectRef.of(b): b})
    kept = runwatch.snapshot(at_one, "hello", record_of("one", a1, b))  # type: ignore[arg-type]
    a2 = cm("a", "one")
    a2["data"] = {"one": "changed by revision two"}
    health = Health(live={ObjectRef.of(a2): a2, ObjectRef.of(b): None, ObjectRef.of(c): c})
    return health, kept, a1, b, c


def test_a_snapshot_keeps_our_fields_of_each_object_as_the_run_left_it() -> None:
    _, kept, a1, b, _ = two_revisions()
    assert kept.bodies is not None
    assert kept.bodies[key(a1)]["data"] == {"one": "x"}
    assert "managedFields" not in kept.bodies[key(a1)]["metadata"]
    assert set(kept.bodies) == {key(a1), key(b)}


def test_nothing_is_kept_of_a_gone_foreign_or_drifted_object_or_a_huge_revision() -> None:
    a1, b = cm("a", "one"), cm("b", "kept")
    record = record_of("one", a1, b)
    gone = Health(live={ObjectRef.of(a1): a1})
    assert runwatch.snapshot(gone, "hello", record).bodies is None  # type: ignore[arg-type]
    foreign = Health(live={ObjectRef.of(a1): a1, ObjectRef.of(b): cm("b", "kept")})
    foreign.live[ObjectRef.of(b)]["metadata"]["labels"][OWNER_LABEL] = "someone-else"  # type: ignore[index]
    assert runwatch.snapshot(foreign, "hello", record).bodies is None  # type: ignore[arg-type]
    taken = Health(live={ObjectRef.of(a1): a1, ObjectRef.of(b): cm("b", "other")})
    assert runwatch.snapshot(taken, "hello", record).bodies is None  # type: ignore[arg-type]
    many = {f"v1|ConfigMap|demo|n{i}": "h" for i in range(runwatch.SNAPSHOT_LIMIT + 1)}
    huge = runs.InstallRecord("rukpak-instance-hello-x-0", "one", many)
    assert runwatch.snapshot(Health(), "hello", huge).bodies is None  # type: ignore[arg-type]


def test_a_kept_revision_is_reverted_sending_what_differs_and_pruning_what_it_lacked() -> None:
    health, kept, a1, _, c = two_revisions()
    installed = frozenset(ObjectRef.of(o) for o in (a1, c))
    revert = runwatch.revert_to(health, "hello", kept, installed)  # type: ignore[arg-type]
    assert revert is not None
    assert [body["metadata"]["name"] for body in revert.bodies] == ["a", "b"]
    assert revert.bodies[0]["data"] == {"one": "x"}  # the value revision one applied
    assert revert.prune == (ObjectRef.of(c),)


def test_an_object_already_as_kept_is_not_sent() -> None:
    health, kept, a1, _, _ = two_revisions()
    health.live[ObjectRef.of(a1)] = a1  # ``a`` is back at revision one's values
    revert = runwatch.revert_to(health, "hello", kept, frozenset())  # type: ignore[arg-type]
    assert revert is not None
    assert [body["metadata"]["name"] for body in revert.bodies] == ["b"]


def test_nothing_kept_an_unknown_kind_or_a_changed_crd_needs_a_run() -> None:
    health, kept, _, _, _ = two_revisions()
    blind = runwatch.Kept(kept.record, None)
    assert runwatch.revert_to(health, "hello", blind, frozenset()) is None  # type: ignore[arg-type]
    health.unknown.add("ConfigMap")
    assert runwatch.revert_to(health, "hello", kept, frozenset()) is None  # type: ignore[arg-type]
    old = cm("widgets.example.com", "v1", kind="CustomResourceDefinition",
             api="apiextensions.k8s.io/v1")  # fmt: skip
    at_one = Health(live={ObjectRef.of(old): old})
    crd = runwatch.snapshot(at_one, "hello", record_of("one", old))  # type: ignore[arg-type]
    new = cm("widgets.example.com", "v1", kind="CustomResourceDefinition",
             api="apiextensions.k8s.io/v1")  # fmt: skip
    new["data"] = {"v1": "a newer schema"}
    later = Health(live={ObjectRef.of(new): new})
    assert runwatch.revert_to(later, "hello", crd, frozenset()) is None  # type: ignore[arg-type]


# -- the plan ----------------------------------------------------------------------------


def target_of(bundle: str) -> runs.Target:
    return runs.Target(bundle, {"type": "image", "image": {"ref": "r/x@sha256:" + "1" * 64}})


def observed(revert: runs.Revert | None, record: runs.InstallRecord, *pods: Obj) -> plan.Observed:
    return plan.Observed(record=record, revert=revert, pods=pods, now=NOW)


def test_the_plan_adopts_the_kept_record_under_the_run_that_would_have_installed_it() -> None:
    health, kept, a1, b, c = two_revisions()
    one = kept.record
    revert = runwatch.revert_to(health, "hello", kept, frozenset())  # type: ignore[arg-type]
    two = record_of("two", cm("a", "two"), c)
    the_bd = bd_v2(installNamespace="demo")
    actions = plan.revert_actions(the_bd, target_of("one"), observed(revert, two), SETTINGS)
    assert [type(a).__name__ for a in actions] == ["Revert", "RecordEvent"]
    action = actions[0]
    assert isinstance(action, plan.Revert)
    run = instance_run_pod(the_bd, "one", target_of("one").resolved, SETTINGS, 0)
    adopted = runs.InstallRecord.of_inventory(
        {"data": {"install-record": json.dumps(action.record)}}
    )
    assert adopted is not None and adopted.by == model.name_of(run)
    assert adopted.bundle == "one" and adopted.applied == one.applied
    assert set(action.refs) == {ObjectRef.of(a1), ObjectRef.of(b)}
    assert action.namespace == "demo"
    assert action.user == plan.instance_user(the_bd, SETTINGS)
    # and runs.decide then sees revision one installed by that run: nothing to run
    decided = runs.decide(the_bd, target_of("one"), (), adopted, (), settings=SETTINGS, now=NOW)
    assert decided.actions == [] and decided.installed[0] == "True"


def test_no_revert_while_a_run_is_active_for_another_target_or_when_installed() -> None:
    health, kept, _, _, c = two_revisions()
    one = kept.record
    revert = runwatch.revert_to(health, "hello", kept, frozenset())  # type: ignore[arg-type]
    two = record_of("two", cm("a", "two"), c)
    the_bd = bd_v2()
    active = {"metadata": {"name": "rukpak-instance-hello-x-0"}, "status": {"phase": "Running"}}
    assert (
        plan.revert_actions(the_bd, target_of("one"), observed(revert, two, active), SETTINGS) == []
    )
    assert plan.revert_actions(the_bd, target_of("two"), observed(revert, two), SETTINGS) == []
    assert plan.revert_actions(the_bd, target_of("one"), observed(revert, one), SETTINGS) == []
    assert plan.revert_actions(the_bd, target_of("one"), observed(None, two), SETTINGS) == []
