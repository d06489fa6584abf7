"""FUSE publishing mode against bind mode, same run, same bundles, through the real plugin.

Where it sits: a module of ``tests.bench`` (``python -m tests.bench fuse``). It
starts Debian's docker-registry, a /dev/fuse holder and ``python -m csi.plugin
--fuse`` processes in the work dir (stopped by pid) and measures:

- time until a volume is readable, large bundle (10,000 files, ~100 MB): a
  NodePublishVolume on a fresh node, FUSE with the bundle's eStargz layer (TOC
  only, files on first read) vs bind mode with the same image (issue goal
  <= 0.1x); FUSE with an ordinary tar.gz layer of the same files (fetched in
  full first, so presented as a read-only bind of hard links into the file store,
  ``csi.fuse.linked``) is reported beside them;
- reading every file of that volume once (cold: page cache dropped before,
  except for the lazy run, which reads right after publishing as a pod would),
  then again (warm): FUSE vs bind (goals <= 1.2x), with a reader that opens,
  reads and closes like ``cat``, and with Python 3.11's buffered ``open()``
  (one isatty ioctl per file, which the FUSE view always sends to the daemon;
  goal <= 1.2x); the same passes over the overlay of that tree (the plugin with
  ``FUSE_LINKED=false``, ``csi.fuse.overlay``, the presentation before linked
  trees and the fallback where hard links are impossible) and over its FUSE view
  (``FUSE_OVERLAY=false``) are reported beside them, and, warm, the two steps
  where an overlay adds to the filesystem below (opening and closing every file,
  ``stat`` of every path) on their own, for both;
- disk used by 10 versions of a bundle that differ in one file each (2,000
  files, ~20 MB; each version one gzip layer): the FUSE file store vs bind
  mode's state (layer blobs + unpacked trees), both as multiples of one
  version's unpacked size (goal FUSE <= 1.2x), the linked trees of the 10
  published volumes included;
- plugin RSS with 100 published FUSE volumes (goal < 150 MiB); the holder's
  RSS is reported beside it.
"""

from __future__ import annotations

import gzip
import io
import json
import os
import subprocess
import sys
import tarfile
import time
from pathlib import Path
from typing import IO, cast

import grpc

from csi.proto import csi_pb2, csi_pb2_grpc
from provisioner.bundle import estargz
from rukpak.oci import mediatypes
from rukpak.oci.client import RegistryClient
from rukpak.oci.manifest import Manifest
from rukpak.oci.reference import Reference
from tests.bench import Result, against, median, progress
from tests.bench.bench_csi import (
    LARGE_BYTES,
    LARGE_FILES,
    LARGE_RANDOM,
    Image,
    MiB,
    make_image,
    pod_target,
    proc_status_mib,
    push,
    remove,
    sync,
    volume_id,
    write_layer,
)
from tests.csi_helpers import PluginProcess, mount_capability, terminate
from tests.registry import RegistryServer

REPETITIONS = 3
VERSIONS = 10
VERSION_FILES = 2_000
VERSION_BYTES = 20 * 10**6
VOLUMES = 100


class FuseNode:
    """A plugin process with FUSE mode on, its own holder, and a Node client."""

    def __init__(self, workdir: Path, *, overlay: bool = True, linked: bool = True) -> None:
        workdir.mkdir(parents=True, exist_ok=True)
        self.holder_socket = workdir / "holder.sock"
        self.holder = subprocess.Popen(
            [
                *(sys.executable, "-m", "csi.fuse.holder"),
                *("--mountpoint", str(workdir / "fusemnt"), "--socket", str(self.holder_socket)),
            ],
            stdout=subprocess.PIPE,
        )
        assert self.holder.stdout is not None
        if self.holder.stdout.readline().strip() != b"ready":
            raise RuntimeError("the FUSE holder did not start")
        os.environ["FUSE_OVERLAY"] = "true" if overlay else "false"  # read by the plugin
        os.environ["FUSE_LINKED"] = "true" if linked else "false"
        try:
            self.plugin = PluginProcess(
                workdir / "plugin",
                extra_args=("--fuse", "--fuse-holder-socket", str(self.holder_socket)),
            ).start()
        finally:
            del os.environ["FUSE_OVERLAY"], os.environ["FUSE_LINKED"]
        self.channel = grpc.insecure_channel(f"unix://{self.plugin.socket}")
        self.stub = csi_pb2_grpc.NodeStub(self.channel)
        self._count = 0

    def target(self) -> Path:
        self._count += 1
        return pod_target(self.plugin.kubelet_dir, self._count)

    def publish(self, image: str, target: Path, mode: str) -> float:
        request = csi_pb2.NodePublishVolumeRequest(
            volume_id=volume_id(target),
            target_path=str(target),
            volume_capability=mount_capability(),
            readonly=True,
            volume_context={"image": image, "publishMode": mode},
        )
        started = time.perf_counter()
        self.stub.NodePublishVolume(request, timeout=600)
        return time.perf_counter() - started

    def memory(self, pid: int | None = None) -> float:
        assert self.plugin.process is not None
        return proc_status_mib(pid or self.plugin.process.pid)

    def close(self) -> None:
        self.channel.close()
        self.plugin.stop()
        self.plugin.unmount_all()
        terminate(self.holder)


