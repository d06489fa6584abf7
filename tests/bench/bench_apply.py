"""The apply engine against ``kubectl apply --server-side``: 1,000 objects, install and no-op.

Where it sits: a module of ``tests.bench`` (``python -m tests.bench apply``). It
starts etcd + kube-apiserver in the work dir with ``tests.cluster``'s start-up
code (stopped by pid), with an audit log of every write request; with
``KUBECONFIG`` set it uses that cluster instead and has no audit log. Per round,
on fresh namespaces of the same cluster:

- install a 1,000-object bundle (a Namespace, ConfigMaps and ServiceAccounts)
  with the engine (client creation, bundle loading and ``apply.install``) and
  the same manifests with ``kubectl apply --server-side -f DIR`` (a process
  per run: that is how it is used) — target: the engine at least 2x faster;
- re-apply both unchanged: the engine's time against kubectl's, and the write
  requests (POST/PUT/PATCH/DELETE) the engine sent — target 0 — counted by its
  ``Kube`` adapter and cross-checked in the API server's audit log, where
  kubectl's writes for its own re-apply are counted too.

Timings are medians over the rounds; the order of engine and kubectl
alternates between rounds.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
import uuid
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from provisioner.engine.apply import apply
from provisioner.engine.bundle import formats
from provisioner.engine.kube.kube import Kube
from tests.bench import Result, against, median, progress
from tests.cluster import bins, controlplane, pki
from tests.cluster.process import Component

OBJECTS = 1000
ROUNDS = 5
CONCURRENCY = apply.Options.concurrency
WRITE_VERBS = frozenset({"create", "update", "patch", "delete", "deletecollection"})
AUDIT_POLICY = {
    "apiVersion": "audit.k8s.io/v1",
    "kind": "Policy",
    "omitStages": ["RequestReceived"],
    "rules": [
        {"level": "Metadata", "verbs": sorted(WRITE_VERBS)},
        {"level": "None"},
    ],
}


# --- the cluster -----------------------------------------------------------------------


@dataclass
class Cluster:
    kubeconfig: Path
    audit_log: Path | None = None
    components: list[Component] = field(default_factory=list)

    def stop(self) -> None:
        for c in reversed(self.components):
            c.stop(grace=5)


def start_cluster(workdir: Path) -> Cluster:
    """etcd + kube-apiserver with a blocking audit log of write requests; or $KUBECONFIG's."""
    external = os.environ.get("KUBECONFIG")
    if external:
        progress(f"apply: using the cluster of KUBECONFIG={external} (no audit log)")
        return Cluster(kubeconfig=Path(external.split(os.pathsep)[0]))
    found = bins.ensure(bins.CONTROL_PLANE)
    files = controlplane.Pki.make(workdir / "pki")
    policy = workdir / "audit-policy.yaml"
    policy.write_text(yaml.safe_dump(AUDIT_POLICY))
    audit_log = workdir / "logs" / "audit.log"
    audit_log.parent.mkdir(parents=True, exist_ok=True)
    cluster = Cluster(kubeconfig=workdir / "admin.kubeconfig", audit_log=audit_log)
    try:
        etcd, etcd_url = controlplane.start_etcd(found["etcd"], workdir)
        cluster.components.append(etcd)
        apiserver, server = controlplane.start_kube_apiserver(
            found["kube-apiserver"],
            workdir,
            etcd_url=etcd_url,
            files=files,
            extra_args=(
                f"--audit-policy-file={policy}",
                f"--audit-log-path={audit_log}",
                "--audit-log-mode=blocking",
                "--audit-log-format=json",
            ),
        )
        cluster.components.append(apiserver)
    except BaseException:
        cluster.stop()
        raise
    pki.kubeconfig(
        cluster.kubeconfig, server=server, ca=files.ca.cert, client=files.admin, user="admin"
    )
    return cluster


