"""The permission preview: objects, scopes, aggregated RBAC rules, escalations, summary, diff."""

from __future__ import annotations

import json
from typing import Any

import pytest

from provisioner.engine.objects import Obj
from provisioner.engine.preview import preview
from provisioner.engine.preview.preview import Escalation, Rule

RBAC = "rbac.authorization.k8s.io/v1"


def obj(api_version: str, kind: str, name: str, namespace: str = "", **rest: Any) -> Obj:
    meta: dict[str, Any] = {"name": name}
    if namespace:
        meta["namespace"] = namespace
    return {"apiVersion": api_version, "kind": kind, "metadata": meta, **rest}


def rule(groups: list[str], resources: list[str], verbs: list[str], **rest: Any) -> Obj:
    return {"apiGroups": groups, "resources": resources, "verbs": verbs, **rest}


def cluster_role(name: str, *rules: Obj, **rest: Any) -> Obj:
    return obj(RBAC, "ClusterRole", name, rules=list(rules), **rest)


def role(namespace: str, name: str, *rules: Obj) -> Obj:
    return obj(RBAC, "Role", name, namespace, rules=list(rules))


def binding(
    kind: str, name: str, role_ref: str, namespace: str = "", subject: Obj | None = None
) -> Obj:
    subjects = [subject or {"kind": "ServiceAccount", "name": "op", "namespace": "ops"}]
    ref = {"apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole", "name": role_ref}
    return obj(RBAC, kind, name, namespace, roleRef=ref, subjects=subjects)


def crd(plural: str, group: str, kind: str, scope: str = "Namespaced") -> Obj:
    spec = {"group": group, "names": {"kind": kind, "plural": plural}, "scope": scope}
    return obj(
        "apiextensions.k8s.io/v1", "CustomResourceDefinition", f"{plural}.{group}", spec=spec
    )


HARMLESS = [
    obj("v1", "Namespace", "shop"),
    obj("v1", "ServiceAccount", "web", "shop"),
    obj("apps/v1", "Deployment", "web", "shop"),
    obj("v1", "ConfigMap", "settings", "shop"),
    role("shop", "web", rule([""], ["configmaps"], ["get", "list", "watch"])),
    obj(
        RBAC,
        "RoleBinding",
        "web",
        "shop",
        roleRef={"kind": "Role", "name": "web"},
        subjects=[{"kind": "ServiceAccount", "name": "web", "namespace": "shop"}],
    ),
]


def whats(*objects: Obj) -> list[str]:
    return [e.what for e in preview.preview(objects).escalations]


# Objects and scopes


def test_objects_are_listed_once_sorted_by_group_kind_namespace_and_name() -> None:
    p = preview.preview([*HARMLESS, HARMLESS[1]])
    assert p.objects == (
        ("", "ConfigMap", "shop", "settings"),
        ("", "Namespace", "", "shop"),
        ("", "ServiceAccount", "shop", "web"),
        ("apps", "Deployment", "shop", "web"),
        ("rbac.authorization.k8s.io", "Role", "shop", "web"),
        ("rbac.authorization.k8s.io", "RoleBinding", "shop", "web"),
    )


def test_well_known_cluster_scoped_kinds_are_listed_group_qualified_without_a_stray_namespace() -> (
    None
):
    p = preview.preview([cluster_role("reader"), obj("v1", "Namespace", "shop", "oops")])
    assert p.cluster_scoped == ("ClusterRole.rbac.authorization.k8s.io/reader", "Namespace/shop")
    assert ("", "Namespace", "", "shop") in p.objects


def test_a_well_known_namespaced_kind_without_a_namespace_is_not_cluster_scoped() -> None:
    p = preview.preview([obj("v1", "ConfigMap", "settings")])
    assert p.objects == (("", "ConfigMap", "", "settings"),)
    assert p.cluster_scoped == ()


def test_an_unknown_kind_without_a_namespace_counts_as_cluster_scoped() -> None:
    p = preview.preview([obj("example.com/v1", "Widget", "w")])
    assert p.cluster_scoped == ("Widget.example.com/w",)


