"""Readiness per kind, with a reason for every object that is not ready."""

from __future__ import annotations

from typing import Any

import pytest

from provisioner.engine import health


def obj(
    api_version: str, kind: str, *, generation: int = 1, spec: Any = None, status: Any = None
) -> dict[str, Any]:
    out: dict[str, Any] = {
        "apiVersion": api_version,
        "kind": kind,
        "metadata": {"name": "x", "generation": generation},
    }
    if spec is not None:
        out["spec"] = spec
    if status is not None:
        out["status"] = status
    return out


def cond(kind: str, status: str, reason: str = "", message: str = "") -> dict[str, str]:
    return {"type": kind, "status": status, "reason": reason, "message": message}


AVAILABLE = [cond("Available", "True")]

CASES = [
    ("present ConfigMap", obj("v1", "ConfigMap"), True, ""),
    (
        "available Deployment",
        obj(
            "apps/v1",
            "Deployment",
            spec={"replicas": 2},
            status={
                "observedGeneration": 1,
                "replicas": 2,
                "updatedReplicas": 2,
                "conditions": AVAILABLE,
            },
        ),
        True,
        "",
    ),
    (
        "Deployment not yet observed",
        obj("apps/v1", "Deployment", generation=3, status={"observedGeneration": 2}),
        False,
        "has not observed generation 3",
    ),
    (
        "Deployment mid rollout",
        obj(
            "apps/v1",
            "Deployment",
            spec={"replicas": 3},
            status={"observedGeneration": 1, "updatedReplicas": 1},
        ),
        False,
        "1 of 3 replicas updated",
    ),
    (
        "stalled Deployment",
        obj(
            "apps/v1",
            "Deployment",
            status={
                "observedGeneration": 1,
                "conditions": [
                    cond("Progressing", "False", "ProgressDeadlineExceeded", "too slow")
                ],
            },
        ),
        False,
        "rollout stalled: too slow",
    ),
    (
        "unavailable Deployment",
        obj(
            "apps/v1",
            "Deployment",
            spec={"replicas": 1},
            status={
                "observedGeneration": 1,
                "replicas": 1,
                "updatedReplicas": 1,
                "conditions": [cond("Available", "False", "MinimumReplicasUnavailable")],
            },
        ),
        False,
        "Available is False: MinimumReplicasUnavailable",
    ),
    (
        "rolled-out StatefulSet",
        obj(
            "apps/v1",
            "StatefulSet",
            spec={"replicas": 2},
            status={
                "observedGeneration": 1,
                "readyReplicas": 2,
                "updatedReplicas": 2,
                "currentRevision": "r1",
                "updateRevision": "r1",
            },
        ),
        True,
        "",
    ),
    (
        "StatefulSet still rolling",
        obj(
            "apps/v1",
            "StatefulSet",
            spec={"replicas": 2},
            status={
                "observedGeneration": 1,
                "readyReplicas": 2,
                "updatedReplicas": 2,
                "currentRevision": "r1",
                "updateRevision": "r2",
            },
        ),
        False,
        "rolling out revision r2",
    ),
    (
        "DaemonSet on every node",
        obj(
            "apps/v1",
            "DaemonSet",
            status={
                "observedGeneration": 1,
                "desiredNumberScheduled": 3,
                "updatedNumberScheduled": 3,
                "numberAvailable": 3,
            },
        ),
        True,
        "",
    ),
    (
        "DaemonSet missing nodes",
        obj(
            "apps/v1",
            "DaemonSet",
            status={
                "observedGeneration": 1,
                "desiredNumberScheduled": 3,
                "updatedNumberScheduled": 3,
                "numberAvailable": 1,
            },
        ),
        False,
        "1 of 3 nodes available",
    ),
    (
        "established CRD",
        obj(
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            status={"conditions": [cond("Established", "True")]},
        ),
        True,
        "",
    ),
    (
        "CRD with clashing names",
        obj(
            "apiextensions.k8s.io/v1",
            "CustomResourceDefinition",
            status={"conditions": [cond("NamesAccepted", "False", message="plural in use")]},
        ),
        False,
        "names not accepted: plural in use",
    ),
    (
        "complete Job",
        obj("batch/v1", "Job", status={"conditions": [cond("Complete", "True")]}),
        True,
        "",
    ),
    (
        "failed Job",
        obj(
            "batch/v1",
            "Job",
            status={"conditions": [cond("Failed", "True", "BackoffLimitExceeded")]},
        ),
        False,
        "job failed: BackoffLimitExceeded",
    ),
    ("running Job", obj("batch/v1", "Job", status={}), False, "no Complete condition yet"),
    (
        "available APIService",
        obj("apiregistration.k8s.io/v1", "APIService", status={"conditions": AVAILABLE}),
        True,
        "",
    ),
    (
        "unavailable APIService",
        obj(
            "apiregistration.k8s.io/v1",
            "APIService",
            status={"conditions": [cond("Available", "False", message="no endpoints")]},
        ),
        False,
        "Available is False: no endpoints",
    ),
]


@pytest.mark.parametrize(("what", "live", "ready", "reason"), CASES, ids=[c[0] for c in CASES])
def test_readiness_per_kind(what: str, live: dict[str, Any], ready: bool, reason: str) -> None:
    got = health.assess(live)
    assert got.ready is ready, what
    assert reason in got.reason


def test_a_missing_object_is_not_ready() -> None:
    assert health.assess(None) == health.Health(False, "not found")
