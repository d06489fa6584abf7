"""Permission preview: what applying a bundle would do, told to the reviewer who approves it.

Sits beside ``preflight`` and ``diff``, before anything is written, and reads no
cluster: ``preview`` takes the objects a BundleDeployment would apply (plain
dicts as decoded from YAML; best the output of ``preflight.prepare``, whose
namespaces are filled in) and lists the objects, the cluster-scoped ones, the
CRDs, the RBAC rules its ClusterRoles and Roles grant (aggregated), what its
bindings bind, and what a reviewer must notice: wildcards, ``escalate``,
``bind``, ``impersonate``, secrets, exec, RBAC writes, tokens, bindings of
``cluster-admin``. ``summary`` bounds it for ``status.preview``, ``render``
prints it for ``rukpak preview`` and ``diff`` says what approving would change.

Total on hostile input: a non-dict object, metadata that is not a mapping, a
rule or verb of the wrong type is skipped, never raised about.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import math
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import Any

from provisioner.engine.objects import Obj, meta_of, split_api_version

CLUSTER = "cluster"
RBAC_GROUP = "rbac.authorization.k8s.io"
CRD_GROUP = "apiextensions.k8s.io"


def _kinds(group: str, kinds: str) -> list[tuple[str, str]]:
    return [(group, kind) for kind in kinds.split()]


CLUSTER_SCOPED = frozenset(
    _kinds("", "Namespace Node PersistentVolume ComponentStatus")
    + _kinds(RBAC_GROUP, "ClusterRole ClusterRoleBinding")
    + _kinds(CRD_GROUP, "CustomResourceDefinition")
    + _kinds("apiregistration.k8s.io", "APIService")
    + _kinds("storage.k8s.io", "StorageClass CSIDriver CSINode VolumeAttachment")
    + _kinds("scheduling.k8s.io", "PriorityClass")
    + _kinds("node.k8s.io", "RuntimeClass")
    + _kinds("networking.k8s.io", "IngressClass")
    + _kinds("policy", "PodSecurityPolicy")
    + _kinds("snapshot.storage.k8s.io", "VolumeSnapshotClass VolumeSnapshotContent")
    + _kinds("certificates.k8s.io", "CertificateSigningRequest")
    + _kinds(
        "admissionregistration.k8s.io",
        "ValidatingWebhookConfiguration MutatingWebhookConfiguration"
        " ValidatingAdmissionPolicy ValidatingAdmissionPolicyBinding",
    )
    + _kinds("flowcontrol.apiserver.k8s.io", "FlowSchema PriorityLevelConfiguration")
)
"""Well-known cluster-scoped kinds, by (group, kind), when the caller has no discovery."""

NAMESPACED = frozenset(
    _kinds(
        "",
        "Pod Service ConfigMap Secret ServiceAccount Endpoints PersistentVolumeClaim"
        " ReplicationController LimitRange ResourceQuota Event",
    )
    + _kinds("apps", "Deployment StatefulSet DaemonSet ReplicaSet")
    + _kinds("batch", "Job CronJob")
    + _kinds("policy", "PodDisruptionBudget")
    + _kinds("networking.k8s.io", "Ingress NetworkPolicy")
    + _kinds(RBAC_GROUP, "Role RoleBinding")
    + _kinds("autoscaling", "HorizontalPodAutoscaler")
    + _kinds("coordination.k8s.io", "Lease")
    + _kinds("discovery.k8s.io", "EndpointSlice")
)
"""Well-known namespaced kinds: without a namespace they go to the install namespace.
A kind in neither table is namespaced if it names a namespace, cluster-scoped if not."""

POWERFUL_CLUSTER_ROLES = ("cluster-admin", "admin", "edit")
EVERYONE = (("Group", "system:authenticated"), ("Group", "system:unauthenticated"))
ANONYMOUS = ("User", "system:anonymous")
AGGREGATES = "aggregates other ClusterRoles by label: its rules are decided at run time"

CORE = ("",)
READ = frozenset({"get", "list", "watch"})
WRITE = frozenset({"create", "update", "patch", "delete", "deletecollection"})
CREATE = frozenset({"create"})
SENSITIVE: tuple[tuple[tuple[str, ...], str, frozenset[str] | None, str], ...] = (
    (CORE, "secrets", READ, "read secrets"),
    (CORE, "secrets", WRITE, "write secrets"),
    (CORE, "pods/exec", CREATE, "create on pods/exec"),
    (CORE, "pods/attach", CREATE, "create on pods/attach"),
    *(((RBAC_GROUP,), r, WRITE, f"write {r}") for r in ("clusterroles", "clusterrolebindings")),
    *(((RBAC_GROUP,), r, WRITE, f"write {r}") for r in ("roles", "rolebindings")),
    (CORE, "nodes/proxy", None, "access nodes/proxy"),
    (CORE, "serviceaccounts/token", CREATE, "create on serviceaccounts/token"),
)
"""(groups, resource, verbs or None for any, what): grants a reviewer must see."""
EXPLICIT_VERBS = ("escalate", "bind", "impersonate")
SHOWN_TARGETS = 5
ATOM_BUDGET = 100_000
"""Most single permissions ``diff`` expands rules into; past it, whole rules are compared."""
SUMMARY_ITEM = 256
"""Longest string ``summary`` keeps; longer ones are cut."""


@dataclass(frozen=True)
class Rule:
    """One RBAC rule the bundle would grant; ``scope`` is ``cluster`` or a Role's namespace
    ("" when the Role names none: the install namespace)."""

    scope: str
    api_groups: tuple[str, ...]
    resources: tuple[str, ...]
    verbs: tuple[str, ...]
    resource_names: tuple[str, ...] = ()
    non_resource_urls: tuple[str, ...] = ()


@dataclass(frozen=True)
class Escalation:
    """Something a reviewer must notice: ``role`` names the ClusterRole, Role or binding,
    ``what`` the power it gives (``write secrets``, ``create on pods/exec``)."""

    role: str
    what: str


@dataclass(frozen=True)
class Preview:
    """What applying a bundle would do; every field sorted, so equal bundles compare equal."""

    objects: tuple[tuple[str, str, str, str], ...]
    """(group, kind, namespace, name); namespace "" when cluster-scoped, and for a
    namespaced object that names none (it goes to the install namespace)."""
    cluster_scoped: tuple[str, ...]
    """``Kind.group/name`` (``Kind/name`` in the core group)."""
    rules: tuple[Rule, ...]
    """All ClusterRole and Role rules, aggregated (``aggregate``)."""
    escalations: tuple[Escalation, ...]
    """By role, then in a fixed order of concern."""
    crds: tuple[str, ...]
    bindings: tuple[str, ...]
    """``ClusterRoleBinding/b -> ClusterRole/r to ServiceAccount ns/sa, User u``."""


def preview(
    objects: Iterable[Obj], *, namespaced: Callable[[str, str], bool] | None = None
) -> Preview:
    """What applying ``objects`` would do. ``namespaced(group, kind)`` (discovery) says a
    kind's scope; a CRD in the bundle decides for its own kind; without either the
    built-in tables do. Same result whatever the order of ``objects``."""
    objs = [o for o in objects if isinstance(o, dict) and _text(o.get("kind"))]
    scopes = _bundle_scopes(objs)
    found: set[tuple[str, str, str, str]] = set()
    cluster_scoped: set[str] = set()
    rules: list[Rule] = []
    concerns: set[Escalation] = set()
    bindings: set[str] = set()
    for obj in objs:
        group = split_api_version(_text(obj.get("apiVersion")))[0]
        kind, meta = _text(obj.get("kind")), _meta(obj)
        namespace, name = _text(meta.get("namespace")), _text(meta.get("name"))
        in_namespace = scopes.get((group, kind))
        if in_namespace is None and namespaced is not None:
            in_namespace = bool(namespaced(group, kind))
        if in_namespace is None:
            in_namespace = (group, kind) not in CLUSTER_SCOPED and (
                bool(namespace) or (group, kind) in NAMESPACED
            )
        namespace = namespace if in_namespace else ""
        found.add((group, kind, namespace, name))
        if not in_namespace:
            cluster_scoped.add(f"{_kind(group, kind)}/{name}")
        if group != RBAC_GROUP:
            continue
        label = _label(kind, namespace, name)
        if kind in ("ClusterRole", "Role"):
            own = _rules_of(obj, CLUSTER if kind == "ClusterRole" else namespace)
            rules += own
            if kind == "ClusterRole" and obj.get("aggregationRule"):
                concerns.add(Escalation(label, AGGREGATES))
            concerns.update(Escalation(label, w) for r in aggregate(own) for w in _concerns(r))
        elif kind in ("ClusterRoleBinding", "RoleBinding"):
            line, whats = _binding(obj, label)
            bindings.add(line)
            concerns.update(Escalation(label, what) for what in whats)
    return Preview(
        objects=tuple(sorted(found)),
        cluster_scoped=tuple(sorted(cluster_scoped)),
        rules=aggregate(rules),
        escalations=tuple(sorted(concerns, key=lambda e: (e.role, _rank(e.what), e.what))),
        crds=tuple(sorted({n for g, k, _, n in found if (g, k) == _CRD and n})),
        bindings=tuple(sorted(bindings)),
    )


_CRD = (CRD_GROUP, "CustomResourceDefinition")


def aggregate(rules: Iterable[Rule]) -> tuple[Rule, ...]:
    """``rules`` merged where the merge grants exactly the same, in a stable order (cluster
    first): rules differing only in resources, only in verbs or only in apiGroups become
    one with the union. resourceNames and nonResourceURLs are never merged (empty means
    all there)."""
    current = set(rules)
    while True:
        before = len(current)
        for field in ("resources", "verbs", "api_groups"):
            current = _merge(current, field)
        if len(current) == before:
            return tuple(sorted(current, key=_rule_order))


def _merge(rules: set[Rule], field: str) -> set[Rule]:
    union: dict[Rule, set[str]] = {}
    for rule in rules:
        union.setdefault(_with(rule, field, ()), set()).update(getattr(rule, field))
    return {_with(key, field, tuple(sorted(values))) for key, values in union.items()}


def _with(rule: Rule, field: str, values: tuple[str, ...]) -> Rule:
    changes: dict[str, Any] = {field: values}
    return dataclasses.replace(rule, **changes)


def _rule_order(r: Rule) -> tuple[Any, ...]:
    return (
        r.scope != CLUSTER,
        r.scope,
        r.api_groups,
        r.resources,
        r.non_resource_urls,
        r.resource_names,
        r.verbs,
    )


def _rank(what: str) -> int:
    for i, prefix in enumerate(_RANKS):
        if what.startswith(prefix):
            return i
    return len(_RANKS)


_RANKS = (
    AGGREGATES,
    "binds ClusterRole/",
    "grants to everyone",
    'verb "*"',
    'resource "*"',
    'apiGroup "*"',
    'non-resource URL "*"',
    *(f"{v} on" for v in EXPLICIT_VERBS),
    *(what for *_, what in SENSITIVE),
)


def _concerns(rule: Rule) -> Iterator[str]:
    """What a reviewer must notice in one rule; ``_rank`` orders them."""
    targets = _shortlist(rule.resources + rule.non_resource_urls)
    if "*" in rule.verbs:
        yield f'verb "*" on {targets}'
    if "*" in rule.resources:
        yield 'resource "*"'
    if "*" in rule.api_groups:
        yield 'apiGroup "*"'
    if "*" in rule.non_resource_urls:
        yield 'non-resource URL "*"'
    for verb in EXPLICIT_VERBS:
        if verb in rule.verbs:
            yield f"{verb} on {targets}"
    for groups, resource, verbs, what in SENSITIVE:
        if _grants(rule, groups, resource, verbs):
            yield what


def _grants(
    rule: Rule, groups: tuple[str, ...], resource: str, verbs: frozenset[str] | None
) -> bool:
    """Whether ``rule`` allows a verb of ``verbs`` (None: any) on ``resource`` in ``groups``,
    wildcards matched as the API server's RBAC authorizer does."""
    _, slash, sub = resource.partition("/")
    return (
        any(g == "*" or g in groups for g in rule.api_groups)
        and any(r in ("*", resource) or (slash and r == f"*/{sub}") for r in rule.resources)
        and any(verbs is None or v == "*" or v in verbs for v in rule.verbs)
    )


