"""Least privilege in the shipped manifests: the effective permissions of every
ServiceAccount that ``deploy/`` (with every optional component) makes, and the optional
NetworkPolicy component.

The permissions are read from the rendered RBAC objects (``kubectl kustomize``): each
ServiceAccount's RoleBindings and ClusterRoleBindings, the rules of the roles they name.
A rule with a wildcard (``*`` in verbs, resources or apiGroups) fails the test unless
``ALLOWED_WILDCARDS`` lists it with the reason it is needed; an entry no rule matches any
more fails too, so the list stays the truth. docs/security.md ("Privileges") explains
each. The same check asks the real API server too (``kubectl auth can-i --list`` as each
account, with the rendered RBAC applied in a namespace of its own). The NetworkPolicies must
leave open exactly the ports the pods they select serve.
"""

from __future__ import annotations

import functools
import json
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest

from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import ObjectRef
from tests import install_helpers as inst
from tests.polling import eventually

COMPONENTS = inst.DEPLOY / "components"
ALL_COMPONENTS = ("monitoring", "network-policy", "registry-mirror")


@dataclass(frozen=True)
class Grant:
    """One rule as a ServiceAccount holds it, through one binding."""

    account: str  # namespace:name
    role: str  # Kind/name
    scope: str  # "cluster" or the RoleBinding's namespace
    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    resource_names: tuple[str, ...]
    non_resource_urls: tuple[str, ...]

    @property
    def wildcard(self) -> bool:
        return "*" in (*self.api_groups, *self.resources, *self.verbs)

    @property
    def key(self) -> tuple[str, str, str, str, str]:
        return (
            self.account,
            self.role,
            ",".join(self.api_groups),
            ",".join(self.resources),
            ",".join(self.verbs),
        )


ALLOWED_WILDCARDS: dict[tuple[str, str, str, str, str], str] = {
    (
        "rukpak-system:rukpak-instance",
        "ClusterRole/rukpak-instance-install",
        "*",
        "*",
        "*",
    ): "The default instance identity applies arbitrary bundles (CRDs, RBAC, workloads in "
    "any namespace): cluster-admin without non-resource URLs. A BundleDeployment that names "
    "its own serviceAccountName gets only what that account is granted.",
}


def render(tmp_path: Path) -> list[dict[str, Any]]:
    objects = inst.render_overlay(tmp_path, *(COMPONENTS / c for c in ALL_COMPONENTS))
    return list(objects.values())


def grants(docs: list[dict[str, Any]]) -> list[Grant]:
    """Every rule every ServiceAccount of ``docs`` holds, through the bindings of ``docs``."""
    roles = {
        (d["kind"], d["metadata"].get("namespace", ""), d["metadata"]["name"]): d
        for d in docs
        if d["kind"] in ("Role", "ClusterRole")
    }
    accounts = {
        f"{d['metadata']['namespace']}:{d['metadata']['name']}"
        for d in docs
        if d["kind"] == "ServiceAccount"
    }
    out: list[Grant] = []
    for binding in (d for d in docs if d["kind"] in ("RoleBinding", "ClusterRoleBinding")):
        ref = binding["roleRef"]
        namespace = binding["metadata"].get("namespace", "")
        role_ns = namespace if ref["kind"] == "Role" else ""
        role = roles.get((ref["kind"], role_ns, ref["name"]))
        assert role is not None, f"{binding['metadata']['name']} binds a missing {ref}"
        assert "aggregationRule" not in role, f"{ref['name']}: aggregated roles are not read"
        scope = namespace if binding["kind"] == "RoleBinding" else "cluster"
        for subject in binding.get("subjects") or []:
            if subject["kind"] != "ServiceAccount":
                continue
            account = f"{subject['namespace']}:{subject['name']}"
            assert account in accounts, f"{binding['metadata']['name']} binds unknown {account}"
            for rule in role.get("rules") or []:
                out.append(
                    Grant(
                        account=account,
                        role=f"{ref['kind']}/{ref['name']}",
                        scope=scope,
                        api_groups=tuple(rule.get("apiGroups") or ()),
                        resources=tuple(rule.get("resources") or ()),
                        verbs=tuple(rule.get("verbs") or ()),
                        resource_names=tuple(rule.get("resourceNames") or ()),
                        non_resource_urls=tuple(rule.get("nonResourceURLs") or ()),
                    )
                )
    return out


@pytest.fixture(scope="module")
def rendered(tmp_path_factory: pytest.TempPathFactory) -> list[dict[str, Any]]:
    return render(tmp_path_factory.mktemp("least-privilege"))


def test_no_wildcard_beyond_the_allow_list(rendered: list[dict[str, Any]]) -> None:
    found = {g.key for g in grants(rendered) if g.wildcard}
    unexplained = sorted(found - ALLOWED_WILDCARDS.keys())
    assert not unexplained, f"wildcard rules without a reason in ALLOWED_WILDCARDS: {unexplained}"
    stale = sorted(ALLOWED_WILDCARDS.keys() - found)
    assert not stale, f"ALLOWED_WILDCARDS entries no rule needs any more: {stale}"


