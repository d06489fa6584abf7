"""The release's multi-arch image: one OCI index over per-architecture images, as an
OCI layout archive, and its push to a registry.

Where it sits: ``hack/release/release.sh`` builds one OCI image layout per architecture
with ``hack/image/build.sh --arch ARCH --oci-layout DIR`` and calls ``merge`` to make
them one layout whose ``index.json`` names a single image index (tagged with the release
version), then ``archive`` to pack it as ``dist/rukpak-python-VERSION.oci.tar``. The
archive is reproducible: entries sorted, owners 0, mtimes 0, modes fixed, and every JSON
document serialised the same way, so the same layers give the same bytes and digest.
``push`` (``hack/release/push.sh``) reads such an archive (or layout) and pushes every
blob, each per-architecture manifest by digest, then the index under a tag, with the
project's own OCI client. ``check`` verifies a layout's shape and every blob's digest.

    python hack/release/ocindex.py merge --tag 1.2.3 OUT LAYOUT...
    python hack/release/ocindex.py archive LAYOUT OUT.tar
    python hack/release/ocindex.py check LAYOUT_OR_ARCHIVE
    python hack/release/ocindex.py push [--insecure HOST:PORT] [--digest-file F] SRC REPO:TAG
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

OCI_INDEX = "application/vnd.oci.image.index.v1+json"
OCI_MANIFEST = "application/vnd.oci.image.manifest.v1+json"
REF_NAME = "org.opencontainers.image.ref.name"
CHUNK = 1 << 20


class LayoutError(Exception):
    """A layout or archive that is not what a release holds; the message says why."""


def _dumps(doc: Any) -> bytes:
    return json.dumps(doc, sort_keys=True, separators=(",", ":")).encode()


def _sha256_file(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        while chunk := f.read(CHUNK):
            h.update(chunk)
    return "sha256:" + h.hexdigest()


def _blob(layout: Path, digest: str) -> Path:
    algorithm, _, hexdigest = digest.partition(":")
    if algorithm != "sha256" or len(hexdigest) != 64:
        raise LayoutError(f"{layout}: unsupported digest {digest!r}")
    return layout / "blobs" / "sha256" / hexdigest


def _read_json(path: Path) -> Any:
    try:
        return json.loads(path.read_bytes())
    except (OSError, ValueError) as e:
        raise LayoutError(f"{path}: not a readable JSON document ({e})") from None


def single_image(layout: Path) -> dict[str, Any]:
    """The one image manifest descriptor (with its platform) of a per-arch layout."""
    index = _read_json(layout / "index.json")
    manifests = index.get("manifests") or []
    if len(manifests) != 1 or manifests[0].get("mediaType") != OCI_MANIFEST:
        raise LayoutError(f"{layout}: want exactly one image manifest in index.json")
    desc = dict(manifests[0])
    if not (desc.get("platform") or {}).get("architecture"):
        raise LayoutError(f"{layout}: its manifest names no platform")
    desc.pop("annotations", None)
    return desc


def merge(layouts: list[Path], out: Path, *, tag: str) -> str:
    """One layout at ``out`` holding every image of ``layouts`` behind one image index
    tagged ``tag``; returns the index's digest. Blobs are hard-linked when possible."""
    images = [single_image(layout) for layout in layouts]
    arches = [d["platform"]["architecture"] for d in images]
    if len(set(arches)) != len(arches):
        raise LayoutError(f"two layouts for one architecture: {arches}")
    if out.exists():
        shutil.rmtree(out)
    blobs = out / "blobs" / "sha256"
    blobs.mkdir(parents=True)
    for layout in layouts:
        for source in sorted((layout / "blobs" / "sha256").iterdir()):
            target = blobs / source.name
            if target.exists():
                continue
            try:
                os.link(source, target)
            except OSError:
                shutil.copyfile(source, target)
    images.sort(key=lambda d: (d["platform"]["os"], d["platform"]["architecture"]))
    index = {"schemaVersion": 2, "mediaType": OCI_INDEX, "manifests": images}
    body = _dumps(index)
    digest = "sha256:" + hashlib.sha256(body).hexdigest()
    (blobs / digest[7:]).write_bytes(body)
    top = {
        "schemaVersion": 2,
        "mediaType": OCI_INDEX,
        "manifests": [
            {
                "mediaType": OCI_INDEX,
                "digest": digest,
                "size": len(body),
                "annotations": {REF_NAME: tag},
            }
        ],
    }
    (out / "index.json").write_bytes(_dumps(top))
    (out / "oci-layout").write_bytes(_dumps({"imageLayoutVersion": "1.0.0"}))
    check(out)
    return digest


