"""BundleDeployment conversion v1alpha1 <-> v1alpha2 (``provisioner.manager.conversion``),
as pure functions: lossless round trips both ways, the origin each form keeps, and
the ConversionReview answers to broken requests. ``test_conversion`` proves the same
through a real API server."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

from provisioner.engine.objects import Obj
from provisioner.manager import conversion

V1_EXAMPLE = Path(__file__).parent / "data" / "upstream-examples" / "bundledeployment.yaml"
V2_EXAMPLES = sorted((Path(__file__).parent / "data" / "upstream-examples-v1alpha2").glob("*.yaml"))


def v1_object() -> Obj:
    doc: Obj = yaml.safe_load(V1_EXAMPLE.read_text())
    doc["metadata"].update({"uid": "u-1", "generation": 3, "resourceVersion": "42"})
    doc["spec"]["template"]["metadata"]["annotations"] = {"team": "a"}
    doc["spec"]["paused"] = False
    doc["status"] = {
        "activeBundle": "combo-abc",
        "observedGeneration": 3,
        "conditions": [{"type": "Installed", "status": "True", "reason": "InstallationSucceeded"}],
    }
    return doc


V2_FULL: Obj = {
    "apiVersion": conversion.V1ALPHA2,
    "kind": "BundleDeployment",
    "metadata": {"name": "multi", "annotations": {"keep": "me"}},
    "spec": {
        "installNamespace": "apps",
        "format": "plain",
        "sources": [
            {"type": "image", "image": {"ref": "r/a@sha256:" + "a" * 64}, "destination": "a"},
            {
                "type": "git",
                "git": {"repository": "g", "ref": {"commit": "c" * 40}},
                "destination": "b",
            },
        ],
        "requireImmutableRefs": True,
        "pollInterval": "10m",
        "preflight": {"crdUpgradeSafety": {"disabled": True}},
        "watchNamespaces": ["x"],
        "config": {"values": "a: 1"},
        "serviceAccountName": "installer",
    },
    "status": {"resolvedSource": {"type": "image", "image": {"ref": "r@sha256:" + "b" * 64}}},
}


def test_a_v1alpha1_object_survives_a_round_trip_through_v1alpha2() -> None:
    original = v1_object()
    v2 = conversion.to_v1alpha2(original)
    assert v2["apiVersion"] == conversion.V1ALPHA2
    assert v2["spec"]["source"] == original["spec"]["template"]["spec"]["source"]
    assert v2["spec"]["installNamespace"] == "default"  # required in v1alpha2: defaulted
    assert "template" not in v2["spec"]
    assert conversion.origin(v2) == "v1alpha1"
    assert conversion.to_v1alpha1(v2) == original
    assert original == v1_object()  # the input is not changed


def test_a_v1alpha1_object_edited_as_v1alpha2_keeps_the_edit() -> None:
    v2 = conversion.to_v1alpha2(v1_object())
    v2["spec"]["source"]["image"]["ref"] = "quay.io/x/y:v2"
    v2["spec"]["installNamespace"] = "apps"
    back = conversion.to_v1alpha1(v2)
    assert back["spec"]["template"]["spec"]["source"]["image"]["ref"] == "quay.io/x/y:v2"
    assert back["spec"]["installNamespace"] == "apps"  # no longer the defaulted value
    assert back["spec"]["template"]["metadata"] == v1_object()["spec"]["template"]["metadata"]


@pytest.mark.parametrize("path", V2_EXAMPLES, ids=[p.stem for p in V2_EXAMPLES])
def test_upstream_v1alpha2_examples_survive_a_round_trip_through_v1alpha1(path: Path) -> None:
    original: Obj = yaml.safe_load(path.read_text())
    v1 = conversion.to_v1alpha1(original)
    assert v1["apiVersion"] == conversion.V1ALPHA1
    template = v1["spec"]["template"]["spec"]
    assert template["source"] == original["spec"]["source"]
    assert template["provisionerClassName"] == original["spec"]["provisionerClassName"]
    assert conversion.origin(v1) == "v1alpha2"
    assert conversion.to_v1alpha2(v1) == original


def test_v1alpha2_only_fields_survive_a_v1alpha1_round_trip() -> None:
    original = copy.deepcopy(V2_FULL)
    v1 = conversion.to_v1alpha1(original)
    # a v1alpha1 reader sees a template with the first source and the class of the format
    assert v1["spec"]["provisionerClassName"] == "core-rukpak-io-plain"
    assert v1["spec"]["template"]["spec"]["source"] == {
        "type": "image",
        "image": {"ref": "r/a@sha256:" + "a" * 64},
    }
    assert v1["metadata"]["annotations"]["keep"] == "me"
    assert conversion.to_v1alpha2(v1) == original


def test_origin_without_annotations_is_the_version_itself() -> None:
    assert conversion.origin({"apiVersion": conversion.V1ALPHA1}) == "v1alpha1"
    assert conversion.origin({"apiVersion": conversion.V1ALPHA2}) == "v1alpha2"


def test_a_broken_origin_annotation_reads_as_absent() -> None:
    obj = copy.deepcopy(V2_FULL)
    obj["metadata"]["annotations"][conversion.V1ALPHA1_ANNOTATION] = "{not json"
    assert conversion.origin(obj) == "v1alpha2"


def review(objects: object, desired: str = conversion.V1ALPHA2) -> Obj:
    body = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "ConversionReview",
        "request": {"uid": "rq-1", "desiredAPIVersion": desired, "objects": objects},
    }
    response: Obj = conversion.review(body)["response"]
    return response


def test_a_review_converts_every_object_and_answers_with_the_uid() -> None:
    response = review([v1_object(), copy.deepcopy(V2_FULL)])
    assert response["uid"] == "rq-1"
    assert response["result"] == {"status": "Success"}
    assert [o["apiVersion"] for o in response["convertedObjects"]] == [conversion.V1ALPHA2] * 2


@pytest.mark.parametrize(
    ("objects", "desired", "words"),
    [
        ("nope", conversion.V1ALPHA2, "must be a list"),
        (["x"], conversion.V1ALPHA2, "must be an object"),
        ([{"apiVersion": "v1", "kind": "Pod"}], conversion.V1ALPHA2, "only BundleDeployments"),
        ([v1_object()], "core.rukpak.io/v9", "cannot convert to 'core.rukpak.io/v9'"),
        (
            [{"apiVersion": "core.rukpak.io/v0", "kind": "BundleDeployment"}],
            conversion.V1ALPHA1,
            "cannot convert from 'core.rukpak.io/v0'",
        ),
    ],
)
def test_a_broken_review_fails_with_a_message_and_converts_nothing(
    objects: object, desired: str, words: str
) -> None:
    response = review(objects, desired)
    assert response["result"]["status"] == "Failure"
    assert words in response["result"]["message"]
    assert "convertedObjects" not in response


def test_the_lifecycle_fields_survive_a_v1alpha1_round_trip() -> None:
    original = copy.deepcopy(V2_FULL)
    original["spec"].update(
        revisionHistoryLimit=3,
        progressDeadlineSeconds=120,
        rollbackOnFailure=True,
        dependsOn=[{"name": "certs"}],
        healthChecks=[{"name": "up", "assertions": [{"cel": "true"}]}],
    )
    v1 = conversion.to_v1alpha1(original)
    assert "dependsOn" not in v1["spec"] and "healthChecks" not in v1["spec"]
    assert conversion.to_v1alpha2(v1) == original
