"""CRD upgrade safety: stored versions, scope, and existing resources against new schemas."""

from __future__ import annotations

import copy
from typing import Any

import pytest

from provisioner.engine.apply import crdsafety
from provisioner.engine.kube import schema

SPEC_SCHEMA: dict[str, Any] = {
    "type": "object",
    "properties": {
        "spec": {
            "type": "object",
            "required": ["size"],
            "properties": {
                "size": {"type": "integer", "minimum": 1, "maximum": 10},
                "color": {"type": "string", "enum": ["red", "blue"]},
                "name": {"type": "string", "maxLength": 5, "pattern": "^[a-z]+$"},
                "ports": {"type": "array", "maxItems": 2, "items": {"type": "integer"}},
                "labels": {"type": "object", "additionalProperties": {"type": "string"}},
                "port": {"x-kubernetes-int-or-string": True},
                "free": {"type": "object", "x-kubernetes-preserve-unknown-fields": True},
                "ratio": {"type": "number", "nullable": True},
            },
        }
    },
}


@pytest.mark.parametrize(
    ("spec", "violations"),
    [
        ({"size": 3}, []),
        (
            {"size": 3, "ratio": 1, "port": "http", "free": {"x": {"y": 1}}, "labels": {"a": "b"}},
            [],
        ),
        ({"size": 3, "ratio": None, "port": 8080}, []),
        ({}, [".spec.size: is required"]),
        ({"size": "3"}, [".spec.size: must be of type integer, is string"]),
        ({"size": 0}, [".spec.size: 0 is less than the minimum 1"]),
        ({"size": 11}, [".spec.size: 11 is greater than the maximum 10"]),
        ({"size": 1, "color": "green"}, [".spec.color: 'green' is not one of 'red', 'blue'"]),
        ({"size": 1, "name": "toolong"}, [".spec.name: has 7 characters, more than maxLength 5"]),
        ({"size": 1, "name": "A1"}, [".spec.name: 'A1' does not match pattern '^[a-z]+$'"]),
        (
            {"size": 1, "ports": [1, "x", 3]},
            [
                ".spec.ports: has 3 items, more than maxItems 2",
                ".spec.ports[1]: must be of type integer, is string",
            ],
        ),
        ({"size": 1, "labels": {"a": 1}}, [".spec.labels.a: must be of type string, is integer"]),
        ({"size": 1, "port": 1.5}, [".spec.port: must be of type integer or string, is number"]),
        ({"size": 1, "extra": True}, [".spec.extra: is not in the new schema and would be pruned"]),
    ],
)
def test_the_validator_reports_each_violation_with_its_path(
    spec: dict[str, Any], violations: list[str]
) -> None:
    cr = {"apiVersion": "example.com/v1", "kind": "Widget", "metadata": {"name": "w"}, "spec": spec}
    assert [str(v) for v in schema.validate(cr, SPEC_SCHEMA, root=True)] == violations


def test_additional_properties_false_refuses_unknown_fields() -> None:
    s = {"type": "object", "properties": {"a": {"type": "string"}}, "additionalProperties": False}
    assert [str(v) for v in schema.validate({"a": "x", "b": 1}, s)] == [
        ".b: is not allowed (additionalProperties: false)"
    ]


def test_combinators_are_checked() -> None:
    s = {"anyOf": [{"type": "string"}, {"type": "integer"}]}
    assert schema.validate(3, s) == []
    assert [str(v) for v in schema.validate([], s)] == [".: matches none of the anyOf schemas"]
    one = {"oneOf": [{"minimum": 0}, {"maximum": 10}]}
    assert [str(v) for v in schema.validate(5, one)] == [
        ".: matches 2 of the oneOf schemas, must match exactly 1"
    ]