def archive(layout: Path, out: Path) -> None:
    """Pack ``layout`` as an uncompressed tar (the layers are compressed already) whose
    bytes depend on the layout's content only."""
    names = ["oci-layout", "index.json", "blobs", "blobs/sha256"]
    names += [f"blobs/sha256/{p.name}" for p in sorted((layout / "blobs" / "sha256").iterdir())]
    tmp = out.with_name(out.name + ".tmp")
    with tarfile.open(tmp, "w", format=tarfile.PAX_FORMAT) as tar:
        for name in names:
            path = layout / name
            info = tarfile.TarInfo(name)
            info.mtime = 0
            info.uid = info.gid = 0
            info.uname = info.gname = ""
            if path.is_dir():
                info.type = tarfile.DIRTYPE
                info.mode = 0o755
                tar.addfile(info)
            else:
                info.size = path.stat().st_size
                info.mode = 0o644
                with path.open("rb") as f:
                    tar.addfile(info, f)
    os.replace(tmp, out)


@contextmanager
def opened(source: Path) -> Iterator[Path]:
    """``source`` as a layout directory: itself, or an archive unpacked to a temp dir
    (only regular files under ``blobs/sha256/`` and the two top files are taken)."""
    if source.is_dir():
        yield source
        return
    with tempfile.TemporaryDirectory(prefix="rk-oci-") as tmp:
        root = Path(tmp)
        (root / "blobs" / "sha256").mkdir(parents=True)
        try:
            with tarfile.open(source) as tar:
                for member in tar:
                    parts = member.name.split("/")
                    top = member.name in ("oci-layout", "index.json")
                    blob = len(parts) == 3 and parts[:2] == ["blobs", "sha256"]
                    if not member.isfile() or not (top or blob) or ".." in parts:
                        continue
                    f = tar.extractfile(member)
                    assert f is not None
                    with (root / member.name).open("wb") as dest:
                        shutil.copyfileobj(f, dest, CHUNK)
        except (OSError, tarfile.TarError) as e:
            raise LayoutError(f"{source}: not a readable OCI layout archive ({e})") from None
        yield root


def check(layout: Path) -> dict[str, Any]:
    """Verify the layout holds one tagged image index whose manifests, configs and
    layers are all present with the right digests and sizes; return a summary:
    ``{"tag", "digest", "platforms": {arch: manifest digest}, "sizes": {arch: bytes}}``."""
    if _read_json(layout / "oci-layout").get("imageLayoutVersion") != "1.0.0":
        raise LayoutError(f"{layout}: oci-layout is not version 1.0.0")
    top = _read_json(layout / "index.json").get("manifests") or []
    if len(top) != 1 or top[0].get("mediaType") != OCI_INDEX:
        raise LayoutError(f"{layout}: index.json must name exactly one image index")
    tag = (top[0].get("annotations") or {}).get(REF_NAME, "")

    def verified(desc: dict[str, Any]) -> Path:
        path = _blob(layout, desc["digest"])
        if not path.is_file():
            raise LayoutError(f"{layout}: blob {desc['digest']} is missing")
        if path.stat().st_size != desc["size"] or _sha256_file(path) != desc["digest"]:
            raise LayoutError(f"{layout}: blob {desc['digest']} does not match its digest")
        return path

    index = _read_json(verified(top[0]))
    if index.get("mediaType") != OCI_INDEX:
        raise LayoutError(f"{layout}: the tagged blob is not an image index")
    platforms: dict[str, str] = {}
    sizes: dict[str, int] = {}
    for desc in index.get("manifests") or []:
        arch = (desc.get("platform") or {}).get("architecture", "")
        manifest = _read_json(verified(desc))
        config = _read_json(verified(manifest["config"]))
        if config.get("architecture") != arch or config.get("os") != "linux":
            raise LayoutError(
                f"{layout}: the {arch} manifest's config says {config.get('architecture')}"
            )
        for layer in manifest["layers"]:
            verified(layer)
        platforms[arch] = desc["digest"]
        sizes[arch] = sum(layer["size"] for layer in manifest["layers"])
    if not platforms:
        raise LayoutError(f"{layout}: the image index lists no images")
    return {"tag": tag, "digest": top[0]["digest"], "platforms": platforms, "sizes": sizes}


