"""registry+v1 bundles convert to plain objects as upstream RukPak v0.16 converts them.

The bundle under ``tests/data/registry-v1/cache-operator`` is shaped like an
operator-sdk bundle: three CRDs, a CSV with permissions, cluster permissions
and three deployments, a metrics Service and a metrics-reader ClusterRole.
Refusals carry upstream's messages; hostile input gets an error naming the file.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
import yaml

from provisioner.engine.bundle import formats, formats_registry
from provisioner.engine.errors import BundleInvalid
from tests.bundles import role_binding

FIXTURE = Path(__file__).parent / "data" / "registry-v1" / "cache-operator"
CSV_FILE = "manifests/cache-operator.clusterserviceversion.yaml"
NS = "cache-operator-system"
MANAGER_SA = "cache-operator-controller-manager"
EXPORTER_SA = "cache-operator-exporter"
# Names computed independently with upstream's algorithm in Go (encoding/json of
# StrategyDeploymentPermissions, sha224, base36, 63-character cut of the base).
MANAGER_CLUSTER = "cache-operator.v0.-13s6y7z0dnokzizicniptqdzroip5e76glyefsbjd3yf"
EXPORTER_CLUSTER = "cache-operator.v0.-1bngcyrx8wzluhsv7l82gjlmi2fu2vpxwf5dr98q5uqd"
MANAGER_PROMOTED = "cache-operator.v0.-1a30b6kgepsc5gjq582irffs6va8d8b1z3ipfy90trpq"


def read_yaml(path: Path) -> Any:
    return yaml.safe_load(path.read_text())


def load(root: Path) -> list[dict[str, Any]]:
    return [m.obj for m in formats.load(root, format="registry+v1").manifests]


def copy_fixture(tmp_path: Path) -> Path:
    root = tmp_path / "bundle"
    shutil.copytree(FIXTURE, root)
    return root


def edit_csv(root: Path, change: Callable[[dict[str, Any]], None]) -> None:
    path = root / CSV_FILE
    csv = read_yaml(path)
    change(csv)
    path.write_text(yaml.safe_dump(csv))


def refusal(root: Path) -> str:
    """Why the bundle at ``root`` is refused, after upstream's prefix (every refusal has it)."""
    with pytest.raises(BundleInvalid) as info:
        formats.load(root, format="registry+v1")
    prefix = "convert registry+v1 bundle to plain+v0 bundle: "
    assert str(info.value).startswith(prefix), str(info.value)
    return str(info.value)[len(prefix) :]


def binding(name: str, sa: str) -> dict[str, Any]:
    return role_binding(name, name, [{"kind": "ServiceAccount", "namespace": NS, "name": sa}])


def suggest_namespace(root: Path, namespace: str) -> None:
    """Set the CSV's ``operatorframework.io/suggested-namespace`` annotation."""
    edit_csv(
        root,
        lambda csv: csv["metadata"]["annotations"].update(
            {"operatorframework.io/suggested-namespace": namespace}
        ),
    )


def test_registered_as_a_bundle_format() -> None:
    assert "registry+v1" in formats.names()


