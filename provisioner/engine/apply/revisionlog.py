"""A BundleDeployment's revision history as the API stores it: ``status.revisions`` and the
rollback annotation, pure.

Sits in the engine so that both the manager (``provisioner.manager.planning.revisions``, which
decides what the history holds) and the command line (``rukpak history``, ``rukpak
rollback``) read and write the same documents.
"""

from __future__ import annotations

import copy
import json
from dataclasses import dataclass

from provisioner.engine.objects import Obj, json_annotation, meta_of

ROLLBACK_ANNOTATION = "core.rukpak.io/rollback"
"""``{"revision": N, "generation": G, "reason": R}``: install kept revision N while the
spec is at generation G."""
INSTALLED = "Installed"
FAILED = "Failed"
IN_PROGRESS = "Progressing"
MANUAL = "Requested"
"""The reason of a rollback asked for by a person (``rukpak rollback``)."""
DEADLINE = "ProgressDeadlineExceeded"


@dataclass(frozen=True)
class Revision:
    number: int
    name: str
    """What the install record calls this content (the Bundle, or ``<bd>-<hash>``)."""
    source: Obj
    """The pin, in the API's shape (``encode_pin``)."""
    generation: int
    time: str
    """When it was first asked for: its progress deadline counts from here."""
    outcome: str = IN_PROGRESS
    objects: int = 0
    installed_at: str = ""
    config: Obj | None = None
    """The spec's ``CONFIG_FIELDS`` it was installed with (a rollback restores them)."""
    nodes: tuple[str, ...] = ()
    """The nodes whose instance runs installed it, newest first (at most ``MAX_NODES``):
    their caches hold its content, so an offline rollback prefers them."""

    def document(self) -> Obj:
        out: Obj = {
            "revision": self.number,
            "name": self.name,
            "source": copy.deepcopy(self.source),
            "generation": self.generation,
            "time": self.time,
            "outcome": self.outcome,
            "objects": self.objects,
        }
        if self.installed_at:
            out["installedAt"] = self.installed_at
        if self.config:
            out["config"] = copy.deepcopy(self.config)
        if self.nodes:
            out["nodes"] = list(self.nodes)
        return out

    @classmethod
    def of(cls, doc: object) -> Revision | None:
        if not isinstance(doc, dict):
            return None
        number, name, source = doc.get("revision"), doc.get("name"), doc.get("source")
        if not isinstance(number, int) or not isinstance(name, str) or not name:
            return None
        if not isinstance(source, dict):
            return None
        generation = doc.get("generation")
        objects = doc.get("objects")
        return cls(
            number=number,
            name=name,
            source=source,
            generation=generation if isinstance(generation, int) else 0,
            time=str(doc.get("time") or ""),
            outcome=str(doc.get("outcome") or IN_PROGRESS),
            objects=objects if isinstance(objects, int) else 0,
            installed_at=str(doc.get("installedAt") or ""),
            config=doc["config"] if isinstance(doc.get("config"), dict) else None,
            nodes=_names(doc.get("nodes")),
        )


MAX_NODES = 3


def _names(value: object) -> tuple[str, ...]:
    if not isinstance(value, list):
        return ()
    return tuple(n for n in value if isinstance(n, str) and n)[:MAX_NODES]


def of_status(bd: Obj) -> list[Revision]:
    """The kept revisions, oldest first; unreadable entries are dropped."""
    found = (bd.get("status") or {}).get("revisions")
    out = [r for r in (Revision.of(d) for d in found or [] if isinstance(found, list)) if r]
    return sorted(out, key=lambda r: r.number)


@dataclass(frozen=True)
class Rollback:
    revision: int
    generation: int
    reason: str


def rollback_of(bd: Obj) -> Rollback | None:
    """The rollback in force: one whose generation is the BD's; None otherwise."""
    doc = json_annotation(bd, ROLLBACK_ANNOTATION)
    if not isinstance(doc, dict):
        return None
    revision, generation = doc.get("revision"), doc.get("generation")
    if not isinstance(revision, int) or not isinstance(generation, int):
        return None
    if generation != int(meta_of(bd).get("generation") or 0):
        return None
    return Rollback(revision, generation, str(doc.get("reason") or MANUAL))


def rollback_annotation(revision: int, generation: int, reason: str) -> str:
    doc = {"revision": revision, "generation": generation, "reason": reason}
    return json.dumps(doc, separators=(",", ":"))


def find(revisions: list[Revision], number: int) -> Revision | None:
    return next((r for r in revisions if r.number == number), None)
