"""The apply engine against a real kube-apiserver (etcd + kube-apiserver, no controllers).

Each test uses its own deployment name and namespace, so they share one API server.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from provisioner.engine.apply import apply, inventory, inventorystore
from provisioner.engine.bundle import formats
from provisioner.engine.errors import (
    ApplyFailed,
    BundleInvalid,
    CRDUpgradeUnsafe,
    OwnershipConflict,
)
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import OWNER_LABEL, ObjectRef
from tests.bundles import (
    configmap,
    crd,
    deployment,
    namespace,
    role_binding,
    widget,
    write_bundle,
)

pytestmark = pytest.mark.cluster


def test_a_bundle_with_a_crd_and_its_resources_installs_in_one_revision(
    kube: Kube, name: str, group: str, tmp_path: Path
) -> None:
    bundle = write_bundle(
        tmp_path,
        {
            "00_widgets.yaml": [
                widget(group, "v1", "w1", {"size": 1}),
                widget(group, "v1", "w2", {"size": 2}),
            ],
            "01_crd.yaml": [crd(group)],
            "02_ns.yaml": [namespace(name), configmap("settings", mode="fast")],
        },
    )
    result = apply.install(kube, bundle, apply.Options(name=name, namespace=name))
    assert [a.ref.kind for a in result.applied] == [
        "Namespace",
        "CustomResourceDefinition",
        "ConfigMap",
        "Widget",
        "Widget",
    ]
    w1 = kube.get(ObjectRef(group, "v1", "Widget", name, "w1"))
    assert w1 is not None and w1["spec"] == {"size": 1}
    assert w1["metadata"]["labels"][OWNER_LABEL] == name
    inv = inventorystore.read_inventory(
        kube, name, system_namespace=inventory.DEFAULT_SYSTEM_NAMESPACE
    )
    assert inv is not None and len(inv.refs) == 5
    # a second install of the same bundle is a no-op on the server
    before = w1["metadata"]["resourceVersion"]
    apply.install(kube, bundle, apply.Options(name=name, namespace=name))
    again = kube.get(ObjectRef(group, "v1", "Widget", name, "w1"))
    assert again is not None and again["metadata"]["resourceVersion"] == before


def test_namespaced_objects_without_a_namespace_land_in_the_install_namespace(
    kube: Kube, name: str, tmp_path: Path
) -> None:
    bundle = write_bundle(
        tmp_path, {"a.yaml": [namespace(name), configmap("plain"), configmap("pinned", name)]}
    )
    apply.install(kube, bundle, apply.Options(name=name, namespace=name))
    assert kube.get(ObjectRef("", "v1", "ConfigMap", name, "plain")) is not None
    assert kube.get(ObjectRef("", "v1", "Namespace", "", name)) is not None


def test_the_api_server_serves_only_kinds_it_knows(kube: Kube) -> None:
    assert kube.serves("v1", "ConfigMap")
    assert kube.serves("apps/v1", "Deployment")
    assert not kube.serves("v1", "NoSuchKind")
    assert not kube.serves("nosuch.example.com/v1", "Widget")


def test_an_upgrade_prunes_what_the_new_revision_no_longer_has(
    kube: Kube, name: str, tmp_path: Path
) -> None:
    opts = apply.Options(name=name, namespace=name)
    apply.install(
        kube,
        write_bundle(tmp_path, {"a.yaml": [namespace(name), configmap("keep"), configmap("drop")]}),
        opts,
    )
    result = apply.install(
        kube, write_bundle(tmp_path, {"a.yaml": [namespace(name), configmap("keep", x="2")]}), opts
    )
    assert result.pruned == [ObjectRef("", "v1", "ConfigMap", name, "drop")]
    assert kube.get(ObjectRef("", "v1", "ConfigMap", name, "drop")) is None
    kept = kube.get(ObjectRef("", "v1", "ConfigMap", name, "keep"))
    assert kept is not None and kept["data"] == {"x": "2"}
    inv = inventorystore.read_inventory(kube, name, system_namespace=opts.system_namespace)
    assert inv is not None and {r.name for r in inv.refs} == {name, "keep"}


def test_an_object_owned_by_another_deployment_is_never_taken_over(
    kube: Kube, name: str, tmp_path: Path
) -> None:
    bundle = write_bundle(tmp_path, {"a.yaml": [namespace(name), configmap("shared")]})
    apply.install(kube, bundle, apply.Options(name=name, namespace=name))
    other = write_bundle(tmp_path / "other", {"b.yaml": [configmap("shared", name, taken="yes")]})
    with pytest.raises(
        OwnershipConflict,
        match=rf"ConfigMap {name}/shared from manifests/b.yaml document 1 .* is owned by"
        rf" deployment '{name}'; deployment 'intruder' will not",
    ):
        apply.install(kube, other, apply.Options(name="intruder", namespace=name))
    live = kube.get(ObjectRef("", "v1", "ConfigMap", name, "shared"))
    assert live is not None and "taken" not in (live.get("data") or {})


def test_an_unowned_object_is_adopted_only_when_asked(
    kube: Kube, name: str, tmp_path: Path
) -> None:
    kube.apply(namespace(name))
    kube.apply(configmap("legacy", name, old="1"))
    bundle = write_bundle(tmp_path, {"a.yaml": [configmap("legacy", name, new="1")]})
    with pytest.raises(OwnershipConflict, match="no deployment owns it; adopt it explicitly"):
        apply.install(kube, bundle, apply.Options(name=name, namespace=name))
    apply.install(kube, bundle, apply.Options(name=name, namespace=name, adopt=True))
    live = kube.get(ObjectRef("", "v1", "ConfigMap", name, "legacy"))
    assert live is not None and live["metadata"]["labels"][OWNER_LABEL] == name


def test_unknown_kinds_are_refused_before_anything_is_applied(
    kube: Kube, name: str, tmp_path: Path
) -> None:
    bundle = write_bundle(
        tmp_path,
        {
            "a.yaml": [
                namespace(name),
                {"apiVersion": "nope.example.com/v1", "kind": "Thing", "metadata": {"name": "t"}},
                {"apiVersion": "nope.example.com/v2", "kind": "Other", "metadata": {"name": "o"}},
            ]
        },
    )
    with pytest.raises(BundleInvalid) as refused:
        apply.install(kube, bundle, apply.Options(name=name, namespace=name))
    # every missing kind is named, in the API machinery's words (as upstream reports them)
    message = refused.value.message
    assert message.startswith("required resource not found: ")  # upstream v0.16's words
    where = " (manifests/a.yaml document 2 (line 6))"
    assert 'no matches for kind "Thing" in version "nope.example.com/v1"' + where in message
    assert 'no matches for kind "Other" in version "nope.example.com/v2"' in message
    assert kube.get(ObjectRef("", "v1", "Namespace", "", name)) is None


def test_a_rejected_object_stops_its_phase_and_keeps_the_inventory(
    kube: Kube, name: str, tmp_path: Path
) -> None:
    bad = {
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {"name": "svc"},
        "spec": {"ports": [{"port": 99999}]},
    }
    bundle = write_bundle(tmp_path, {"a.yaml": [namespace(name), configmap("ok"), bad]})
    with pytest.raises(
        ApplyFailed,
        match=rf"(?s)phase .other..*Service {name}/svc from manifests/a.yaml document 3",
    ):
        apply.install(kube, bundle, apply.Options(name=name, namespace=name))
    assert kube.get(ObjectRef("", "v1", "ConfigMap", name, "ok")) is not None
    inv = inventorystore.read_inventory(
        kube, name, system_namespace=inventory.DEFAULT_SYSTEM_NAMESPACE
    )
    assert inv is not None and ObjectRef("", "v1", "ConfigMap", name, "ok") in inv.refs


def test_a_missing_namespace_is_named_in_the_error(kube: Kube, name: str, tmp_path: Path) -> None:
    bundle = write_bundle(tmp_path, {"a.yaml": [configmap("orphan")]})
    with pytest.raises(
        ApplyFailed,
        match=rf"(?s)ConfigMap {name}/orphan from manifests/a.yaml"
        rf".*namespaces \"{name}\" not found",
    ):
        apply.install(kube, bundle, apply.Options(name=name, namespace=name))


class TestCRDUpgradeSafety:
    @staticmethod
    def install(kube: Kube, name: str, tmp_path: Path, *docs: dict[str, Any]) -> apply.Result:
        """Install namespace ``name`` and ``docs`` as deployment ``name``."""
        bundle = write_bundle(tmp_path, {"a.yaml": [namespace(name), *docs]})
        return apply.install(kube, bundle, apply.Options(name=name, namespace=name))

    def install_v1(self, kube: Kube, name: str, tmp_path: Path, size: int) -> str:
        """The Widget CRD at v1 and one Widget ``w`` of ``size``; the CRD's group."""
        group = f"{name}.example.com"
        v1 = crd(group)
        self.install(kube, name, tmp_path, v1, widget(group, "v1", "w", {"size": size}))
        return group

    @pytest.mark.parametrize(
        ("size", "versions", "spec_props", "widget_version", "says"),
        [
            pytest.param(
                5,
                [("v2", True, True)],
                None,
                "v2",
                r"CRD widgets.{group}: cannot remove stored versions \[v1\]",  # upstream's
                id="removing-a-stored-version",
            ),
            pytest.param(
                5,
                [("v1", False, False), ("v2", True, True)],
                None,
                None,
                "version v1 is stored but would no longer be served",
                id="unserving-a-stored-version",
            ),
            pytest.param(
                50,
                [("v1", True, True)],
                {"size": {"type": "integer", "maximum": 10}},
                None,
                r"CRD widgets.{group}: existing custom object {name}/w failed validation for"
                r" new schema version v1: spec.size: 50 is greater than the maximum 10",
                id="a-schema-existing-resources-would-fail",
            ),
        ],
    )
    def test_an_unsafe_upgrade_is_refused(
        self,
        kube: Kube,
        name: str,
        tmp_path: Path,
        size: int,
        versions: list[tuple[str, bool, bool]],
        spec_props: dict[str, Any] | None,
        widget_version: str | None,
        says: str,
    ) -> None:
        group = self.install_v1(kube, name, tmp_path, size)
        docs = [crd(group, versions=versions, spec_props=spec_props)]
        if widget_version:
            docs.append(widget(group, widget_version, "w", {"size": size}))
        with pytest.raises(CRDUpgradeUnsafe, match=says.format(group=group, name=name)):
            self.install(kube, name, tmp_path, *docs)

    def test_the_opt_out_annotation_lets_an_unsafe_upgrade_through(
        self, kube: Kube, name: str, tmp_path: Path
    ) -> None:
        group = self.install_v1(kube, name, tmp_path, 50)
        tighter = crd(
            group,
            spec_props={"size": {"type": "integer", "maximum": 10}},
            annotations={"core.rukpak.io/crd-upgrade-safety": "disabled"},
        )
        result = self.install(kube, name, tmp_path, tighter)
        ref = ObjectRef(
            "apiextensions.k8s.io",
            "v1",
            "CustomResourceDefinition",
            "",
            tighter["metadata"]["name"],
        )
        assert ref in [a.ref for a in result.applied if not a.unchanged]
        live = kube.get(ref)
        assert live is not None
        schema = live["spec"]["versions"][0]["schema"]["openAPIV3Schema"]
        assert schema["properties"]["spec"]["properties"]["size"]["maximum"] == 10

    def test_a_compatible_new_version_is_accepted(
        self, kube: Kube, name: str, tmp_path: Path
    ) -> None:
        group = self.install_v1(kube, name, tmp_path, 5)
        v2 = crd(group, versions=[("v1", True, False), ("v2", True, True)])
        self.install(kube, name, tmp_path, v2, widget(group, "v2", "w", {"size": 6}))
        live = kube.get(ObjectRef(group, "v2", "Widget", name, "w"))
        assert live is not None and live["spec"]["size"] == 6


