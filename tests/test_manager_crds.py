"""The Bundle and BundleDeployment CRDs (provisioner/crds) on a real kube-apiserver.

Upstream RukPak's example YAML is accepted as written; bad specs are rejected
by the API server with a message that says what to fix; a Bundle's spec is
immutable (CEL ``self == oldSelf``); status is a subresource.
"""

from __future__ import annotations

import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef
from provisioner.manager import model
from provisioner.manager.acting import actuate
from rukpak.common import errors
from tests.crd_helpers import install_crds


@pytest.fixture(scope="module", autouse=True)
def crds(kube: Kube) -> None:
    """The Bundle and BundleDeployment CRDs, on the session's API server."""
    install_crds(kube)


ONE_OF = r"must validate one and only one schema \(oneOf\). "


def unique(prefix: str) -> str:
    return f"{prefix}-{uuid.uuid4().hex[:6]}"


# Upstream RukPak's example YAML, verbatim.
EXAMPLES = Path(__file__).parent / "data" / "upstream-examples"
UPSTREAM_BUNDLE = (EXAMPLES / "bundle-image.yaml").read_text()
UPSTREAM_GIT_BUNDLE = (EXAMPLES / "bundle-git.yaml").read_text()
UPSTREAM_BD = (EXAMPLES / "bundledeployment.yaml").read_text()


def load(text: str, name: str) -> Obj:
    doc: Obj = yaml.safe_load(text)
    doc["metadata"]["name"] = name
    return doc


@pytest.mark.parametrize("example", [UPSTREAM_BUNDLE, UPSTREAM_GIT_BUNDLE], ids=["image", "git"])
def test_upstream_bundle_examples_are_accepted(kube: Kube, example: str) -> None:
    created = kube.create(load(example, unique("bundle")))
    assert created["spec"] == yaml.safe_load(example)["spec"]


def test_an_upstream_bundledeployment_example_is_accepted_with_defaults(kube: Kube) -> None:
    created = kube.create(load(UPSTREAM_BD, unique("combo")))
    assert created["spec"]["template"]["metadata"]["labels"] == {"app": "combo"}
    assert created["spec"]["deletionPolicy"] == "Delete"


def test_our_extra_bundledeployment_fields_are_accepted(kube: Kube) -> None:
    doc = load(UPSTREAM_BD, unique("extras"))
    doc["spec"].update(
        paused=True,
        serviceAccountName="installer",
        installNamespace="team-a",
        deletionPolicy="Orphan",
        config={"anything": {"goes": [1, 2]}},
    )
    created = kube.create(doc)
    for key in ("paused", "serviceAccountName", "installNamespace", "deletionPolicy", "config"):
        assert created["spec"][key] == doc["spec"][key]


def test_a_bundle_spec_is_immutable(kube: Kube) -> None:
    name = unique("immutable")
    kube.create(load(UPSTREAM_BUNDLE, name))
    ref = ObjectRef(model.GROUP, model.VERSION, model.BUNDLE, "", name)
    with pytest.raises(errors.InvalidArgument, match=r"bundle\.spec is immutable"):
        kube.merge_patch(ref, {"spec": {"source": {"image": {"ref": "example.com/other:v2"}}}})


def _bad_bundle_image_without_image(doc: Obj) -> None:
    del doc["spec"]["source"]["image"]


def _bad_bundle_unknown_type(doc: Obj) -> None:
    doc["spec"]["source"]["type"] = "ftp"


def _bad_bundle_no_class(doc: Obj) -> None:
    del doc["spec"]["provisionerClassName"]


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (_bad_bundle_image_without_image, '"spec.source" ' + ONE_OF + "Found none valid"),
        (_bad_bundle_unknown_type, 'Unsupported value: "ftp"'),
        (_bad_bundle_no_class, "provisionerClassName: Required value"),
    ],
    ids=["image type without image", "unknown source type", "no provisioner class"],
)
def test_a_bad_bundle_is_rejected_saying_why(kube: Kube, mutate: Any, message: str) -> None:
    doc = load(UPSTREAM_BUNDLE, unique("bad"))
    mutate(doc)
    with pytest.raises(errors.InvalidArgument, match=message):
        kube.create(doc)


def _bad_bd_policy(doc: Obj) -> None:
    doc["spec"]["deletionPolicy"] = "Keep"


def _bad_bd_no_template(doc: Obj) -> None:
    del doc["spec"]["template"]


def _bad_bd_namespace(doc: Obj) -> None:
    doc["spec"]["installNamespace"] = "Not_A_Namespace"


