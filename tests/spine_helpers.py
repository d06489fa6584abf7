"""Helpers for the spine tests: one node per publish mode, fed the same content.

The spine (resolve, authorize, fetch, verify, unpack within budgets, commit) is the
same for every source and both publish modes (``docs/architecture.md``); only the
presentation differs. :class:`Node` publishes through each mode's real entry point
and reads back what a pod would see, as one listing (path → ``file:<content>`` /
``dir`` / ``-> target``), so a test states its expectation once for both modes:

- images, ``bind``: ``rukpak.image.cache.ImageCache`` (the committed tree on disk);
- images, ``fuse``: ``csi.fuse.images.FuseImages`` (the saved index and the file
  store, lazily fetched files fetched as the filesystem would);
- git and http: the publish core (``csi.node.publish.Publisher``) with the volume's
  ``publishMode`` set; both modes present these as a bind of the source cache's tree
  (``Publisher._publish_fetched``), so a FUSE publisher is wired in and must stay
  unused. ConfigMap sources never reach the node plugin (the unpack pod mounts them
  as a projected volume), so they have no mode here.

Also: a git repository written with ``git fast-import`` (paths no work tree can hold)
and eStargz images pushed to the test registry.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import tarfile
from pathlib import Path

from csi import mounter
from csi.fuse import index
from csi.fuse.images import FuseImages
from csi.fuse.publisher import FusePublisher
from csi.node.publish import Publisher
from csi.volume.request import PublishRequest
from provisioner.bundle import estargz
from rukpak.image import grants
from rukpak.image.cache import ImageCache
from rukpak.image.members import Limits
from rukpak.image.seams import Puller, PullPolicy
from rukpak.image.settings import CacheSettings
from rukpak.oci import mediatypes
from rukpak.oci.auth import Credentials
from rukpak.oci.client import RegistryClient
from rukpak.oci.manifest import Manifest, Platform
from rukpak.oci.reference import Reference
from rukpak.sources.volume import VolumeSource
from tests.csi_helpers import Entry, PushedImage, tar_bytes, tree
from tests.source_servers import git

MODES = ("bind", "fuse")
PLATFORM = Platform.parse("linux/amd64")


def registry_client(credentials: Credentials | None) -> Puller:
    return RegistryClient(credentials=credentials, timeout=10)


def no_network(credentials: Credentials | None) -> Puller:
    raise AssertionError("this path must not reach a registry")


class RecordingMounter:
    """Records binds instead of mounting (the source is the tree a pod would see)."""

    def __init__(self) -> None:
        self.bound: list[tuple[Path, Path]] = []

    def mounts(self) -> list[mounter.MountInfo]:
        return []

    def bind_read_only(self, source: Path, target: Path) -> None:
        self.bound.append((source, target))

    def unmount(self, target: Path) -> None:
        return None


class _NoMount:
    def tree_dir(self, name: str) -> Path:
        raise AssertionError("git and http volumes are never served from the FUSE mount")

    def tree_index(self, name: str) -> None:
        return None  # nothing fetched here: no overlay to present


class Node:
    """One node's caches in one publish mode."""

    def __init__(
        self,
        mode: str,
        root: Path,
        *,
        limits: Limits | None = None,
        auth_ttl: float = grants.DEFAULT_TTL,
    ) -> None:
        assert mode in MODES
        self.mode = mode
        self.root = root
        self.limits = limits or Limits()
        settings = CacheSettings(limits=self.limits, auth_ttl=auth_ttl)
        self.images = ImageCache(root / "images", puller_factory=registry_client, settings=settings)
        self.fuse = FuseImages(root / "fuse", puller_factory=registry_client, settings=settings)
        self.mounter = RecordingMounter()
        unused_fuse = FuseImages(root / "unused-fuse", puller_factory=no_network)
        self.publisher = Publisher(
            images=self.images,
            mounter=self.mounter,
            kubelet_dir=root / "kubelet",
            platform=PLATFORM,
            fuse=FusePublisher(unused_fuse, _NoMount(), root / "publishes.json"),
            default_mode=mode,
        )
        (root / "kubelet").mkdir(parents=True, exist_ok=True)
        self._volumes = 0

    def publish_image(
        self,
        ref: str,
        *,
        credentials: Credentials | None = None,
        policy: PullPolicy = PullPolicy.IF_NOT_PRESENT,
    ) -> dict[str, str]:
        """The tree of image ``ref`` as this mode's cache serves it."""
        if self.mode == "bind":
            unpacked = self.images.ensure(
                ref, platform=PLATFORM, pull_policy=policy, credentials=credentials
            )
            return tree(unpacked.path)
        ready = self.fuse.ensure(
            ref, platform=PLATFORM, pull_policy=policy, credentials=credentials
        )
        return fuse_listing(self.fuse, ready.name)

    def publish_source(self, attributes: dict[str, str]) -> dict[str, str]:
        """The tree of a git or http volume, published by the publish core in this mode."""
        self._volumes += 1
        target = self.root / "kubelet" / "pods" / f"p{self._volumes}" / "volumes" / "v"
        target.parent.mkdir(parents=True)
        source = VolumeSource.from_attributes({**attributes, "publishMode": self.mode})
        self.publisher.publish(PublishRequest(f"vol-{self._volumes}", str(target), source))
        bound, at = self.mounter.bound[-1]
        assert at == target
        return tree(bound)