def test_operator_bundle_converts_to_exactly_the_expected_objects() -> None:
    csv = read_yaml(FIXTURE / CSV_FILE)
    strategy = csv["spec"]["install"]["spec"]
    manifests = FIXTURE / "manifests"
    csv_annotations = csv["metadata"]["annotations"]
    service = read_yaml(
        manifests / "cache-operator-controller-manager-metrics-service_v1_service.yaml"
    )
    service["metadata"]["namespace"] = NS

    def deployment(index: int, annotations: dict[str, str], labels: dict[str, str] | None) -> Any:
        spec = strategy["deployments"][index]
        meta: dict[str, Any] = {"namespace": NS, "name": spec["name"]}
        if labels:
            meta["labels"] = labels
        meta["annotations"] = {**csv_annotations, **annotations, "olm.targetNamespaces": ""}
        return {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": meta,
            "spec": spec["spec"],
        }

    expected = [
        {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NS}},
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"namespace": NS, "name": MANAGER_SA},
        },
        {
            "apiVersion": "v1",
            "kind": "ServiceAccount",
            "metadata": {"namespace": NS, "name": EXPORTER_SA},
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": MANAGER_CLUSTER},
            "rules": strategy["clusterPermissions"][0]["rules"],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": EXPORTER_CLUSTER},
            "rules": [{"verbs": ["get", "list"], "apiGroups": [""], "resources": ["pods"]}],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": MANAGER_PROMOTED},
            "rules": strategy["permissions"][0]["rules"],
        },
        binding(MANAGER_CLUSTER, MANAGER_SA),
        binding(EXPORTER_CLUSTER, EXPORTER_SA),
        binding(MANAGER_PROMOTED, MANAGER_SA),
        read_yaml(manifests / "cache.example.com_backups.yaml"),
        read_yaml(manifests / "cache.example.com_memcacheds.yaml"),
        read_yaml(manifests / "cache.example.com_redises.yaml"),
        service,
        read_yaml(
            manifests
            / "cache-operator-metrics-reader_rbac.authorization.k8s.io_v1_clusterrole.yaml"
        ),
        deployment(
            0,
            {"kubectl.kubernetes.io/default-container": "manager"},
            {"control-plane": "controller-manager"},
        ),
        deployment(1, {}, None),
        deployment(2, {}, None),
    ]
    assert load(FIXTURE) == expected


def test_generated_objects_point_back_at_the_csv_and_passed_objects_at_their_file() -> None:
    bundle = formats.load(FIXTURE, format="registry+v1")
    files = {(m.obj["kind"], m.source.file) for m in bundle.manifests}
    assert ("Deployment", CSV_FILE) in files
    assert ("ClusterRoleBinding", CSV_FILE) in files
    assert ("CustomResourceDefinition", "manifests/cache.example.com_redises.yaml") in files
    assert bundle.format == "registry+v1"


def test_suggested_namespace_annotation_is_the_install_namespace(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path)
    suggest_namespace(root, "caches")
    objs = load(root)
    assert objs[0] == {"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": "caches"}}
    namespaced = [o for o in objs if "namespace" in o["metadata"]]
    assert {o["metadata"]["namespace"] for o in namespaced} == {"caches"}
    assert all(
        s["namespace"] == "caches"
        for o in objs
        if o["kind"] == "ClusterRoleBinding"
        for s in o["subjects"]
    )


def test_pod_template_annotations_win_over_the_csvs(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path)

    def change(csv: dict[str, Any]) -> None:
        template = csv["spec"]["install"]["spec"]["deployments"][0]["spec"]["template"]
        template["metadata"]["annotations"]["capabilities"] = "Full Lifecycle"

    edit_csv(root, change)
    manager = next(o for o in load(root) if o["kind"] == "Deployment")
    assert manager["metadata"]["annotations"]["capabilities"] == "Full Lifecycle"
    assert manager["metadata"]["annotations"]["olm.targetNamespaces"] == ""


# Upstream's refusals, with upstream's messages (including its "Defintions" typo), and ours.


def _no_all_namespaces(csv: dict[str, Any]) -> None:
    csv["spec"]["installModes"] = [
        {"type": "OwnNamespace", "supported": True},
        {"type": "AllNamespaces", "supported": False},
    ]


def _no_install_modes(csv: dict[str, Any]) -> None:
    del csv["spec"]["installModes"]


def _api_service(csv: dict[str, Any]) -> None:
    csv["spec"]["apiservicedefinitions"] = {
        "owned": [{"group": "metrics.example.com", "version": "v1", "kind": "Sample", "name": "s"}]
    }


def _webhook(csv: dict[str, Any]) -> None:
    csv["spec"]["webhookdefinitions"] = [
        {"type": "ValidatingAdmissionWebhook", "generateName": "vmemcached.kb.io"}
    ]


def _no_deployments(csv: dict[str, Any]) -> None:
    csv["spec"]["install"]["spec"]["deployments"] = []


