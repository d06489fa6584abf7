"""Install one revision of a bundle: preflight, apply phase by phase, prune, record.

The centre of the flow. ``install`` takes a loaded ``Bundle`` and a ``Kube``
adapter and:

1. prepares every object: owner label, the install namespace for namespaced
   objects that have none (namespaced-ness from discovery, or from a CRD in the
   same bundle; a cluster-scoped object's stray namespace is dropped), unknown
   kinds refused with file and document named, and the digest annotation of
   ``managed``;
2. preflights ownership (an object owned by another deployment is never taken
   over; an unowned one only with ``adopt``) and CRD upgrade safety, reading
   the live objects in bulk;
3. records *previous | current* in the inventory before writing anything else,
   so an object applied by a run that fails part way is still pruned later;
4. applies the ordering phases one after another with server-side apply
   (field manager ``rukpak``), objects inside a phase concurrently with a
   bounded pool; an object whose live copy already is what it would apply
   (``ownership.stale_reason``) is left alone, so re-installing unchanged
   content sends no writes; after the CRD phase it waits until the CRDs are
   Established and served; a failing phase stops the run naming every failed
   object;
5. prunes what the previous revision applied and this one does not, in
   reverse phase order, and records *current* alone (the inventory is only
   written when it changes).

Deletion (pruning and uninstall) first reads the object and leaves it alone
unless it still carries this deployment's owner label; ``Orphan`` (the policy
or the object's ``core.rukpak.io/deletion-policy`` annotation) removes the
label instead of deleting.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Literal

from csi.common import errors
from provisioner.engine import (
    crdsafety,
    health,
    inventory,
    inventorystore,
    ordering,
    ownership,
    pool,
)
from provisioner.engine.errors import (
    ApplyFailed,
    BundleInvalid,
    CRDUpgradeUnsafe,
    OwnershipConflict,
    UnknownKind,
)
from provisioner.engine.formats import Bundle, Manifest
from provisioner.engine.kube import Kube
from provisioner.engine.objects import (
    DELETION_POLICY_ANNOTATION,
    OWNER_LABEL,
    Obj,
    ObjectRef,
    owner_of,
    with_namespace,
    with_owner,
)

Progress = Callable[[str], None]
DeletionPolicy = Literal["Delete", "Orphan"]
CRD_GROUP = "apiextensions.k8s.io"


def no_progress(_: str) -> None:
    pass


@dataclass(frozen=True)
class Options:
    name: str
    """The deployment's name: the owner label's value and the inventory's key."""
    namespace: str = "default"
    """Install namespace for namespaced objects that do not name one."""
    adopt: bool = False
    """Take over existing objects no deployment owns (never ones another deployment owns)."""
    system_namespace: str = inventory.DEFAULT_SYSTEM_NAMESPACE
    concurrency: int = 16
    crd_timeout: float = 60.0
    """Seconds to wait for applied CRDs to become Established and served."""
    prune: bool = True


@dataclass(frozen=True)
class Applied:
    manifest: Manifest
    """The prepared manifest (owner label, namespace defaulted), with its bundle source."""
    live: Obj
    """The object as the API server returned it after apply (or as read, when unchanged)."""
    unchanged: bool = False
    """The live object already was what applying would make it: no request was sent."""

    @property
    def ref(self) -> ObjectRef:
        return self.manifest.ref


@dataclass
class Result:
    applied: list[Applied] = field(default_factory=list)
    pruned: list[ObjectRef] = field(default_factory=list)
    orphaned: list[ObjectRef] = field(default_factory=list)
    skipped: list[tuple[ObjectRef, str]] = field(default_factory=list)
    """Refs left alone during deletion, each with the reason."""


# -- preparation --------------------------------------------------------------


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