def drop_caches() -> None:
    sync()
    Path("/proc/sys/vm/drop_caches").write_text("3")


def read_all(root: Path, *, buffered: bool = False) -> tuple[float, int]:
    """Seconds to open and read every regular file under ``root``; bytes read.

    The default reader works like ``cat`` or a Go or C program: open, read to the
    end, close. ``buffered`` uses Python 3.11's ``open(path, "rb")``, which also
    asks ``isatty`` (an ioctl) of every file; FUSE sends every ioctl to the
    daemon, cached pages or not (Python 3.14 no longer asks for regular files).
    """
    started = time.perf_counter()
    total = 0
    for dirpath, _dirs, files in os.walk(root):
        for name in files:
            with open(os.path.join(dirpath, name), "rb", buffering=-1 if buffered else 0) as f:
                total += len(f.read())
    return time.perf_counter() - started, total


def per_file(root: Path) -> tuple[float, float]:
    """Seconds to open and close every regular file under ``root``, and to ``stat`` each by
    its path (the list made first, untimed): the two steps where an overlay adds to what
    the filesystem below costs (a backing file opened beside the overlay's own, each
    path component looked up and permission-checked in the overlay and the layer)."""
    paths = [os.path.join(d, n) for d, _dirs, files in os.walk(root) for n in files]
    started = time.perf_counter()
    for path in paths:
        os.close(os.open(path, os.O_RDONLY | os.O_CLOEXEC))
    opened = time.perf_counter() - started
    started = time.perf_counter()
    for path in paths:
        os.stat(path)
    return opened, time.perf_counter() - started


def du(path: Path, *options: str) -> int:
    """Bytes allocated on disk under ``path`` (``options``: more of ``du``'s)."""
    command = ["du", "-s", "-B1", *options, str(path)]
    blocks = subprocess.run(command, capture_output=True, check=True)
    return int(blocks.stdout.split()[0])


def push_estargz(registry: RegistryServer, repository: str, plain_gz: Path, unpacked: int) -> Image:
    """The same content as ``plain_gz`` rewritten as an eStargz layer, pushed with its TOC."""
    layer = plain_gz.with_suffix(".esgz")
    with gzip.open(plain_gz, "rb") as plain, layer.open("wb") as out:
        written = estargz.convert(cast(IO[bytes], plain), out)
    ref = Reference.parse(f"{registry.host}/{repository}:v1")
    with RegistryClient() as client:
        config = json.dumps(
            {"architecture": "amd64", "os": "linux", "config": {"Labels": {"bench": repository}},
             "rootfs": {"type": "layers", "diff_ids": [written.diff_id]}}
        ).encode()  # fmt: skip
        config_desc = client.push_blob(ref, config, media_type=mediatypes.OCI_CONFIG)
        desc = client.push_blob(ref, layer, media_type=mediatypes.OCI_LAYER_GZIP)
        desc.annotations = written.annotations()
        manifest = Manifest(mediatypes.OCI_MANIFEST, config_desc, [desc])
        client.push_manifest(ref, manifest.to_json(), mediatypes.OCI_MANIFEST)
    layer.unlink()
    return Image(str(ref), repository, desc.digest, desc.size, unpacked, blobs=2)


