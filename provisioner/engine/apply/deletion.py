"""Deleting what a deployment owns: pruning (``apply.install``) and ``lifecycle.uninstall``.

Each object is read first and left alone unless it still carries the
deployment's owner label; ``Orphan`` (the policy, or the object's
``core.rukpak.io/deletion-policy`` annotation) removes the owner labels instead of
deleting. Objects go in reverse phase order (``ordering.deletion_order``),
each group concurrently. Idempotent: an object already gone counts as done.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from provisioner.engine import pool
from provisioner.engine.apply import ordering
from provisioner.engine.errors import ApplyFailed
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import (
    DELETION_POLICY_ANNOTATION,
    OWNER_KIND_LABEL,
    OWNER_LABEL,
    ObjectRef,
    meta_of,
    owner_of,
)
from rukpak.common import errors

DeletionPolicy = Literal["Delete", "Orphan"]


@dataclass
class Deleted:
    pruned: list[ObjectRef] = field(default_factory=list)
    orphaned: list[ObjectRef] = field(default_factory=list)
    skipped: list[tuple[ObjectRef, str]] = field(default_factory=list)
    """Refs left alone, each with the reason."""


def _delete_one(kube: Kube, ref: ObjectRef, owner: str, policy: DeletionPolicy) -> str:
    live = kube.get(ref)
    if live is None:
        return "gone"
    actual = owner_of(live)
    if actual != owner:
        return f"skipped: owned by {actual!r}" if actual else "skipped: no longer labelled as ours"
    annotations = meta_of(live).get("annotations") or {}
    if policy == "Orphan" or annotations.get(DELETION_POLICY_ANNOTATION) == "Orphan":
        kube.merge_patch(ref, {"metadata": {"labels": {OWNER_LABEL: None, OWNER_KIND_LABEL: None}}})
        return "orphaned"
    kube.delete(ref)
    return "deleted"


def delete_owned(
    kube: Kube,
    refs: Sequence[ObjectRef],
    owner: str,
    *,
    policy: DeletionPolicy,
    concurrency: int,
) -> Deleted:
    """Delete (or orphan) ``refs`` still owned by ``owner``, reverse phase order, group by group.

    Raises ``ApplyFailed`` (phase "prune") naming every object of the first group
    that failed; the groups after it are not touched.
    """
    result = Deleted()
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
    return result
