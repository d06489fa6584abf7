"""Dependencies between BundleDeployments (``spec.dependsOn``), judged from the cache, pure.

Sits beside ``runwatch`` under the controller, which hands what these functions find to
the planners through ``plan.Observed``: the dependencies not ready yet (an install waits
for them, ``DependencyNotReady``), a cycle (refused, ``DependencyCycle``), and the
dependents a deletion waits for (reverse order). It also says which BundleDeployments to
wake when one changes, and judges for the admission webhook (``webhook``) whether a
create or update of ``spec.dependsOn`` closes a cycle.

A dependency is ready when it is Installed and Healthy *and settled*: not moving to
other content or configuration (``upgrading``). So when a dependency and its dependents
change together, the dependency's new revision is installed and healthy before a
dependent moves (upgrades in dependency order); the dependency's status changing wakes
its dependents (``dependents``).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator

from provisioner.engine.apply import revisionlog
from provisioner.engine.objects import Obj, condition, meta_of, name_of
from provisioner.manager import conversion, model
from provisioner.manager.planning import revisions

Lookup = Callable[[str], Obj | None]


def depends_on(bd: Obj) -> tuple[str, ...]:
    """The names ``spec.dependsOn`` lists, in order, without repeats or blanks."""
    out: list[str] = []
    for entry in (bd.get("spec") or {}).get("dependsOn") or []:
        name = entry.get("name") if isinstance(entry, dict) else None
        if isinstance(name, str) and name and name not in out:
            out.append(name)
    return tuple(out)


def _without_items(source: object) -> object:
    if not isinstance(source, dict):
        return source
    out = {k: v for k, v in source.items() if k != revisions.ITEMS}
    if isinstance(out.get("sources"), list):
        out["sources"] = [_without_items(s) for s in out["sources"]]
    return out


def _resolved(dep: Obj) -> object:
    """The content the dependency's spec is pinned to now, in a revision's shape."""
    status = dep.get("status") or {}
    several = status.get("resolvedSources")
    if isinstance(several, list) and several:
        return {"sources": several}
    return status.get("resolvedSource")


def upgrading(dep: Obj) -> str:
    """Why ``dep`` is moving to content or configuration it has not installed yet, in a few
    words; "" when it is settled. A paused BundleDeployment counts as it stands.

    Judged from the object alone: a spec generation the manager has not acted on yet
    (``status.observedGeneration`` behind); a rollback in force not installed yet; the
    newest revision still in progress; a pin newer than the newest revision (a
    ``pollInterval`` re-pin about to become one); for objects created as v1alpha1, a
    wanted Bundle other than ``status.activeBundle``."""
    spec, status = dep.get("spec") or {}, dep.get("status") or {}
    if spec.get("paused"):
        return ""
    generation = int(meta_of(dep).get("generation") or 0)
    seen = status.get("observedGeneration")
    if isinstance(seen, int) and seen < generation:
        return f"upgrading: spec generation {generation} not acted on yet"
    installed = status.get("installedRevision")
    kept = revisionlog.of_status(dep)
    rollback = revisionlog.rollback_of(dep)
    if rollback is not None:
        if installed != rollback.revision:
            return f"rolling back to revision {rollback.revision}"
        return ""
    if kept:
        newest = kept[-1]
        if newest.number != installed and newest.outcome == revisionlog.IN_PROGRESS:
            verb = "installing" if installed is None else "upgrading to"
            return f"{verb} revision {newest.number}"
        pinned = _resolved(dep)
        if pinned is not None and _without_items(pinned) != _without_items(newest.source):
            return "upgrading: newly resolved content is not a revision yet"
    active = status.get("activeBundle")
    if active and conversion.origin(dep) == "v1alpha1":
        wanted = model.bundle_name(conversion.to_v1alpha1(dep))
        if wanted != active:
            return f"upgrading to Bundle {wanted}"
    return ""


def _state(dep: Obj | None) -> str:
    """Why a dependency is not ready, in a few words; "" when it is."""
    if dep is None:
        return "not found"
    if meta_of(dep).get("deletionTimestamp"):
        return "being deleted"
    moving = upgrading(dep)
    if moving:
        return moving
    for kind in ("Installed", "Healthy"):
        cond = condition(dep, kind)
        if cond is None:
            return f"{kind} not reported yet"
        if cond.get("status") != "True":
            why = str(cond.get("reason") or cond.get("status") or "")
            return f"{kind}={cond.get('status')} ({why})"
    return ""


def unmet(bd: Obj, lookup: Lookup) -> tuple[str, ...]:
    """Each dependency that is not ready (Installed, Healthy and settled), as
    ``name: why``."""
    out: list[str] = []
    for name in depends_on(bd):
        why = _state(lookup(name))
        if why:
            out.append(f"{name}: {why}")
    return tuple(out)


def cycle(bd: Obj, lookup: Lookup) -> str:
    """The cycle through ``bd`` that ``spec.dependsOn`` makes (``a -> b -> a``, or
    ``a -> a``); "" if none. ``bd`` is taken as given (its stored version is never looked
    up), so an update can be judged before it is stored. Dependencies that do not exist
    end a path; each BundleDeployment is visited once, so any length of chain is
    followed (no recursion)."""
    start = name_of(bd)
    seen = {start}
    path: list[str] = [start]
    stack: list[Iterator[str]] = [iter(depends_on(bd))]
    while stack:
        name = next(stack[-1], None)
        if name is None:
            stack.pop()
            path.pop()
            continue
        if name == start:
            return " -> ".join([*path, start])
        if name in seen:
            continue
        seen.add(name)
        found = lookup(name)
        if found is None:
            continue
        path.append(name)
        stack.append(iter(depends_on(found)))
    return ""


def admission_denial(operation: str, old: Obj | None, new: Obj | None, lookup: Lookup) -> str:
    """Why a create or update of BundleDeployment ``new`` is refused ("" to admit): its
    ``spec.dependsOn`` closes a cycle (``lookup`` reads the stored others). An update that
    leaves ``spec.dependsOn`` as it was is admitted, and so is one of an object being
    deleted: a cycle made while no webhook answered must still let its members go (their
    finalizers are removed by updates)."""
    if operation not in ("CREATE", "UPDATE") or new is None:
        return ""
    if meta_of(new).get("deletionTimestamp"):
        return ""
    wanted = depends_on(new)
    if not wanted or (operation == "UPDATE" and old is not None and depends_on(old) == wanted):
        return ""
    found = cycle(new, lookup)
    if not found:
        return ""
    return f"spec.dependsOn closes a cycle: {found}; remove one of its edges"


def dependents(name: str, bds: Iterable[Obj]) -> tuple[str, ...]:
    """The BundleDeployments whose ``spec.dependsOn`` names ``name``, sorted."""
    return tuple(sorted(name_of(b) for b in bds if name in depends_on(b) and name_of(b) != name))