def limited_user(kube: Kube, name: str, tmp_path: Path, deployment_verbs: list[str]) -> None:
    """User ``name`` may manage ConfigMaps (its namespace and the inventory's) and has
    ``deployment_verbs`` on Deployments in its namespace."""
    system_ns = inventory.DEFAULT_SYSTEM_NAMESPACE

    def role(role_name: str, group: str, resource: str, verbs: list[str]) -> dict[str, Any]:
        return {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": role_name},
            "rules": [{"apiGroups": [group], "resources": [resource], "verbs": verbs}],
        }

    user = [{"apiGroup": "rbac.authorization.k8s.io", "kind": "User", "name": name}]

    def binding(role_name: str, ns: str) -> dict[str, Any]:
        return role_binding(role_name, role_name, user, namespace=ns)

    all_verbs = ["get", "list", "watch", "create", "update", "patch", "delete"]
    kube.apply(namespace(system_ns))  # shared by every test: created unowned
    objects = [
        namespace(name),
        role(f"{name}-namespaces", "", "namespaces", ["get"]),
        role_binding(f"{name}-namespaces", f"{name}-namespaces", user),
        role(f"{name}-configmaps", "", "configmaps", all_verbs),
        binding(f"{name}-configmaps", name),
        binding(f"{name}-configmaps", system_ns),
    ]
    if deployment_verbs:
        objects += [
            role(f"{name}-deployments", "apps", "deployments", deployment_verbs),
            binding(f"{name}-deployments", name),
        ]
    setup = write_bundle(tmp_path / "setup", {"rbac.yaml": objects})
    apply.install(kube, setup, apply.Options(name=f"{name}-setup", namespace=name))