def _rules_of(role: Obj, scope: str) -> list[Rule]:
    raw = role.get("rules")
    out: list[Rule] = []
    for rule in raw if isinstance(raw, list) else []:
        if not isinstance(rule, dict):
            continue
        got = Rule(
            scope=scope,
            api_groups=_strings(rule.get("apiGroups")),
            resources=_strings(rule.get("resources")),
            verbs=_strings(rule.get("verbs")),
            resource_names=_strings(rule.get("resourceNames")),
            non_resource_urls=_strings(rule.get("nonResourceURLs")),
        )
        if got.verbs and ((got.api_groups and got.resources) or got.non_resource_urls):
            out.append(got)
    return out


def _binding(obj: Obj, label: str) -> tuple[str, list[str]]:
    """The binding's line ("RoleBinding/ns/b -> ClusterRole/r to ServiceAccount ns/sa")
    and what about it a reviewer must notice."""
    ref = _mapping(obj.get("roleRef"))
    role_kind, role_name = _text(ref.get("kind")) or "?", _text(ref.get("name")) or "?"
    raw = obj.get("subjects")
    subjects = [_mapping(s) for s in raw] if isinstance(raw, list) else []
    whom: list[str] = []
    whats: list[str] = []
    if role_kind == "ClusterRole" and role_name in POWERFUL_CLUSTER_ROLES:
        whats.append(f"binds ClusterRole/{role_name}")
    for s in subjects:
        kind, name = _text(s.get("kind")), _text(s.get("name"))
        if not kind or not name:
            continue
        ns = _text(s.get("namespace"))
        whom.append(f"{kind} {ns}/{name}" if kind == "ServiceAccount" and ns else f"{kind} {name}")
        if (kind, name) in EVERYONE or (kind, name) == ANONYMOUS:
            whats.append(f"grants to everyone ({kind} {name})")
    to = ", ".join(whom) or "nobody"
    return f"{label} -> {role_kind}/{role_name} to {to}", whats


