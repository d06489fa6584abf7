"""Runs without pods (``provisioner.instance.runrecord``), pure: which runs may be taken
by a standing provisioner, the ConfigMap a run becomes, the pod the planner reads back at
each state, claiming, and the run view over both kinds.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest

from provisioner.instance import runrecord
from provisioner.manager import model
from provisioner.manager.model import Settings
from provisioner.manager.planning import generate, runs, sources
from provisioner.manager.planning.sources import volume

SETTINGS = Settings(image="rukpak:test")
DIGEST = "sha256:" + "d" * 64
NOW = datetime(2026, 11, 28, 4, 0, 0, tzinfo=UTC)


def bd(source: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "core.rukpak.io/v1alpha2",
        "kind": "BundleDeployment",
        "metadata": {"name": "hello", "uid": "u-1", "generation": 1},
        "spec": {
            "installNamespace": "hello",
            "provisionerClassName": model.PLAIN_CLASS,
            "source": source,
        },
    }


def image_source(ref: str = f"registry.example.com/hello@{DIGEST}") -> dict[str, Any]:
    return {"type": "image", "image": {"ref": ref}}


def run_pod(source: dict[str, Any] | None = None) -> dict[str, Any]:
    resolved = source or image_source()
    return generate.instance_run_pod(bd(resolved), "hello-rev", resolved, SETTINGS, 0)


GIT = {"type": "git", "git": {"repository": "https://g.example/r", "ref": {"commit": "a" * 40}}}
HTTP = {"type": "http", "http": {"url": f"https://files.example.com/b.tgz#sha256={'d' * 64}"}}
CONFIGMAPS = {
    "type": "configMaps",
    "configMaps": [{"configMap": {"name": "manifests"}, "path": "manifests"}],
    sources.ITEMS_KEY: [["manifests", "cm.yaml", "manifests/cm.yaml"]],
}


@pytest.mark.parametrize(
    "source", [image_source(), GIT, HTTP, CONFIGMAPS], ids=["image", "git", "http", "configMaps"]
)
def test_a_run_of_one_pinned_source_may_be_taken_by_a_standing_provisioner(
    source: dict[str, Any],
) -> None:
    assert runrecord.eligible(run_pod(source))


SEVERAL = {
    "type": sources.MULTI,
    "sources": [
        {**image_source(), "destination": "app"},
        {**GIT, "destination": "extra/git"},
        {**CONFIGMAPS, "destination": "cms"},
    ],
}


def test_a_run_of_several_pinned_sources_runs_standing_and_of_a_tag_among_them_does_not() -> None:
    pod = run_pod(SEVERAL)
    assert runrecord.several_sources(pod) and runrecord.eligible(pod)
    tagged = {**SEVERAL, "sources": [{**image_source("r.example.com/a:v1"), "destination": "a"},
                                     {**GIT, "destination": "b"}]}  # fmt: skip
    assert not runrecord.eligible(run_pod(tagged))


def test_a_run_of_a_tag_or_of_another_layout_keeps_its_pod() -> None:
    assert not runrecord.eligible(run_pod(image_source("registry.example.com/hello:v1")))
    pod = run_pod()
    pod["spec"]["volumes"].append({"name": "other", "emptyDir": {}})
    assert not runrecord.eligible(pod)
    pod = run_pod()
    pod["spec"]["volumes"][0]["csi"]["driver"] = "other.csi.example.com"
    assert not runrecord.eligible(pod)


def test_the_configmap_items_are_read_from_a_projected_volume_only() -> None:
    items = runrecord.configmap_items(volume(CONFIGMAPS))
    assert items == [("manifests", "cm.yaml", "manifests/cm.yaml")]
    mixed = volume(CONFIGMAPS)
    mixed["projected"]["sources"].append({"secret": {"name": "s"}})
    assert runrecord.configmap_items(mixed) is None
    assert runrecord.configmap_items({"name": "bundle", "emptyDir": {}}) is None


def test_the_run_configmap_carries_the_pod_and_reads_back_as_it_pending() -> None:
    pod = run_pod()
    cm = runrecord.from_pod(pod)
    assert cm["kind"] == "ConfigMap"
    assert cm["metadata"]["name"] == pod["metadata"]["name"]
    assert cm["metadata"]["labels"][runrecord.RUN_LABEL] == "instance"
    assert json.loads(cm["data"]["pod"])["spec"] == pod["spec"]
    seen = runrecord.as_pod(cm)
    assert seen["metadata"]["name"] == pod["metadata"]["name"]
    assert seen["metadata"]["labels"]["core.rukpak.io/bundle-deployment"] == "hello"
    assert runs.phase(seen) == "Pending" and runs.is_active(seen)
    assert runs.waiting(seen) == f"waits: {runrecord.UNTAKEN}"


def test_a_claimed_run_reads_as_running_on_its_node() -> None:
    cm = runrecord.from_pod(run_pod())
    cm["metadata"]["resourceVersion"] = "7"
    patch = runrecord.claim_patch(cm, holder="standing-0", node="node-1", now=NOW)
    assert patch["metadata"]["resourceVersion"] == "7"  # a second claimant gets a conflict
    cm["metadata"]["annotations"].update(patch["metadata"]["annotations"])
    seen = runrecord.as_pod(cm)
    assert runs.phase(seen) == "Running" and seen["spec"]["nodeName"] == "node-1"
    assert runs.waiting(seen) == "is installing"


@pytest.mark.parametrize("succeeded", [True, False])
def test_a_finished_run_reads_as_a_terminated_pod_with_its_message(succeeded: bool) -> None:
    cm = runrecord.from_pod(run_pod())
    patch = runrecord.finish_patch(succeeded=succeeded, message="why it ended", now=NOW)
    cm["metadata"]["annotations"].update(patch["metadata"]["annotations"])
    cm["data"].update(patch["data"])
    seen = runrecord.as_pod(cm)
    assert runs.phase(seen) == ("Succeeded" if succeeded else "Failed")
    assert not runs.is_active(seen)
    assert runs.termination_message(seen) == "why it ended"
    assert runs.ended_at(seen) == "2026-11-28T04:00:00Z"
    if not succeeded:
        assert runs.failure(seen) == "why it ended"


def test_a_run_is_claimable_while_pending_or_when_its_holder_went_silent() -> None:
    cm = runrecord.from_pod(run_pod())
    assert runrecord.claimable(cm, NOW)
    annotations = cm["metadata"]["annotations"]
    annotations.update(
        runrecord.claim_patch(cm, holder="a", node="n", now=NOW)["metadata"]["annotations"]
    )
    assert not runrecord.claimable(cm, NOW + timedelta(seconds=runrecord.CLAIM_TTL - 1))
    assert runrecord.claimable(cm, NOW + timedelta(seconds=runrecord.CLAIM_TTL + 1))
    annotations[runrecord.PHASE] = "Succeeded"
    assert not runrecord.claimable(cm, NOW + timedelta(hours=1))
    cm["metadata"]["deletionTimestamp"] = "2026-11-28T04:00:00Z"
    annotations[runrecord.PHASE] = "Pending"
    assert not runrecord.claimable(cm, NOW)


def test_a_run_configmap_with_a_broken_pod_reads_as_an_empty_spec() -> None:
    cm = runrecord.from_pod(run_pod())
    cm["data"]["pod"] = "{not json"
    assert runrecord.pod_of(cm) == {}
    assert runrecord.as_pod(cm)["spec"] == {}


class Cache:
    def __init__(self, *objs: dict[str, Any]) -> None:
        self.objs = list(objs)

    def items(self) -> list[dict[str, Any]]:
        return list(self.objs)

    def get(self, namespace: str, name: str) -> dict[str, Any] | None:
        return next((o for o in self.objs if o["metadata"]["name"] == name), None)


def test_the_run_view_reads_pods_and_run_configmaps_as_one_cache_of_pods() -> None:
    pod = run_pod({"type": "git", "git": {"repository": "r", "ref": {"commit": "a" * 40}}})
    cm = runrecord.from_pod(run_pod())
    view = runrecord.RunView(Cache(pod), Cache(cm))
    assert [p["kind"] for p in view.items()] == ["Pod", "Pod"]
    found = view.get("rukpak-system", cm["metadata"]["name"])
    assert found is not None and runs.phase(found) == "Pending"
    assert view.get("rukpak-system", pod["metadata"]["name"]) is pod
    assert view.get("rukpak-system", "nothing") is None


def test_the_source_volume_of_an_image_is_what_eligible_reads() -> None:
    attributes = runrecord.csi_attributes(volume(image_source()))
    assert attributes is not None and attributes["image"].endswith(DIGEST)
    git = runrecord.csi_attributes(volume(GIT))
    assert git == {"git": "https://g.example/r", "commit": "a" * 40}


def bundle(source: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "core.rukpak.io/v1alpha1",
        "kind": "Bundle",
        "metadata": {"name": "hello-bundle", "uid": "u-2"},
        "spec": {"provisionerClassName": model.PLAIN_CLASS, "source": source},
    }


def unpack_run(source: dict[str, Any] | None = None) -> dict[str, Any]:
    resolved = source or image_source()
    return generate.unpack_pod(bundle(resolved), resolved, SETTINGS)


def test_a_bundles_check_of_one_pinned_image_runs_standing_and_goes_with_its_bundle() -> None:
    pod = unpack_run()
    assert runrecord.eligible(pod)
    cm = runrecord.from_pod(pod)
    assert cm["metadata"]["labels"][runrecord.RUN_LABEL] == "unpack"
    assert cm["metadata"]["ownerReferences"] == pod["metadata"]["ownerReferences"]
    finished = {**cm, "data": {**cm["data"], runrecord.MESSAGE_KEY: '{"objects": 1}'}}
    finished["metadata"] = {
        **cm["metadata"],
        "annotations": {**cm["metadata"]["annotations"], runrecord.PHASE: "Succeeded"},
    }
    seen = runrecord.as_pod(finished)
    (status,) = seen["status"]["containerStatuses"]
    assert status["name"] == generate.UNPACK_CONTAINER  # what the Bundle planner reads
    assert status["state"]["terminated"]["message"] == '{"objects": 1}'
    assert seen["metadata"]["ownerReferences"][0]["kind"] == "Bundle"


def test_a_bundles_check_of_a_tag_keeps_its_pod_and_of_git_runs_standing() -> None:
    assert not runrecord.eligible(unpack_run(image_source("registry.example.com/hello:v1")))
    assert runrecord.eligible(unpack_run(GIT))


def test_a_pod_of_another_command_never_runs_standing() -> None:
    pod = run_pod()
    pod["spec"]["containers"][0]["command"][1] = "serve"
    assert not runrecord.eligible(pod)
    assert runrecord.command_of({"spec": {"containers": []}}) == ""


def merged(obj: dict[str, Any], patch: dict[str, Any]) -> dict[str, Any]:
    """RFC 7386 merge patch, as the API server applies it (null removes a key)."""
    out = dict(obj)
    for key, value in patch.items():
        if value is None:
            out.pop(key, None)
        elif isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = merged(out[key], value)
        else:
            out[key] = value
    return out


def test_a_run_given_back_by_a_stopping_provisioner_is_taken_at_once_by_the_next() -> None:
    cm = runrecord.from_pod(run_pod())
    cm["metadata"]["resourceVersion"] = "7"
    claimed = merged(cm, runrecord.claim_patch(cm, holder="standing-0", node="n1", now=NOW))
    assert not runrecord.claimable(claimed, NOW + timedelta(seconds=1))
    back = merged(claimed, runrecord.release_patch())
    annotations = back["metadata"]["annotations"]
    assert runrecord.HOLDER not in annotations and runrecord.NODE not in annotations
    assert runrecord.claimable(back, NOW + timedelta(seconds=1))
    assert runs.waiting(runrecord.as_pod(back)) == f"waits: {runrecord.UNTAKEN}"


def test_the_run_view_decodes_each_version_of_a_run_configmap_once() -> None:
    cm = runrecord.from_pod(run_pod())
    cm["metadata"]["resourceVersion"] = "1"
    view = runrecord.RunView(Cache(), Cache(cm))
    (first,) = view.items()
    assert view.get(cm["metadata"]["namespace"], cm["metadata"]["name"]) is first
    claimed = {
        **cm,
        "metadata": {
            **cm["metadata"],
            "resourceVersion": "2",
            "annotations": {**cm["metadata"]["annotations"], runrecord.PHASE: "Running"},
        },
    }
    view = runrecord.RunView(Cache(), Cache(claimed))
    assert runs.phase(view.items()[0]) == "Running"  # a new version is decoded again


def test_a_check_whose_content_was_not_served_waits_with_the_mount_failure_then_is_retried() -> (
    None
):
    cm = runrecord.from_pod(run_pod())
    cm["metadata"]["resourceVersion"] = "7"
    claimed = merged(cm, runrecord.claim_patch(cm, holder="standing-0", node="n1", now=NOW))
    said = runrecord.mount_message("bundle", "NOT_FOUND", "the node store could not serve x")
    assert said == (
        'MountVolume.SetUp failed for volume "bundle" : '
        "rpc error: code = NotFound desc = the node store could not serve x"
    )
    back = merged(claimed, runrecord.mount_failed_patch(said, now=NOW))
    seen = runrecord.as_pod(back)
    assert runs.phase(seen) == "Pending" and runrecord.mount_failure(seen) == said
    # not taken again at once (no hot loop over content that is not there), but later
    assert not runrecord.claimable(back, NOW + timedelta(seconds=1))
    assert runrecord.claimable(back, NOW + timedelta(seconds=runrecord.MOUNT_RETRY + 1))
    # taken again: no longer waiting on its content; given back: the old answer is gone
    again = merged(back, runrecord.claim_patch(back, holder="s-1", node="n2", now=NOW))
    assert runrecord.mount_failure(runrecord.as_pod(again)) == ""
    released = merged(again, runrecord.release_patch())
    assert runrecord.MOUNT_FAILED not in released["metadata"]["annotations"]
    assert runrecord.claimable(released, NOW)
