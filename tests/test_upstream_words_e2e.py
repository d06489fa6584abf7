"""End to end: upstream RukPak v0.16's behaviours and words, on the installed system.

RukPak is installed from ``deploy/`` by the ``standing_system`` fixture
(``tests.install_helpers``): the manager, its webhook registered by the shipped
ValidatingWebhookConfiguration, the node plugin and the standing provisioner taking
every run on the local kubelet (no pod is started for any change, checked after each
test). Each test plays one case of upstream's e2e suite (``test/e2e/
plain_provisioner_test.go``, ``crdvalidator_test.go``) and checks what upstream checks:

- a BundleDeployment targeting a Bundle whose kinds the cluster does not serve projects a
  failed installation: ``Installed=False`` ``InstallFailed`` naming every missing kind,
  no ``activeBundle``, ``Healthy=False``;
- a BundleDeployment whose Bundle fails unpacking: ``HasValidBundle=False``
  ``UnpackFailed`` (``Failed to unpack the NAME Bundle: ...``);
- an update of a CRD a BundleDeployment installed that existing custom resources would
  fail is denied by the webhook in the crdvalidator's words, a compatible one admitted;
- a deleted BundleDeployment leaves none of the CRDs it installed, and is NotFound then
  (``Orphan`` keeps them, unlabelled).
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.engine.bundle import words
from provisioner.engine.objects import OWNER_KIND, OWNER_KIND_LABEL, OWNER_LABEL, Obj, ObjectRef
from provisioner.manager import model
from provisioner.manager.acting import actuate
from rukpak.common import errors
from tests import bundles
from tests import e2e_helpers as e2e
from tests import install_helpers as inst
from tests.polling import eventually

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SUFFIX = uuid.uuid4().hex[:6]


@pytest.fixture(scope="module", name="system")
def _system(standing_system: inst.RukpakSystem) -> inst.RukpakSystem:
    """The default install (the standing provisioner): every test's."""
    return standing_system


def _push(system: inst.RukpakSystem, root: Path, docs: list[Obj], repo: str) -> str:
    (root / "manifests").mkdir(parents=True)
    (root / "manifests" / "all.yaml").write_text(yaml.safe_dump_all(docs))
    ref = f"{system.registry_host}/e2e-upwords-{SUFFIX}/{repo}:v1"
    e2e.push_bundle(root, ref)
    return ref


def _cond(system: inst.RukpakSystem, name: str, kind: str) -> tuple[str, str, str]:
    c = inst.conditions(system.kube.get(actuate.bd_ref(name))).get(kind) or {}
    return str(c.get("status")), str(c.get("reason")), str(c.get("message"))


def _installed(system: inst.RukpakSystem, name: str) -> None:
    def done() -> bool:
        status, reason, message = _cond(system, name, words.INSTALLED)
        if status == "False" and reason in words.FAILED_INSTALL_REASONS:
            pytest.fail(f"{name} failed to install: {message}")
        return (status, reason) == ("True", words.INSTALLATION_SUCCEEDED)

    eventually(done, timeout=180, what=f"{name} Installed")
    assert "Instantiated bundle" in _cond(system, name, words.INSTALLED)[2]


def _owned_crds(system: inst.RukpakSystem, name: str) -> list[str]:
    """The CRDs upstream's suite finds for BundleDeployment ``name``: its selector,
    ``util.NewBundleDeploymentLabelSelector`` (owner-kind and owner-name)."""
    selector = f"{OWNER_KIND_LABEL}={OWNER_KIND},{OWNER_LABEL}={name}"
    items, _ = system.kube.list(
        "apiextensions.k8s.io/v1", "CustomResourceDefinition", label_selector=selector
    )
    return [i["metadata"]["name"] for i in items]


def test_a_bundledeployment_targeting_an_invalid_bundle_projects_a_failed_installation(
    system: inst.RukpakSystem, tmp_path: Path
) -> None:
    """Upstream's "a BundleDeployment targets an invalid Bundle" (plain-v0:invalid-missing-crds):
    the OLM kinds are not served."""
    ns = f"olm-{SUFFIX}"
    olm = [
        ("operators.coreos.com/v1alpha1", "CatalogSource"),
        ("operators.coreos.com/v1alpha1", "ClusterServiceVersion"),
        ("operators.coreos.com/v1", "OLMConfig"),
        ("operators.coreos.com/v1", "OperatorGroup"),
    ]
    docs: list[Obj] = [bundles.namespace(ns)]
    for api_version, kind in olm:
        meta: dict[str, Any] = {"name": kind.lower()}
        if kind != "OLMConfig":
            meta["namespace"] = ns
        docs.append({"apiVersion": api_version, "kind": kind, "metadata": meta, "spec": {}})
    ref = _push(system, tmp_path / "olm", docs, "olm-apis")
    name = f"olm-apis-{SUFFIX}"
    system.kube.create(inst.bundle_deployment(name, ref))
    try:
        _, _, message = eventually(
            lambda: (
                c
                if (c := _cond(system, name, words.INSTALLED))[0] == "False"
                and c[1] == words.INSTALL_FAILED
                else None
            ),
            timeout=180,
            what=f"{name} Installed=False InstallFailed",
        )
        assert message.count(words.REQUIRED_RESOURCE) == 1, message
        for api_version, kind in olm:
            assert f'no matches for kind "{kind}" in version "{api_version}"' in message
        live = system.kube.get(actuate.bd_ref(name)) or {}
        assert not (live.get("status") or {}).get("activeBundle")
        assert _cond(system, name, words.HEALTHY)[:2] == ("False", words.INSTALLATION_STATUS_FALSE)
        assert system.kube.get(ObjectRef("", "v1", "Namespace", "", ns)) is None
    finally:
        system.kube.delete(actuate.bd_ref(name))
    eventually(lambda: system.kube.get(actuate.bd_ref(name)) is None, timeout=120, what="BD gone")