def large_bundle(registry: RegistryServer, workdir: Path) -> list[Result]:
    progress(f"building the large bundle ({LARGE_FILES} files, ~{LARGE_BYTES // 10**6} MB)")
    plain_gz = workdir / "large.tar.gz"
    unpacked = write_layer(
        plain_gz, files=LARGE_FILES, total=LARGE_BYTES, random_share=LARGE_RANDOM, seed=1
    )
    plain = push(registry, "bench/fuse-large", plain_gz, unpacked)
    lazy = push_estargz(registry, "bench/fuse-large-estargz", plain_gz, unpacked)
    plain_gz.unlink()
    runs = {  # name: (image, publishMode)
        "bind": (lazy, "bind"),
        "fuse-lazy": (lazy, "fuse"),
        "fuse-full": (plain, "fuse"),
        "fuse-overlay": (plain, "fuse"),  # FUSE_LINKED=false: the overlay of a fetched tree
        "fuse-view": (plain, "fuse"),  # FUSE_OVERLAY=false: the FUSE view of a fetched tree
    }
    publish: dict[str, list[float]] = {name: [] for name in runs}
    cold: dict[str, list[float]] = {name: [] for name in runs}
    warm: dict[str, list[float]] = {name: [] for name in runs}
    warm_py: dict[str, list[float]] = {name: [] for name in runs}
    opens: dict[str, list[float]] = {name: [] for name in runs}
    stats: dict[str, list[float]] = {name: [] for name in runs}
    for rep in range(REPETITIONS):
        order = list(runs) if rep % 2 == 0 else list(reversed(runs))
        for name in order:
            image, mode = runs[name]
            node = FuseNode(
                workdir / f"large-{name}-{rep}",
                overlay=name != "fuse-view",
                linked=name != "fuse-overlay",
            )
            try:
                target = node.target()
                sync()
                publish[name].append(node.publish(image.ref, target, mode))
                if name != "fuse-lazy":
                    drop_caches()  # lazy: read at once, as a pod would, while files arrive
                seconds, nbytes = read_all(target)
                assert nbytes >= unpacked, (nbytes, unpacked)
                cold[name].append(seconds)
                warm[name].append(read_all(target)[0])
                warm_py[name].append(read_all(target, buffered=True)[0])
                opened, statted = per_file(target)
                opens[name].append(opened)
                stats[name].append(statted)
            finally:
                node.close()
            progress(
                f"large rep {rep} {name}: publish {publish[name][-1]:.2f}s, read cold "
                f"{cold[name][-1]:.2f}s, warm {warm[name][-1]:.2f}s, warm with Python open() "
                f"{warm_py[name][-1]:.2f}s"
            )
            remove(workdir / f"large-{name}-{rep}")
    note = (
        f"{LARGE_FILES} files, {unpacked / 10**6:.0f} MB, {lazy.layer_size / 10**6:.0f} MB "
        f"eStargz layer; medians of {REPETITIONS}"
    )

    def per_run(values: dict[str, list[float]]) -> str:
        return ", ".join(f"{n} {median(v):.2f}s" for n, v in values.items())

    def per_file_us(values: dict[str, list[float]]) -> str:
        return ", ".join(f"{n} {median(v) * 1e6 / LARGE_FILES:.1f} us" for n, v in values.items())

    def vs_bind(
        name: str, runs: dict[str, list[float]], mode: str, more: str, target: float | None = None
    ) -> Result:
        """The median seconds of ``mode`` against bind mode's, from the same runs."""
        return against(name, runs[mode], runs["bind"], target=target, note=note + more)

    # what the other two presentations report, with no note of their own: the overlay
    # everything, the view (no overlay) the whole reads
    reads = (
        ("read all files cold", cold),
        ("read all files warm", warm),
        ("read all files warm, Python 3.11 open(),", warm_py),
    )
    measured = (
        ("time to readable", publish),
        *reads,
        ("open and close every file, warm,", opens),
        ("stat every file by its path, warm,", stats),
    )
    return [
        vs_bind(
            "FUSE+lazy time to readable vs bind",
            publish,
            "fuse-lazy",
            f"; NodePublishVolume seconds: {per_run(publish)}",
            target=0.1,
        ),
        vs_bind(
            "FUSE (full fetch) time to readable vs bind",
            publish,
            "fuse-full",
            "; an ordinary tar.gz layer of the same files",
        ),
        vs_bind(
            "FUSE read all files cold vs bind",
            cold,
            "fuse-full",
            f"; page cache dropped before; all runs: {per_run(cold)} (lazy: read "
            "right after publish, files fetched by range or by the background completion)",
            target=1.2,
        ),
        vs_bind(
            "FUSE read all files warm vs bind",
            warm,
            "fuse-full",
            f"; reader: open, read, close (as cat); all runs: {per_run(warm)}",
            target=1.2,
        ),
        vs_bind(
            "FUSE read all files warm, Python 3.11 open(), vs bind",
            warm_py,
            "fuse-full",
            "; open() asks isatty (the FUSE view sends it to the daemon); all runs: "
            + per_run(warm_py),
            target=1.2,
        ),
        vs_bind(
            "FUSE open and close every file, warm, vs bind",
            opens,
            "fuse-full",
            f"; no read; a file, all runs: {per_file_us(opens)}",
        ),
        vs_bind(
            "FUSE stat every file by its path, warm, vs bind",
            stats,
            "fuse-full",
            f"; a file, all runs: {per_file_us(stats)}",
        ),
        *(
            vs_bind(f"FUSE (overlay) {what} vs bind", runs, "fuse-overlay", "")
            for what, runs in measured
        ),
        *(
            vs_bind(f"FUSE view (no overlay) {what} vs bind", runs, "fuse-view", "")
            for what, runs in reads
        ),
    ]


