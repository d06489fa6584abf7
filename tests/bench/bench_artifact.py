"""Any OCI artifact as a volume: a 1 GiB single-blob artifact (one file titled
``model.bin``, as ``oras push`` makes it), cold-published by the node plugin against
``curl`` of the same blob onto the same disk (target <= 1.0x, issue 39).

Where it sits: a module of ``tests.bench`` (``python -m tests.bench artifact``). It starts
Debian's docker-registry and ``python -m csi.plugin`` processes in the work dir (stopped
by pid). Estimator as in ``bench_csi``: alternating pairs, each side on a fresh plugin
state or a fresh file, ``sync`` (untimed) before each measurement, the figure the pair
with the median ratio. The plugin streams the blob into its content store (into disk
allocated before the download, read straight into the slots a second thread hashes as
they come, ``rukpak.oci.handoff``) and links that one copy into the volume's tree;
``curl`` only writes it. The plugin's peak memory (VmHWM) shows the blob is
never held in memory.
"""

from __future__ import annotations

import os
import subprocess
import time
from pathlib import Path

from rukpak.oci import mediatypes
from rukpak.oci.client import RegistryClient
from rukpak.oci.manifest import Descriptor, Manifest
from rukpak.oci.reference import Reference
from tests.bench import Result, median, progress
from tests.bench.bench_csi import Node, median_pair, remove, sync
from tests.registry import RegistryServer

SIZE = int(os.environ.get("RUKPAK_BENCH_ARTIFACT_BYTES", str(1 << 30)))
PAIRS = 5
TITLE = "org.opencontainers.image.title"


def push_artifact(registry: RegistryServer, workdir: Path) -> tuple[str, str]:
    """The 1 GiB artifact pushed; (its ref by digest, its blob's URL)."""
    blob = workdir / "model.bin"
    with blob.open("wb") as out:
        left = SIZE
        while left:
            chunk = os.urandom(min(left, 1 << 24))
            out.write(chunk)
            left -= len(chunk)
    ref = Reference.parse(f"{registry.host}/bench/model:v1")
    with RegistryClient() as client:
        config = client.push_blob(ref, b"{}", media_type=mediatypes.OCI_EMPTY)
        layer = client.push_blob(ref, blob, media_type="application/vnd.example.weights")
        layer = Descriptor(
            layer.media_type, layer.digest, layer.size, annotations={TITLE: "model.bin"}
        )
        manifest = Manifest(mediatypes.OCI_MANIFEST, config, [layer])
        digest = client.push_manifest(ref, manifest.to_json(), mediatypes.OCI_MANIFEST)
    blob.unlink()
    return (
        f"{registry.host}/bench/model@{digest}",
        f"{registry.url}/v2/bench/model/blobs/{layer.digest}",
    )


def curl(url: str, dest: Path) -> float:
    dest.mkdir(parents=True)
    started = time.perf_counter()
    subprocess.run(["curl", "-sf", "-o", str(dest / "model.bin"), url], check=True)
    return time.perf_counter() - started


def run(workdir: Path) -> list[Result]:
    registry = RegistryServer.start(workdir / "registry")
    try:
        progress(f"artifact: pushing one {SIZE / (1 << 30):.2f} GiB blob")
        ref, url = push_artifact(registry, workdir)
        plugin: list[float] = []
        baseline: list[float] = []
        hwm = 0.0

        def via_plugin(rep: int) -> None:
            nonlocal hwm
            node = Node(workdir / f"plugin-{rep}")
            try:
                target = node.target()
                sync()
                plugin.append(node.publish(ref, target))
                hwm = max(hwm, node.memory("VmHWM"))
                assert (target / "model.bin").stat().st_size == SIZE
                node.unpublish(target)
            finally:
                node.close()
                remove(workdir / f"plugin-{rep}")

        def via_curl(rep: int) -> None:
            sync()
            baseline.append(curl(url, workdir / f"curl-{rep}"))
            remove(workdir / f"curl-{rep}")

        for rep in range(PAIRS):
            for side in (via_curl, via_plugin) if rep % 2 == 0 else (via_plugin, via_curl):
                side(rep)
            progress(f"artifact rep {rep}: curl {baseline[-1]:.2f}s, plugin {plugin[-1]:.2f}s")
        pairs = list(zip(plugin, baseline, strict=True))
        mid_plugin, mid_baseline = median_pair(pairs)
        samples = ", ".join(f"{p:.2f}/{b:.2f}" for p, b in pairs)
        return [
            Result(
                "1 GiB single-blob artifact cold publish vs curl of the blob",
                mid_plugin,
                "s",
                baseline=mid_baseline,
                target=1.0,
                note=(
                    f"{SIZE} bytes, one titled file; the pair with the median ratio of {PAIRS} "
                    f"alternating pairs (medians: plugin {median(plugin):.2f}s, curl "
                    f"{median(baseline):.2f}s); plugin/curl seconds: {samples}"
                ),
            ),
            Result("plugin peak RSS (VmHWM) publishing the 1 GiB artifact", hwm, "MiB", target=100),
        ]
    finally:
        registry.stop()
