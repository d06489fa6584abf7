"""What signature policies cost a publish: the publish spine with and without a policy.

Two publish spines (``csi.node.publish.Publisher``, the node plugin's core, in-process,
binds recorded rather than mounted) share the test registry and one signed bundle
(200 files). One has no gate; the other has a gate whose enforcing policy selects the
bundle and whose key signed it. After one cold publish each, hot publishes alternate
between the two (so both see the same disk and the same noise) and the p50s are
compared: the goal is at most 5 % added. The first check's cost (resolve the tag, fetch
and verify the signature) is reported as information; it is paid once per digest and
policy generation.
"""

from __future__ import annotations

import time
from pathlib import Path

from cryptography.hazmat.primitives.asymmetric import ec

from csi.node.publish import Publisher, PublishRequest
from rukpak.common import errors
from rukpak.image.cache import ImageCache
from rukpak.oci.auth import Credentials
from rukpak.oci.client import RegistryClient
from rukpak.oci.manifest import Platform
from rukpak.signing import keys
from rukpak.signing import policy as signing
from rukpak.signing import sign as signer
from rukpak.signing.gate import Gate
from rukpak.sources.volume import VolumeSource
from tests.bench import Result, percentile, progress
from tests.csi_helpers import push_image
from tests.publish_fakes import FakeMounter
from tests.registry import RegistryServer

HOT = 300
FILES = 200


def client(credentials: Credentials | None = None) -> RegistryClient:
    return RegistryClient(credentials=credentials, timeout=30)


def no_secret(name: str) -> bytes:
    raise errors.NotFound(name)


class Spine:
    def __init__(self, root: Path, gate: Gate | None) -> None:
        (root / "kubelet").mkdir(parents=True)
        self.root = root
        self.publisher = Publisher(
            images=ImageCache(root / "images", puller_factory=client),
            mounter=FakeMounter(),
            kubelet_dir=root / "kubelet",
            platform=Platform.parse("linux/amd64"),
            gate=gate,
        )
        self.count = 0

    def publish(self, ref: str) -> float:
        self.count += 1
        target = self.root / "kubelet" / "pods" / f"p{self.count}" / "volumes" / "v"
        target.parent.mkdir(parents=True)
        request = PublishRequest(f"vol-{self.count}", str(target), VolumeSource(image=ref))
        started = time.perf_counter()
        self.publisher.publish(request)
        return time.perf_counter() - started


def run(workdir: Path) -> list[Result]:
    registry = RegistryServer.start(workdir / "registry")
    try:
        files = [("manifests/", "dir")] + [
            (f"manifests/obj-{i:03d}.yaml", "file", f"kind: ConfigMap\nn: {i}\n".encode() * 20)
            for i in range(FILES)
        ]
        image = push_image(registry.host, "bench/signed", "v1", [files])
        key = ec.generate_private_key(ec.SECP256R1())
        with client() as c:
            signer.sign(c, image.ref, key)
        policy = signing.parse(
            {
                "metadata": {"name": "bench", "uid": "u", "generation": 1},
                "spec": {
                    "images": [{"glob": f"{registry.host}/bench/**"}],
                    "authorities": [{"name": "k", "key": {"data": keys.public_pem(key).decode()}}],
                },
            }
        )
        gate = Gate(policies=lambda: [policy], read_secret=no_secret, client=client)
        plain = Spine(workdir / "plain", None)
        checked = Spine(workdir / "checked", gate)
        plain.publish(image.ref)
        started = time.perf_counter()
        verdict = gate.check(image.ref)
        first_check = time.perf_counter() - started
        assert verdict is not None and verdict.digest == image.manifest_digest
        checked.publish(image.ref)
        without: list[float] = []
        with_gate: list[float] = []
        for i in range(HOT):
            if i % 2:
                without.append(plain.publish(image.ref))
                with_gate.append(checked.publish(image.ref))
            else:
                with_gate.append(checked.publish(image.ref))
                without.append(plain.publish(image.ref))
            if i % 100 == 99:
                progress(f"signing: {i + 1}/{HOT} hot publish pairs")
        ms = 1000.0
        return [
            Result(
                "hot publish p50, signed and checked vs no policy",
                percentile(with_gate, 50) * ms,
                "ms",
                baseline=percentile(without, 50) * ms,
                target=1.05,
                note=f"{HOT} alternating pairs; the verdict is remembered per digest and policy",
            ),
            Result(
                "first signature check (resolve, fetch, verify)",
                first_check * ms,
                "ms",
                note="once per digest and policy generation",
            ),
        ]
    finally:
        registry.stop()
