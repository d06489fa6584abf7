"""Dependencies judged without a cluster (``provisioner.manager.planning.dependencies``), pure: a
dependency counts as ready only once settled (its new revision installed), and the cycle
finder that the admission webhook and the ``DependencyCycle`` condition share, and the
webhook's review of a BundleDeployment write (``webhook.bd_review``).

The dependency's states are the ones the v1alpha2 planner (``inline``) writes itself: each
test walks a BundleDeployment through its plans as the manager would.
"""

from __future__ import annotations

from typing import Any

import pytest

from provisioner.engine.health.health import Health
from provisioner.engine.objects import Obj
from provisioner.manager import conversion, model
from provisioner.manager.planning import dependencies, plan, revisions, sources
from provisioner.manager.serving import webhook
from rukpak.common import errors
from tests.plan_helpers import D1, D2, T0, bd_v2, installed, record_of, step


def provider(*, generation: int = 1, digest: str = D1, status: Obj | None = None) -> Obj:
    return bd_v2(generation=generation, pin=(generation, T0), digest=digest, status=status)


def changed(old: Obj, generation: int = 2, digest: str = D2) -> Obj:
    """``old`` with a new spec (generation) pinned to ``digest``, not planned yet."""
    new = provider(generation=generation, digest=digest, status=old["status"])
    new["status"]["resolvedSource"] = sources.pinned_image(digest)
    return new


def state_of(dep: Obj) -> str:
    found = dependencies.unmet({"spec": {"dependsOn": [{"name": "hello"}]}}, {"hello": dep}.get)
    return found[0] if found else ""


# -- a dependency is ready once settled ------------------------------------------------------


def test_an_installed_and_healthy_dependency_is_ready() -> None:
    dep, _ = installed(provider())
    assert dependencies.upgrading(dep) == ""
    assert state_of(dep) == ""


def test_a_spec_change_not_acted_on_yet_is_upgrading_though_installed_still_says_true() -> None:
    dep, _ = installed(provider())
    moved = changed(dep)
    assert {c["type"]: c["status"] for c in moved["status"]["conditions"]}["Installed"] == "True"
    assert state_of(moved) == "hello: upgrading: spec generation 2 not acted on yet"


def test_a_new_revision_being_installed_is_upgrading_to_its_number() -> None:
    dep, record = installed(provider())
    _, pending = step(changed(dep), plan.Observed(record=record, health=Health(True), now=T0))
    assert pending["status"]["installedRevision"] == 1
    assert state_of(pending) == "hello: upgrading to revision 2"


def test_the_new_revision_installed_and_healthy_is_ready_again() -> None:
    dep, record = installed(provider())
    actions, pending = step(changed(dep), plan.Observed(record=record, now=T0))
    _, done = step(pending, plan.Observed(record=record_of(actions), health=Health(True), now=T0))
    assert done["status"]["installedRevision"] == 2
    assert state_of(done) == ""


def test_the_new_revision_installed_but_not_healthy_is_not_ready() -> None:
    dep, record = installed(provider())
    actions, pending = step(changed(dep), plan.Observed(record=record, now=T0))
    unhealthy = Health(False, "Deployment apps/x is not available")
    _, done = step(pending, plan.Observed(record=record_of(actions), health=unhealthy, now=T0))
    assert dependencies.upgrading(done) == ""
    assert state_of(done) == "hello: Healthy=False (Unhealthy)"


def test_a_re_pin_of_the_same_spec_is_upgrading_until_it_is_a_revision() -> None:
    dep, _ = installed(provider())
    repinned = {**dep, "status": {**dep["status"], "resolvedSource": sources.pinned_image(D2)}}
    assert state_of(repinned) == "hello: upgrading: newly resolved content is not a revision yet"


def test_a_rollback_in_force_is_pending_until_its_revision_is_installed() -> None:
    dep, _ = installed(provider())
    dep["status"]["installedRevision"] = 2
    dep["metadata"]["annotations"] = {
        **dep["metadata"].get("annotations", {}),
        revisions.ROLLBACK_ANNOTATION: revisions.rollback_annotation(1, 1, "Manual"),
    }
    assert state_of(dep) == "hello: rolling back to revision 1"
    dep["status"]["installedRevision"] = 1
    assert state_of(dep) == ""


def test_a_paused_dependency_counts_as_it_stands() -> None:
    dep, _ = installed(provider())
    moved = changed(dep)
    moved["spec"]["paused"] = True
    assert dependencies.upgrading(moved) == ""


def test_a_dependency_created_as_v1alpha1_upgrades_until_its_wanted_bundle_is_active() -> None:
    v1: Obj = {
        "apiVersion": conversion.V1ALPHA1,
        "kind": "BundleDeployment",
        "metadata": {"name": "hello", "generation": 1},
        "spec": {
            "provisionerClassName": model.PLAIN_CLASS,
            "template": {"spec": {"provisionerClassName": model.PLAIN_CLASS, "source": {}}},
        },
    }
    stored = conversion.to_v1alpha2(v1)
    wanted = model.bundle_name(v1)
    stored["status"] = {"observedGeneration": 1, "activeBundle": "hello-old"}
    assert dependencies.upgrading(stored) == f"upgrading to Bundle {wanted}"
    stored["status"]["activeBundle"] = wanted
    assert dependencies.upgrading(stored) == ""


