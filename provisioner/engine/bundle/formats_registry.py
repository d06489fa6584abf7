"""The ``registry+v1`` bundle format: an OLM operator bundle, converted to plain objects.

A ``formats`` loader, like ``formats_plain``: the bundle directory (an OLM
bundle image's tree: ``metadata/annotations.yaml`` and ``manifests/`` with one
ClusterServiceVersion, CRDs and a few other objects) becomes the plain objects
the rest of the engine orders and applies. The conversion follows upstream
RukPak v0.16's ``internal/convert`` (``RegistryV1ToPlain`` with no install
namespace and no target namespaces), its rules and its messages:

- the install namespace is the CSV's ``operatorframework.io/suggested-namespace``
  annotation, else ``<package>-system``; a Namespace object for it comes first;
- the CSV must support the ``AllNamespaces`` install mode ("AllNamespace install
  mode must be enabled"); the target namespaces are then all (``""``);
- owned API service definitions and webhook definitions are refused;
- ``permissions`` become ClusterRoles and ClusterRoleBindings too (all-namespaces
  mode promotes them; upstream's extra "namespaces get/list/watch" rule is never
  actually added by upstream, so it is not added here either), named
  ``<csv>-<serviceaccount>-<hash of the permission>`` exactly as upstream names them;
- one ServiceAccount per deployment and per permission (``default`` is never created);
- one Deployment per ``spec.install.spec.deployments`` entry, with the CSV's
  annotations merged under the pod template's and ``olm.targetNamespaces``;
- CRDs pass through; other objects must be of a kind OLM supports
  (operator-registry's list) and namespaced ones move into the install namespace.

Beyond upstream (which would install something half-broken or nothing): exactly
one CSV, at least one deployment, a package name, files that stay inside the
bundle, and duplicate objects are refused with messages that name the file.
"""

from __future__ import annotations

import copy
import hashlib
import json
import re
from pathlib import Path
from typing import Any

import yaml

from provisioner.engine.bundle import formats_plain, words, yamlbounds
from provisioner.engine.bundle.manifest import Bundle, Manifest, Source
from provisioner.engine.errors import BundleInvalid
from provisioner.engine.objects import Obj, ObjectRef

NAME = "registry+v1"
ANNOTATIONS_FILE = "metadata/annotations.yaml"
PACKAGE_ANNOTATION = "operators.operatorframework.io.bundle.package.v1"
MEDIATYPE_ANNOTATION = "operators.operatorframework.io.bundle.mediatype.v1"
SUGGESTED_NAMESPACE_ANNOTATION = "operatorframework.io/suggested-namespace"
TARGET_NAMESPACES_ANNOTATION = "olm.targetNamespaces"
MAX_NAME_LENGTH = 63

SUPPORTED_KINDS: dict[str, bool] = {
    # operator-registry v1.28 pkg/lib/bundle supportedResources: kind -> namespaced
    "ClusterServiceVersion": True,
    "CustomResourceDefinition": False,
    "ClusterRole": False,
    "ClusterRoleBinding": False,
    "Service": True,
    "ServiceAccount": True,
    "Role": True,
    "RoleBinding": True,
    "PrometheusRule": True,
    "ServiceMonitor": True,
    "Secret": True,
    "ConfigMap": True,
    "PodDisruptionBudget": True,
    "PriorityClass": False,
    "VerticalPodAutoscaler": False,
    "ConsoleYAMLSample": False,
    "ConsoleQuickStart": False,
    "ConsoleCLIDownload": False,
    "ConsoleLink": False,
}

