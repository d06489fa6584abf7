"""Apply order: kind phases, files in name order within a phase.

Second step of the flow, after ``formats``. Objects a later phase depends on
come first: Namespaces, then CRDs (``apply`` waits until they are Established
before going on, so custom resources in the same bundle find their API), then
identities and RBAC, configuration, workloads, everything else, and admission
webhooks last so a webhook whose backend is not yet running cannot block the
rest of the bundle. Objects inside one phase do not depend on each other and
are applied concurrently; pruning walks the phases backwards.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import TypeVar

from provisioner.engine.bundle.formats import Manifest
from provisioner.engine.objects import ObjectRef


@dataclass(frozen=True)
class PhaseSpec:
    name: str
    kinds: frozenset[tuple[str, str]]
    """(group, kind) pairs; the catch-all phase has none."""
    wait_established: bool = False


def _kinds(group: str, *kinds: str) -> frozenset[tuple[str, str]]:
    return frozenset((group, k) for k in kinds)


RBAC = "rbac.authorization.k8s.io"
ADMISSION = "admissionregistration.k8s.io"

PHASES: tuple[PhaseSpec, ...] = (
    PhaseSpec("namespaces", _kinds("", "Namespace")),
    PhaseSpec(
        "crds",
        _kinds("apiextensions.k8s.io", "CustomResourceDefinition"),
        wait_established=True,
    ),
    PhaseSpec(
        "rbac",
        _kinds("", "ServiceAccount")
        | _kinds(RBAC, "ClusterRole", "ClusterRoleBinding", "Role", "RoleBinding"),
    ),
    PhaseSpec("config", _kinds("", "ConfigMap", "Secret")),
    PhaseSpec(
        "workloads",
        _kinds("apps", "Deployment", "StatefulSet", "DaemonSet", "ReplicaSet")
        | _kinds("batch", "Job", "CronJob")
        | _kinds("", "Pod", "ReplicationController"),
    ),
    PhaseSpec("other", frozenset()),
    PhaseSpec(
        "webhooks",
        _kinds(
            ADMISSION,
            "MutatingWebhookConfiguration",
            "ValidatingWebhookConfiguration",
            "ValidatingAdmissionPolicy",
            "ValidatingAdmissionPolicyBinding",
            "MutatingAdmissionPolicy",
            "MutatingAdmissionPolicyBinding",
        ),
    ),
)
_OTHER = next(i for i, p in enumerate(PHASES) if not p.kinds)
_INDEX = {gk: i for i, p in enumerate(PHASES) for gk in p.kinds}


def phase_index(ref: ObjectRef) -> int:
    """Position of ``ref``'s phase in ``PHASES``."""
    return _INDEX.get((ref.group, ref.kind), _OTHER)


@dataclass(frozen=True)
class Phase:
    """One phase of a bundle's install (:func:`phases`): its manifests in apply order,
    applied concurrently; the next phase starts once they are."""

    spec: PhaseSpec
    manifests: tuple[Manifest, ...]

    @property
    def name(self) -> str:
        return self.spec.name


def phases(manifests: Iterable[Manifest]) -> list[Phase]:
    """The non-empty phases in apply order; inside each, files in name order, then documents."""
    buckets: list[list[Manifest]] = [[] for _ in PHASES]
    ordered = sorted(manifests, key=lambda m: (m.source.file, m.source.document))
    for m in ordered:
        buckets[phase_index(m.ref)].append(m)
    return [Phase(spec, tuple(b)) for spec, b in zip(PHASES, buckets, strict=True) if b]


R = TypeVar("R", bound=ObjectRef)


def deletion_order(refs: Iterable[R]) -> list[list[R]]:
    """Groups of refs to delete, reverse phase order (webhooks first, namespaces last)."""
    buckets: list[list[R]] = [[] for _ in PHASES]
    for ref in sorted(refs):
        buckets[phase_index(ref)].append(ref)
    return [b for b in reversed(buckets) if b]


def flatten(groups: Sequence[Sequence[R]]) -> list[R]:
    return [r for g in groups for r in g]