def _version_layer(base: bytes, path: Path, version: int) -> None:
    """``base`` (an uncompressed tar) with one file's content replaced, gzipped."""
    with (
        tarfile.open(fileobj=io.BytesIO(base), mode="r:") as src,
        gzip.GzipFile(path, mode="wb", compresslevel=6, mtime=0) as gz,
        tarfile.open(fileobj=gz, mode="w|", format=tarfile.PAX_FORMAT) as out,
    ):
        changed = False
        for member in src:
            data = src.extractfile(member) if member.isreg() else None
            if data is not None and not changed:
                body = f"version: {version}\n".encode()
                member.size = len(body)
                out.addfile(member, io.BytesIO(body))
                changed = True
            else:
                out.addfile(member, data)


def versions(registry: RegistryServer, workdir: Path) -> list[Result]:
    progress(f"building {VERSIONS} versions ({VERSION_FILES} files, ~{VERSION_BYTES // 10**6} MB)")
    base_gz = workdir / "versions-base.tar.gz"
    unpacked = write_layer(
        base_gz, files=VERSION_FILES, total=VERSION_BYTES, random_share=LARGE_RANDOM, seed=2
    )
    base = gzip.decompress(base_gz.read_bytes())
    images = []
    for v in range(VERSIONS):
        layer = workdir / f"version-{v}.tar.gz"
        _version_layer(base, layer, v)
        images.append(push(registry, f"bench/versions-{v}", layer, unpacked))
        layer.unlink()
    node = FuseNode(workdir / "versions")
    try:
        for mode in ("bind", "fuse"):
            for image in images:
                node.publish(image.ref, node.target(), mode)
        state = node.plugin.state_dir
        sync()
        one = du(next(p for p in (state / "images" / "unpacked").iterdir() if p.is_dir()))
        bind_disk = du(state / "images")
        fuse_disk = du(state / "fuse" / "store")  # linked trees included, an inode once
        content_disk = du(state / "fuse" / "store", "--exclude=linked")
        linked = sum(1 for p in (state / "fuse" / "store" / "linked").iterdir())
    finally:
        node.close()
    note = (
        f"{VERSIONS} versions x {VERSION_FILES} files, {unpacked / 10**6:.0f} MB each, one file "
        f"differs; one unpacked version = {one / MiB:.1f} MiB on disk"
    )
    return [
        Result(
            "FUSE store, 10 versions / one version", fuse_disk / one, "x", target=1.2, note=note
        ),
        Result(
            "FUSE store without the linked trees, 10 versions / one version",
            content_disk / one,
            "x",
            note=note + " (stored files, variants and indexes: the committed content)",
        ),
        Result(
            "linked trees on disk, 10 versions published",
            linked,
            "trees",
            note=note + " (their hard links and directories are in the store's figure)",
        ),
        Result(
            "bind state, 10 versions / one version",
            bind_disk / one,
            "x",
            note=note + " (layer blobs + unpacked trees)",
        ),
    ]


def many_volumes(registry: RegistryServer, workdir: Path) -> list[Result]:
    image = make_image(
        registry,
        workdir,
        "bench/fuse-typical",
        files=200,
        total=1_500_000,
        random_share=0.3,
        seed=3,
    )
    node = FuseNode(workdir / "many")
    try:
        idle = node.memory()
        targets = [node.target() for _ in range(VOLUMES)]
        for target in targets:
            node.publish(image.ref, target, "fuse")
        for target in targets:
            read_all(target)
        rss = node.memory()
        holder = node.memory(node.holder.pid)
    finally:
        node.close()
    return [
        Result(
            f"plugin RSS with {VOLUMES} FUSE volumes",
            rss,
            "MiB",
            target=150,
            note=f"idle {idle:.0f} MiB before; every file of every volume read once; "
            f"the /dev/fuse holder process: {holder:.0f} MiB",
        )
    ]


def run(workdir: Path) -> list[Result]:
    registry = RegistryServer.start(workdir / "registry")
    try:
        results = many_volumes(registry, workdir)
        results += versions(registry, workdir)
        results += large_bundle(registry, workdir)
        return results
    finally:
        registry.stop()
