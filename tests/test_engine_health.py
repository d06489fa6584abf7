"""Readiness per kind, with a reason for every object that is not ready."""

from __future__ import annotations

from typing import Any

import pytest

from provisioner.engine.health import health


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


def statefulset(update_revision: str) -> dict[str, Any]:
    """Two ready replicas, all updated; on revision r1, rolling to ``update_revision``."""
    status: dict[str, Any] = {"observedGeneration": 1, "readyReplicas": 2, "updatedReplicas": 2}
    status |= {"currentRevision": "r1", "updateRevision": update_revision}
    return obj("apps/v1", "StatefulSet", spec={"replicas": 2}, status=status)


def daemonset(available: int) -> dict[str, Any]:
    """Scheduled and updated on 3 nodes, ``available`` of them available."""
    status = {"observedGeneration": 1, "desiredNumberScheduled": 3, "updatedNumberScheduled": 3}
    return obj("apps/v1", "DaemonSet", status=status | {"numberAvailable": available})


def with_conditions(api_version: str, kind: str, *conditions: dict[str, str]) -> dict[str, Any]:
    return obj(api_version, kind, status={"conditions": list(conditions)})


def deployment(replicas: int, *conditions: dict[str, str]) -> dict[str, Any]:
    """Observed, every replica updated, with ``conditions``."""
    status = {"observedGeneration": 1, "replicas": replicas, "updatedReplicas": replicas}
    spec = {"replicas": replicas}
    return obj("apps/v1", "Deployment", spec=spec, status=status | {"conditions": list(conditions)})


CRD = ("apiextensions.k8s.io/v1", "CustomResourceDefinition")
APISERVICE = ("apiregistration.k8s.io/v1", "APIService")

CASES = [
    ("present ConfigMap", obj("v1", "ConfigMap"), True, ""),
    (
        "available Deployment",
        deployment(2, *AVAILABLE),
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
        deployment(1, cond("Available", "False", "MinimumReplicasUnavailable")),
        False,
        "Available is False: MinimumReplicasUnavailable",
    ),
    (
        "rolled-out StatefulSet",
        statefulset("r1"),
        True,
        "",
    ),
    (
        "StatefulSet still rolling",
        statefulset("r2"),
        False,
        "rolling out revision r2",
    ),
    (
        "DaemonSet on every node",
        daemonset(3),
        True,
        "",
    ),
    (
        "DaemonSet missing nodes",
        daemonset(1),
        False,
        "1 of 3 nodes available",
    ),
    (
        "established CRD",
        with_conditions(*CRD, cond("Established", "True")),
        True,
        "",
    ),
    (
        "CRD with clashing names",
        with_conditions(*CRD, cond("NamesAccepted", "False", message="plural in use")),
        False,
        "names not accepted: plural in use",
    ),
    (
        "complete Job",
        with_conditions("batch/v1", "Job", cond("Complete", "True")),
        True,
        "",
    ),
    (
        "failed Job",
        with_conditions("batch/v1", "Job", cond("Failed", "True", "BackoffLimitExceeded")),
        False,
        "job failed: BackoffLimitExceeded",
    ),
    ("running Job", obj("batch/v1", "Job", status={}), False, "no Complete condition yet"),
    (
        "available APIService",
        with_conditions(*APISERVICE, *AVAILABLE),
        True,
        "",
    ),
    (
        "unavailable APIService",
        with_conditions(*APISERVICE, cond("Available", "False", message="no endpoints")),
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