def test_a_bundledeployment_whose_bundle_fails_unpacking_has_no_valid_bundle(
    system: inst.RukpakSystem,
) -> None:
    """Upstream's invalid configMaps bundle (a ``.gitignore`` among the manifests) behind a
    BundleDeployment: ``HasValidBundle`` False, UnpackFailed, in upstream's words."""
    cm_name = f"invalid-{SUFFIX}"
    inst.configmap_bundle(
        system,
        cm_name,
        {
            "cm.yaml": yaml.safe_dump(bundles.configmap("c", "default", a="b")),
            ".gitignore": "!.gitignore\n",
        },
    )
    name = f"invalid-cm-{SUFFIX}"
    bd = inst.bundle_deployment(name, "unused")
    bd["spec"]["template"]["spec"]["source"] = inst.configmaps_source(cm_name)
    system.kube.create(bd)
    try:
        _, reason, message = eventually(
            lambda: c if (c := _cond(system, name, words.HAS_VALID_BUNDLE))[0] == "False" else None,
            timeout=180,
            what=f"{name} HasValidBundle=False",
        )
        assert reason == words.UNPACK_FAILED
        assert message.startswith("Failed to unpack the "), message
        assert "json: cannot unmarshal string into Go value" in message
        live = system.kube.get(actuate.bd_ref(name)) or {}
        assert not (live.get("status") or {}).get("activeBundle")
        # upstream v0.16 leaves Installed unset here; ours says nothing is installed
        assert _cond(system, name, words.INSTALLED)[:2] == ("False", words.INSTALL_PENDING)
        assert _cond(system, name, words.HEALTHY)[0] == "Unknown"
    finally:
        system.kube.delete(actuate.bd_ref(name))
    eventually(lambda: system.kube.get(actuate.bd_ref(name)) is None, timeout=120, what="BD gone")
    cm = ObjectRef("", "v1", "ConfigMap", inst.NAMESPACE, cm_name)
    # (refused while its generated Bundle still sources it: upstream's rule)
    eventually(lambda: system.kube.delete(cm) or True, timeout=60, what="the ConfigMap deleted")


def _widgets_bundle(
    system: inst.RukpakSystem, tmp_path: Path, group: str, ns: str
) -> tuple[str, Obj]:
    crd = bundles.crd(group)
    return _push(system, tmp_path / group, [bundles.namespace(ns), crd], group), crd


def _patch_versions(
    system: inst.RukpakSystem, crd: Obj, props: dict[str, Any], **extra: Any
) -> Obj:
    """The CRD's one version with ``props`` as spec's properties (and ``extra`` in spec's
    schema), patched as any user would."""
    version = dict(crd["spec"]["versions"][0])
    spec_schema = {"type": "object", "properties": props, **extra}
    version["schema"] = {"openAPIV3Schema": {"type": "object", "properties": {"spec": spec_schema}}}
    ref = ObjectRef(
        "apiextensions.k8s.io", "v1", "CustomResourceDefinition", "", crd["metadata"]["name"]
    )
    return system.kube.merge_patch(ref, {"spec": {"versions": [version]}})


