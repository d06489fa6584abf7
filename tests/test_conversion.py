"""One BundleDeployment, two versions, on a real kube-apiserver: the CRD serves v1alpha1
and v1alpha2 (storage) and converts through the manager's webhook (``conversion``,
served here by ``crd_helpers`` as the manager serves it).

Upstream v0.24's v1alpha2 YAML is accepted unchanged, and bad v1alpha2 specs are refused in
upstream's words where upstream has them.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef
from provisioner.manager import conversion, model
from rukpak.common import errors
from tests.crd_helpers import install_crds

EXAMPLES = Path(__file__).parent / "data"
V1_EXAMPLE = EXAMPLES / "upstream-examples" / "bundledeployment.yaml"
V2_EXAMPLES = sorted((EXAMPLES / "upstream-examples-v1alpha2").glob("*.yaml"))
DIGEST = "sha256:" + "d" * 64


@pytest.fixture(scope="module", autouse=True)
def crds(kube: Kube) -> None:
    install_crds(kube)


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


def load(path: Path, name: str) -> Obj:
    doc: Obj = yaml.safe_load(path.read_text())
    doc["metadata"]["name"] = name
    return doc


def ref(name: str, version: str) -> ObjectRef:
    return ObjectRef(model.GROUP, version, model.BUNDLE_DEPLOYMENT, "", name)


def test_a_v1alpha1_object_reads_as_v1alpha2_and_back_unchanged(kube: Kube) -> None:
    name = unique("v1")
    created = kube.create(load(V1_EXAMPLE, name))
    as_v2 = kube.get(ref(name, "v1alpha2"))
    assert as_v2 is not None and as_v2["apiVersion"] == model.API_VERSION_V2
    assert as_v2["spec"]["source"] == created["spec"]["template"]["spec"]["source"]
    assert as_v2["spec"]["installNamespace"] == "default"
    assert conversion.origin(as_v2) == "v1alpha1"
    as_v1 = kube.get(ref(name, "v1alpha1"))
    assert as_v1 is not None
    assert as_v1["spec"] == created["spec"]
    assert as_v1["metadata"].get("annotations") == created["metadata"].get("annotations")


@pytest.mark.parametrize("path", V2_EXAMPLES, ids=[p.stem for p in V2_EXAMPLES])
def test_upstream_v1alpha2_examples_are_accepted_unchanged(kube: Kube, path: Path) -> None:
    doc = load(path, unique("v2"))
    created = kube.create(doc)
    assert created["spec"] == {**doc["spec"], "deletionPolicy": "Delete"}
    as_v1 = kube.get(ref(model.name_of(doc), "v1alpha1"))
    assert as_v1 is not None
    assert as_v1["spec"]["template"]["spec"]["source"] == doc["spec"]["source"]
    assert conversion.origin(as_v1) == "v1alpha2"


def test_v1alpha2_only_fields_survive_a_write_through_v1alpha1(kube: Kube) -> None:
    name = unique("only")
    spec = {
        "installNamespace": "apps",
        "format": "plain",
        "sources": [
            {"type": "image", "image": {"ref": f"r.example/a@{DIGEST}"}, "destination": "a"},
            {"type": "image", "image": {"ref": f"r.example/b@{DIGEST}"}, "destination": "b"},
        ],
        "requireImmutableRefs": True,
        "pollInterval": "10m",
        "preflight": {"crdUpgradeSafety": {"disabled": True}},
    }
    kube.create(
        {
            "apiVersion": model.API_VERSION_V2,
            "kind": model.BUNDLE_DEPLOYMENT,
            "metadata": {"name": name},
            "spec": spec,
        }
    )
    as_v1 = kube.get(ref(name, "v1alpha1"))
    assert as_v1 is not None and as_v1["spec"]["provisionerClassName"] == model.PLAIN_CLASS
    kube.merge_patch(ref(name, "v1alpha1"), {"spec": {"paused": True}})
    after = kube.get(ref(name, "v1alpha2"))
    assert after is not None
    assert after["spec"] == {**spec, "paused": True, "deletionPolicy": "Delete"}
    assert conversion.V1ALPHA2_ANNOTATION not in (after["metadata"].get("annotations") or {})


def test_status_written_in_one_version_reads_in_the_other(kube: Kube) -> None:
    name = unique("status")
    kube.create(load(V1_EXAMPLE, name))
    kube.merge_patch_status(
        ref(name, "v1alpha1"),
        {"status": {"activeBundle": f"{name}-x", "observedGeneration": 1}},
    )
    as_v2 = kube.get(ref(name, "v1alpha2"))
    assert as_v2 is not None and as_v2["status"]["activeBundle"] == f"{name}-x"
    pinned = {"type": "image", "image": {"ref": f"r.example/a@{DIGEST}"}}
    kube.merge_patch_status(ref(name, "v1alpha2"), {"status": {"resolvedSource": pinned}})
    as_v1 = kube.get(ref(name, "v1alpha1"))
    assert as_v1 is not None and as_v1["status"]["resolvedSource"] == pinned


def v2_doc(name: str, **spec: Any) -> Obj:
    base: Obj = {
        "installNamespace": "default",
        "provisionerClassName": model.PLAIN_CLASS,
        "source": {"type": "image", "image": {"ref": "r.example/a:v1"}},
    }
    base.update(spec)
    return {
        "apiVersion": model.API_VERSION_V2,
        "kind": model.BUNDLE_DEPLOYMENT,
        "metadata": {"name": name},
        "spec": {k: v for k, v in base.items() if v is not None},
    }


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        (
            {"source": {"type": "git", "image": {"ref": "a"}}},
            'bundledeployment.spec.source.git must be set for source type "git"',
        ),
        (
            {
                "source": {
                    "type": "image",
                    "image": {"ref": "a"},
                    "git": {"repository": "g", "ref": {"branch": "m"}},
                }
            },
            r"must validate one and only one schema \(oneOf\)",
        ),
        ({"installNamespace": None}, "installNamespace: Required value"),
        ({"provisionerClassName": None}, "spec.provisionerClassName or spec.format must be set"),
        ({"format": "registry-v1"}, "spec.format and spec.provisionerClassName disagree"),
        (
            {
                "source": None,
                "sources": [{"type": "image", "image": {"ref": "a"}, "destination": "../x"}],
            },
            "destination must stay inside the bundle tree",
        ),
        (
            {
                "source": None,
                "sources": [{"type": "image", "image": {"ref": "a"}, "destination": "/x"}],
            },
            "destination must be a relative directory",
        ),
        (
            {
                "source": None,
                "sources": [
                    {"type": "image", "image": {"ref": "a"}, "destination": "x"},
                    {"type": "image", "image": {"ref": "b"}, "destination": "x"},
                ],
            },
            "two sources have the same destination",
        ),
        (
            {"sources": [{"type": "image", "image": {"ref": "a"}, "destination": "x"}]},
            "exactly one of spec.source and spec.sources must be set",
        ),
        (
            {
                "source": {
                    "type": "configMaps",
                    "configMaps": [{"configMap": {"name": "c"}, "path": "a/../../b"}],
                }
            },
            "path must stay inside the bundle",
        ),
        ({"pollInterval": "soon"}, "pollInterval"),
        (
            {"watchNamespaces": ["a", ""]},
            "Empty string not accepted if length of watchNamespaces is more than 1.",
        ),
    ],
    ids=[
        "git type with an image",
        "two sources in one",
        "no install namespace",
        "no class and no format",
        "format and class disagree",
        "destination climbs out",
        "absolute destination",
        "same destination twice",
        "source and sources",
        "configMap path climbs out",
        "bad poll interval",
        "empty watch namespace",
    ],
)
def test_a_bad_v1alpha2_spec_is_refused_saying_why(kube: Kube, spec: Obj, message: str) -> None:
    with pytest.raises(errors.InvalidArgument, match=message):
        kube.create(v2_doc(unique("bad"), **spec))


def test_a_v1alpha2_name_longer_than_52_is_refused_in_upstreams_words(kube: Kube) -> None:
    name = "n" * 53
    with pytest.raises(
        errors.InvalidArgument, match=r"metadata\.name: Too long: may not be longer than 52"
    ):
        kube.create(v2_doc(name))
    kube.create(v2_doc("n" * 52))  # (45 is v1alpha1's limit, for its generated Bundles)


def test_format_alone_names_the_class_for_v1alpha1_readers(kube: Kube) -> None:
    name = unique("fmt")
    kube.create(v2_doc(name, provisionerClassName=None, format="registry-v1"))
    as_v1 = kube.get(ref(name, "v1alpha1"))
    assert as_v1 is not None
    assert as_v1["spec"]["provisionerClassName"] == model.REGISTRY_CLASS
    as_v2 = kube.get(ref(name, "v1alpha2"))
    assert as_v2 is not None and "provisionerClassName" not in as_v2["spec"]


SHIPPED = sorted((Path(__file__).parent.parent / "examples" / "bundledeployments").glob("*.yaml"))


@pytest.mark.parametrize("path", SHIPPED, ids=[p.stem for p in SHIPPED])
def test_the_shipped_examples_are_accepted(kube: Kube, path: Path) -> None:
    for doc in yaml.safe_load_all(path.read_text()):
        doc["metadata"]["name"] = unique(doc["metadata"]["name"])
        created = kube.create(doc)
        assert created["spec"]["deletionPolicy"] == "Delete"
