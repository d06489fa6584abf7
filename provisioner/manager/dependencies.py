"""Dependencies between BundleDeployments (``spec.dependsOn``), judged from the cache, pure.

Sits beside ``runwatch`` under the controller, which hands what these functions find to
the planners through ``plan.Observed``: the dependencies not Installed and Healthy yet
(an install waits for them, ``DependencyNotReady``), a cycle (refused,
``DependencyCycle``), and the dependents a deletion waits for (reverse order). It also
says which BundleDeployments to wake when one changes.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from provisioner.engine.objects import Obj, condition, meta_of, name_of

Lookup = Callable[[str], Obj | None]
MAX_DEPTH = 64
"""How far a chain is followed looking for a cycle (a longer chain is reported as one)."""


def depends_on(bd: Obj) -> tuple[str, ...]:
    """The names ``spec.dependsOn`` lists, in order, without repeats or blanks."""
    out: list[str] = []
    for entry in (bd.get("spec") or {}).get("dependsOn") or []:
        name = entry.get("name") if isinstance(entry, dict) else None
        if isinstance(name, str) and name and name not in out:
            out.append(name)
    return tuple(out)


def _state(dep: Obj | None) -> str:
    """Why a dependency is not ready, in a few words; "" when it is."""
    if dep is None:
        return "not found"
    if meta_of(dep).get("deletionTimestamp"):
        return "being deleted"
    for kind in ("Installed", "Healthy"):
        cond = condition(dep, kind)
        if cond is None:
            return f"{kind} not reported yet"
        if cond.get("status") != "True":
            why = str(cond.get("reason") or cond.get("status") or "")
            return f"{kind}={cond.get('status')} ({why})"
    return ""


def unmet(bd: Obj, lookup: Lookup) -> tuple[str, ...]:
    """Each dependency that is not Installed and Healthy, as ``name: why``."""
    out: list[str] = []
    for name in depends_on(bd):
        why = _state(lookup(name))
        if why:
            out.append(f"{name}: {why}")
    return tuple(out)


def cycle(bd: Obj, lookup: Lookup) -> str:
    """The cycle through ``bd`` that ``spec.dependsOn`` makes (``a -> b -> a``); "" if
    none. Dependencies that do not exist end a path."""
    start = name_of(bd)
    path: list[str] = [start]
    seen: set[str] = set()

    def walk(current: Obj, depth: int) -> str:
        for name in depends_on(current):
            if name == start:
                return " -> ".join([*path, name])
            if name in seen or depth >= MAX_DEPTH:
                continue
            seen.add(name)
            nxt = lookup(name)
            if nxt is None:
                continue
            path.append(name)
            found = walk(nxt, depth + 1)
            if found:
                return found
            path.pop()
        return ""

    return walk(bd, 0)


def dependents(name: str, bds: Iterable[Obj]) -> tuple[str, ...]:
    """The BundleDeployments whose ``spec.dependsOn`` names ``name``, sorted."""
    return tuple(sorted(name_of(b) for b in bds if name in depends_on(b) and name_of(b) != name))
