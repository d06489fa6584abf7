"""Cluster DNS for the multi-node local cluster: CoreDNS, built from its Go module
(``build.sh``), as a Deployment behind the ``kube-dns`` Service at 10.0.0.10, the way
kubeadm and kind install it.

Where it sits: ``localcluster`` calls ``install`` once the nodes are Ready. The image is one
layer holding the static ``coredns`` binary, pushed to the cluster's registry. The
Corefile serves ``cluster.local`` and the reverse zones from the API and forwards nothing:
no name outside the cluster resolves, as nothing here may leave the machine.
"""

from __future__ import annotations

import io
import json
import subprocess
import tarfile
import time
from pathlib import Path

from tests.cluster import images

NAMESPACE = "kube-system"
IMAGE_REPO = "rukpak-test/coredns"
READY_TIMEOUT = 120.0

COREFILE = """.:53 {
    errors
    health :8080
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
        ttl 5
    }
    cache 5
    loop
    reload
}
"""


def image(binary: Path) -> images.Image:
    """``/coredns`` in one layer, the entrypoint."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        data = binary.read_bytes()
        info = tarfile.TarInfo("coredns")
        info.size = len(data)
        info.mode = 0o755
        tar.addfile(info, io.BytesIO(data))
    return images.make_image(buf.getvalue(), entrypoint=["/coredns"], cmd=[])


def manifests(image_ref: str, cluster_ip: str) -> list[dict[str, object]]:
    """ServiceAccount, RBAC, Corefile, Deployment and the kube-dns Service."""
    labels = {"k8s-app": "kube-dns"}
    meta = {"name": "coredns", "namespace": NAMESPACE}
    return [
        {"apiVersion": "v1", "kind": "ServiceAccount", "metadata": meta},
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRole",
            "metadata": {"name": "system:coredns"},
            "rules": [
                {
                    "apiGroups": [""],
                    "resources": ["endpoints", "services", "pods", "namespaces"],
                    "verbs": ["list", "watch"],
                },
                {
                    "apiGroups": ["discovery.k8s.io"],
                    "resources": ["endpointslices"],
                    "verbs": ["list", "watch"],
                },
            ],
        },
        {
            "apiVersion": "rbac.authorization.k8s.io/v1",
            "kind": "ClusterRoleBinding",
            "metadata": {"name": "system:coredns"},
            "roleRef": {
                "apiGroup": "rbac.authorization.k8s.io",
                "kind": "ClusterRole",
                "name": "system:coredns",
            },
            "subjects": [{"kind": "ServiceAccount", **meta}],
        },
        {"apiVersion": "v1", "kind": "ConfigMap", "metadata": meta, "data": {"Corefile": COREFILE}},
        {
            "apiVersion": "apps/v1",
            "kind": "Deployment",
            "metadata": {**meta, "labels": labels},
            "spec": {
                "replicas": 1,
                "selector": {"matchLabels": labels},
                "template": {
                    "metadata": {"labels": labels},
                    "spec": {
                        "serviceAccountName": "coredns",
                        "dnsPolicy": "Default",
                        "priorityClassName": "system-cluster-critical",
                        "containers": [
                            {
                                "name": "coredns",
                                "image": image_ref,
                                "args": ["-conf", "/etc/coredns/Corefile"],
                                "ports": [
                                    {"name": "dns", "containerPort": 53, "protocol": "UDP"},
                                    {"name": "dns-tcp", "containerPort": 53, "protocol": "TCP"},
                                ],
                                "readinessProbe": {
                                    "httpGet": {"path": "/ready", "port": 8181},
                                    "periodSeconds": 2,
                                },
                                "livenessProbe": {
                                    "httpGet": {"path": "/health", "port": 8080},
                                    "initialDelaySeconds": 30,
                                },
                                "resources": {"limits": {"memory": "170Mi"}},
                                "volumeMounts": [{"name": "config", "mountPath": "/etc/coredns"}],
                            }
                        ],
                        "volumes": [{"name": "config", "configMap": {"name": "coredns"}}],
                    },
                },
            },
        },
        {
            "apiVersion": "v1",
            "kind": "Service",
            "metadata": {"name": "kube-dns", "namespace": NAMESPACE, "labels": labels},
            "spec": {
                "selector": labels,
                "clusterIP": cluster_ip,
                "ports": [
                    {"name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53},
                    {"name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53},
                ],
            },
        },
    ]


def install(
    *, kubectl: Path, kubeconfig: Path, binary: Path, registry_url: str, cluster_ip: str
) -> str:
    """Push the image, apply the manifests, wait until CoreDNS is ready; the image ref."""
    version = subprocess.run(
        [str(binary), "-version"], capture_output=True, text=True, check=True
    ).stdout.split()[0]
    tag = version.rsplit("-", 1)[-1] or "dev"
    ref = images.push(registry_url, IMAGE_REPO, tag, image(binary))
    docs = "\n".join(json.dumps(d) for d in manifests(ref, cluster_ip))
    base = [str(kubectl), "--kubeconfig", str(kubeconfig)]
    subprocess.run(
        [*base, "apply", "-f", "-"], input=docs, text=True, check=True, capture_output=True
    )
    deadline = time.monotonic() + READY_TIMEOUT
    while True:
        out = subprocess.run(
            [*base, "-n", NAMESPACE, "get", "deployment", "coredns", "-o", "json"],
            capture_output=True,
            text=True,
        )
        if out.returncode == 0 and json.loads(out.stdout).get("status", {}).get("readyReplicas"):
            return ref
        if time.monotonic() > deadline:
            pods = subprocess.run(
                [*base, "-n", NAMESPACE, "describe", "pods", "-l", "k8s-app=kube-dns"],
                capture_output=True,
                text=True,
            ).stdout
            raise RuntimeError(f"CoreDNS not ready after {READY_TIMEOUT:.0f}s:\n{pods[-3000:]}")
        time.sleep(0.5)
