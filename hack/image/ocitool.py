"""Pack a directory as an OCI layer, and assemble and push an image, without a container engine.

Where it sits: ``hack/image/build.sh`` makes the node plugin's root filesystem with
debootstrap and calls this helper to turn directories into layers (``layer``) and the
layers into an image pushed to a registry with the project's own OCI client
(``push``), or written as an OCI image layout directory (``layout``).

A layer is GNU tar's output (names sorted, numeric owners, modes, symlinks and hard
links kept; device nodes, fifos and sockets left out) compressed with gzip without a
name or timestamp in its header. Next to ``LAYER.tar.gz`` a ``LAYER.json`` records its
digest, size and diff_id (the digest of the uncompressed tar), so a cached layer is
reused without reading it again.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import platform
import shutil
import stat
import subprocess
import sys
import tempfile
import time
import zlib
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))
from rukpak.common import fsio  # the one atomic-write helper (stdlib only)

CHUNK = 1 << 20
LAYER_GZIP = "application/vnd.oci.image.layer.v1.tar+gzip"
OCI_CONFIG = "application/vnd.oci.image.config.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
_ARCH = {"x86_64": "amd64", "aarch64": "arm64", "armv7l": "arm", "ppc64le": "ppc64le"}


def _special_files(root: Path) -> list[str]:
    """Device nodes, fifos and sockets under ``root`` (relative, ``./``-prefixed)."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        for name in filenames + dirnames:
            path = Path(dirpath, name)
            mode = path.lstat().st_mode
            if (
                stat.S_ISCHR(mode)
                or stat.S_ISBLK(mode)
                or stat.S_ISFIFO(mode)
                or stat.S_ISSOCK(mode)
            ):
                found.append(str(path.relative_to(root)))
    return found


def pack_layer(
    root: Path, out: Path, *, mtime: int | None = None, level: int = 6
) -> dict[str, Any]:
    """Write ``root``'s contents as ``out`` (tar+gzip); return and record its descriptor."""
    names = sorted(os.listdir(root))
    if not names:
        raise SystemExit(f"{root} is empty: nothing to pack")
    special = _special_files(root)
    with tempfile.NamedTemporaryFile("w", delete=False) as excludes:
        excludes.write("".join(f"{name}\n" for name in special))
    argv = [
        "tar", "-C", str(root), "--create", "--file=-",
        "--sort=name", "--numeric-owner", "--format=posix",
        "--pax-option=exthdr.name=%d/PaxHeaders/%f,delete=atime,delete=ctime",
        f"--exclude-from={excludes.name}",
        "--xattrs", "--xattrs-include=security.capability",
    ]  # fmt: skip
    if mtime is not None:
        argv.append(f"--mtime=@{mtime}")
    argv += ["--", *names]
    diff = hashlib.sha256()
    blob = hashlib.sha256()
    size = 0
    # gzip with no file name and mtime 0 in its header: same input, same bytes
    gz = zlib.compressobj(level, zlib.DEFLATED, 16 + zlib.MAX_WBITS)
    try:
        with (
            subprocess.Popen(argv, stdout=subprocess.PIPE) as tar,
            fsio.atomic_writer(out, mode=0o644) as f,
        ):
            assert tar.stdout is not None
            while chunk := tar.stdout.read(CHUNK):
                diff.update(chunk)
                data = gz.compress(chunk)
                blob.update(data)
                size += len(data)
                f.write(data)
            data = gz.flush()
            blob.update(data)
            size += len(data)
            f.write(data)
            tar.wait()
            if tar.returncode != 0:
                raise SystemExit(f"tar of {root} failed (exit {tar.returncode})")
    finally:
        os.unlink(excludes.name)
    desc = {
        "mediaType": LAYER_GZIP,
        "digest": "sha256:" + blob.hexdigest(),
        "size": size,
        "diff_id": "sha256:" + diff.hexdigest(),
    }
    meta = json.dumps(desc, indent=2) + "\n"
    fsio.write_bytes_atomic(out.with_suffix("").with_suffix(".json"), meta.encode(), mode=0o644)
    return desc


def _layer_desc(layer: Path) -> dict[str, Any]:
    meta: dict[str, Any] = json.loads(layer.with_suffix("").with_suffix(".json").read_text())
    return meta


def host_arch() -> str:
    machine = platform.machine()
    return _ARCH.get(machine, machine)


def image_config(
    layers: list[dict[str, Any]],
    *,
    entrypoint: list[str],
    env: list[str],
    labels: dict[str, str],
    arch: str | None = None,
) -> bytes:
    """The OCI image config: platform (``arch``, default this host's), entrypoint, env,
    diff_ids."""
    config = {
        "architecture": arch or host_arch(),
        "os": "linux",
        "config": {"Entrypoint": entrypoint, "Env": env, "Labels": labels, "WorkingDir": "/"},
        "rootfs": {"type": "layers", "diff_ids": [layer["diff_id"] for layer in layers]},
        "history": [{"created_by": f"hack/image/build.sh: {layer['comment']}"} for layer in layers],
    }
    return json.dumps(config, sort_keys=True, separators=(",", ":")).encode()


