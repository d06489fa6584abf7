"""Optional manifests: unserved APIs are set aside only for objects marked optional."""

from __future__ import annotations

from typing import Any

import pytest

from provisioner.engine.apply import optional
from provisioner.engine.bundle.manifest import Manifest, Source
from provisioner.engine.errors import BundleInvalid


def manifest(obj: dict[str, Any], document: int = 1) -> Manifest:
    return Manifest(obj=obj, source=Source("manifests/app.yaml", document, 1))


def monitor(name: str, flag: str | None = "true") -> Manifest:
    meta: dict[str, Any] = {"name": name, "namespace": "app"}
    if flag is not None:
        meta["annotations"] = {optional.ANNOTATION: flag}
    return manifest(
        {"apiVersion": "monitoring.coreos.com/v1", "kind": "ServiceMonitor", "metadata": meta}
    )


DEPLOYMENT = manifest({"apiVersion": "apps/v1", "kind": "Deployment", "metadata": {"name": "web"}})


def crd(group: str, kind: str, versions: list[dict[str, Any]]) -> Manifest:
    return manifest(
        {
            "apiVersion": "apiextensions.k8s.io/v1",
            "kind": "CustomResourceDefinition",
            "metadata": {"name": f"{kind.lower()}s.{group}"},
            "spec": {"group": group, "names": {"kind": kind}, "versions": versions},
        }
    )


class Asked:
    """A ``served`` answer that records every question."""

    def __init__(self, served: set[tuple[str, str]]) -> None:
        self.served = served
        self.questions: list[tuple[str, str]] = []

    def __call__(self, api_version: str, kind: str) -> bool:
        self.questions.append((api_version, kind))
        return (api_version, kind) in self.served


def split_none_served(
    manifests: list[Manifest],
) -> tuple[list[Manifest], list[optional.Skipped], list[tuple[str, str]]]:
    """``optional.split`` on a cluster that serves no optional API; also what it asked."""
    asked = Asked(set())
    kept, skipped = optional.split(manifests, asked)
    return kept, skipped, asked.questions


def test_an_optional_object_of_an_unserved_api_is_skipped_and_the_rest_kept() -> None:
    a, b = monitor("a"), monitor("b")
    kept, skipped, questions = split_none_served([DEPLOYMENT, a, b])
    assert kept == [DEPLOYMENT]
    assert [s.manifest for s in skipped] == [a, b]
    assert questions == [("monitoring.coreos.com/v1", "ServiceMonitor")]  # asked once
    assert optional.awaited(skipped) == {("monitoring.coreos.com", "v1", "ServiceMonitor")}


def test_an_optional_object_of_a_served_api_is_applied() -> None:
    m = monitor("a")
    kept, skipped = optional.split([m], Asked({("monitoring.coreos.com/v1", "ServiceMonitor")}))
    assert (kept, skipped) == ([m], [])


def test_objects_not_marked_optional_are_never_skipped_nor_asked_about() -> None:
    plain, off = monitor("plain", flag=None), monitor("off", flag="false")
    assert split_none_served([plain, off]) == ([plain, off], [], [])


def test_an_api_the_bundles_own_crd_serves_counts_as_served() -> None:
    m = monitor("a")
    own = crd("monitoring.coreos.com", "ServiceMonitor", [{"name": "v1", "served": True}])
    assert split_none_served([own, m]) == ([own, m], [], [])


def test_a_crd_version_that_is_not_served_does_not_count() -> None:
    m = monitor("a")
    own = crd("monitoring.coreos.com", "ServiceMonitor", [{"name": "v1", "served": False}])
    kept, skipped = optional.split([own, m], Asked(set()))
    assert kept == [own]
    assert [s.manifest for s in skipped] == [m]


@pytest.mark.parametrize("value", ["yes", "True", ""])
def test_other_annotation_values_are_refused_naming_the_object(value: str) -> None:
    with pytest.raises(BundleInvalid) as info:
        optional.split([monitor("a", flag=value)], Asked(set()))
    assert str(info.value).startswith(
        "manifests/app.yaml document 1 (line 1): annotation core.rukpak.io/optional of "
        "ServiceMonitor.monitoring.coreos.com app/a is "
    )


def test_summary_names_each_skipped_object_and_is_empty_for_none() -> None:
    _, skipped = optional.split([monitor("a")], Asked(set()))
    assert optional.summary(skipped) == (
        "skipped 1 optional object(s) whose API the cluster does not serve: "
        "ServiceMonitor.monitoring.coreos.com app/a (monitoring.coreos.com/v1 is not served); "
        "they are created when the API appears"
    )
    assert optional.summary([]) == ""