def test_a_crd_update_breaking_existing_resources_is_denied_in_upstreams_words(
    system: inst.RukpakSystem, tmp_path: Path
) -> None:
    group = f"deny{SUFFIX}.example.com"
    ns = f"deny-{SUFFIX}"
    ref, crd = _widgets_bundle(system, tmp_path, group, ns)
    name = f"deny-{SUFFIX}"
    crd_name = crd["metadata"]["name"]
    system.kube.create(inst.bundle_deployment(name, ref))
    try:
        _installed(system, name)
        widget = bundles.widget(group, "v1", "existing", {"size": 3})
        widget["metadata"]["namespace"] = ns
        eventually(lambda: system.kube.create(widget), timeout=30, what="the Widget created")

        # a new required field the existing Widget lacks
        with pytest.raises(errors.RukpakError) as required:
            _patch_versions(
                system,
                crd,
                {"size": {"type": "integer"}, "colour": {"type": "string"}},
                required=["colour"],
            )
        message = required.value.message
        assert 'admission webhook "crd-validation.core.rukpak.io" denied the request: ' in message
        assert (
            f'failed to validate safety of UPDATE for CRD "{crd_name}" (NOTE: to disable this '
            'validation, set the "core.rukpak.io/safe-crd-upgrade-validation" annotation to '
            f'"false"): error validating existing CRs against new CRD\'s schema for '
            f'"{crd_name}": existing custom object {ns}/existing failed validation for new '
            "schema version v1: "
        ) in message, message
        assert "colour" in message
        # a type change
        with pytest.raises(errors.RukpakError) as typed:
            _patch_versions(system, crd, {"size": {"type": "string"}})
        assert "error validating existing CRs against new CRD's schema" in typed.value.message
        assert "size" in typed.value.message
        # a compatible update: a new optional field
        updated = _patch_versions(
            system, crd, {"size": {"type": "integer"}, "colour": {"type": "string"}}
        )
        props = updated["spec"]["versions"][0]["schema"]["openAPIV3Schema"]["properties"]
        assert "colour" in props["spec"]["properties"]
    finally:
        system.kube.delete(actuate.bd_ref(name))
    eventually(lambda: not _owned_crds(system, name), timeout=120, what="its CRD gone")


@pytest.mark.parametrize("policy", ["Delete", "Orphan"])
def test_a_deleted_bundledeployment_leaves_no_crd_and_is_not_found(
    system: inst.RukpakSystem, tmp_path: Path, policy: str
) -> None:
    """Upstream's "a BundleDeployment has been deleted": the CRDs labelled as its own are
    eventually gone, and at that moment the BundleDeployment is NotFound."""
    group = f"{policy.lower()}{SUFFIX}.example.com"
    ns = f"{policy.lower()}-{SUFFIX}"
    ref, crd = _widgets_bundle(system, tmp_path, group, ns)
    name = f"crds-{policy.lower()}-{SUFFIX}"
    system.kube.create(inst.bundle_deployment(name, ref, deletionPolicy=policy))
    _installed(system, name)
    assert _owned_crds(system, name) == [crd["metadata"]["name"]]

    system.kube.delete(actuate.bd_ref(name))
    eventually(
        lambda: not _owned_crds(system, name), timeout=120, what="no CRD labelled as its own"
    )
    assert system.kube.get(actuate.bd_ref(name)) is None  # upstream's AfterEach, right then
    live = system.kube.get(
        ObjectRef(
            "apiextensions.k8s.io", "v1", "CustomResourceDefinition", "", crd["metadata"]["name"]
        )
    )
    if policy == "Delete":
        assert live is None
    else:
        assert live is not None and not live["metadata"].get("deletionTimestamp")
        labels = live["metadata"].get("labels") or {}
        assert OWNER_LABEL not in labels and OWNER_KIND_LABEL not in labels
        system.kube.delete(ObjectRef.of(live))


REGISTRY_FIXTURE = Path(__file__).parent / "data" / "registry-v1" / "cache-operator"
CSV_FILE = "manifests/cache-operator.clusterserviceversion.yaml"


def test_a_registry_bundle_without_all_namespaces_fails_in_upstreams_words(
    system: inst.RukpakSystem, tmp_path: Path
) -> None:
    """Upstream v0.16's registry provisioner suite: the conversion's reason right after its
    prefix; where (the CSV, its document and line) follows."""
    root = tmp_path / "cache-operator"
    shutil.copytree(REGISTRY_FIXTURE, root)
    csv = yaml.safe_load((root / CSV_FILE).read_text())
    csv["spec"]["installModes"] = [
        {"type": "OwnNamespace", "supported": True},
        {"type": "AllNamespaces", "supported": False},
    ]
    (root / CSV_FILE).write_text(yaml.safe_dump(csv))
    ref = f"{system.registry_host}/e2e-upwords-{SUFFIX}/own-namespace:v1"
    e2e.push_bundle(root, ref)
    name = f"own-namespace-{SUFFIX}"
    system.kube.create(bundles.bundle_doc(name, ref, cls=model.REGISTRY_CLASS))
    try:

        def failing() -> Obj | None:
            live = system.kube.get(actuate.bundle_ref(name)) or {}
            return live if (live.get("status") or {}).get("phase") == "Failing" else None

        live = eventually(failing, timeout=180, what=f"Bundle {name} Failing")
        unpacked = inst.conditions(live)[words.UNPACKED]
        assert (unpacked["status"], unpacked["reason"]) == ("False", words.UNPACK_FAILED)
        assert (
            words.conversion_failed(
                "AllNamespace install mode must be enabled", f"{CSV_FILE} document 1 (line 1)"
            )
            in unpacked["message"]
        ), unpacked["message"]
    finally:
        system.kube.delete(actuate.bundle_ref(name))