def _image(args: argparse.Namespace) -> tuple[bytes, list[tuple[Path, dict[str, Any]]]]:
    layers = []
    for spec in args.layer:
        path_text, _, comment = spec.partition("=")
        path = Path(path_text)
        desc = _layer_desc(path)
        desc["comment"] = comment or path.name
        layers.append((path, desc))
    env = [f"PATH={args.path}", "PYTHONUNBUFFERED=1"]
    labels = dict(label.split("=", 1) for label in args.label)
    config = image_config(
        [d for _, d in layers],
        entrypoint=args.entrypoint.split(),
        env=env,
        labels=labels,
        arch=args.arch,
    )
    return config, layers


def push(args: argparse.Namespace) -> None:
    """Push the layers, config and manifest to ``args.ref`` with rukpak.oci's client."""
    from rukpak.oci import mediatypes
    from rukpak.oci.client import RegistryClient
    from rukpak.oci.manifest import Descriptor, Manifest
    from rukpak.oci.reference import Reference

    config, layers = _image(args)
    ref = Reference.parse(args.ref)
    started = time.monotonic()
    with RegistryClient(insecure=tuple(args.insecure), timeout=120.0) as registry:
        layer_descs = []
        for path, desc in layers:
            there = registry.blob_exists(ref, desc["digest"])
            print(f"==> layer {desc['digest'][:19]} {desc['size'] / 1e6:7.1f} MB "
                  f"{'already in the registry' if there else 'uploading'}", flush=True)  # fmt: skip
            if not there:
                registry.push_blob(ref, path, digest=desc["digest"], media_type=desc["mediaType"])
            layer_descs.append(Descriptor(desc["mediaType"], desc["digest"], desc["size"]))
        config_desc = registry.push_blob(ref, config, media_type=mediatypes.OCI_CONFIG)
        manifest = Manifest(
            media_type=mediatypes.OCI_MANIFEST,
            config=Descriptor(mediatypes.OCI_CONFIG, config_desc.digest, len(config)),
            layers=layer_descs,
        )
        digest = registry.push_manifest(ref, manifest.to_json(), mediatypes.OCI_MANIFEST)
    total = sum(d["size"] for _, d in layers)
    print(f"==> pushed {args.ref}@{digest} ({total / 1e6:.1f} MB compressed, "
          f"{len(layers)} layers) in {time.monotonic() - started:.1f}s", flush=True)  # fmt: skip
    if args.digest_file:
        Path(args.digest_file).write_text(f"{digest}\n")


def layout(args: argparse.Namespace) -> None:
    """Write an OCI image layout directory (``oci-layout``, ``index.json``, ``blobs/``)."""
    config, layers = _image(args)
    out = Path(args.dir)
    blobs = out / "blobs" / "sha256"
    blobs.mkdir(parents=True, exist_ok=True)

    def put(data: bytes) -> str:
        digest = "sha256:" + hashlib.sha256(data).hexdigest()
        (blobs / digest[7:]).write_bytes(data)
        return digest

    for path, desc in layers:
        target = blobs / desc["digest"][7:]
        if not target.exists():
            shutil.copyfile(path, target)
    manifest = {
        "schemaVersion": 2,
        "mediaType": OCI_MANIFEST,
        "config": {"mediaType": OCI_CONFIG, "digest": put(config), "size": len(config)},
        "layers": [
            {"mediaType": d["mediaType"], "digest": d["digest"], "size": d["size"]}
            for _, d in layers
        ],
    }
    body = json.dumps(manifest, separators=(",", ":")).encode()
    index = {
        "schemaVersion": 2,
        "manifests": [
            {
                "mediaType": OCI_MANIFEST,
                "digest": put(body),
                "size": len(body),
                "platform": {"os": "linux", "architecture": args.arch or host_arch()},
                "annotations": {"org.opencontainers.image.ref.name": args.tag},
            }
        ],
    }
    (out / "oci-layout").write_text('{"imageLayoutVersion":"1.0.0"}')
    (out / "index.json").write_text(json.dumps(index, indent=2) + "\n")
    print(f"==> wrote OCI layout {out} (tag {args.tag})", flush=True)


def main() -> None:
    p = argparse.ArgumentParser(prog="ocitool", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    lay = sub.add_parser("layer", help="pack DIR as OUT.tar.gz (+ OUT.json)")
    lay.add_argument("root", type=Path)
    lay.add_argument("out", type=Path)
    lay.add_argument("--mtime", type=int, default=None, help="set every file's mtime to this")
    for name in ("push", "layout"):
        s = sub.add_parser(name)
        s.add_argument("--layer", action="append", required=True, metavar="FILE.tar.gz[=COMMENT]")
        s.add_argument("--entrypoint", required=True)
        s.add_argument("--path", required=True, help="the image's PATH")
        s.add_argument("--label", action="append", default=[], metavar="KEY=VALUE")
        s.add_argument("--arch", default=None, help="the image's architecture (default: host's)")
    sub.choices["push"].add_argument("ref")
    sub.choices["push"].add_argument("--insecure", action="append", default=[])
    sub.choices["push"].add_argument("--digest-file")
    sub.choices["layout"].add_argument("dir")
    sub.choices["layout"].add_argument("--tag", default="latest")
    args = p.parse_args()
    if args.command == "layer":
        started = time.monotonic()
        desc = pack_layer(args.root, args.out, mtime=args.mtime)
        print(f"==> packed {args.root} -> {args.out.name}: {desc['size'] / 1e6:.1f} MB "
              f"in {time.monotonic() - started:.1f}s", flush=True)  # fmt: skip
    elif args.command == "push":
        push(args)
    else:
        layout(args)


if __name__ == "__main__":
    main()
