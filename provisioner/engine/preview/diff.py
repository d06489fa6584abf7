"""What an install would change, found by server-side dry run.

The read-only twin of ``apply.install``: each prepared object is applied with
``dryRun=All`` (so defaulting, admission and field ownership are the server's
own) and the result compared with the live object after both drop what no one
writes by hand (status, managedFields, resourceVersion, timestamps). Objects
the previous revision applied and this one does not show up as ``prune``.
``rukpak diff`` prints the result and exits 3 when anything would change.
"""

from __future__ import annotations

import copy
import difflib
from dataclasses import dataclass
from typing import Literal

import yaml

from provisioner.engine import pool
from provisioner.engine.apply import apply, inventory, inventorystore, preflight
from provisioner.engine.bundle.formats import Bundle, Manifest, Source
from provisioner.engine.errors import ApplyFailed, UnknownKind
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef, owner_of
from rukpak.common import errors

Action = Literal["create", "update", "unchanged", "prune", "conflict"]

VOLATILE_METADATA = (
    "managedFields",
    "resourceVersion",
    "generation",
    "creationTimestamp",
    "uid",
    "selfLink",
)


@dataclass(frozen=True)
class Change:
    ref: ObjectRef
    action: Action
    detail: str = ""
    """A unified diff for ``update``; a note otherwise."""
    source: Source | None = None


def comparable(obj: Obj) -> Obj:
    """``obj`` without status and server-maintained metadata."""
    out = copy.deepcopy(obj)
    out.pop("status", None)
    meta = out.get("metadata") or {}
    for key in VOLATILE_METADATA:
        meta.pop(key, None)
    return out


def unified(live: Obj, wanted: Obj, label: str) -> str:
    """A unified diff between two objects as YAML; empty when they are equal."""
    a = yaml.safe_dump(comparable(live), sort_keys=True).splitlines(keepends=True)
    b = yaml.safe_dump(comparable(wanted), sort_keys=True).splitlines(keepends=True)
    return "".join(difflib.unified_diff(a, b, f"live/{label}", f"bundle/{label}"))


def _one(kube: Kube, m: Manifest, options: apply.Options, bundle_namespaces: set[str]) -> Change:
    ref = m.ref
    live = kube.get(ref)
    if live is not None:
        owner = owner_of(live)
        if owner != options.name and (owner or not options.adopt):
            why = f"owned by deployment {owner!r}" if owner else "exists and no deployment owns it"
            return Change(ref, "conflict", why, m.source)
    try:
        dry = kube.apply(m.obj, dry_run=True)
    except UnknownKind:
        return Change(ref, "create", "its CRD is created by this bundle", m.source)
    except errors.NotFound:
        if ref.namespace in bundle_namespaces:
            return Change(
                ref, "create", f"namespace {ref.namespace} is created by this bundle", m.source
            )
        raise
    if live is None:
        return Change(ref, "create", "", m.source)
    text = unified(live, dry, str(ref).replace(" ", "/"))
    return Change(ref, "update" if text else "unchanged", text, m.source)


def plan(kube: Kube, bundle: Bundle, options: apply.Options) -> list[Change]:
    """Every object's change, in bundle order, then the prunes; nothing is written."""
    manifests = preflight.prepare(kube, bundle, name=options.name, namespace=options.namespace)
    namespaces = {m.ref.name for m in manifests if (m.ref.group, m.ref.kind) == ("", "Namespace")}
    results = pool.run_all(
        manifests, lambda m: _one(kube, m, options, namespaces), concurrency=options.concurrency
    )
    failures = [(m.describe(), r) for m, r in results if isinstance(r, errors.RukpakError)]
    if failures:
        raise ApplyFailed("diff", failures)
    changes = [r for _, r in results if isinstance(r, Change)]
    previous = inventorystore.read_inventory(
        kube, options.name, system_namespace=options.system_namespace
    )
    if previous is not None and options.prune:
        for ref in inventory.plan_prune(previous.refs, [m.ref for m in manifests]):
            live = kube.get(ref)
            if live is not None and owner_of(live) == options.name:
                changes.append(Change(ref, "prune"))
    return changes
