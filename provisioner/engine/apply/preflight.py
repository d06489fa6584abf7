"""Before anything is written: prepare a bundle's objects and check they may be applied.

Step 1 and 2 of ``apply.install`` (and all of ``diff``): ``prepare`` turns the
bundle's manifests into what will be applied (owner label, the install
namespace for namespaced objects that have none, namespaced-ness from
discovery or from a CRD in the same bundle, a cluster-scoped object's stray
namespace dropped, the digest annotation of ``ownership``; unknown kinds and
objects defined twice refused with file and document named). The checks read
the live objects in bulk (``read_live``: a GET each, one list for big groups)
and refuse, listing every reason, to take over an object another deployment
owns (or an unowned one without ``adopt``) and unsafe CRD upgrades
(``crdsafety``).
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence

from provisioner.engine import pool
from provisioner.engine.apply import crdsafety, ownership
from provisioner.engine.bundle import words
from provisioner.engine.bundle.formats import Bundle, Manifest
from provisioner.engine.errors import (
    ApplyFailed,
    BundleInvalid,
    CRDUpgradeUnsafe,
    OwnershipConflict,
    UnknownKind,
)
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef, owner_of, with_namespace, with_owner
from rukpak.common import errors

CRD_GROUP = "apiextensions.k8s.io"


def _bundle_scopes(manifests: Iterable[Manifest]) -> dict[tuple[str, str], bool]:
    """(group, kind) -> namespaced, for kinds whose CRD is in the bundle."""
    scopes: dict[tuple[str, str], bool] = {}
    for m in manifests:
        ref = m.ref
        if (ref.group, ref.kind) == (CRD_GROUP, "CustomResourceDefinition"):
            spec = m.obj.get("spec") or {}
            kind = (spec.get("names") or {}).get("kind")
            if spec.get("group") and kind:
                scopes[(spec["group"], kind)] = spec.get("scope", "Namespaced") == "Namespaced"
    return scopes


def prepare(kube: Kube, bundle: Bundle, *, name: str, namespace: str) -> list[Manifest]:
    """The bundle's manifests as deployment ``name`` applies them, namespaced objects
    without a namespace put in ``namespace``; ``BundleInvalid`` for unknown kinds."""
    scopes = _bundle_scopes(bundle.manifests)
    out: list[Manifest] = []
    seen: dict[tuple[str, str, str, str], Manifest] = {}
    unknown: dict[tuple[str, str], str] = {}
    for m in bundle.manifests:
        ref = m.ref
        namespaced = scopes.get((ref.group, ref.kind))
        if namespaced is None:
            try:
                namespaced = kube.resource(ref.api_version, ref.kind).namespaced
            except UnknownKind:
                unknown.setdefault((ref.api_version, ref.kind), str(m.source))
                continue
        target = (ref.namespace or namespace) if namespaced else ""
        obj = ownership.with_digest(with_owner(with_namespace(m.obj, target), name))
        prepared = Manifest(obj=obj, source=m.source)
        first = seen.setdefault(prepared.ref.identity, prepared)
        if first is not prepared:
            raise BundleInvalid(
                f"{m.source}: {prepared.ref} is defined twice (first in {first.source})"
            )
        out.append(prepared)
    if unknown:
        raise BundleInvalid(unknown_kinds(unknown))
    return out


def unknown_kinds(unknown: dict[tuple[str, str], str]) -> str:
    """Every kind the API server does not serve, in upstream's words (``required resource
    not found: no matches for kind "X" in version "G/V"``), each followed by where the
    bundle uses it (``words.unknown_kinds``)."""
    return words.unknown_kinds(unknown)


LIST_THRESHOLD = 20
"""From this many objects of one kind in one namespace, one list beats a GET each."""


def read_live(
    kube: Kube, refs: Sequence[ObjectRef], concurrency: int
) -> dict[ObjectRef, Obj | errors.RukpakError | None]:
    """The live object, None, or the error reading it, for each ref: by GET or, for big
    groups, by one list (a failed list is that error for every member)."""
    groups: dict[tuple[str, str, str], list[ObjectRef]] = {}
    for ref in refs:
        groups.setdefault((ref.api_version, ref.kind, ref.namespace), []).append(ref)
    listed = [key for key, members in groups.items() if len(members) >= LIST_THRESHOLD]
    singles = [r for key, members in groups.items() if key not in listed for r in members]

    def list_group(key: tuple[str, str, str]) -> dict[str, Obj]:
        api_version, kind, namespace = key
        try:
            items, _ = kube.list(api_version, kind, namespace=namespace)
        except UnknownKind:
            return {}
        return {str(i["metadata"]["name"]): i for i in items}

    out: dict[ObjectRef, Obj | errors.RukpakError | None] = {}
    for key, found in pool.run_all(listed, list_group, concurrency=concurrency):
        for ref in groups[key]:
            out[ref] = found if isinstance(found, errors.RukpakError) else found.get(ref.name)
    for ref, got in pool.run_all(singles, kube.get, concurrency=concurrency):
        out[ref] = got
    return out


def check_ownership(
    kube: Kube, manifests: Sequence[Manifest], *, name: str, adopt: bool, concurrency: int
) -> dict[ObjectRef, Obj]:
    """Live copies of the manifests' objects; raises ``OwnershipConflict`` listing every clash.

    An object that cannot be read (RBAC, API server errors) stops the install before
    anything is written, as ``ApplyFailed`` naming each object's file and document.
    """
    read = read_live(kube, [m.ref for m in manifests], concurrency)
    unreadable = [
        (m.describe(), got) for m in manifests if isinstance(got := read[m.ref], errors.RukpakError)
    ]
    if unreadable:
        raise ApplyFailed("ownership check (read)", unreadable)
    live = {ref: got for ref, got in read.items() if isinstance(got, dict)}
    clashes: list[str] = []
    for m in manifests:
        got = live.get(m.ref)
        if got is None:
            continue
        owner = owner_of(got)
        if owner == name:
            continue
        if owner:
            clashes.append(
                f"{m.describe()} is owned by deployment {owner!r};"
                f" deployment {name!r} will not take it over"
            )
        elif not adopt:
            clashes.append(
                f"{m.describe()} already exists and no deployment owns it;"
                " adopt it explicitly (--adopt) or delete it"
            )
    if clashes:
        raise OwnershipConflict("\n".join(clashes))
    return live


def check_crds(kube: Kube, manifests: Sequence[Manifest], live: dict[ObjectRef, Obj]) -> None:
    """Refuse unsafe CRD upgrades (``crdsafety``) with every reason listed."""
    reasons: list[str] = []
    for m in manifests:
        ref = m.ref
        if (ref.group, ref.kind) != (CRD_GROUP, "CustomResourceDefinition"):
            continue
        old = live.get(ref)
        if old is None or crdsafety.opted_out(m.obj):
            continue
        spec = old.get("spec") or {}
        group, kind = spec.get("group", ""), (spec.get("names") or {}).get("kind", "")
        existing: dict[str, list[Obj]] = {}
        for version, read_at in crdsafety.read_plan(old, m.obj).items():
            existing[version] = kube.list(f"{group}/{read_at}", kind)[0]
        reasons += crdsafety.check(old, m.obj, existing)
    if reasons:
        raise CRDUpgradeUnsafe(
            "\n".join(reasons) + f"\n(to skip these checks annotate the CRD"
            f" {crdsafety.OPT_OUT_ANNOTATION}: {crdsafety.OPT_OUT_VALUE})"
        )