_DNS_LABEL = re.compile(r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$")
_POLICY_RULE_FIELDS = ("verbs", "apiGroups", "resources", "resourceNames", "nonResourceURLs")


CONVERT_PREFIX = words.CONVERT_PREFIX


def _invalid(where: object, reason: str) -> BundleInvalid:
    """A refusal: the reason first (upstream's where it has one), then where it is."""
    return BundleInvalid(f"{reason} ({where})")


def load(root: Path) -> Bundle:
    """Read the registry+v1 bundle at ``root`` and convert it to plain objects; a failure
    reads ``convert registry+v1 bundle to plain+v0 bundle: REASON (WHERE)``
    (``words.conversion_failed``): upstream's prefix and reason, then our location."""
    try:
        return _load(root)
    except BundleInvalid as err:
        raise BundleInvalid(words.conversion_failed(err.message)) from None


def _load(root: Path) -> Bundle:
    base = root.resolve()
    package = _package_name(base)
    manifests = _read_manifests(base)
    yamlbounds.check_count(len(manifests))
    csvs = [m for m in manifests if m.obj["kind"] == "ClusterServiceVersion"]
    if not csvs:
        raise _invalid(
            "manifests/", "a registry+v1 bundle needs one ClusterServiceVersion; found none"
        )
    if len(csvs) > 1:
        where = ", ".join(str(m.source) for m in csvs)
        raise _invalid(
            f"manifests/: {where}",
            f"a registry+v1 bundle holds exactly one ClusterServiceVersion; found {len(csvs)}",
        )
    others = [m for m in manifests if m.obj["kind"] != "ClusterServiceVersion"]
    out = convert(package, csvs[0], others)
    _refuse_duplicates(out)
    return Bundle(format=NAME, manifests=tuple(out))


def _inside(base: Path, rel: str) -> Path:
    """``base/rel`` resolved; refuses paths that leave the bundle (symlinks included)."""
    path = (base / rel).resolve()
    if path != base and base not in path.parents:
        raise _invalid(rel, f"leads outside the bundle (to {path}); bundles are self-contained")
    return path


def _read_text(base: Path, rel: str) -> str:
    path = _inside(base, rel)
    if not path.is_file():
        raise _invalid(rel, "not a regular file")
    yamlbounds.check_size(rel, path.stat().st_size)
    try:
        return path.read_text(encoding="utf-8")
    except UnicodeDecodeError as err:
        raise _invalid(rel, f"not UTF-8 text ({err})") from None


def _package_name(base: Path) -> str:
    if not (base / ANNOTATIONS_FILE).exists():
        raise _invalid(
            ANNOTATIONS_FILE,
            f"missing; a registry+v1 bundle names its package there "
            f"({PACKAGE_ANNOTATION}); is this a plain+v0 bundle?",
        )
    text = _read_text(base, ANNOTATIONS_FILE)
    yamlbounds.check(ANNOTATIONS_FILE, text)
    try:
        doc = yaml.safe_load(text)
    except yaml.YAMLError as err:
        raise _invalid(ANNOTATIONS_FILE, f"invalid YAML: {err}") from None
    annotations = doc.get("annotations") if isinstance(doc, dict) else None
    if not isinstance(annotations, dict):
        raise _invalid(ANNOTATIONS_FILE, "expected a mapping with an 'annotations' key")
    mediatype = annotations.get(MEDIATYPE_ANNOTATION)
    if mediatype is not None and mediatype != NAME:
        raise _invalid(
            ANNOTATIONS_FILE,
            f"{MEDIATYPE_ANNOTATION} is {mediatype!r}, not {NAME!r}; "
            "use the provisioner class for that format",
        )
    package = annotations.get(PACKAGE_ANNOTATION)
    if not isinstance(package, str) or not package:
        raise _invalid(ANNOTATIONS_FILE, f"annotation {PACKAGE_ANNOTATION} is missing")
    return package


def _read_manifests(base: Path) -> list[Manifest]:
    manifests_dir = _inside(base, "manifests")
    if not manifests_dir.is_dir():
        raise _invalid("manifests/", "a registry+v1 bundle must contain a manifests/ directory")
    out: list[Manifest] = []
    for rel, entry in formats_plain.manifest_entries(manifests_dir):
        if entry.is_dir():
            raise BundleInvalid(words.subdirectory(rel, prefix=""))
        out.extend(formats_plain.parse(rel, _read_text(base, rel)))
    return out


def convert(package: str, csv_manifest: Manifest, others: list[Manifest]) -> list[Manifest]:
    """Upstream's ``Convert(bundle, "", nil)``: the plain objects, in upstream's order."""
    csv = csv_manifest.obj
    src = csv_manifest.source
    meta = csv["metadata"]
    csv_annotations = _string_map(meta.get("annotations"), src, "metadata.annotations")
    namespace = csv_annotations.get(SUGGESTED_NAMESPACE_ANNOTATION) or f"{package}-system"
    if not _DNS_LABEL.match(namespace) or len(namespace) > MAX_NAME_LENGTH:
        raise _invalid(
            src,
            f"install namespace {namespace!r} (from the package name or the "
            f"{SUGGESTED_NAMESPACE_ANNOTATION} annotation) is not a valid namespace name",
        )
    spec = _mapping(csv.get("spec"), src, "spec")
    modes = {
        m.get("type")
        for m in _list(spec.get("installModes"), src, "spec.installModes")
        if isinstance(m, dict) and m.get("supported") is True
    }
    if "AllNamespaces" not in modes:
        raise _invalid(src, "AllNamespace install mode must be enabled")
    target_namespaces = [""]
    api_services = _mapping(spec.get("apiservicedefinitions"), src, "spec.apiservicedefinitions")
    if _list(api_services.get("owned"), src, "spec.apiservicedefinitions.owned"):
        raise _invalid(src, "apiServiceDefintions are not supported")
    if _list(spec.get("webhookdefinitions"), src, "spec.webhookdefinitions"):
        raise _invalid(src, "webhookDefinitions are not supported")

    install = _mapping(spec.get("install"), src, "spec.install")
    strategy = _mapping(install.get("spec"), src, "spec.install.spec")
    deployment_specs = _list(strategy.get("deployments"), src, "spec.install.spec.deployments")
    if not deployment_specs:
        raise _invalid(
            src, "spec.install.spec.deployments is empty; the operator needs a Deployment"
        )

    def made(obj: Obj) -> Manifest:
        return Manifest(obj=obj, source=src)

    deployments: list[Obj] = []
    service_accounts: dict[str, Obj] = {}
    for i, dep in enumerate(deployment_specs):
        deployments.append(_deployment(dep, i, src, namespace, csv_annotations, target_namespaces))
        pod_spec = deployments[-1]["spec"].get("template", {}).get("spec") or {}
        sa = _sa_name(pod_spec.get("serviceAccountName"))
        service_accounts[sa] = _service_account(namespace, sa)

    permissions = _permissions(strategy, "permissions", src)
    cluster_permissions = _permissions(strategy, "clusterPermissions", src)
    for permission in permissions + cluster_permissions:
        sa = _sa_name(permission["serviceAccountName"])
        service_accounts.setdefault(sa, _service_account(namespace, sa))
    # All-namespaces mode (the only one upstream v0.16 accepts) promotes permissions.
    cluster_permissions = cluster_permissions + permissions

    cluster_roles: list[Obj] = []
    cluster_role_bindings: list[Obj] = []
    for permission in cluster_permissions:
        sa = _sa_name(permission["serviceAccountName"])
        name = generate_name(f"{meta['name']}-{sa}", permission)
        cluster_roles.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRole",
                "metadata": {"name": name},
                "rules": permission["rules"],
            }
        )
        cluster_role_bindings.append(
            {
                "apiVersion": "rbac.authorization.k8s.io/v1",
                "kind": "ClusterRoleBinding",
                "metadata": {"name": name},
                "subjects": [{"kind": "ServiceAccount", "namespace": namespace, "name": sa}],
                "roleRef": {
                    "apiGroup": "rbac.authorization.k8s.io",
                    "kind": "ClusterRole",
                    "name": name,
                },
            }
        )

    out = [made({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": namespace}})]
    out += [made(sa) for name, sa in sorted(service_accounts.items()) if name != "default"]
    out += [made(obj) for obj in cluster_roles + cluster_role_bindings]
    crds = [m for m in others if m.obj["kind"] == "CustomResourceDefinition"]
    for m in crds:
        if m.obj["apiVersion"] != "apiextensions.k8s.io/v1":
            raise _invalid(
                m.source,
                f"CustomResourceDefinition {m.ref.name} uses {m.obj['apiVersion']}; "
                "convert it to apiextensions.k8s.io/v1 (v1beta1 is no longer served)",
            )
    out += crds
    for m in others:
        if m.obj["kind"] == "CustomResourceDefinition":
            continue
        out.append(_other(m, namespace))
    out += [made(obj) for obj in deployments]
    return out


def generate_name(base: str, permission: Obj) -> str:
    """Upstream's ``generateName``: ``base-<base36 sha224 of the permission's Go JSON>``."""
    encoded = _go_json(permission) + "\n"  # json.Encoder ends every value with a newline
    hash_str = sha224_base36(encoded)
    if len(base) + len(hash_str) > MAX_NAME_LENGTH:
        base = base[: MAX_NAME_LENGTH - len(hash_str) - 1]
    return f"{base}-{hash_str}"


def _go_json(value: Any) -> str:
    """``encoding/json`` output for already-ordered data: compact, HTML characters escaped."""
    text = json.dumps(value, separators=(",", ":"), ensure_ascii=False)
    for char, escaped in (
        ("<", "\\u003c"),
        (">", "\\u003e"),
        ("&", "\\u0026"),
        ("\u2028", "\\u2028"),
        ("\u2029", "\\u2029"),
    ):
        text = text.replace(char, escaped)
    return text


def sha224_base36(text: str) -> str:
    """Upstream's name hash: the sha224 of ``text`` (UTF-8) as a base-36 number, as Go's
    ``big.Int.Text(36)`` writes it (also the manager's BundleDeployment template hash)."""
    n = int.from_bytes(hashlib.sha224(text.encode("utf-8")).digest(), "big")
    digits = "0123456789abcdefghijklmnopqrstuvwxyz"
    out = ""
    while n:
        n, r = divmod(n, 36)
        out = digits[r] + out
    return out or "0"


def _permissions(strategy: Obj, key: str, src: Source) -> list[Obj]:
    """The permissions as Go's typed structs would hold them: field order, omitempty."""
    out: list[Obj] = []
    for i, raw in enumerate(_list(strategy.get(key), src, f"spec.install.spec.{key}")):
        where = f"spec.install.spec.{key}[{i}]"
        item = _mapping(raw, src, where)
        sa = item.get("serviceAccountName") or ""
        if not isinstance(sa, str):
            raise _invalid(src, f"{where}.serviceAccountName must be a string")
        rules: list[Obj] | None = None
        if item.get("rules") is not None:
            rules = [
                _policy_rule(rule, src, f"{where}.rules[{j}]")
                for j, rule in enumerate(_list(item["rules"], src, f"{where}.rules"))
            ]
        out.append({"serviceAccountName": sa, "rules": rules})
    return out


def _policy_rule(raw: Any, src: Source, where: str) -> Obj:
    rule = _mapping(raw, src, where)
    out: Obj = {"verbs": None}
    for field in _POLICY_RULE_FIELDS:
        value = rule.get(field)
        if value is None:
            continue
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise _invalid(src, f"{where}.{field} must be a list of strings")
        if value or field == "verbs":
            out[field] = list(value)
    return out


def _deployment(
    raw: Any,
    index: int,
    src: Source,
    namespace: str,
    csv_annotations: dict[str, str],
    target_namespaces: list[str],
) -> Obj:
    where = f"spec.install.spec.deployments[{index}]"
    dep = _mapping(raw, src, where)
    name = dep.get("name")
    if not isinstance(name, str) or not name:
        raise _invalid(src, f"{where}.name is missing")
    spec = copy.deepcopy(_mapping(dep.get("spec"), src, f"{where}.spec"))
    template = _mapping(spec.get("template"), src, f"{where}.spec.template")
    template_meta = _mapping(template.get("metadata"), src, f"{where}.spec.template.metadata")
    annotations = dict(csv_annotations)
    annotations.update(
        _string_map(template_meta.get("annotations"), src, f"{where}.spec.template annotations")
    )
    annotations[TARGET_NAMESPACES_ANNOTATION] = ",".join(target_namespaces)
    metadata: Obj = {"namespace": namespace, "name": name}
    labels = _string_map(dep.get("label"), src, f"{where}.label")
    if labels:
        metadata["labels"] = labels
    metadata["annotations"] = annotations
    return {"apiVersion": "apps/v1", "kind": "Deployment", "metadata": metadata, "spec": spec}


def _other(m: Manifest, namespace: str) -> Manifest:
    kind = m.obj["kind"]
    if kind not in SUPPORTED_KINDS:
        raise _invalid(
            m.source, f"bundle contains unsupported resource: Name: {m.ref.name}, Kind: {kind}"
        )
    obj = copy.deepcopy(m.obj)
    if SUPPORTED_KINDS[kind]:
        obj["metadata"]["namespace"] = namespace
    else:
        obj["metadata"].pop("namespace", None)
    return Manifest(obj=obj, source=m.source)


def _service_account(namespace: str, name: str) -> Obj:
    return {
        "apiVersion": "v1",
        "kind": "ServiceAccount",
        "metadata": {"namespace": namespace, "name": name},
    }


def _sa_name(name: Any) -> str:
    return name if isinstance(name, str) and name else "default"


def _mapping(value: Any, src: Source, where: str) -> Obj:
    if value is None:
        return {}
    if not isinstance(value, dict):
        raise _invalid(src, f"{where} must be a mapping, got {type(value).__name__}")
    return value


def _list(value: Any, src: Source, where: str) -> list[Any]:
    if value is None:
        return []
    if not isinstance(value, list):
        raise _invalid(src, f"{where} must be a list, got {type(value).__name__}")
    return value


def _string_map(value: Any, src: Source, where: str) -> dict[str, str]:
    mapping = _mapping(value, src, where)
    for key, item in mapping.items():
        if not isinstance(key, str) or not isinstance(item, str):
            raise _invalid(src, f"{where}: {key!r} must map to a string")
    return dict(mapping)


def _refuse_duplicates(manifests: list[Manifest]) -> None:
    seen: dict[tuple[str, str, str, str], Manifest] = {}
    for m in manifests:
        first = seen.setdefault(ObjectRef.of(m.obj).identity, m)
        if first is not m:
            raise _invalid(
                m.source,
                f"{m.ref} is defined twice after conversion (first from "
                f"{first.source}); drop one of them from the bundle",
            )