def test_every_service_account_is_listed_with_its_permissions(
    rendered: list[dict[str, Any]],
) -> None:
    """The accounts deploy/ makes, each with at least one rule, except the unpack pods'
    (no token) and the scraper's (a non-resource URL only)."""
    by_account: dict[str, list[Grant]] = {}
    for grant in grants(rendered):
        by_account.setdefault(grant.account, []).append(grant)
    accounts = {
        f"{d['metadata']['namespace']}:{d['metadata']['name']}"
        for d in rendered
        if d["kind"] == "ServiceAccount"
    }
    assert accounts - by_account.keys() == {"rukpak-system:rukpak-unpack"}
    scraper = by_account["rukpak-system:rukpak-metrics-scraper"]
    assert [(g.non_resource_urls, g.verbs) for g in scraper] == [(("/metrics",), ("get",))]
    for account in ("rukpak-csi-node", "rukpak-csi-controller", "rukpak-metrics-scraper"):
        assert not [g for g in by_account[f"rukpak-system:{account}"] if g.wildcard], account


def secret_grants(rendered: list[dict[str, Any]], account: str) -> list[Grant]:
    """The rules of ``account`` that reach Secrets (named, or through a wildcard)."""
    return [
        g
        for g in grants(rendered)
        if g.account == account
        and ({"", "*"} & set(g.api_groups))
        and ({"secrets", "*"} & set(g.resources))
    ]


def test_the_manager_reads_secrets_only_by_name_in_its_namespace(
    rendered: list[dict[str, Any]],
) -> None:
    """The manager gets the Secrets BundleDeployments, Bundles and policies name (all in
    rukpak-system) and keeps its webhook certificate: no list or watch, nothing outside
    its namespace, writes only to the certificate (docs/security.md, 'The manager and
    Secrets')."""
    found = secret_grants(rendered, "rukpak-system:rukpak-manager")
    assert found, "the manager must read the Secrets its objects name"
    for grant in found:
        assert grant.scope == "rukpak-system", grant
        assert not {"list", "watch", "*", "delete", "deletecollection"} & set(grant.verbs), grant
        if {"update", "patch"} & set(grant.verbs):
            assert grant.resource_names == ("rukpak-webhook-cert",), grant
    # what it does to a bundle's objects it does as the instance: it may impersonate the
    # ServiceAccounts of its own namespace, and no other user
    impersonation = [
        g for g in grants(rendered)
        if g.account == "rukpak-system:rukpak-manager" and "impersonate" in g.verbs
    ]  # fmt: skip
    assert [(g.scope, g.resources) for g in impersonation] == [
        ("rukpak-system", ("serviceaccounts",))
    ]


def test_a_new_wildcard_fails_the_check(rendered: list[dict[str, Any]]) -> None:
    """The check can fail: a ClusterRole of the node plugin's gains ``*`` verbs."""
    role = next(
        d
        for d in rendered
        if d["kind"] == "ClusterRole" and d["metadata"]["name"] == "rukpak-csi-node"
    )
    widened = [
        {**d, "rules": [*d["rules"], {"apiGroups": [""], "resources": ["secrets"], "verbs": ["*"]}]}
        if d is role
        else d
        for d in rendered
    ]
    found = {g.key for g in grants(widened) if g.wildcard}
    assert (
        "rukpak-system:rukpak-csi-node",
        "ClusterRole/rukpak-csi-node",
        "",
        "secrets",
        "*",
    ) in found - ALLOWED_WILDCARDS.keys()


# -- NetworkPolicy ----------------------------------------------------------------------------


def selects(policy: dict[str, Any], labels: dict[str, str]) -> bool:
    wanted = (policy["spec"].get("podSelector") or {}).get("matchLabels") or {}
    return wanted.items() <= labels.items()


def test_the_network_policies_open_exactly_the_ports_the_pods_serve(
    rendered: list[dict[str, Any]],
) -> None:
    policies = [d for d in rendered if d["kind"] == "NetworkPolicy"]
    assert {p["metadata"]["name"] for p in policies} >= {
        "rukpak-default-deny-ingress",
        "rukpak-manager",
        "rukpak-csi-controller",
    }
    deny = next(p for p in policies if p["metadata"]["name"] == "rukpak-default-deny-ingress")
    assert deny["spec"] == {"podSelector": {}, "policyTypes": ["Ingress"]}
    opened: set[int] = set()
    for workload in (d for d in rendered if d["kind"] in ("Deployment", "DaemonSet")):
        template = workload["spec"]["template"]
        if template["spec"].get("hostNetwork"):
            continue  # NetworkPolicy does not cover the node's network
        labels = template["metadata"]["labels"]
        served = {
            int(p["containerPort"])
            for c in template["spec"]["containers"]
            for p in c.get("ports") or []
        }
        allowed = {
            int(port["port"])
            for p in policies
            if selects(p, labels) and p["metadata"]["name"] != "rukpak-default-deny-ingress"
            for rule in p["spec"].get("ingress") or []
            for port in rule.get("ports") or []
        }
        assert served == allowed, (workload["metadata"]["name"], served, allowed)
        opened |= allowed
    every_port = {
        int(port["port"])
        for p in policies
        for rule in p["spec"].get("ingress") or []
        for port in rule.get("ports") or []
    }
    assert every_port == opened, f"ports opened for no pod: {every_port - opened}"
    for policy in policies:
        assert policy["metadata"]["namespace"] == "rukpak-system"
        assert policy["spec"]["policyTypes"] == ["Ingress"]


