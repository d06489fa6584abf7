"""Live content refresh: a tag moved in the registry → the new content readable in a
published refresh volume (``refresh: 1s``), through the real node plugin (issue 39: at
most 2 s after the registry answers).

Where it sits: a module of ``tests.bench`` (``python -m tests.bench refresh``). It starts
Debian's docker-registry and ``python -m csi.plugin`` in the work dir (stopped by pid),
publishes one refresh volume of a typical bundle (200 files) and, ROUNDS times, pushes a
new version under the same tag and times from the push's end (the registry answered it)
until the view's ``..digest`` names the new digest and its files read the new text. The
interval is part of the figure: with ``refresh: 1s`` a move waits up to 1 s to be seen.
"""

from __future__ import annotations

import time
from pathlib import Path

from csi.node import refresh
from tests.bench import Result, median, percentile, progress
from tests.bench.bench_csi import Node
from tests.csi_helpers import Entry, publish_request, push_image
from tests.registry import RegistryServer

ROUNDS = 10
FILES = 200


def push(registry: RegistryServer, text: str) -> str:
    entries: list[Entry] = [("manifests/", "dir")]
    entries += [
        (f"manifests/f{i:03}.yaml", "file", f"# {text} {i}\n".encode()) for i in range(FILES)
    ]
    return push_image(registry.host, "bench/live", "live", [entries]).manifest_digest


def run(workdir: Path) -> list[Result]:
    registry = RegistryServer.start(workdir / "registry")
    node = Node(workdir / "plugin")
    try:
        push(registry, "round 0")
        view = node.target()
        request_ref = f"{registry.host}/bench/live:live"
        node.stub.NodePublishVolume(
            publish_request(str(view), request_ref, volume_id="live", refresh="1s"), timeout=120
        )
        seconds: list[float] = []
        for n in range(1, ROUNDS + 1):
            digest = push(registry, f"round {n}")
            pushed = time.perf_counter()
            while True:
                try:
                    seen = (view / refresh.DIGEST_FILE).read_text().split()[0]
                except FileNotFoundError:
                    seen = ""
                if seen == digest:
                    break
                if time.perf_counter() - pushed > 30:
                    raise RuntimeError(f"round {n}: {digest} not presented within 30 s")
                time.sleep(0.005)
            seconds.append(time.perf_counter() - pushed)
            assert (view / "manifests" / "f123.yaml").read_text() == f"# round {n} 123\n"
            progress(f"refresh round {n}: {seconds[-1]:.2f}s")
        return [
            Result(
                "tag moved -> new content in a refresh volume (refresh: 1s), p50",
                median(seconds),
                "s",
                target=2.0,
                note=f"{ROUNDS} moves of a {FILES}-file bundle; max {max(seconds):.2f}s",
            ),
            Result(
                "tag moved -> new content in a refresh volume (refresh: 1s), p99",
                percentile(seconds, 99),
                "s",
                target=2.0,
            ),
        ]
    finally:
        node.close()
        registry.stop()