def fuse_listing(images: FuseImages, name: str) -> dict[str, str]:
    """What the FUSE filesystem serves for tree ``name``, as :func:`tests.csi_helpers.tree`."""
    idx = images.load(name)
    paths: dict[int, str] = {0: ""}
    out: dict[str, str] = {}
    for row_id, row in enumerate(idx.rows):
        if not row_id:
            continue
        path = f"{paths[row.parent]}/{row.name}".lstrip("/")
        paths[row_id] = path
        if row.kind == index.DIR:
            out[path] = "dir"
        elif row.kind == index.LINK:
            out[path] = f"-> {row.target}"
        else:
            if not images.files.has(row.digest):
                images.lazy.fetch(name, row)  # as the filesystem does on first read
            data = images.files.path(row.digest).read_bytes()
            out[path] = "file:" + data.decode(errors="replace")
    return dict(sorted(out.items()))


# --- content ------------------------------------------------------------------------


def fast_import_repo(path: Path, files: dict[str, str]) -> str:
    """A repository whose one commit holds ``files`` (``symlink:`` values are links),
    written with ``git fast-import`` so paths no work tree could hold are possible;
    returns the commit."""
    path.mkdir(parents=True)
    git(path, "init", "-q", "-b", "main")
    git(path, "config", "uploadpack.allowAnySHA1InWant", "true")
    commands = ["commit refs/heads/main", "committer t <t@example.com> 0 +0000", "data 1", "m"]
    for name, content in files.items():
        mode = "100644"
        if content.startswith("symlink:"):
            mode, content = "120000", content[len("symlink:") :]
        data = content.encode()
        commands += [f"M {mode} inline {name}", f"data {len(data)}", content]
    stream = ("\n".join(commands) + "\n").encode()
    subprocess.run(
        ["git", "-C", str(path), "fast-import", "--quiet"], input=stream, check=True, timeout=60
    )
    return git(path, "rev-parse", "main")


def push_estargz(
    host: str,
    repo: str,
    entries: list[Entry],
    *,
    tag: str = "v1",
    credentials: Credentials | None = None,
) -> PushedImage:
    """Push a one-layer eStargz image (lazily fetched in FUSE mode) holding ``entries``."""
    layer = io.BytesIO()
    written = estargz.convert(io.BytesIO(tar_bytes(entries)), layer)
    return push_layer(
        host, repo, layer.getvalue(), written.annotations(), tag=tag, credentials=credentials
    )


def push_layer(
    host: str,
    repo: str,
    layer: bytes,
    annotations: dict[str, str],
    *,
    tag: str = "v1",
    credentials: Credentials | None = None,
) -> PushedImage:
    """Push an image of one gzip layer with ``annotations`` on its descriptor."""
    ref = Reference.parse(f"{host}/{repo}:{tag}")
    with RegistryClient(credentials=credentials) as client:
        config = client.push_blob(ref, b"{}", media_type=mediatypes.OCI_CONFIG)
        desc = client.push_blob(ref, layer, media_type=mediatypes.OCI_LAYER_GZIP)
        desc.annotations = dict(annotations)
        manifest = Manifest(mediatypes.OCI_MANIFEST, config, [desc])
        digest = client.push_manifest(ref, manifest.to_json(), mediatypes.OCI_MANIFEST)
    return PushedImage(str(ref), digest, [config.digest, desc.digest])


def toc_member(toc: bytes) -> bytes:
    """An eStargz TOC member: a gzip member of a tar holding ``stargz.index.json``."""
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        info = tarfile.TarInfo(estargz.TOC_NAME)
        info.size = len(toc)
        tar.addfile(info, io.BytesIO(toc))
    return gzip.compress(plain.getvalue(), mtime=0)


def push_estargz_dirs(host: str, repo: str, names: list[str]) -> PushedImage:
    """Push an eStargz image of directories ``names``, written by hand: names the
    writer (``provisioner.bundle.estargz``) cannot hold in its TOC member's ustar."""
    headers = b""
    for name in names:
        info = tarfile.TarInfo(name)
        info.type, info.mode = tarfile.DIRTYPE, 0o755
        headers += info.tobuf(tarfile.PAX_FORMAT, "utf-8", "surrogateescape")
    members = gzip.compress(headers, mtime=0)
    doc = {"version": 1, "entries": [{"name": n, "type": "dir", "mode": 0o755} for n in names]}
    toc = json.dumps(doc).encode()
    layer = members + toc_member(toc) + estargz.footer(len(members))
    annotations = {estargz.TOC_DIGEST_ANNOTATION: f"sha256:{hashlib.sha256(toc).hexdigest()}"}
    return push_layer(host, repo, layer, annotations)