class Audit:
    """Counts write events in the audit log after a mark, by client (user agent prefix)."""

    def __init__(self, path: Path | None) -> None:
        self.path = path
        self._offset = 0

    def mark(self) -> None:
        if self.path is not None:
            self._offset = self.path.stat().st_size if self.path.exists() else 0

    def writes_since_mark(self, *, kubectl: bool) -> int | None:
        """Write requests by the admin user since ``mark``: kubectl's, or everyone else's."""
        if self.path is None:
            return None
        time.sleep(0.5)  # the ResponseComplete event may land just after the response
        count = 0
        with self.path.open("rb") as f:
            f.seek(self._offset)
            for line in f:
                event = json.loads(line)
                if event.get("stage") != "ResponseComplete" or event.get("verb") not in WRITE_VERBS:
                    continue
                if (event.get("user") or {}).get("username") != "admin":
                    continue
                if str(event.get("userAgent", "")).startswith("kubectl") == kubectl:
                    count += 1
        return count


# --- the two clients -------------------------------------------------------------------


def make_bundle(root: Path, ns: str) -> Path:
    """A plain+v0 bundle: Namespace ``ns`` and 999 ConfigMaps and ServiceAccounts in it."""
    manifests = root / "manifests"
    manifests.mkdir(parents=True)
    (manifests / "00_namespace.yaml").write_text(
        yaml.safe_dump({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": ns}})
    )
    docs: list[dict[str, Any]] = []
    for i in range(OBJECTS - 1):
        kind = "ServiceAccount" if i % 5 == 0 else "ConfigMap"
        doc: dict[str, Any] = {
            "apiVersion": "v1",
            "kind": kind,
            "metadata": {"name": f"obj-{i:04d}", "namespace": ns, "labels": {"bench": "yes"}},
        }
        if kind == "ConfigMap":
            doc["data"] = {"index": str(i), "payload": "x" * 200}
        docs.append(doc)
    for part in range(10):
        chunk = docs[part * 100 : (part + 1) * 100]
        (manifests / f"{part + 1:02d}_objects.yaml").write_text(yaml.safe_dump_all(chunk))
    return root


def kubectl_binary() -> str:
    found = bins.find("kubectl") or shutil.which("kubectl")
    if found is None:
        raise RuntimeError("no kubectl: run tests/cluster/build.sh or put kubectl on PATH")
    return str(found)


@dataclass(frozen=True)
class Clients:
    kubeconfig: Path
    kubectl: str

    def kubectl_apply(self, bundle: Path) -> float:
        """Seconds for ``kubectl apply --server-side -f bundle/manifests``."""
        argv = [
            self.kubectl,
            "--kubeconfig",
            str(self.kubeconfig),
            "apply",
            "--server-side",
            "--field-manager=bench-kubectl",
            "-f",
            str(bundle / "manifests"),
        ]
        started = time.monotonic()
        subprocess.run(argv, check=True, capture_output=True)
        return time.monotonic() - started

    def rukpak_install(self, bundle: Path, name: str) -> tuple[float, int, int]:
        """Seconds for a fresh client to load and install ``bundle``; its writes and requests."""
        started = time.monotonic()
        kube = Kube.from_kubeconfig(str(self.kubeconfig), pool_size=CONCURRENCY)
        try:
            options = apply.Options(name=name, namespace=name, concurrency=CONCURRENCY)
            apply.install(kube, formats.load(bundle), options)
            seconds = time.monotonic() - started
            return seconds, kube.writes, sum(kube.requests.values())
        finally:
            kube.close()


# --- the benchmark ---------------------------------------------------------------------


@dataclass
class Samples:
    install: list[float] = field(default_factory=list)
    kubectl_install: list[float] = field(default_factory=list)
    noop: list[float] = field(default_factory=list)
    kubectl_noop: list[float] = field(default_factory=list)
    install_writes: list[int] = field(default_factory=list)
    noop_writes: list[int] = field(default_factory=list)
    noop_requests: list[int] = field(default_factory=list)
    noop_audit: list[int] = field(default_factory=list)
    kubectl_noop_audit: list[int] = field(default_factory=list)


def one_round(clients: Clients, audit: Audit, workdir: Path, index: int, out: Samples) -> None:
    run_id = f"{uuid.uuid4().hex[:6]}-{index}"  # fresh namespaces, even on a reused cluster
    name = f"bench-rukpak-{run_id}"
    ours = make_bundle(workdir / name, name)
    theirs = make_bundle(workdir / f"bench-kubectl-{run_id}", f"bench-kubectl-{run_id}")

    def rukpak_install() -> None:
        seconds, writes, _ = clients.rukpak_install(ours, name)
        out.install.append(seconds)
        out.install_writes.append(writes)

    def rukpak_noop() -> None:
        audit.mark()
        seconds, writes, requests = clients.rukpak_install(ours, name)
        out.noop.append(seconds)
        out.noop_writes.append(writes)
        out.noop_requests.append(requests)
        seen = audit.writes_since_mark(kubectl=False)
        if seen is not None:
            out.noop_audit.append(seen)

    def kubectl_install() -> None:
        out.kubectl_install.append(clients.kubectl_apply(theirs))

    def kubectl_noop() -> None:
        audit.mark()
        out.kubectl_noop.append(clients.kubectl_apply(theirs))
        seen = audit.writes_since_mark(kubectl=True)
        if seen is not None:
            out.kubectl_noop_audit.append(seen)

    steps: list[Callable[[], None]] = [rukpak_install, kubectl_install, rukpak_noop, kubectl_noop]
    if index % 2:
        steps = [kubectl_install, rukpak_install, kubectl_noop, rukpak_noop]
    for step in steps:
        step()
    progress(
        f"apply: round {index + 1}/{ROUNDS}: install {out.install[-1]:.2f}s"
        f" (kubectl {out.kubectl_install[-1]:.2f}s), no-op {out.noop[-1]:.2f}s"
        f" with {out.noop_writes[-1]} writes (kubectl {out.kubectl_noop[-1]:.2f}s)"
    )


def against_kubectl(name: str, ours: list[float], theirs: list[float], note: str) -> Result:
    """Our median time as a fraction of kubectl's; the target is half of it or less."""
    return against(name, ours, theirs, target=0.5, note=note)


def results(s: Samples, *, audited: bool) -> list[Result]:
    out = [
        against_kubectl(
            "apply: install 1,000 objects vs kubectl apply --server-side",
            s.install,
            s.kubectl_install,
            f"median of {ROUNDS} fresh namespaces each; the engine with {CONCURRENCY}"
            f" workers, client start and bundle loading included; writes sent"
            f" {max(s.install_writes)}",
        ),
        against_kubectl(
            "apply: no-op re-apply vs kubectl re-apply",
            s.noop,
            s.kubectl_noop,
            f"requests sent by the engine: at most {max(s.noop_requests)},"
            f" of which writes {max(s.noop_writes)}",
        ),
        Result(
            name="apply: no-op re-apply writes (engine's adapter count)",
            measured=max(s.noop_writes),
            unit="requests",
            target=0,
        ),
    ]
    if audited:
        out += [
            Result(
                name="apply: no-op re-apply writes (audit log)",
                measured=max(s.noop_audit),
                unit="requests",
                target=0,
                note="admin write events other than kubectl's in the API server's audit log",
            ),
            Result(
                name="kubectl: no-op re-apply writes (audit log)",
                measured=median(s.kubectl_noop_audit),
                unit="requests",
            ),
        ]
    return out


def run(workdir: Path) -> list[Result]:
    cluster = start_cluster(workdir)
    try:
        clients = Clients(cluster.kubeconfig, kubectl_binary())
        audit = Audit(cluster.audit_log)
        samples = Samples()
        for index in range(ROUNDS):
            one_round(clients, audit, workdir, index, samples)
        return results(samples, audited=cluster.audit_log is not None)
    finally:
        cluster.stop()