def test_a_crd_in_the_bundle_decides_the_scope_of_its_kind() -> None:
    p = preview.preview(
        [
            crd("gadgets", "example.com", "Gadget", scope="Cluster"),
            obj("example.com/v1", "Gadget", "g", "stray"),
            crd("widgets", "example.com", "Widget"),
            obj("example.com/v1", "Widget", "w"),
        ]
    )
    assert "Gadget.example.com/g" in p.cluster_scoped
    assert "Widget.example.com/w" not in p.cluster_scoped
    assert p.crds == ("gadgets.example.com", "widgets.example.com")


def test_the_callers_discovery_decides_the_scope_when_given() -> None:
    def namespaced(group: str, kind: str) -> bool:
        return kind != "Widget"

    p = preview.preview(
        [obj("example.com/v1", "Widget", "w", "x"), obj("example.com/v1", "Gizmo", "g")],
        namespaced=namespaced,
    )
    assert p.objects == (("example.com", "Gizmo", "", "g"), ("example.com", "Widget", "", "w"))
    assert p.cluster_scoped == ("Widget.example.com/w",)


def test_the_preview_does_not_depend_on_the_order_of_the_objects() -> None:
    bundle = [*HARMLESS, cluster_role("a", rule([""], ["secrets"], ["*"])), crd("x", "e.io", "X")]
    assert preview.preview(bundle) == preview.preview(list(reversed(bundle)))


# RBAC rules and their aggregation


def test_rules_differing_only_in_verbs_become_one() -> None:
    p = preview.preview(
        [
            cluster_role(
                "reader",
                rule([""], ["configmaps"], ["get", "list"]),
                rule([""], ["configmaps"], ["watch", "get"]),
            )
        ]
    )
    assert p.rules == (Rule(preview.CLUSTER, ("",), ("configmaps",), ("get", "list", "watch")),)


def test_rules_differing_only_in_resources_or_groups_become_one() -> None:
    p = preview.preview(
        [
            cluster_role("a", rule(["apps"], ["deployments"], ["get"])),
            cluster_role("b", rule(["apps"], ["statefulsets"], ["get"])),
            cluster_role("c", rule(["extensions"], ["deployments", "statefulsets"], ["get"])),
        ]
    )
    groups, resources = ("apps", "extensions"), ("deployments", "statefulsets")
    assert p.rules == (Rule(preview.CLUSTER, groups, resources, ("get",)),)


def test_rules_that_would_grant_more_together_stay_apart() -> None:
    p = preview.preview(
        [
            cluster_role(
                "mixed",
                rule([""], ["pods"], ["get"]),
                rule([""], ["secrets"], ["delete"]),
                rule([""], ["configmaps"], ["get"], resourceNames=["a"]),
                rule([""], ["configmaps"], ["list"]),
            )
        ]
    )
    assert p.rules == (
        Rule(preview.CLUSTER, ("",), ("configmaps",), ("list",)),
        Rule(preview.CLUSTER, ("",), ("configmaps",), ("get",), resource_names=("a",)),
        Rule(preview.CLUSTER, ("",), ("pods",), ("get",)),
        Rule(preview.CLUSTER, ("",), ("secrets",), ("delete",)),
    )


def test_role_rules_are_scoped_to_their_namespace_after_the_cluster_rules() -> None:
    p = preview.preview(
        [
            role("b", "r", rule([""], ["pods"], ["get"])),
            role("a", "r", rule([""], ["pods"], ["get"])),
            cluster_role("c", {"nonResourceURLs": ["/metrics"], "verbs": ["get"]}),
        ]
    )
    assert [r.scope for r in p.rules] == [preview.CLUSTER, "a", "b"]
    assert p.rules[0].non_resource_urls == ("/metrics",)


# Escalations


def test_a_harmless_bundle_needs_no_attention() -> None:
    p = preview.preview(HARMLESS)
    assert p.escalations == ()
    assert p.bindings == ("RoleBinding/shop/web -> Role/web to ServiceAccount shop/web",)


def test_star_on_secrets_is_flagged() -> None:
    p = preview.preview([cluster_role("op", rule([""], ["secrets"], ["*"]))])
    assert p.escalations == (
        Escalation("ClusterRole/op", 'verb "*" on secrets'),
        Escalation("ClusterRole/op", "read secrets"),
        Escalation("ClusterRole/op", "write secrets"),
    )


