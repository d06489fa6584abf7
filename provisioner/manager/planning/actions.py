"""The actions a BundleDeployment's plan is made of: what ``plan`` decides, ``actuate`` does.

Sits between the planners (``plan``, ``inline``, ``runs``; ``bundleplan`` shares
``CreatePod``, ``DeletePod``, ``RecordEvent`` and ``Requeue``) and ``actuate``, the only
writer: plain values, one per kind of request, so plans are compared in tests as data.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

from provisioner.engine.objects import Obj, ObjectRef


@dataclass(frozen=True)
class AddFinalizer:
    """Put ``model.FINALIZER`` on the BundleDeployment before anything is installed for it,
    so its deletion waits for the uninstall."""


@dataclass(frozen=True)
class RemoveFinalizer:
    """Take ``model.FINALIZER`` off the BundleDeployment once ``MarkUninstall`` has marked
    its install record: the object goes first, a later pass finishes a cut-short uninstall."""


@dataclass(frozen=True)
class CreateBundle:
    bundle: Obj


@dataclass(frozen=True)
class CreatePod:
    """Create ``pod``: a BundleDeployment's instance run, or a Bundle's unpack pod
    (``bundleplan``); one that exists already counts as made."""

    pod: Obj


@dataclass(frozen=True)
class RestoreDrift:
    """Re-apply our fields of drifted objects (``engine.restore``), acting as ``user``: the
    instance's ServiceAccount, so the manager writes no more than the instance could."""

    bodies: tuple[Obj, ...]
    user: str


@dataclass(frozen=True)
class DeletePod:
    """Delete the run or unpack pod ``namespace/name``; one already gone is fine."""

    namespace: str
    name: str


@dataclass(frozen=True)
class DeleteLease:
    """Delete the Lease the BundleDeployment's instance pods take (``lease.lease_name``, in
    the system namespace): the last step of an uninstall."""


@dataclass(frozen=True)
class DeleteBundle:
    name: str


@dataclass(frozen=True)
class Revert:
    """Go back to a revision installed before without a run: keep the inventory's objects
    and ``refs`` listed while ``bodies`` are applied as ``user`` (the instance's
    ServiceAccount) and ``prune`` is deleted, then store the inventory of ``refs`` in
    ``namespace`` and the install ``record`` (a document, its ``by`` the run that would
    have installed it)."""

    bodies: tuple[Obj, ...]
    user: str
    prune: tuple[ObjectRef, ...]
    refs: tuple[ObjectRef, ...]
    namespace: str
    record: Obj


@dataclass(frozen=True)
class MarkUninstall:
    """Write on the install record that it is to be uninstalled with ``policy`` as ``user``
    (and which BundleDeployments the deleted one depended on): the finalizer goes before
    the uninstall, and a pass that finds the mark without its BundleDeployment finishes
    the uninstall."""

    policy: Literal["Delete", "Orphan"]
    depends_on: tuple[str, ...] = ()
    user: str = ""


@dataclass(frozen=True)
class Uninstall:
    """Delete (or release, ``Orphan``) what the install record lists, acting as ``user``
    (the instance's ServiceAccount: what it installed it may delete); "" for the caller's
    own identity."""

    policy: Literal["Delete", "Orphan"]
    user: str = ""


@dataclass(frozen=True)
class WriteStatus:
    status: Obj


@dataclass(frozen=True)
class RecordEvent:
    type: Literal["Normal", "Warning"]
    reason: str
    message: str


@dataclass(frozen=True)
class ResolveSource:
    """Pin a BundleDeployment's inline sources (created as v1alpha2) for ``generation``:
    record ``status.resolvedSource`` (one ``source``, destination "") or
    ``status.resolvedSources`` (``spec.sources``), its ``Unpacked`` condition and the pin
    annotation, or report why they cannot be pinned (``ref`` names each in messages)."""

    sources: tuple[tuple[str, Obj], ...]
    """(destination, source) of each source."""
    namespace: str
    generation: int


@dataclass(frozen=True)
class SetRollback:
    """Install kept revision ``revision`` while the spec stays at ``generation``
    (``revisions.ROLLBACK_ANNOTATION``); ``reason`` says who asked."""

    revision: int
    generation: int
    reason: str


@dataclass(frozen=True)
class Requeue:
    """Look again after ``after`` seconds: waiting on something no watch reports."""

    after: float
    why: str


Action = (
    AddFinalizer
    | RemoveFinalizer
    | CreateBundle
    | CreatePod
    | RestoreDrift
    | DeletePod
    | DeleteLease
    | DeleteBundle
    | MarkUninstall
    | Revert
    | Uninstall
    | WriteStatus
    | RecordEvent
    | ResolveSource
    | SetRollback
    | Requeue
)