def as_user(kube_apiserver: Any, user: str) -> Kube:
    impersonating = Kube.from_kubeconfig(str(kube_apiserver.kubeconfig))
    impersonating._api.set_default_header(  # type: ignore[no-untyped-call]
        "Impersonate-User", user
    )  # as `kubectl --as` does
    return impersonating


def app_bundle(tmp_path: Path) -> formats.Bundle:
    return write_bundle(tmp_path / "app", {"app.yaml": [configmap("settings"), deployment()]})


def install_as_limited_user(
    kube: Kube, kube_apiserver: Any, name: str, tmp_path: Path, *, verbs: list[str], match: str
) -> tuple[ApplyFailed, int]:
    """Install ``app_bundle`` as user ``name`` (``verbs`` on Deployments), which must fail
    with ``match``; the error and the write requests that user's client sent."""
    limited_user(kube, name, tmp_path, deployment_verbs=verbs)
    limited = as_user(kube_apiserver, name)
    try:
        with pytest.raises(ApplyFailed, match=match) as info:
            apply.install(limited, app_bundle(tmp_path), apply.Options(name=name, namespace=name))
        return info.value, limited.writes
    finally:
        limited.close()


def test_an_rbac_denial_stops_at_its_phase_and_keeps_what_was_applied(
    kube: Kube, kube_apiserver: Any, name: str, tmp_path: Path
) -> None:
    """May read Deployments but not write them: the ConfigMap phase lands and is recorded;
    the workload phase stops with 'forbidden', naming file, document and object."""
    failed, _ = install_as_limited_user(
        kube,
        kube_apiserver,
        name,
        tmp_path,
        verbs=["get", "list", "watch"],
        match=rf"(?s)phase .workloads..*Deployment\.apps {name}/web"
        r" from manifests/app.yaml document 2.*forbidden",
    )
    assert failed.code == "PERMISSION_DENIED"
    settings = ObjectRef("", "v1", "ConfigMap", name, "settings")
    assert kube.get(settings) is not None
    inv = inventorystore.read_inventory(
        kube, name, system_namespace=inventory.DEFAULT_SYSTEM_NAMESPACE
    )
    assert inv is not None and settings in inv.refs


def test_objects_the_user_may_not_even_read_stop_the_install_before_any_write(
    kube: Kube, kube_apiserver: Any, name: str, tmp_path: Path
) -> None:
    _, writes = install_as_limited_user(
        kube,
        kube_apiserver,
        name,
        tmp_path,
        verbs=[],
        match=rf"(?s)ownership check.*Deployment\.apps {name}/web"
        r" from manifests/app.yaml document 2.*forbidden",
    )
    assert writes == 0
    assert kube.get(ObjectRef("", "v1", "ConfigMap", name, "settings")) is None