# -- the same question asked of the real API server -------------------------------------------

RBAC_KINDS = ("ServiceAccount", "Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding")


def in_namespace(docs: list[dict[str, Any]], namespace: str, suffix: str) -> list[dict[str, Any]]:
    """The rendered RBAC objects moved to ``namespace``, cluster-scoped names suffixed, so
    they apply beside other tests' installs on the shared API server."""
    out = []
    for doc in docs:
        if doc["kind"] not in RBAC_KINDS:
            continue
        doc = json.loads(json.dumps(doc).replace('"rukpak-system"', f'"{namespace}"'))
        if doc["kind"].startswith("Cluster"):
            doc["metadata"]["name"] += f"-{suffix}"
        if doc["kind"] in ("RoleBinding", "ClusterRoleBinding") and doc["roleRef"]["kind"] == (
            "ClusterRole"
        ):
            doc["roleRef"]["name"] += f"-{suffix}"
        out.append(doc)
    return out


def wildcard_lines(listing: str) -> list[tuple[str, frozenset[str]]]:
    """(resource, verbs) of each line of ``kubectl auth can-i --list`` whose resource or
    verbs hold ``*`` (non-resource URLs such as the discovery paths are left out)."""
    out = []
    for line in listing.splitlines()[1:]:
        match = re.match(r"^(\S+)\s+\[[^\]]*\]\s+\[[^\]]*\]\s+\[([^\]]*)\]\s*$", line)
        if not match:
            continue
        resource, verbs = match.group(1), frozenset(match.group(2).split())
        if "*" in resource or "*" in verbs:
            out.append((resource, verbs))
    return out


@pytest.mark.cluster
def test_the_api_server_grants_no_wildcard_beyond_the_allow_list(
    kube: Kube, kube_apiserver: Any, rendered: list[dict[str, Any]], name: str
) -> None:
    """``kubectl auth can-i --list --as=system:serviceaccount:...`` for every account: the
    API server's own answer, merged across roles, agrees with the rendered one."""
    suffix = name.rsplit("-", 1)[-1]
    docs = in_namespace(rendered, name, suffix)
    kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": name}})
    for doc in docs:
        kube.apply(doc)
    try:
        allowed: dict[str, set[str]] = {}
        for who, _, groups, resources, verbs in ALLOWED_WILDCARDS:
            if (groups, resources) == ("*", "*"):
                allowed.setdefault(who.split(":", 1)[1], set()).update(verbs.split(","))
        accounts = [d["metadata"]["name"] for d in docs if d["kind"] == "ServiceAccount"]
        assert len(accounts) >= 6, accounts

        def listing(account: str) -> str:
            user = f"system:serviceaccount:{name}:{account}"
            return inst.run_kubectl(
                kube_apiserver.kubeconfig, "auth", "can-i", "--list", f"--as={user}", "-n", name
            )

        def in_effect(account: str) -> bool:
            return {r for r, _ in wildcard_lines(listing(account))} == {"*.*"}

        # the authorizer's cache has the bindings once the allowed wildcards show
        for account in sorted(allowed):
            eventually(
                functools.partial(in_effect, account),
                timeout=30,
                what=f"the wildcard rules of {account} in effect",
            )
        for account in accounts:
            permitted = allowed.get(account, set())
            for resource, granted in wildcard_lines(listing(account)):
                ok = resource == "*.*" and ("*" in permitted or granted <= permitted)
                assert ok, (account, resource, sorted(granted))

        # the manager's Secrets, as the authorizer answers: get by name in its namespace,
        # nothing more (the manager's own identity; what it does as an instance is that
        # instance's)
        def can(verb: str, namespace: str) -> str:
            user = f"system:serviceaccount:{name}:rukpak-manager"
            out = inst.run_kubectl(
                kube_apiserver.kubeconfig, "auth", "can-i", verb, "secrets", f"--as={user}",
                "-n", namespace, check=False,
            )  # fmt: skip
            return out.strip()

        assert can("get", name) == "yes"
        assert [can(verb, name) for verb in ("list", "watch", "delete")] == ["no"] * 3
        assert [can(verb, "default") for verb in ("get", "list", "watch")] == ["no"] * 3
        assert [can(verb, "kube-system") for verb in ("get", "delete", "patch")] == ["no"] * 3
    finally:
        for doc in docs:
            if doc["kind"].startswith("Cluster"):
                kube.delete(ObjectRef.of(doc))
        kube.delete(ObjectRef("", "v1", "Namespace", "", name))