def _verbs_not_a_list(csv: dict[str, Any]) -> None:
    csv["spec"]["install"]["spec"]["permissions"][0]["rules"][0]["verbs"] = "get"


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (_no_all_namespaces, "AllNamespace install mode must be enabled"),
        (_no_install_modes, "AllNamespace install mode must be enabled"),
        (_api_service, "apiServiceDefintions are not supported"),
        (_webhook, "webhookDefinitions are not supported"),
        # and ours, for what upstream's conversion would choke on later
        (
            _no_deployments,
            "spec.install.spec.deployments is empty; the operator needs a Deployment",
        ),
        (
            _verbs_not_a_list,
            "spec.install.spec.permissions[0].rules[0].verbs must be a list of strings",
        ),
    ],
)
def test_csv_refusals_say_what_is_wrong(
    tmp_path: Path, change: Callable[[dict[str, Any]], None], message: str
) -> None:
    root = copy_fixture(tmp_path)
    edit_csv(root, change)
    # upstream's prefix, then its reason (or ours) at once, then where: the CSV
    assert refusal(root) == f"{message} ({CSV_FILE} document 1 (line 1))"


def test_a_conversion_failure_reads_as_upstream_wrote_it_then_where(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path)
    edit_csv(root, _no_all_namespaces)
    with pytest.raises(BundleInvalid) as refused:
        formats.load(root, format="registry+v1")
    # upstream v0.16's suite: the prefix immediately followed by the reason
    assert str(refused.value).startswith(
        "convert registry+v1 bundle to plain+v0 bundle: AllNamespace install mode must be enabled"
    )
    assert str(refused.value).endswith(f"({CSV_FILE} document 1 (line 1))")


def test_unsupported_kinds_are_refused_by_name(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path)
    (root / "manifests" / "event.yaml").write_text(
        "apiVersion: v1\nkind: Event\nmetadata:\n  name: hello\n"
    )
    assert refusal(root) == (
        "bundle contains unsupported resource: Name: hello, Kind: Event "
        "(manifests/event.yaml document 1 (line 1))"
    )


def test_cluster_scoped_extras_lose_a_namespace_and_namespaced_ones_move(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path)
    (root / "manifests" / "extras.yaml").write_text(
        "apiVersion: scheduling.k8s.io/v1\nkind: PriorityClass\n"
        "metadata: {name: cache-critical, namespace: stray}\nvalue: 1000\n---\n"
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: cache-config}\ndata: {a: b}\n"
    )
    objs = {o["kind"]: o for o in load(root)}
    assert objs["PriorityClass"]["metadata"] == {"name": "cache-critical"}
    assert objs["ConfigMap"]["metadata"] == {"name": "cache-config", "namespace": NS}


def test_v1beta1_crds_are_refused_with_the_fix(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path)
    path = root / "manifests" / "cache.example.com_backups.yaml"
    path.write_text(
        path.read_text().replace("apiextensions.k8s.io/v1", "apiextensions.k8s.io/v1beta1")
    )
    message = refusal(root)
    assert message.endswith("(manifests/cache.example.com_backups.yaml document 1 (line 1))")
    assert "convert it to apiextensions.k8s.io/v1" in message


def test_an_object_the_conversion_also_generates_is_refused_as_a_duplicate(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path)
    (root / "manifests" / "sa.yaml").write_text(
        f"apiVersion: v1\nkind: ServiceAccount\nmetadata:\n  name: {MANAGER_SA}\n"
    )
    message = refusal(root)
    assert message.startswith(f"ServiceAccount {NS}/{MANAGER_SA} is defined twice")
    assert message.endswith("(manifests/sa.yaml document 1 (line 1))")
    assert f"first from {CSV_FILE}" in message


# Hostile or broken input.


def test_missing_annotations_file_is_named(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path)
    (root / "metadata" / "annotations.yaml").unlink()
    message = refusal(root)
    assert message.startswith("missing; a registry+v1 bundle names its package there")
    assert message.endswith("(metadata/annotations.yaml)")


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("annotations: [unclosed\n", "invalid YAML:"),
        ("- a list\n", "expected a mapping with an 'annotations' key"),
        (
            "annotations:\n  operators.operatorframework.io.bundle.channels.v1: alpha\n",
            "annotation operators.operatorframework.io.bundle.package.v1 is missing",
        ),
        (
            "annotations:\n  operators.operatorframework.io.bundle.mediatype.v1: plain+v0\n"
            "  operators.operatorframework.io.bundle.package.v1: x\n",
            "operators.operatorframework.io.bundle.mediatype.v1 is 'plain+v0', not 'registry+v1'",
        ),
    ],
)
def test_bad_annotations_are_named(tmp_path: Path, text: str, message: str) -> None:
    root = copy_fixture(tmp_path)
    (root / "metadata" / "annotations.yaml").write_text(text)
    refused = refusal(root)
    assert refused.startswith(message) and refused.endswith("(metadata/annotations.yaml)")