@pytest.mark.parametrize(
    ("granted", "flagged"),
    [
        (rule(["rbac.authorization.k8s.io"], ["roles"], ["escalate"]), "escalate on roles"),
        (rule(["rbac.authorization.k8s.io"], ["clusterroles"], ["bind"]), "bind on clusterroles"),
        (rule([""], ["users", "groups"], ["impersonate"]), "impersonate on groups, users"),
        (rule([""], ["secrets"], ["list"]), "read secrets"),
        (rule(["*"], ["secrets"], ["watch"]), "read secrets"),
        (rule([""], ["secrets"], ["patch"]), "write secrets"),
        (rule([""], ["pods/exec"], ["create"]), "create on pods/exec"),
        (rule([""], ["*/attach"], ["create"]), "create on pods/attach"),
        (rule(["rbac.authorization.k8s.io"], ["rolebindings"], ["update"]), "write rolebindings"),
        (rule(["*"], ["clusterrolebindings"], ["create"]), "write clusterrolebindings"),
        (rule([""], ["nodes/proxy"], ["get"]), "access nodes/proxy"),
        (rule([""], ["serviceaccounts/token"], ["create"]), "create on serviceaccounts/token"),
        (rule(["apps"], ["*"], ["get"]), 'resource "*"'),
        (rule(["*"], ["deployments"], ["get"]), 'apiGroup "*"'),
        (rule([""], ["*"], ["get"]), "read secrets"),
        ({"nonResourceURLs": ["*"], "verbs": ["get"]}, 'non-resource URL "*"'),
    ],
)
def test_a_dangerous_grant_is_flagged(granted: Obj, flagged: str) -> None:
    assert flagged in whats(cluster_role("r", granted))


@pytest.mark.parametrize(
    "granted",
    [
        rule([""], ["configmaps", "pods", "services"], ["get", "list", "watch"]),
        rule(["example.com"], ["secrets"], ["get"]),  # a custom resource called secrets
        rule([""], ["pods/log"], ["get"]),
        rule([""], ["pods/exec"], ["get"]),
        rule(["rbac.authorization.k8s.io"], ["roles"], ["get", "list"]),
        rule([""], ["serviceaccounts"], ["create"]),
        rule([""], ["secrets"], []),  # no verbs grants nothing
    ],
)
def test_an_ordinary_grant_is_not_flagged(granted: Obj) -> None:
    assert whats(cluster_role("r", granted)) == []


def test_each_concern_is_reported_once_per_role_in_a_fixed_order() -> None:
    got = preview.preview(
        [
            role("ns", "r", rule([""], ["secrets"], ["get"]), rule([""], ["secrets"], ["list"])),
            role("ns", "r", rule([""], ["*"], ["*"])),
        ]
    ).escalations
    assert [e.what for e in got] == [
        'verb "*" on *',
        'resource "*"',
        "read secrets",
        "write secrets",
        "create on pods/exec",
        "create on pods/attach",
        "access nodes/proxy",
        "create on serviceaccounts/token",
    ]
    assert {e.role for e in got} == {"Role/ns/r"}


def test_a_cluster_role_that_aggregates_others_is_flagged() -> None:
    aggregating = cluster_role("agg", aggregationRule={"clusterRoleSelectors": [{}]})
    assert whats(aggregating) == [preview.AGGREGATES]


@pytest.mark.parametrize("powerful", ["cluster-admin", "admin", "edit"])
@pytest.mark.parametrize(("kind", "namespace"), [("ClusterRoleBinding", ""), ("RoleBinding", "x")])
def test_binding_a_powerful_cluster_role_is_flagged(
    powerful: str, kind: str, namespace: str
) -> None:
    p = preview.preview([binding(kind, "b", powerful, namespace)])
    label = f"{kind}/{namespace}/b" if namespace else f"{kind}/b"
    assert p.escalations == (Escalation(label, f"binds ClusterRole/{powerful}"),)
    assert p.bindings == (f"{label} -> ClusterRole/{powerful} to ServiceAccount ops/op",)


GROUP_ALL = {"kind": "Group", "name": "system:authenticated"}


def test_binding_to_everyone_is_flagged() -> None:
    everyone = binding("ClusterRoleBinding", "b", "view", subject=GROUP_ALL)
    assert whats(everyone) == ["grants to everyone (Group system:authenticated)"]


# Summary


