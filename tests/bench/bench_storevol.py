"""The store volume's two figures (issue 35): a cached digest's first read after its
request, and 1,000 digests requested back to back.

One node plugin process (real gRPC, real bind mounts, ``--store-volume-allow``) and the
test registry. Small images of their own content (so of their own digest) are pushed
first. Then, through ``rukpak.sources.storeclient`` on a store volume's socket, as a
standing provisioner would ask:

- first read of a cached digest: 50 digests the node already holds (asked for once
  through another store volume) are asked for in a new store volume, each timed from
  the request to the end of reading its file; p50 and p99 (goal: at most 50 ms);
- 1,000 digests back to back: 1,000 digests the node has never pulled, one request after
  the other on one connection (each pulls, unpacks and commits one small image), total
  seconds; and the same 1,000 again in a new volume, now cached (goal: at most 10 s: the
  store volume's own cost; never pulled, each request also pays a whole pull).
"""

from __future__ import annotations

import itertools
import time
from pathlib import Path

from csi.proto import csi_pb2
from rukpak.sources.storeclient import StoreClient
from tests.bench import Result, percentile, progress
from tests.bench.bench_csi import Node
from tests.csi_helpers import PushedImage, mount_capability, push_image
from tests.registry import RegistryServer

COLD = 1000
HOT = 50
_volumes = itertools.count()


def pinned(image: PushedImage) -> str:
    return f"{image.ref.rsplit(':', 1)[0]}@{image.manifest_digest}"


def images(registry: RegistryServer, prefix: str, count: int) -> list[PushedImage]:
    out = []
    for i in range(count):
        text = f"{prefix} {i}".encode()
        out.append(
            push_image(registry.host, f"storebench/{prefix}{i}", "v1", [[("m.yaml", "file", text)]])
        )
    return out


def store_volume(node: Node) -> Path:
    """A new store volume published for the allowed pod; its mount."""
    target = node.target()
    n = next(_volumes)
    node.stub.NodePublishVolume(
        csi_pb2.NodePublishVolumeRequest(
            volume_id=f"store-{n}",
            target_path=str(target),
            volume_capability=mount_capability(),
            readonly=True,
            volume_context={
                "kind": "store",
                "csi.storage.k8s.io/pod.namespace": "bench",
                "csi.storage.k8s.io/pod.name": f"provisioner-{n}",
                "csi.storage.k8s.io/pod.uid": f"uid-{n}",
                "csi.storage.k8s.io/serviceAccount.name": "provisioner",
            },
        ),
        timeout=60,
    )
    return target


def first_reads(node: Node, hot: list[PushedImage]) -> list[float]:
    with StoreClient(store_volume(node)) as warm:
        for image in hot:
            warm.fetch(pinned(image))
    seconds = []
    with StoreClient(store_volume(node)) as store:
        for image in hot:
            started = time.perf_counter()
            path = store.fetch(pinned(image))
            (path / "m.yaml").read_bytes()
            seconds.append(time.perf_counter() - started)
    return seconds


def back_to_back(node: Node, cold: list[PushedImage]) -> float:
    with StoreClient(store_volume(node)) as store:
        started = time.perf_counter()
        for image in cold:
            store.fetch(pinned(image))
        return time.perf_counter() - started


def run(workdir: Path) -> list[Result]:
    registry = RegistryServer.start(workdir / "registry")
    try:
        progress(f"pushing {HOT + COLD} small images")
        hot = images(registry, "hot", HOT)
        cold = images(registry, "cold", COLD)
        node = Node(workdir / "plugin", "--store-volume-allow", "bench/provisioner")
        try:
            progress("first reads of cached digests")
            reads = first_reads(node, hot)
            progress(f"{COLD} digests back to back, never pulled")
            pulled = back_to_back(node, cold)
            progress(f"the same {COLD} digests again, cached, in a new volume")
            cached = back_to_back(node, cold)
            rss = node.memory()
        finally:
            node.close()
    finally:
        registry.stop()
    ms = [s * 1000 for s in reads]
    return [
        Result(
            "store volume: first read of a cached digest after its request, p99",
            percentile(ms, 99),
            "ms",
            target=50,
        ),
        Result(
            "store volume: first read of a cached digest after its request, p50",
            percentile(ms, 50),
            "ms",
        ),
        Result(f"store volume: {COLD} digests requested back to back, never pulled", pulled, "s",
               note="each pulls, unpacks and durably commits an image: the pull path's cost"),
        Result(f"store volume: {COLD} digests requested back to back, cached", cached, "s",
               target=10),
        Result(f"plugin RSS with {COLD + 2 * HOT} digests shown in store volumes", rss, "MiB"),
    ]  # fmt: skip