def push(source: Path, ref_text: str, *, insecure: tuple[str, ...] = ()) -> str:
    """Push the layout (or archive) ``source`` to ``ref_text`` (``REPO:TAG``): blobs,
    manifests by digest, then the index under the tag. Returns the index digest."""
    from rukpak.oci.client import RegistryClient
    from rukpak.oci.reference import Reference

    ref = Reference.parse(ref_text)
    with opened(source) as layout:
        summary = check(layout)
        index_body = _blob(layout, summary["digest"]).read_bytes()
        index = json.loads(index_body)
        with RegistryClient(insecure=insecure, timeout=120.0) as registry:
            for desc in index["manifests"]:
                body = _blob(layout, desc["digest"]).read_bytes()
                manifest = json.loads(body)
                for blob in [manifest["config"], *manifest["layers"]]:
                    if not registry.blob_exists(ref, blob["digest"]):
                        registry.push_blob(
                            ref,
                            _blob(layout, blob["digest"]),
                            digest=blob["digest"],
                            media_type=blob["mediaType"],
                        )
                by_digest = Reference(ref.registry, ref.repository, digest=desc["digest"])
                registry.push_manifest(by_digest, body, OCI_MANIFEST)
            digest = registry.push_manifest(ref, index_body, OCI_INDEX)
    if digest != summary["digest"]:
        raise LayoutError(f"pushed index digest {digest} differs from the layout's")
    return digest


def main() -> None:
    p = argparse.ArgumentParser(prog="ocindex", description=__doc__.split("\n")[0])
    sub = p.add_subparsers(dest="command", required=True)
    m = sub.add_parser("merge", help="one multi-arch layout from per-arch layouts")
    m.add_argument("--tag", required=True)
    m.add_argument("out", type=Path)
    m.add_argument("layouts", type=Path, nargs="+")
    a = sub.add_parser("archive", help="pack a layout as a reproducible tar")
    a.add_argument("layout", type=Path)
    a.add_argument("out", type=Path)
    c = sub.add_parser("check", help="verify a layout or archive; print its summary")
    c.add_argument("source", type=Path)
    u = sub.add_parser("push", help="push a layout or archive to REPO:TAG")
    u.add_argument("source", type=Path)
    u.add_argument("ref")
    u.add_argument("--insecure", action="append", default=[])
    u.add_argument("--digest-file", type=Path)
    args = p.parse_args()
    try:
        if args.command == "merge":
            print(merge(args.layouts, args.out, tag=args.tag))
        elif args.command == "archive":
            archive(args.layout, args.out)
        elif args.command == "check":
            with opened(args.source) as layout:
                print(json.dumps(check(layout), indent=2, sort_keys=True))
        else:
            digest = push(args.source, args.ref, insecure=tuple(args.insecure))
            if args.digest_file:
                args.digest_file.write_text(digest + "\n")
            print(f"{args.ref.rsplit(':', 1)[0]}@{digest}")
    except LayoutError as e:
        raise SystemExit(f"ocindex: {e}") from None


if __name__ == "__main__":
    main()