def _bundle_scopes(objs: Iterable[Obj]) -> dict[tuple[str, str], bool]:
    """(group, kind) -> namespaced, for kinds whose CRD is in the bundle."""
    scopes: dict[tuple[str, str], bool] = {}
    for obj in objs:
        if (split_api_version(_text(obj.get("apiVersion")))[0], obj.get("kind")) != _CRD:
            continue
        spec = _mapping(obj.get("spec"))
        group, kind = _text(spec.get("group")), _text(_mapping(spec.get("names")).get("kind"))
        if group and kind:
            scopes[(group, kind)] = spec.get("scope", "Namespaced") != "Cluster"
    return scopes


def summary(p: Preview, *, limit: int = 4096) -> dict[str, Any]:
    """``p`` for ``status.preview``: counts, kinds, CRDs and escalations, at most ``limit``
    bytes as JSON. What does not fit is cut from the tail of the CRDs, then of the kinds,
    then of the escalations (kept longest), with ``truncated`` set and ``more`` saying
    what was left out (dropped too when even the counts barely fit). Under a limit too
    small for the counts: ``{"truncated": true}``."""
    by_kind = Counter(_kind(g, k) for g, k, _, _ in p.objects)
    lists: dict[str, list[Any]] = {
        "crds": [_cut(c) for c in p.crds],
        "byKind": sorted(by_kind.items()),
        "escalations": [_cut(f"{e.role}: {e.what}") for e in p.escalations],
    }
    keep = {key: len(values) for key, values in lists.items()}

    def build(keep: dict[str, int], *, hint: bool = True) -> dict[str, Any]:
        out: dict[str, Any] = {
            "objects": len(p.objects),
            "clusterScoped": len(p.cluster_scoped),
            "byKind": dict(lists["byKind"][: keep["byKind"]]),
            "crds": lists["crds"][: keep["crds"]],
            "rules": len(p.rules),
            "escalations": lists["escalations"][: keep["escalations"]],
            "truncated": False,
        }
        left = [(len(lists[k]) - keep[k], k) for k in ("escalations", "byKind", "crds")]
        if any(n for n, _ in left):
            out["truncated"] = True
        if any(n for n, _ in left) and hint:
            shown = ", ".join(f"{n} more {_WORDS[k]}" for n, k in left if n)
            out["more"] = f"{shown}: `rukpak preview` lists all"
        return out

    def fits(keep: dict[str, int]) -> bool:
        return _size(build(keep)) <= limit

    for key in ("crds", "byKind", "escalations"):
        if fits(keep):
            return build(keep)
        low, high = 0, keep[key]
        while low < high:
            mid = (low + high + 1) // 2
            low, high = (mid, high) if fits({**keep, key: mid}) else (low, mid - 1)
        keep[key] = low
    if fits(keep):
        return build(keep)
    bare = build(keep, hint=False)
    return bare if _size(bare) <= limit else {"truncated": True}


