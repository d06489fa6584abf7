"""Revisions of a BundleDeployment: what was installed, kept to go back to, pure.

Sits under both planners (``plan`` for objects created as v1alpha1, ``inline`` for those
created as v1alpha2) and beside ``runs``: each distinct content that an instance run is
asked to install is a revision, numbered from 1 in ``status.revisions`` (the last
``spec.revisionHistoryLimit``, default 5), with its pin (an image digest, a git commit,
an http content digest), the generation that asked for it, when, its outcome and how
many objects it applied. ``status.installedRevision`` names what the install record
holds now; ``status.previousRevision`` what it held before.

A rollback (``ROLLBACK_ANNOTATION``, written by ``rukpak rollback`` or by the manager
when ``spec.rollbackOnFailure`` meets ``spec.progressDeadlineSeconds``) names a kept
revision and the generation it holds for: while the spec stays at that generation the
planner installs the kept pin instead of resolving the spec, so no registry, git or
http server is asked (the node caches hold the content); the next spec change ends it.

The ``Progressing`` condition judges the newest revision against its deadline:
``progress`` says whether it became Installed and Healthy in time.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass, replace
from typing import Any

from provisioner.engine.apply import revisionlog
from provisioner.engine.apply.revisionlog import DEADLINE as DEADLINE
from provisioner.engine.apply.revisionlog import FAILED as FAILED
from provisioner.engine.apply.revisionlog import IN_PROGRESS as IN_PROGRESS
from provisioner.engine.apply.revisionlog import INSTALLED as INSTALLED
from provisioner.engine.apply.revisionlog import MANUAL as MANUAL
from provisioner.engine.apply.revisionlog import ROLLBACK_ANNOTATION as ROLLBACK_ANNOTATION
from provisioner.engine.apply.revisionlog import Revision as Revision
from provisioner.engine.apply.revisionlog import Rollback as Rollback
from provisioner.engine.apply.revisionlog import find as find
from provisioner.engine.apply.revisionlog import of_status as of_status
from provisioner.engine.apply.revisionlog import rollback_annotation as rollback_annotation
from provisioner.engine.apply.revisionlog import rollback_of as rollback_of
from provisioner.engine.objects import Obj
from provisioner.manager import model
from provisioner.manager.planning import sources

HISTORY_LIMIT = 5
"""Revisions kept without ``spec.revisionHistoryLimit``."""
PROGRESS_DEADLINE = 600
"""Seconds without ``spec.progressDeadlineSeconds`` (as a Deployment's)."""
PROGRESSING = "Progressing"
ITEMS = "configMapItems"
"""Where a revision keeps the projected items of its configMaps sources."""
CONFIG_FIELDS = ("installNamespace", "config")
"""The configuration a revision holds beside its content: a change of it is a revision."""


def config_of(spec: Obj) -> Obj:
    """The spec's ``CONFIG_FIELDS`` that are set."""
    return {k: copy.deepcopy(spec[k]) for k in CONFIG_FIELDS if spec.get(k) not in (None, "", {})}


def with_config(bd: Obj, config: Obj | None) -> Obj:
    """``bd`` with the configuration a kept revision was installed with."""
    spec = {k: v for k, v in (bd.get("spec") or {}).items() if k not in CONFIG_FIELDS}
    return {**bd, "spec": {**spec, **copy.deepcopy(config or {})}}


def limit_of(spec: Obj) -> int:
    value = spec.get("revisionHistoryLimit")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    return HISTORY_LIMIT


def deadline_of(spec: Obj) -> int:
    value = spec.get("progressDeadlineSeconds")
    if isinstance(value, int) and not isinstance(value, bool) and value >= 1:
        return value
    return PROGRESS_DEADLINE


# -- pins as a revision keeps them ---------------------------------------------------------


def _encode_one(resolved: Obj) -> Obj:
    out = sources.stored(resolved)
    items = resolved.get(sources.ITEMS_KEY)
    if items is not None:
        out[ITEMS] = items
    return out


def encode_pin(resolved: Obj) -> Obj:
    """A pinned source (``sources.pinned``, ``sources.several``) as a revision stores it:
    the API's ``resolvedSource`` shape, or ``{"sources": [..., destination]}``."""
    if resolved.get("type") == sources.MULTI:
        return {
            "sources": [{**_encode_one(r), "destination": d} for d, r in sources.parts(resolved)]
        }
    return _encode_one(resolved)


def _decode_one(stored: Obj) -> Obj | None:
    view: Obj = {"status": {"resolvedSource": {k: v for k, v in stored.items() if k != ITEMS}}}
    if ITEMS in stored:
        text = json.dumps(stored[ITEMS])
        view["metadata"] = {"annotations": {sources.ITEMS_ANNOTATION: text}}
    return sources.pinned(view)


def decode_pin(stored: Obj) -> Obj | None:
    """The pinned source a revision keeps (``encode_pin`` undone); None when it is not a
    complete pin."""
    several = stored.get("sources")
    if isinstance(several, list):
        parts: list[tuple[str, Obj]] = []
        for entry in several:
            if not isinstance(entry, dict):
                return None
            one = _decode_one({k: v for k, v in entry.items() if k != "destination"})
            if one is None:
                return None
            parts.append((str(entry.get("destination") or ""), one))
        return sources.several(parts) if parts else None
    return _decode_one(stored)


# -- keeping the history -------------------------------------------------------------------


def track(
    revisions: list[Revision],
    *,
    name: str,
    resolved: Obj,
    generation: int,
    now: str,
    limit: int,
    keep: str = "",
    asked: bool = True,
    config: Obj | None = None,
) -> list[Revision]:
    """``revisions`` with ``name`` in it: a new revision numbered after the newest unless
    one of that name is kept (a rollback, or a spec changed back, reuses it). The oldest
    go beyond ``limit``, never the one named nor ``keep`` (the installed one). A kept
    revision asked for again by a newer generation (``asked``; not a rollback) is timed
    anew."""
    found = next((r for r in revisions if r.name == name), None)
    if found is not None:
        if asked and found.generation != generation and found.name != keep:
            # the spec came back to kept content: a new attempt, timed from now
            again = replace(found, generation=generation, time=now, outcome=IN_PROGRESS)
            return [again if r is found else r for r in revisions]
        return list(revisions)
    number = max((r.number for r in revisions), default=0) + 1
    new = Revision(number, name, encode_pin(resolved), generation, now, config=config)
    kept = [*revisions, new]
    while len(kept) > limit:
        victims = [r for r in kept if r.name not in (name, keep)]
        if not victims:
            break
        kept.remove(victims[0])
    return kept


def settle(
    revisions: list[Revision],
    *,
    name: str,
    outcome: str,
    objects: int | None,
    installed: bool,
    was_installed: int | None,
    now: str,
    node: str = "",
) -> list[Revision]:
    """Record what became of revision ``name``: its outcome, object count, when it became
    the installed one (``installed`` now, while ``was_installed`` named another), and the
    ``node`` whose run installed it (first among its nodes; none given keeps them)."""
    out: list[Revision] = []
    for rev in revisions:
        if rev.name == name:
            changes: dict[str, Any] = {"outcome": outcome}
            if objects is not None:
                changes["objects"] = objects
            if installed and was_installed != rev.number:
                changes["installed_at"] = now
            if installed and node:
                others = [n for n in rev.nodes if n != node]
                changes["nodes"] = (node, *others)[: revisionlog.MAX_NODES]
            rev = replace(rev, **changes)
        out.append(rev)
    return out


def installed_of(revisions: list[Revision], record_name: str) -> Revision | None:
    """The revision the install record holds."""
    return next((r for r in reversed(revisions) if r.name == record_name), None)


def previous_of(revisions: list[Revision], installed: Revision | None) -> Revision | None:
    """The revision installed before ``installed`` (by when each became installed)."""
    if installed is None:
        return None
    earlier = [
        r
        for r in revisions
        if r.installed_at
        and r.number != installed.number
        and r.installed_at <= installed.installed_at
    ]
    return max(earlier, key=lambda r: (r.installed_at, r.number), default=None)


def status_fields(revisions: list[Revision], installed: Revision | None) -> Obj:
    previous = previous_of(revisions, installed)
    out: Obj = {"revisions": [r.document() for r in revisions]}
    out["installedRevision"] = installed.number if installed is not None else None
    out["previousRevision"] = previous.number if previous is not None else None
    return out


# -- progress ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Progress:
    verdict: tuple[str, str, str]
    left: float | None
    """Seconds until the deadline passes (for a requeue); None when it cannot any more."""
    exceeded: bool = False


def progress(
    newest: Revision,
    *,
    ready: bool,
    why: str,
    deadline: int,
    now: str,
    rollback: Rollback | None,
    rolled_to: Revision | None,
) -> Progress:
    """``Progressing`` for the newest revision: True while it works towards Installed and
    Healthy, or once it got there; False with ``ProgressDeadlineExceeded`` when
    ``deadline`` seconds passed first (and while a rollback made for that holds)."""
    if rollback is not None and rollback.reason == DEADLINE:
        to = f"; rolled back to revision {rolled_to.number}" if rolled_to is not None else ""
        message = (
            f"revision {newest.number} did not become Installed and Healthy within {deadline}s{to}"
        )
        return Progress(("False", DEADLINE, message), None, exceeded=True)
    if rollback is not None:
        target = rolled_to.number if rolled_to is not None else rollback.revision
        state = "installed and healthy" if ready else f"in progress: {why}"
        message = f"rolled back to revision {target} on request ({state}); a spec change ends it"
        return Progress(("True", "RolledBack", message), None)
    if ready:
        return Progress(
            ("True", "Succeeded", f"revision {newest.number} is installed and healthy"), None
        )
    spent = model.seconds_between(newest.time, now)
    if spent is not None and spent >= deadline:
        message = (
            f"revision {newest.number} did not become Installed and Healthy within "
            f"{deadline}s: {why}"
        )
        return Progress(("False", DEADLINE, message), None, exceeded=True)
    left = None if spent is None else max(deadline - spent, 1.0)
    return Progress(("True", "Progressing", f"revision {newest.number}: {why}"), left)


def newly_installed(bd: Obj, written: Obj, now: str) -> tuple[str, float] | None:
    """When a status write (``written``) makes a revision the installed one: what it was
    (``install`` the first, ``pivot`` a later one, ``rollback`` one under a rollback) and the
    seconds since it was asked for; None otherwise. For the manager's metrics."""
    number = written.get("installedRevision")
    before = (bd.get("status") or {}).get("installedRevision")
    if not isinstance(number, int) or number == before:
        return None
    kept = [r for r in (Revision.of(d) for d in written.get("revisions") or []) if r]
    rev = find(kept, number)
    seconds = model.seconds_between(rev.time, now) if rev is not None else None
    if seconds is None:
        return None
    if rollback_of(bd) is not None:
        kind = "rollback"
    else:
        kind = "pivot" if isinstance(before, int) else "install"
    return kind, max(seconds, 0.0)