def prepare(kube: Kube, bundle: Bundle, options: Options) -> list[Manifest]:
    """The bundle's manifests as they will be applied; ``BundleInvalid`` for unknown kinds."""
    scopes = _bundle_scopes(bundle.manifests)
    out: list[Manifest] = []
    seen: dict[tuple[str, str, str, str], Manifest] = {}
    for m in bundle.manifests:
        ref = m.ref
        namespaced = scopes.get((ref.group, ref.kind))
        if namespaced is None:
            try:
                namespaced = kube.resource(ref.api_version, ref.kind).namespaced
            except UnknownKind as err:
                raise BundleInvalid(f"{m.source}: {err}") from None
        namespace = (ref.namespace or options.namespace) if namespaced else ""
        obj = ownership.with_digest(with_owner(with_namespace(m.obj, namespace), options.name))
        prepared = Manifest(obj=obj, source=m.source)
        first = seen.setdefault(prepared.ref.identity, prepared)
        if first is not prepared:
            raise BundleInvalid(
                f"{m.source}: {prepared.ref} is defined twice (first in {first.source})"
            )
        out.append(prepared)
    return out


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
    kube: Kube, manifests: Sequence[Manifest], options: Options
) -> dict[ObjectRef, Obj]:
    """Live copies of the manifests' objects; raises ``OwnershipConflict`` listing every clash.

    An object that cannot be read (RBAC, API server errors) stops the install before
    anything is written, as ``ApplyFailed`` naming each object's file and document.
    """
    read = read_live(kube, [m.ref for m in manifests], options.concurrency)
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
        if owner == options.name:
            continue
        if owner:
            clashes.append(
                f"{m.describe()} is owned by deployment {owner!r};"
                f" deployment {options.name!r} will not take it over"
            )
        elif not options.adopt:
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


# -- apply ------------------------------------------------------------------------