_WORDS = {"crds": "CRDs", "byKind": "kinds", "escalations": "escalations"}


def _size(value: Any) -> int:
    return len(json.dumps(value).encode())


def cut(text: str) -> str:
    """``text`` as one item of the summary: control characters out, at most
    ``SUMMARY_ITEM`` characters."""
    return _cut(text)


def _cut(text: str) -> str:
    text = _clean(text)
    return text if len(text) <= SUMMARY_ITEM else text[: SUMMARY_ITEM - 1] + "…"


def render(p: Preview) -> str:
    """``p`` as text for ``rukpak preview``: objects by kind, cluster-scoped objects, CRDs,
    aggregated RBAC rules, bindings, and what needs a reviewer's attention."""
    cluster = set(p.cluster_scoped)
    objects = sorted(
        (_kind(g, k), ns or ("-" if f"{_kind(g, k)}/{n}" in cluster else "(install)"), n)
        for g, k, ns, n in p.objects
    )
    rules = [
        (_scope(r.scope), _targets(r), _list(r.resource_names), _list(r.verbs)) for r in p.rules
    ]
    attention = [f"! {e.role}: {e.what}" for e in p.escalations]
    sections = [
        ("Objects", len(objects), _table(("KIND", "NAMESPACE", "NAME"), objects)),
        ("Cluster-scoped", len(p.cluster_scoped), list(p.cluster_scoped)),
        ("CRDs", len(p.crds), list(p.crds)),
        (
            "RBAC rules",
            len(rules),
            _table(("SCOPE", "RESOURCES", "RESOURCE NAMES", "VERBS"), rules),
        ),
        ("Bindings", len(p.bindings), list(p.bindings)),
        ("Needs a reviewer's attention", len(attention), attention),
    ]
    out: list[str] = []
    for title, count, lines in sections:
        out += [f"{title} ({count}):", *(f"  {line}" for line in lines or ["none"]), ""]
    return "\n".join(_clean(line) for line in out[:-1]) + "\n"