def crd(
    versions: list[tuple[str, bool, bool]],
    *,
    stored: list[str] | None = None,
    scope: str = "Namespaced",
    spec_schema: dict[str, Any] | None = None,
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": {"name": "widgets.example.com"},
        "spec": {
            "group": "example.com",
            "scope": scope,
            "names": {"kind": "Widget", "plural": "widgets"},
            "versions": [
                {
                    "name": n,
                    "served": served,
                    "storage": storage,
                    "schema": {"openAPIV3Schema": spec_schema or SPEC_SCHEMA},
                }
                for n, served, storage in versions
            ],
        },
    }
    if stored is not None:
        out["status"] = {"storedVersions": stored}
    return out


def widget(name: str, spec: dict[str, Any]) -> dict[str, Any]:
    return {
        "apiVersion": "example.com/v1",
        "kind": "Widget",
        "metadata": {"name": name, "namespace": "ns"},
        "spec": spec,
    }


def test_an_identical_crd_with_valid_resources_is_safe() -> None:
    live = crd([("v1", True, True)], stored=["v1"])
    assert (
        crdsafety.check(live, crd([("v1", True, True)]), {"v1": [widget("a", {"size": 2})]}) == []
    )


@pytest.mark.parametrize(
    ("live", "new", "existing", "reasons"),
    [
        (
            crd([("v1", True, False), ("v2", True, True)], stored=["v1", "v2"]),
            crd([("v2", True, True)]),
            {},
            ["CRD widgets.example.com: cannot remove stored versions [v1]"],  # upstream's words,
        ),
        (
            crd([("v1", True, False), ("v2", True, True)], stored=["v1", "v2"]),
            crd([("v1", False, False), ("v2", True, True)]),
            {},
            ["CRD widgets.example.com: version v1 is stored but would no longer be served"],
        ),
        (
            crd([("v1", True, True)], stored=["v1"]),
            crd([("v1", True, True)], scope="Cluster"),
            {},
            ["CRD widgets.example.com: scope changes from Namespaced to Cluster"],
        ),
        (
            crd([("v1", True, True)], stored=["v1"]),
            crd([("v1", True, True)]),
            {"v1": [widget("a", {"size": 2}), widget("b", {"size": 20})]},
            [
                "CRD widgets.example.com: existing custom object ns/b failed validation for"
                " new schema version v1: spec.size: 20 is greater than the maximum 10"
            ],
        ),
    ],
)
def test_unsafe_upgrades_are_refused_naming_crd_version_and_field(
    live: dict[str, Any],
    new: dict[str, Any],
    existing: dict[str, list[dict[str, Any]]],
    reasons: list[str],
) -> None:
    got = crdsafety.check(live, new, existing)
    assert len(got) == len(reasons)
    for have, want in zip(got, reasons, strict=True):
        assert have.startswith(want)


def test_the_opt_out_annotation_skips_every_check() -> None:
    live = crd([("v1", True, True)], stored=["v1"])
    new = crd([("v2", True, True)], scope="Cluster")
    new["metadata"]["annotations"] = {crdsafety.OPT_OUT_ANNOTATION: "disabled"}
    assert crdsafety.check(live, new, {}) == []


def test_many_violations_are_summarised() -> None:
    live = crd([("v1", True, True)], stored=["v1"])
    bad = [widget(f"w{i}", {}) for i in range(25)]
    got = crdsafety.check(live, crd([("v1", True, True)]), {"v1": bad})
    assert len(got) == crdsafety.MAX_REASONS_PER_VERSION + 1
    assert got[-1].endswith("15 more existing custom objects fail the new schema")


def test_new_versions_are_read_at_a_served_version_when_conversion_is_none() -> None:
    live = crd([("v1", True, True)], stored=["v1"])
    new = crd([("v1", True, False), ("v2", True, True)])
    assert crdsafety.read_plan(live, new) == {"v1": "v1", "v2": "v1"}
    webhook = copy.deepcopy(live)
    webhook["spec"]["conversion"] = {"strategy": "Webhook"}
    assert crdsafety.read_plan(webhook, new) == {"v1": "v1"}