def test_the_planner_holds_a_dependent_back_with_what_its_dependency_upgrades_to() -> None:
    dependent, record = installed(provider())
    moved = changed(dependent)
    waiting = ("a: upgrading to revision 2",)
    actions, after = step(moved, plan.Observed(record=record, dependencies=waiting, now=T0))
    assert not [a for a in actions if isinstance(a, plan.CreatePod)]
    cond = {c["type"]: c for c in after["status"]["conditions"]}["Installed"]
    assert cond["reason"] == "DependencyNotReady"
    assert "a: upgrading to revision 2" in cond["message"]


# -- the cycle finder ------------------------------------------------------------------------


def bd(name: str, *needs: str) -> Obj:
    return {"metadata": {"name": name}, "spec": {"dependsOn": [{"name": n} for n in needs]}}


def graph(*bds: Obj) -> dependencies.Lookup:
    return {model.name_of(b): b for b in bds}.get


@pytest.mark.parametrize(
    ("new", "stored", "want"),
    [
        (bd("a", "a"), [], "a -> a"),
        (bd("a", "b"), [bd("b", "a")], "a -> b -> a"),
        (bd("a", "b"), [bd("b", "c"), bd("c", "a")], "a -> b -> c -> a"),
        (bd("a", "x", "b"), [bd("b", "a")], "a -> b -> a"),
        (bd("a", "b"), [bd("b", "missing")], ""),
        (bd("a", "b"), [bd("b", "c"), bd("c", "b")], ""),
        (bd("a", "b", "c"), [bd("b", "c"), bd("c")], ""),
    ],
    ids=[
        "self-dependency",
        "2-cycle",
        "3-cycle",
        "a missing dependency ends one path, another closes",
        "a missing dependency ends the path",
        "a cycle elsewhere is not this one's",
        "a diamond is no cycle",
    ],
)  # fmt: skip
def test_the_cycle_through_a_bundledeployment(new: Obj, stored: list[Obj], want: str) -> None:
    assert dependencies.cycle(new, graph(*stored)) == want


def test_a_long_chain_is_followed_to_its_end_without_recursion() -> None:
    length = 5000
    chain = [bd(f"n{i}", f"n{i + 1}") for i in range(1, length)]
    assert dependencies.cycle(bd("n0", "n1"), graph(*chain, bd(f"n{length}"))) == ""
    closing = graph(*chain, bd(f"n{length}", "n0"))
    found = dependencies.cycle(bd("n0", "n1"), closing)
    assert found.startswith("n0 -> n1 -> n2") and found.endswith(f"n{length} -> n0")
    assert found.count(" -> ") == length + 1


def test_the_object_judged_is_taken_as_given_not_as_stored() -> None:
    """An update that removes the edge closing a cycle is judged by its new spec."""
    stored = graph(bd("a", "b"), bd("b", "a"))
    assert dependencies.cycle(bd("a"), stored) == ""
    assert dependencies.cycle(bd("a", "b"), stored) == "a -> b -> a"


# -- admission -------------------------------------------------------------------------------


def admit(operation: str, new: Obj | None, old: Obj | None = None, *stored: Obj) -> str:
    return dependencies.admission_denial(operation, old, new, graph(*stored))


def test_a_create_closing_a_cycle_is_refused_naming_it() -> None:
    denial = admit("CREATE", bd("a", "b"), None, bd("b", "a"))
    assert denial == "spec.dependsOn closes a cycle: a -> b -> a; remove one of its edges"


def test_an_update_adding_the_closing_edge_is_refused() -> None:
    assert "b -> c -> b" in admit("UPDATE", bd("b", "c"), bd("b"), bd("c", "b"))


def test_what_closes_no_cycle_is_admitted() -> None:
    assert admit("CREATE", bd("a", "b"), None, bd("b", "c")) == ""
    assert admit("CREATE", bd("a"), None) == ""


def test_an_update_leaving_depends_on_alone_is_admitted_even_on_a_cycle() -> None:
    """A cycle made while no webhook answered: its members' other updates (labels, the
    finalizer's removal) still go through, so they can be deleted."""
    looped = bd("a", "b")
    assert admit("UPDATE", looped, bd("a", "b"), bd("b", "a")) == ""


def test_an_object_being_deleted_is_admitted() -> None:
    looped: Any = bd("a", "b")
    looped["metadata"]["deletionTimestamp"] = T0
    assert admit("UPDATE", looped, bd("a"), bd("b", "a")) == ""


def test_deletes_and_connects_are_not_judged() -> None:
    assert admit("DELETE", None, bd("a", "b"), bd("b", "a")) == ""
    assert admit("CONNECT", bd("a", "b"), None, bd("b", "a")) == ""


# -- the webhook's dispatch ------------------------------------------------------------------


def review_of(operation: str, new: Obj | None, lookup: dependencies.Lookup) -> Obj:
    request = {"uid": "u-7", "operation": operation, "name": "a", "object": new}
    response: Obj = webhook.bd_review({"request": request}, lookup)["response"]
    return response


def test_the_review_echoes_the_uid_and_refuses_with_403_and_the_cycle() -> None:
    answer = review_of(
        "CREATE", {**bd("a", "b"), "apiVersion": model.API_VERSION_V2}, graph(bd("b", "a"))
    )
    assert answer["uid"] == "u-7" and answer["allowed"] is False
    assert answer["status"]["code"] == 403
    assert "closes a cycle: a -> b -> a" in answer["status"]["message"]


def test_the_review_admits_when_the_others_cannot_be_read() -> None:
    def unreadable(name: str) -> Obj | None:
        raise errors.Unavailable("API server unreachable")

    answer = review_of("CREATE", {**bd("a", "b"), "apiVersion": model.API_VERSION_V2}, unreadable)
    assert answer == {"uid": "u-7", "allowed": True}