def _table(header: tuple[str, ...], rows: Iterable[tuple[str, ...]]) -> list[str]:
    body = [tuple(_clean(cell) or "-" for cell in row) for row in rows]
    if not body:
        return []
    widths = [max(len(row[i]) for row in [header, *body]) for i in range(len(header) - 1)]
    return [
        "   ".join([*(cell.ljust(w) for cell, w in zip(row, widths, strict=False)), row[-1]])
        for row in [header, *body]
    ]


def diff(new: Preview, installed: Preview) -> str:
    """What approving ``new`` over ``installed`` adds (``+``) and removes (``-``): objects,
    permissions (only the verbs, resources... that change), bindings, escalations; ""
    when nothing does."""
    new_rules, old_rules = _rule_sets(new, installed)
    lines = _changes(
        "object", [_object(o) for o in new.objects], [_object(o) for o in installed.objects]
    )
    lines += [f"+ rule {_rule_text(r)}" for r in aggregate(new_rules - old_rules)]
    lines += [f"- rule {_rule_text(r)}" for r in aggregate(old_rules - new_rules)]
    lines += _changes("binding", list(new.bindings), list(installed.bindings))
    lines += _changes(
        "attention",
        [f"{e.role}: {e.what}" for e in new.escalations],
        [f"{e.role}: {e.what}" for e in installed.escalations],
    )
    return "".join(_clean(line) + "\n" for line in lines)


def added_rules(new: Preview, installed: Preview) -> list[str]:
    """The permissions ``new`` grants that ``installed`` does not (new rules, verbs,
    resources, groups, names), aggregated, as ``diff`` words them without the ``+ rule``."""
    new_rules, old_rules = _rule_sets(new, installed)
    return [_clean(_rule_text(r)) for r in aggregate(new_rules - old_rules)]


def _rule_sets(new: Preview, installed: Preview) -> tuple[set[Rule], set[Rule]]:
    new_rules, old_rules = _atoms(new.rules), _atoms(installed.rules)
    if new_rules is None or old_rules is None:
        return set(new.rules), set(installed.rules)
    return new_rules, old_rules