def _bad_bd_template_source(doc: Obj) -> None:
    doc["spec"]["template"]["spec"]["source"] = {"type": "git"}


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (_bad_bd_policy, 'supported values: "Delete", "Orphan"'),
        (_bad_bd_no_template, "template: Required value"),
        (_bad_bd_namespace, "installNamespace"),
        (_bad_bd_template_source, "spec.template.spec.source.git: Required value"),
    ],
    ids=["unknown deletion policy", "no template", "bad namespace name", "git without git"],
)
def test_a_bad_bundledeployment_is_rejected_saying_why(
    kube: Kube, mutate: Any, message: str
) -> None:
    doc = load(UPSTREAM_BD, unique("bad"))
    mutate(doc)
    with pytest.raises(errors.InvalidArgument, match=message):
        kube.create(doc)


def test_status_is_a_subresource(kube: Kube) -> None:
    name = unique("status")
    kube.create(load(UPSTREAM_BD, name))
    ref = actuate.bd_ref(name)
    kube.merge_patch(ref, {"status": {"activeBundle": "ignored"}})
    assert ((kube.get(ref) or {}).get("status") or {}).get("activeBundle") is None
    actuate.write_status(kube, name, {"activeBundle": "b1", "observedGeneration": 1})
    assert (kube.get(ref) or {})["status"]["activeBundle"] == "b1"


def test_the_bundledeployment_crd_has_printer_columns(kube: Kube) -> None:
    crd = kube.get(
        ObjectRef(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "",
            "bundledeployments.core.rukpak.io",
        )
    )
    assert crd is not None
    columns = [c["name"] for c in crd["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns[:2] == ["Active Bundle", "Install State"]
    assert "Age" in columns


# -- upstream's API validation, in upstream's words ---------------------------------------


def _two_sources(doc: Obj) -> None:
    doc["spec"]["source"]["git"] = {"repository": "https://x", "ref": {"branch": "main"}}


def _no_source(doc: Obj) -> None:
    doc["spec"]["source"] = {"type": "image"}


def _two_git_refs(doc: Obj) -> None:
    doc["spec"]["source"] = {
        "type": "git",
        "git": {"repository": "https://x", "ref": {"branch": "main", "tag": "v1"}},
    }


def _no_git_ref(doc: Obj) -> None:
    doc["spec"]["source"] = {"type": "git", "git": {"repository": "https://x", "ref": {}}}


def _bad_class(doc: Obj) -> None:
    doc["spec"]["provisionerClassName"] = "invalid/class-name"


UPSTREAM_REFUSALS = [
    (_two_sources, '"spec.source" ' + ONE_OF + "Found 2 valid alternatives"),
    (_no_source, '"spec.source" ' + ONE_OF + "Found none valid"),
    (_two_git_refs, '"spec.source.git.ref" ' + ONE_OF + "Found 2 valid alternatives"),
    (_no_git_ref, '"spec.source.git.ref" ' + ONE_OF + "Found none valid"),
    (
        _bad_class,
        'spec.provisionerClassName: Invalid value: "invalid/class-name": spec.provisionerClassName',
    ),
]
UPSTREAM_IDS = ["two sources", "no source", "two git refs", "no git ref", "bad class name"]


@pytest.mark.parametrize(("mutate", "message"), UPSTREAM_REFUSALS, ids=UPSTREAM_IDS)
def test_a_bundle_is_validated_as_upstream(kube: Kube, mutate: Any, message: str) -> None:
    doc = load(UPSTREAM_BUNDLE, unique("upstream"))
    mutate(doc)
    with pytest.raises(errors.InvalidArgument, match=message):
        kube.create(doc)


@pytest.mark.parametrize(("mutate", "message"), UPSTREAM_REFUSALS, ids=UPSTREAM_IDS)
def test_a_bundledeployment_template_is_validated_as_upstream(
    kube: Kube, mutate: Any, message: str
) -> None:
    doc = load(UPSTREAM_BD, unique("upstream"))
    mutate(doc["spec"]["template"])
    with pytest.raises(
        errors.InvalidArgument, match=message.replace("spec.", "spec.template.spec.")
    ):
        kube.create(doc)


def test_a_bundledeployment_class_name_is_a_dns_label(kube: Kube) -> None:
    doc = load(UPSTREAM_BD, unique("upstream"))
    doc["spec"]["provisionerClassName"] = "invalid/class-name"
    with pytest.raises(
        errors.InvalidArgument,
        match=r'spec\.provisionerClassName: Invalid value: "invalid/class-name": '
        r"spec\.provisionerClassName",
    ):
        kube.create(doc)


@pytest.mark.parametrize(
    ("example", "limit"), [(UPSTREAM_BUNDLE, 52), (UPSTREAM_BD, 45)], ids=["Bundle", "BD"]
)
def test_names_longer_than_upstreams_limit_are_refused(
    kube: Kube, example: str, limit: int
) -> None:
    fits = load(example, "n" * limit)
    kube.create(fits)
    too_long = load(example, "n" * (limit + 1))
    with pytest.raises(
        errors.InvalidArgument,
        match=f"metadata.name: Too long: may not be longer than {limit}",  # upstream's words
    ):
        kube.create(too_long)
    kube.delete(ObjectRef.of(fits))
