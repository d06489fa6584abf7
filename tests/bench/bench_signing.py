"""What signature policies cost a publish: the node plugin with and without a policy.

Two node plugin processes (real gRPC, real read-only bind mounts) share the test
registry and one bundle (200 files) signed with ``rukpak bundle sign``'s code. One runs
as before; the other runs with ``--signature-policies=cluster`` against a real API server
(etcd and kube-apiserver of the local cluster, no node) holding an enforcing
ClusterBundlePolicy that selects the bundle, with the key that signed it. After one cold
publish each, hot publishes (NodePublishVolume to a new target, as for each new pod)
alternate, so all see the same disk and the same noise, and p50s are compared:

- the goal (at most 5 % added): in the plugin with policies, the signed image a policy
  selects against the same content in a repository no policy selects; one process, so
  only the check differs;
- for information: the plugin with policies against the one without, measured first,
  while both hold as many volumes (a publish's cost grows with the volumes its plugin
  records, so a comparison across processes is fair only then).

The checked plugin's first publish pays the check itself (resolve the tag, fetch and
verify the signature) once per digest and policy generation.
"""

from __future__ import annotations

import os
from pathlib import Path

import yaml
from cryptography.hazmat.primitives.asymmetric import ec

from provisioner.engine.kube.kube import Kube
from provisioner.manager import model
from rukpak.common import errors
from rukpak.oci.client import RegistryClient
from rukpak.signing import keys
from rukpak.signing import policy as signing
from rukpak.signing import sign as signer
from tests.bench import Result, percentile, progress
from tests.bench.bench_csi import Node
from tests.cluster.localcluster import LocalCluster
from tests.csi_helpers import push_image
from tests.polling import eventually
from tests.registry import RegistryServer

HOT = 200
FILES = 200


def policy(repo: str, key: ec.EllipticCurvePrivateKey) -> dict[str, object]:
    return {
        "apiVersion": f"{signing.GROUP}/{signing.VERSION}",
        "kind": signing.KIND,
        "metadata": {"name": "bench"},
        "spec": {
            "images": [{"glob": f"{repo}/**"}],
            "authorities": [{"name": "k", "key": {"data": keys.public_pem(key).decode()}}],
        },
    }


def checked_node(workdir: Path, kubeconfig: Path) -> Node:
    """A plugin following the cluster's policies, started once it has loaded them."""
    before = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(kubeconfig)
    try:
        node = Node(workdir, "--signature-policies=cluster")
    finally:
        if before is None:
            os.environ.pop("KUBECONFIG")
        else:
            os.environ["KUBECONFIG"] = before
    eventually(
        lambda: "bench@1" in node.plugin.log(), timeout=60, what="the plugin to load the policy"
    )
    return node


def _created(kube: Kube, obj: dict[str, object]) -> bool:
    """Create ``obj``; False while its API is not served yet (a CRD just created)."""
    try:
        kube.create(obj)
    except errors.NotFound:
        return False
    return True


def run(workdir: Path) -> list[Result]:
    registry = RegistryServer.start(workdir / "registry")
    cluster = LocalCluster.start(workdir / "apiserver", node=False)
    nodes: list[Node] = []
    try:
        files = [("manifests/", "dir")] + [
            (f"manifests/obj-{i:03d}.yaml", "file", f"kind: ConfigMap\nn: {i}\n".encode() * 20)
            for i in range(FILES)
        ]
        image = push_image(registry.host, "bench/signed", "v1", [files])
        unselected = push_image(registry.host, "other/plain", "v1", [files])
        key = ec.generate_private_key(ec.SECP256R1())
        with RegistryClient(timeout=30) as c:
            signer.sign(c, image.ref, key)
        kube = Kube.from_kubeconfig(str(cluster.kubeconfig))
        for path in model.crd_files():
            for doc in yaml.safe_load_all(path.read_text()):
                if doc:
                    kube.create(doc)
        eventually(
            lambda: _created(kube, policy(f"{registry.host}/bench", key)),
            timeout=30,
            what="the ClusterBundlePolicy API to serve",
        )
        plain = Node(workdir / "plain")
        nodes.append(plain)
        checked = checked_node(workdir / "checked", cluster.kubeconfig)
        nodes.append(checked)
        cold = plain.publish(image.ref, plain.target())
        first = checked.publish(image.ref, checked.target())
        without: list[float] = []
        with_policy: list[float] = []
        same_without: list[float] = []
        same_with: list[float] = []
        rounds = [
            # across processes, first: each publish adds a holder to its plugin's state,
            # whose save grows with them, so both must hold as many
            ((plain, image.ref, without), (checked, image.ref, with_policy)),
            # in one process: an image no policy selects, the signed image one selects
            ((checked, unselected.ref, same_without), (checked, image.ref, same_with)),
        ]
        plain.publish(unselected.ref, plain.target())  # as many holders on both
        checked.publish(unselected.ref, checked.target())
        for pair in rounds:
            for i in range(HOT):
                for node, ref, samples in pair if i % 2 else reversed(pair):
                    samples.append(node.publish(ref, node.target()))
                if i % 100 == 99:
                    progress(f"signing: {i + 1}/{HOT} pairs of hot publishes")
        ms = 1000.0
        return [
            Result(
                "hot publish p50, signed and checked vs not selected",
                percentile(same_with, 50) * ms,
                "ms",
                baseline=percentile(same_without, 50) * ms,
                target=1.05,
                note=f"{HOT} alternating rounds in one plugin process: the policy check's cost",
            ),
            Result(
                "hot publish p50, plugin with policies vs without",
                percentile(with_policy, 50) * ms,
                "ms",
                baseline=percentile(without, 50) * ms,
                note="two processes, as many publishes each",
            ),
            Result(
                "hot publish p99, plugin with policies vs without",
                percentile(with_policy, 99) * ms,
                "ms",
                baseline=percentile(without, 99) * ms,
            ),
            Result(
                "cold publish, signed and checked vs no policy",
                first * ms,
                "ms",
                baseline=cold * ms,
                note="pull and unpack, plus resolve, fetch and verify the signature once",
            ),
        ]
    finally:
        for node in nodes:
            node.close()
        cluster.stop(remove=True)
        registry.stop()
