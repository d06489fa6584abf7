"""Hot publish with 1 and with 1,000 volumes held on the node: flat, p99 < 3 ms (issue 35).

Where it sits: a module of ``tests.bench`` (``python -m tests.bench holders``). It starts
Debian's docker-registry and ``python -m csi.plugin`` processes in the work dir (stopped
by pid), pushes the typical bundle of ``bench_csi`` (200 files, ~1.5 MB) and, for each
plugin, publishes it to ``HELD`` targets (real bind mounts, each a held volume), then
measures ``HOT`` hot publishes (NodePublishVolume of the cached image to a new target,
as for each new pod) through the plugin's gRPC socket: p50 and p99.

Before and after in one run: with ``BENCH_BEFORE_TREE`` naming a checkout of the code
before the holder registry (e.g. the main branch), the same measurement runs against a
plugin started from that tree first, so both sides share the disk's mood. The after side
runs twice: as shipped (holder files fsynced) and with ``--no-durable-commit`` (the
same files written without fsync; a hot publish commits no tree, so that flag changes
only them). First, the registry's own part in-process (``Holders.hold`` with ``held``
records already there), fsynced and not. ``BENCH_HELD`` overrides the held counts
(comma-separated, e.g. ``1,200``) and ``BENCH_HOT`` the number of hot publishes timed,
for a reduced run.
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import time
from pathlib import Path

from rukpak.store import holders
from tests.bench import Result, percentile, progress
from tests.bench.bench_csi import (
    TYPICAL_BYTES,
    TYPICAL_FILES,
    TYPICAL_RANDOM,
    Node,
    make_image,
)
from tests.polling import eventually
from tests.registry import RegistryServer

HELD = (1, 1000)
HOT = 200
WARMUP = 200
DIGEST = "sha256:" + "0" * 64
HERE = Path(__file__).resolve().parents[2]


def node_from(tree: Path, workdir: Path, *args: str) -> Node:
    """A plugin started from the code in ``tree``: ``python -m csi.plugin`` puts its
    working directory first on the path."""
    with contextlib.chdir(tree):
        return Node(workdir, *args)


def commit_of(tree: Path) -> str:
    try:
        out = subprocess.run(
            ["git", "-C", str(tree), "rev-parse", "--short", "HEAD"],
            capture_output=True,
            text=True,
            check=True,
        )
    except (OSError, subprocess.CalledProcessError):
        return "?"
    return out.stdout.strip()


def hot_publishes(node: Node, image: str, held: int) -> list[float]:
    """Publish ``image`` to ``held`` targets, then time ``HOT`` more; their seconds.

    After the cold publish and its tree's background sync, ``WARMUP`` publishes and
    unpublishes come first (untimed), so that neither count measures a plugin just
    started."""
    node.publish(image, node.target())  # cold: pulls and commits the tree
    # Its durability follows in the background (a syncfs of the whole disk, which other
    # writers here can make slow): measure after it, as a node at rest would.
    markers = node.plugin.state_dir / "images" / "unpacked"

    def synced(marker: Path) -> bool:
        doc = json.loads(marker.read_text())
        return bool(doc.get("synced") or not doc.get("boot_id"))  # none: --no-durable-commit

    eventually(
        lambda: all(synced(m) for m in markers.glob("*.sealed")) or None,
        timeout=120,
        what="the tree's background sync",
    )
    for _ in range(WARMUP):
        warm = node.target()
        node.publish(image, warm)
        node.unpublish(warm)
    for n in range(held - 1):
        node.publish(image, node.target())
        if (n + 1) % 250 == 0:
            progress(f"holders: {n + 1}/{held} volumes held")
    hot = int(os.environ.get("BENCH_HOT", HOT))
    return [node.publish(image, node.target()) for _ in range(hot)]


def registry_holds(root: Path, held: int, *, durable: bool) -> list[float]:
    """Seconds of ``HOT`` holds (and as many releases, untimed) in a registry that already
    holds ``held`` records: the registry's own part of a hot publish, in-process."""
    registry = holders.Holders(root, durable=durable)
    for n in range(held):
        registry.hold(holders.Record(f"/k/held-{n}", f"vol-{n}", DIGEST, holders.TREE))
    seconds = []
    for n in range(int(os.environ.get("BENCH_HOT", HOT))):
        record = holders.Record(f"/k/hot-{n}", f"hot-{n}", DIGEST, holders.TREE)
        started = time.perf_counter()
        registry.hold(record)
        seconds.append(time.perf_counter() - started)
    return seconds


def run(workdir: Path) -> list[Result]:
    held_counts = tuple(int(n) for n in os.environ.get("BENCH_HELD", "").split(",") if n) or HELD
    before = os.environ.get("BENCH_BEFORE_TREE")
    sides: list[tuple[str, Path, tuple[str, ...]]] = []
    if before:
        sides.append((f"before ({commit_of(Path(before))})", Path(before), ()))
    sides.append((f"after ({commit_of(HERE)})", HERE, ()))
    sides.append(
        (f"after ({commit_of(HERE)}), holder files not fsynced", HERE, ("--no-durable-commit",))
    )
    results: list[Result] = []
    for held in held_counts:
        for durable in (True, False):
            ms = [
                s * 1000
                for s in registry_holds(
                    workdir / f"registry-{held}-{durable}", held, durable=durable
                )
            ]
            kind = "fsynced" if durable else "not fsynced"
            results.append(
                Result(
                    f"holder record write p99 (in-process), {held} held, {kind}",
                    percentile(ms, 99),
                    "ms",
                    note=f"p50 {percentile(ms, 50):.3f} ms; rukpak.store.holders.Holders.hold",
                )
            )
    registry = RegistryServer.start(workdir / "registry")
    try:
        image = make_image(
            registry,
            workdir,
            "bench/holders",
            files=TYPICAL_FILES,
            total=TYPICAL_BYTES,
            random_share=TYPICAL_RANDOM,
            seed=3,
        )
        for held in held_counts:
            for n, (label, tree, args) in enumerate(sides):
                node = node_from(tree, workdir / f"plugin-{held}-{n}", *args)
                try:
                    hot = hot_publishes(node, image.ref, held)
                finally:
                    node.close()
                ms = [s * 1000 for s in hot]
                progress(
                    f"holders: {label}, {held} held: p50 {percentile(ms, 50):.2f} ms, "
                    f"p99 {percentile(ms, 99):.2f} ms"
                )
                results.append(
                    Result(f"hot publish p50, {held} held, {label}", percentile(ms, 50), "ms")
                )
                results.append(
                    Result(
                        f"hot publish p99, {held} held, {label}",
                        percentile(ms, 99),
                        "ms",
                        target=3 if label.startswith("after") else None,
                        note=f"{len(hot)} publishes of the cached typical bundle to new targets",
                    )
                )
    finally:
        registry.stop()
    return results


if __name__ == "__main__":
    sys.exit("run it as: python -m tests.bench holders")