def _changes(word: str, now: list[str], before: list[str]) -> list[str]:
    """``+`` lines for what ``now`` has and ``before`` lacks, then ``-`` lines, in list order."""
    had, has = set(before), set(now)
    return [f"+ {word} {x}" for x in now if x not in had] + [
        f"- {word} {x}" for x in before if x not in has
    ]


def _atoms(rules: Iterable[Rule]) -> set[Rule] | None:
    """``rules`` as single permissions (one group, resource, verb, name or URL each);
    None when there would be more than ``ATOM_BUDGET``."""
    rules = list(rules)
    fields = [
        (r.api_groups, r.resources, r.verbs, r.resource_names, r.non_resource_urls) for r in rules
    ]
    total = sum(math.prod(max(len(f), 1) for f in each) for each in fields)
    if total > ATOM_BUDGET:
        return None
    out: set[Rule] = set()
    for rule, each in zip(rules, fields, strict=True):
        for one in itertools.product(*(tuple((v,) for v in f) or ((),) for f in each)):
            out.add(Rule(rule.scope, *one))
    return out


def _rule_text(r: Rule) -> str:
    named = f" named {_list(r.resource_names)}" if r.resource_names else ""
    return f"{_scope(r.scope)}: {_list(r.verbs)} on {_targets(r)}{named}"


def _object(o: tuple[str, str, str, str]) -> str:
    group, kind, namespace, name = o
    return (
        f"{_kind(group, kind)} {namespace}/{name}" if namespace else f"{_kind(group, kind)} {name}"
    )


def _kind(group: str, kind: str) -> str:
    return f"{kind}.{group}" if group else kind


def _label(kind: str, namespace: str, name: str) -> str:
    return f"{kind}/{namespace}/{name}" if namespace else f"{kind}/{name}"


def _scope(scope: str) -> str:
    return "(cluster)" if scope == CLUSTER else scope or "(install namespace)"


def _targets(r: Rule) -> str:
    """kubectl's spelling: ``deployments.apps``, ``pods``, ``/metrics``."""
    named = [f"{res}.{g}" if g else res for g in r.api_groups for res in r.resources]
    return ", ".join([*named, *r.non_resource_urls])


def _list(values: tuple[str, ...]) -> str:
    return "[" + " ".join(values) + "]"


def _shortlist(values: tuple[str, ...]) -> str:
    shown = ", ".join(values[:SHOWN_TARGETS])
    more = len(values) - SHOWN_TARGETS
    return f"{shown} and {more} more" if more > 0 else shown


def _clean(text: str) -> str:
    """``text`` with what does not print (newlines, ANSI escapes, bidi overrides, line
    separators) escaped, so bundle content cannot forge the lines a reviewer reads."""
    return "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)


def _meta(obj: Obj) -> dict[str, Any]:
    return _mapping(meta_of(obj))


def _mapping(value: object) -> dict[str, Any]:
    return value if isinstance(value, dict) else {}


def _text(value: object) -> str:
    return value if isinstance(value, str) else ""


def _strings(value: object) -> tuple[str, ...]:
    """The strings of a list, sorted and unique; () for anything else."""
    return (
        tuple(sorted({v for v in value if isinstance(v, str)})) if isinstance(value, list) else ()
    )


# -- where a preview is kept -------------------------------------------------------------------

CONFIGMAP_PREFIX = "rukpak-preview-"
PREVIEW_LABEL = "core.rukpak.io/bundle-deployment"
"""On the preview ConfigMap: the BundleDeployment it previews (the manager's label for what
belongs to one; deleting the BundleDeployment deletes the preview)."""
SUMMARY_KEY = "summary.json"
RENDER_KEY = "preview.txt"
DIFF_KEY = "diff.txt"
REVISION_KEY = "revision"
STATUS_LIMIT = 3072
NEW_RULES_LIMIT = 6
"""Permissions an upgrade adds listed in the summary (``newRules``); the rest are counted."""
"""Bytes of ``summary`` in ``status.preview`` (and the preview pod's termination message)."""
TEXT_LIMIT = 400 * 1024
"""Bytes of the rendered preview and of its diff kept on the ConfigMap each."""


def configmap_name(deployment: str) -> str:
    """The ConfigMap (system namespace) holding deployment ``deployment``'s full preview."""
    return f"{CONFIGMAP_PREFIX}{deployment}"