BIG = [
    *(crd(f"things{i}", "example.com", f"Thing{i}") for i in range(40)),
    *(cluster_role(f"role-{i}", rule([""], ["secrets"], ["*"])) for i in range(40)),
    *(obj("v1", "ConfigMap", f"c{i}", "shop") for i in range(40)),
]


def test_summary_counts_objects_by_kind_and_lists_crds_and_escalations() -> None:
    got = preview.summary(
        preview.preview(
            [*HARMLESS, crd("x", "e.io", "X"), cluster_role("a", rule([""], ["*"], ["get"]))]
        )
    )
    assert got == {
        "objects": 8,
        "clusterScoped": 3,
        "byKind": {
            "ClusterRole.rbac.authorization.k8s.io": 1,
            "ConfigMap": 1,
            "CustomResourceDefinition.apiextensions.k8s.io": 1,
            "Deployment.apps": 1,
            "Namespace": 1,
            "Role.rbac.authorization.k8s.io": 1,
            "RoleBinding.rbac.authorization.k8s.io": 1,
            "ServiceAccount": 1,
        },
        "crds": ["x.e.io"],
        "rules": 2,
        "escalations": [
            'ClusterRole/a: resource "*"',
            "ClusterRole/a: read secrets",
            "ClusterRole/a: access nodes/proxy",
        ],
        "truncated": False,
    }


def test_a_big_summary_is_cut_to_fit_keeping_escalations_longest() -> None:
    got = preview.summary(preview.preview(BIG), limit=1024)
    assert len(json.dumps(got).encode()) <= 1024
    assert got["truncated"] is True
    assert got["crds"] == []
    assert got["byKind"] == {}
    assert got["escalations"][0] == 'ClusterRole/role-0: verb "*" on secrets'
    assert got["more"].startswith("1")
    assert "40 more CRDs" in got["more"]
    assert "`rukpak preview`" in got["more"]
    assert got["objects"] == 120


@pytest.mark.parametrize("limit", [0, 10, 100, 150, 200, 500, 2000, 5000, 20000])
def test_a_summary_never_exceeds_its_limit_and_stays_json(limit: int) -> None:
    got = preview.summary(preview.preview(BIG), limit=limit)
    text = json.dumps(got)
    assert json.loads(text) == got
    assert len(text.encode()) <= max(limit, len('{"truncated": true}'))
    assert got["truncated"] is (limit < 20000)


def test_a_summary_cuts_one_overlong_escalation() -> None:
    long_name = "x" * 5000
    got = preview.summary(preview.preview([cluster_role(long_name, rule(["*"], ["a"], ["get"]))]))
    assert len(got["escalations"][0]) == preview.SUMMARY_ITEM


# Render


def test_render_shows_every_section_readably() -> None:
    bundle = [*HARMLESS, crd("x", "e.io", "X"), cluster_role("a", rule([""], ["secrets"], ["get"]))]
    text = preview.render(preview.preview(bundle))
    assert text.splitlines()[:3] == [
        "Objects (8):",
        "  KIND                                            NAMESPACE   NAME",
        "  ClusterRole.rbac.authorization.k8s.io           -           a",
    ]
    for heading in (
        "Cluster-scoped (3):",
        "CRDs (1):\n  x.e.io\n",
        "RBAC rules (2):",
        "  (cluster)   secrets      []               [get]",
        "Bindings (1):",
        "Needs a reviewer's attention (1):\n  ! ClusterRole/a: read secrets\n",
    ):
        assert heading in text


def test_render_says_none_for_empty_sections() -> None:
    text = preview.render(preview.preview([]))
    assert "Objects (0):\n  none\n" in text
    assert text.endswith("Needs a reviewer's attention (0):\n  none\n")


def test_render_escapes_control_characters_so_a_bundle_cannot_forge_lines() -> None:
    forged = role("ns\n  ! nothing to see", "r\x1b[2K\u202e\u2028", rule([""], ["pods"], ["get"]))
    text = preview.render(preview.preview([forged]))
    assert all(c.isprintable() for line in text.splitlines() for c in line)
    assert "\n  ! nothing" not in text
    assert "ns\\n  ! nothing to see" in text
    assert "r\\x1b[2K\\u202e\\u2028" in text


# Diff