def test_a_csv_that_is_not_yaml_is_named_with_its_line(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path)
    (root / CSV_FILE).write_text("apiVersion: operators.coreos.com/v1alpha1\nkind: [oops\n")
    assert refusal(root).startswith(f"{CSV_FILE} document 1 (line 3): invalid YAML:")


def test_two_csvs_are_refused_naming_both(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path)
    shutil.copy(root / CSV_FILE, root / "manifests" / "z-second.clusterserviceversion.yaml")
    message = refusal(root)
    assert "exactly one ClusterServiceVersion; found 2" in message
    assert CSV_FILE in message and "manifests/z-second.clusterserviceversion.yaml" in message


def test_a_bundle_without_a_csv_is_refused(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path)
    (root / CSV_FILE).unlink()
    assert refusal(root) == (
        "a registry+v1 bundle needs one ClusterServiceVersion; found none (manifests/)"
    )


def test_an_invalid_install_namespace_is_refused(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path)
    suggest_namespace(root, "Not_A_Namespace")
    assert "install namespace 'Not_A_Namespace'" in refusal(root)


def test_subdirectories_in_manifests_get_upstreams_message(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path)
    (root / "manifests" / "extra").mkdir()
    assert refusal(root) == (
        'subdirectories are not allowed within the "manifests" directory of the '
        'bundle image filesystem: found "manifests/extra"'
    )


@pytest.mark.parametrize(
    "link",
    ["manifests/escape.yaml", "metadata/annotations.yaml"],
)
def test_symlinks_out_of_the_bundle_are_refused(tmp_path: Path, link: str) -> None:
    root = copy_fixture(tmp_path)
    outside = tmp_path / "outside.yaml"
    outside.write_text("apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: stolen\n")
    (root / link).unlink(missing_ok=True)
    (root / link).symlink_to(outside)
    refused = refusal(root)
    assert refused.startswith("leads outside the bundle") and refused.endswith(f"({link})")


def test_a_manifests_directory_linked_out_of_the_bundle_is_refused(tmp_path: Path) -> None:
    root = copy_fixture(tmp_path)
    elsewhere = tmp_path / "elsewhere"
    shutil.move(root / "manifests", elsewhere)
    (root / "manifests").symlink_to(elsewhere)
    refused = refusal(root)
    assert refused.startswith("leads outside the bundle") and refused.endswith("(manifests)")


def test_a_plain_bundle_loaded_as_registry_says_what_is_missing(tmp_path: Path) -> None:
    (tmp_path / "manifests").mkdir()
    (tmp_path / "manifests" / "cm.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n"
    )
    assert "is this a plain+v0 bundle?" in refusal(tmp_path)


@pytest.mark.parametrize(
    ("base", "permission", "name"),
    [
        # Expected values computed with upstream's Go algorithm (see FIXTURE names above).
        (
            "short",
            {"serviceAccountName": "", "rules": None},
            "short-13nr4ju4s7dcvb397jw50p5sf63zsmvshg28rk87pxom",
        ),
        (
            "x" * 70,
            {
                "serviceAccountName": "a<b>&c\u2028é",
                "rules": [{"verbs": [], "apiGroups": [""], "resourceNames": ["<&>"]}],
            },
            "xxxxxxxxxxxxxxxxxxx-2husdyknjxvgb3n6h60ccl29u4ja9q1449sn4e0t059",
        ),
        (
            "y" * 20,
            {"serviceAccountName": "s", "rules": [{"verbs": None, "nonResourceURLs": ["/m"]}]},
            "yyyyyyyyyyyyyyyyyy-2e89fneavqof3anja8tw576932fnx4o58us4ioqjrx3e",
        ),
    ],
)
def test_generated_names_match_upstreams_go_hash(
    base: str, permission: dict[str, Any], name: str
) -> None:
    assert formats_registry.generate_name(base, permission) == name