def _wait_crds(kube: Kube, applied: Sequence[Applied], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for a in applied:
        spec = a.manifest.obj.get("spec") or {}
        kind = (spec.get("names") or {}).get("kind", "")
        served = [v["name"] for v in spec.get("versions") or [] if v.get("served")]
        while True:
            live = kube.get(a.ref)
            state = health.crd(live) if live is not None else health.Health(False, "not found")
            if state.ready:
                group = spec.get("group")
                if all(kube.serves(f"{group}/{version}", kind) for version in served):
                    break
                state = health.Health(False, "established but not yet served")
            if "names not accepted" in state.reason:
                raise ApplyFailed(
                    "crds", [(a.manifest.describe(), errors.InvalidArgument(state.reason))]
                )
            if time.monotonic() > deadline:
                raise ApplyFailed(
                    "crds",
                    [
                        (
                            a.manifest.describe(),
                            errors.DeadlineExceeded(f"not established: {state.reason}"),
                        )
                    ],
                )
            time.sleep(0.2)


RETRYABLE = (errors.Unavailable, errors.Aborted)
"""Server busy or a write conflict: worth another attempt with backoff."""


def apply_with_retry(kube: Kube, obj: Obj, *, attempts: int = 4) -> Obj:
    """``kube.apply`` retrying temporary failures (5xx, 429, conflicts) with backoff."""
    delay = 0.2
    for attempt in range(attempts):
        try:
            return kube.apply(obj)
        except RETRYABLE:
            if attempt == attempts - 1:
                raise
            time.sleep(delay)
            delay *= 3
    raise AssertionError("unreachable")


def apply_phase(
    kube: Kube,
    phase: ordering.Phase,
    options: Options,
    *,
    live: Mapping[ObjectRef, Obj] | None = None,
    progress: Progress = no_progress,
) -> list[Applied]:
    """Apply one phase's objects concurrently; ``ApplyFailed`` names every failure.

    Objects whose copy in ``live`` is already what applying would make them
    are not sent (``Applied.unchanged``).
    """
    live = live or {}
    unchanged = {
        m.ref
        for m in phase.manifests
        if ownership.stale_reason(m.obj, live.get(m.ref), options.name) is None
    }
    todo = [m for m in phase.manifests if m.ref not in unchanged]
    total = len(todo)
    step = max(100, total // 10)
    done = 0
    lock = threading.Lock()

    def one(m: Manifest) -> Obj:
        nonlocal done
        result = apply_with_retry(kube, m.obj)
        with lock:
            done += 1
            if done % step == 0 and done < total:
                progress(f"  {phase.name}: {done}/{total}")
        return result

    sent = pool.run_all(todo, one, concurrency=options.concurrency)
    failures = [(m.describe(), got) for m, got in sent if isinstance(got, errors.RukpakError)]
    if failures:
        raise ApplyFailed(phase.name, failures)
    after = {m.ref: got for m, got in sent if not isinstance(got, errors.RukpakError)}
    applied = [
        Applied(m, live[m.ref], unchanged=True) if m.ref in unchanged else Applied(m, after[m.ref])
        for m in phase.manifests
    ]
    if phase.spec.wait_established:
        progress(f"waiting for {len(applied)} CRDs to be established")
        _wait_crds(kube, applied, options.crd_timeout)
    return applied


def install(
    kube: Kube, bundle: Bundle, options: Options, *, progress: Progress = no_progress
) -> Result:
    """Make the cluster hold ``bundle`` as deployment ``options.name``; see the module doc.

    Idempotent: installing the same bundle twice changes nothing the second
    time, and sends no write requests (unchanged objects are not re-applied,
    an unchanged inventory is not rewritten).
    """
    manifests = prepare(kube, bundle, options)
    current = [m.ref for m in manifests]
    progress(f"{len(manifests)} objects; checking ownership")
    live = check_ownership(kube, manifests, options)
    check_crds(kube, manifests, live)

    previous = inventorystore.read_inventory(
        kube, options.name, system_namespace=options.system_namespace
    )
    previous_refs = previous.refs if previous else frozenset()
    stored = inventorystore.write_inventory(
        kube,
        inventory.Inventory(
            options.name, options.namespace, inventory.merged(previous_refs, current)
        ),
        system_namespace=options.system_namespace,
        stored=previous,
    )

    result = Result()
    total, done, unchanged = len(manifests), 0, 0
    for phase in ordering.phases(manifests):
        progress(f"applying {phase.name}: {len(phase.manifests)} objects")
        applied = apply_phase(kube, phase, options, live=live, progress=progress)
        result.applied += applied
        done += len(applied)
        unchanged += sum(1 for a in applied if a.unchanged)
        progress(f"applied {done}/{total} ({unchanged} already up to date)")

    if options.prune and previous_refs:
        doomed = inventory.plan_prune(previous_refs, current)
        if doomed:
            progress(f"pruning {len(doomed)} objects")
        delete_owned(
            kube,
            doomed,
            options.name,
            policy="Delete",
            result=result,
            concurrency=options.concurrency,
        )
    inventorystore.write_inventory(
        kube,
        inventory.Inventory(options.name, options.namespace, frozenset(current)),
        system_namespace=options.system_namespace,
        stored=stored,
    )
    return result


# -- deletion -----------------------------------------------------------------------


def _delete_one(kube: Kube, ref: ObjectRef, owner: str, policy: DeletionPolicy) -> str:
    live = kube.get(ref)
    if live is None:
        return "gone"
    actual = owner_of(live)
    if actual != owner:
        return f"skipped: owned by {actual!r}" if actual else "skipped: no longer labelled as ours"
    annotations = (live.get("metadata") or {}).get("annotations") or {}
    if policy == "Orphan" or annotations.get(DELETION_POLICY_ANNOTATION) == "Orphan":
        kube.merge_patch(ref, {"metadata": {"labels": {OWNER_LABEL: None}}})
        return "orphaned"
    kube.delete(ref)
    return "deleted"


def delete_owned(
    kube: Kube,
    refs: Sequence[ObjectRef],
    owner: str,
    *,
    policy: DeletionPolicy,
    result: Result,
    concurrency: int,
) -> None:
    """Delete (or orphan) ``refs`` still owned by ``owner``, reverse phase order, group by group."""
    for group in ordering.deletion_order(refs):
        outcomes = pool.run_all(
            group, lambda r: _delete_one(kube, r, owner, policy), concurrency=concurrency
        )
        failures = [(str(r), o) for r, o in outcomes if isinstance(o, errors.RukpakError)]
        if failures:
            raise ApplyFailed("prune", failures)
        for ref, outcome in outcomes:
            if outcome == "deleted":
                result.pruned.append(ref)
            elif outcome == "orphaned":
                result.orphaned.append(ref)
            elif isinstance(outcome, str) and outcome.startswith("skipped"):
                result.skipped.append((ref, outcome.removeprefix("skipped: ")))