def test_the_diff_of_the_same_preview_is_empty() -> None:
    p = preview.preview([*HARMLESS, *BIG[:3]])
    assert preview.diff(p, p) == ""


def test_the_diff_shows_added_and_removed_objects() -> None:
    before = preview.preview(HARMLESS)
    after = preview.preview([*HARMLESS[:3], obj("v1", "Secret", "token", "shop"), *HARMLESS[4:]])
    assert preview.diff(after, before) == (
        "+ object Secret shop/token\n- object ConfigMap shop/settings\n"
    )


def test_the_diff_shows_only_the_permissions_that_change() -> None:
    before = preview.preview([cluster_role("r", rule(["apps"], ["deployments"], ["get", "list"]))])
    after = preview.preview(
        [
            cluster_role(
                "r",
                rule(["apps"], ["deployments"], ["get", "list", "delete"]),
                rule([""], ["secrets"], ["get"]),
            )
        ]
    )
    assert preview.diff(after, before) == (
        "+ rule (cluster): [get] on secrets\n"
        "+ rule (cluster): [delete] on deployments.apps\n"
        "+ attention ClusterRole/r: read secrets\n"
    )
    assert preview.diff(before, after).splitlines()[0] == "- rule (cluster): [get] on secrets"


def test_the_diff_compares_whole_rules_past_the_expansion_budget() -> None:
    groups, resources = [f"g{i}" for i in range(400)], [f"r{i}" for i in range(300)]
    huge = rule(groups, resources, ["get", "list"])
    before = preview.preview([cluster_role("r", huge)])
    after = preview.preview([cluster_role("r", {**huge, "verbs": ["get", "list", "watch"]})])
    lines = preview.diff(after, before).splitlines()
    assert [line[:8] for line in lines] == ["+ rule (", "- rule ("]


# Broken and hostile input


@pytest.mark.parametrize(
    "broken",
    [
        "not an object",
        None,
        42,
        ["a", "list"],
        {},
        {"kind": 7},
        {"kind": "ConfigMap", "metadata": "not a mapping"},
        {"kind": "ConfigMap", "apiVersion": ["v1"], "metadata": {"name": ["x"], "namespace": 3}},
        {"kind": "ClusterRole", "apiVersion": RBAC, "rules": "not a list"},
        {"kind": "ClusterRole", "apiVersion": RBAC, "rules": ["not a rule", None, 3]},
        cluster_role("r", {"apiGroups": "", "resources": "secrets", "verbs": "*"}),
        cluster_role("r", {"apiGroups": [None, 1], "resources": [{}], "verbs": [1, None, ["*"]]}),
        obj(RBAC, "ClusterRoleBinding", "b", roleRef="cluster-admin", subjects="everyone"),
        obj(RBAC, "RoleBinding", "b", "x", roleRef={"name": 1}, subjects=[None, {"kind": 2}]),
        crd("x", "e.io", "X") | {"spec": "broken"},
        crd("x", "e.io", "X") | {"spec": {"names": "broken", "group": 1}},
    ],
)
def test_broken_objects_are_skipped_without_raising(broken: Any) -> None:
    p = preview.preview([broken, *HARMLESS])
    assert p.escalations == ()
    assert set(preview.preview(HARMLESS).objects) <= set(p.objects)
    preview.render(p)
    json.dumps(preview.summary(p, limit=300))
    preview.diff(p, preview.preview(HARMLESS))


def test_a_binding_without_usable_subjects_binds_nobody() -> None:
    broken = obj(RBAC, "ClusterRoleBinding", "b", roleRef=None, subjects=[{"kind": "User"}])
    assert preview.preview([broken]).bindings == ("ClusterRoleBinding/b -> ?/? to nobody",)


def test_added_rules_are_the_permissions_the_installed_bundle_lacks() -> None:
    before = preview.preview([cluster_role("r", rule([""], ["secrets"], ["get"]))])
    after = preview.preview(
        [
            cluster_role(
                "r", rule([""], ["secrets"], ["get", "list"]), rule([""], ["pods/exec"], ["create"])
            )
        ]
    )
    added = preview.added_rules(after, before)
    assert len(added) == 2
    assert any("list" in r and "secrets" in r and "get" not in r for r in added), added
    assert any("create" in r and "pods/exec" in r for r in added), added
    assert preview.added_rules(before, after) == []  # fewer permissions: nothing added
