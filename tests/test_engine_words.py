"""Upstream's words, once (``provisioner.engine.bundle.words``): each reads exactly as upstream
RukPak v0.16's and v0.24's suites expect it, and our detail only ever follows it."""

from __future__ import annotations

import pytest

from provisioner.engine.bundle import words


def test_the_plain_bundle_words_are_upstreams() -> None:
    assert words.MISSING_MANIFESTS == (
        "get objects from bundle manifests: readdir manifests: file does not exist"
    )
    assert words.ZERO_OBJECTS == (
        "invalid bundle: found zero objects: plain+v0 bundles are required to contain at "
        "least one object"
    )
    assert words.subdirectory("manifests/emptydir") == (
        "get objects from bundle manifests: subdirectories are not allowed within the "
        '"manifests" directory of the bundle image filesystem: found "manifests/emptydir"'
    )


@pytest.mark.parametrize(
    ("value", "go_type"),
    [("", "string"), ("text", "string"), ([1], "array"), (3, "number"), (True, "bool")],
)
def test_a_document_that_is_not_an_object_reads_as_gos_decoder_words_it(
    value: object, go_type: str
) -> None:
    message = words.not_an_object("manifests/.gitignore", value, "document 1, line 1")
    assert message == (
        f'unable to decode "manifests/.gitignore": json: cannot unmarshal {go_type} into Go '
        "value of type map[string]interface {} (document 1, line 1)"
    )


def test_a_conversion_failure_puts_where_after_upstreams_reason() -> None:
    message = words.conversion_failed(
        "AllNamespace install mode must be enabled", "manifests/csv.yaml document 1 (line 1)"
    )
    assert message.startswith(
        "convert registry+v1 bundle to plain+v0 bundle: AllNamespace install mode must be enabled"
    )
    assert message.endswith(" (manifests/csv.yaml document 1 (line 1))")


def test_an_image_that_does_not_resolve_names_the_image_descriptor() -> None:
    ref = "registry.example/plain-v0:non-existent-tag"
    detail = f"image {ref} not found in registry registry.example: check the name and tag"
    message = words.unresolved("image", ref, detail)
    assert message == f"source bundle content: error fetching image descriptor: {detail}"
    # a detail that does not name the reference gets it
    assert words.unresolved("image", ref, "connection refused") == (
        f"source bundle content: error fetching image descriptor: {ref}: connection refused"
    )
    assert words.unresolved("git", "https://git.example/r#main", "timed out", " (at x)") == (
        "source bundle content: cannot resolve https://git.example/r#main: timed out (at x)"
    )


def test_kinds_nobody_serves_say_required_resource_not_found_then_each_kind() -> None:
    message = words.unknown_kinds(
        {
            ("operators.coreos.com/v1", "OLMConfig"): "manifests/b.yaml document 1 (line 1)",
            ("operators.coreos.com/v1alpha1", "CatalogSource"): "manifests/a.yaml document 2",
        }
    )
    assert message == (
        "required resource not found: "
        'no matches for kind "OLMConfig" in version "operators.coreos.com/v1" '
        "(manifests/b.yaml document 1 (line 1)); "
        'no matches for kind "CatalogSource" in version "operators.coreos.com/v1alpha1" '
        "(manifests/a.yaml document 2); ensure CRDs are installed first"
    )


@pytest.mark.parametrize(
    ("version", "failure", "reason"),
    [
        ("v1alpha1", words.REQUIRED_RESOURCE + "x", "InstallFailed"),
        ("v1alpha2", words.REQUIRED_RESOURCE + "x", "ErrorGettingReleaseState"),
        ("v1alpha1", words.MISSING_MANIFESTS, "InstallFailed"),
        ("v1alpha2", words.MISSING_MANIFESTS, "InstallFailed"),
    ],
)
def test_a_failed_run_reads_as_the_upstream_of_its_api_version(
    version: str, failure: str, reason: str
) -> None:
    status, got, message = words.install_failed(version, "rukpak-instance-a-1-0", failure)
    assert (status, got) == ("False", reason)
    assert message == f"instance pod rukpak-instance-a-1-0 failed: {failure}"


def test_healthy_beside_a_failed_install_is_upstreams() -> None:
    assert words.healthy_when_failed() == (
        "False",
        "InstallationStatusFalse",
        "Installed condition is false",
    )


def test_the_crd_validators_denial_is_upstreams_then_the_reasons() -> None:
    denial = words.crd_denied("UPDATE", "widgets.x.io", ["a", "b"])
    # upstream's crdvalidator handler around internal/crd's error, byte for byte
    assert denial == (
        'failed to validate safety of UPDATE for CRD "widgets.x.io" (NOTE: to disable this '
        'validation, set the "core.rukpak.io/safe-crd-upgrade-validation" annotation to '
        '"false"): error validating existing CRs against new CRD\'s schema for '
        '"widgets.x.io": a; b'
    )


def test_an_existing_custom_object_the_new_schema_refuses_reads_as_upstreams() -> None:
    one = words.existing_invalid("ns", "w", "v1", ["spec.colour: Required value"])
    assert one == (
        "existing custom object ns/w failed validation for new schema version v1: "
        "spec.colour: Required value"
    )
    # a cluster-scoped object: no namespace before the slash, as upstream prints it
    two = words.existing_invalid("", "w", "v1", ["spec.a: Required value", "spec.b: x"])
    assert two.endswith(
        "/w failed validation for new schema version v1: [spec.a: Required value, spec.b: x]"
    )
    assert words.stored_versions_removed(["v2", "v1"]) == "cannot remove stored versions [v1 v2]"
