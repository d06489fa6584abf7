"""eStargz layers: written by ``rukpak bundle build --estargz``, read by the reference
implementation and by ordinary tar.gz readers, and fetched lazily by the FUSE image cache.

The reference reader is ``github.com/containerd/stargz-snapshotter/estargz``, built from
the Go module proxy by ``tests/estargz/build.sh`` (cached); it verifies the TOC digest
and every chunk, and reports each entry with the sha256 of the content it returns.
"""

from __future__ import annotations

import contextlib
import gzip
import hashlib
import io
import json
import shutil
import subprocess
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from csi.fuse import index, lazy
from csi.fuse.images import FuseImages, Ready
from provisioner.bundle import estargz
from provisioner.cli import main as cli
from rukpak.common import errors
from rukpak.image.seams import Puller, PullPolicy
from rukpak.oci import mediatypes
from rukpak.oci.auth import Credentials
from rukpak.oci.client import RegistryClient
from rukpak.oci.manifest import Manifest, Platform
from rukpak.oci.reference import Reference
from tests.registry import RegistryServer

HERE = Path(__file__).parent
CONFIGMAP = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: c{n}\ndata:\n  k: '{body}'\n"
BIG = 9 * 1024 * 1024 + 123  # three 4 MiB chunks


def _bundle(root: Path, *, files: int = 20) -> dict[str, bytes]:
    """A bundle directory; returns path → content of every file in the image."""
    (root / "manifests").mkdir(parents=True)
    contents: dict[str, bytes] = {}
    for n in range(files):
        body = "x" * (BIG if n == 0 else n * 100)
        text = CONFIGMAP.format(n=n, body=body).encode()
        (root / "manifests" / f"{n:02}.yaml").write_bytes(text)
        contents[f"manifests/{n:02}.yaml"] = text
    return contents


def _build(tmp_path: Path, ref: str, *push: str) -> tuple[Path, dict[str, bytes]]:
    contents = _bundle(tmp_path / "bundle")
    layout = tmp_path / "layout"
    argv = ["bundle", "build", str(tmp_path / "bundle"), "--tag", ref, "-o", str(layout)]
    assert cli.main([*argv, "--estargz", *push]) == 0
    return layout, contents


def _layer(layout: Path) -> tuple[Path, dict[str, object]]:
    index_doc = json.loads((layout / "index.json").read_text())
    manifest_digest = index_doc["manifests"][0]["digest"]
    manifest = json.loads((layout / "blobs/sha256" / manifest_digest[7:]).read_text())
    (layer,) = manifest["layers"]
    return layout / "blobs/sha256" / layer["digest"][7:], layer


@pytest.fixture(scope="session")
def estargz_check() -> Path:
    if shutil.which("go") is None:
        pytest.fail(
            "no `go` on PATH: the eStargz reference reader is built from its Go module "
            "(make test needs Go for the Kubernetes binaries too)"
        )
    out = subprocess.run(
        [str(HERE / "estargz" / "build.sh")], capture_output=True, text=True, check=True
    )
    return Path(out.stdout.strip())


@pytest.mark.slow
def test_the_reference_implementation_reads_our_layers(tmp_path: Path, estargz_check: Path) -> None:
    layout, contents = _build(tmp_path, "example.com/estargz/ref:v1")
    blob, layer = _layer(layout)
    annotations = layer["annotations"]
    assert isinstance(annotations, dict)
    toc_digest = annotations[estargz.TOC_DIGEST_ANNOTATION]
    out = subprocess.run(
        [str(estargz_check), str(blob), toc_digest], capture_output=True, text=True, check=False
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout)
    assert seen["tocDigest"] == toc_digest
    files = {k: v for k, v in seen["entries"].items() if v["type"] == "reg"}
    assert set(files) == set(contents)
    for name, text in contents.items():
        assert files[name]["sha256"] == "sha256:" + hashlib.sha256(text).hexdigest()
        assert files[name]["digest"] == files[name]["sha256"]
        assert files[name]["size"] == len(text)


def test_an_estargz_layer_is_an_ordinary_tar_gz(tmp_path: Path) -> None:
    layout, contents = _build(tmp_path, "example.com/estargz/plain:v1")
    blob, layer = _layer(layout)
    with tarfile.open(blob, "r:gz") as tar:
        names = tar.getnames()
        for name, text in contents.items():
            handle = tar.extractfile(name)
            assert handle is not None and handle.read() == text
    assert names[-1] == estargz.TOC_NAME
    annotations = layer["annotations"]
    assert isinstance(annotations, dict)
    plain = gzip.decompress(blob.read_bytes())
    assert annotations[estargz.UNCOMPRESSED_SIZE_ANNOTATION] == str(len(plain))
    # Deterministic: the same directory builds the same layer.
    again, _ = _build(tmp_path / "again", "example.com/estargz/plain:v1")
    assert _layer(again)[0].read_bytes() == blob.read_bytes()


@pytest.mark.registry
def test_a_lazy_tree_is_indexed_from_the_toc_and_files_arrive_on_first_read(
    tmp_path: Path, registry: RegistryServer
) -> None:
    ref = f"{registry.host}/estargz/lazy:v1"
    _layout, contents = _build(tmp_path, ref, "--push")

    images, ready = _ensure_lazily(tmp_path, ref)
    tree = images.load(ready.name)
    assert not _stored(images, tree)  # nothing but the TOC was fetched
    row_id = tree.lookup("manifests/00.yaml")
    assert row_id is not None
    row = tree.rows[row_id]
    assert row.kind == index.FILE and row.size == len(contents["manifests/00.yaml"])
    images.lazy.fetch(ready.name, row)
    assert images.files.path(row.digest).read_bytes() == contents["manifests/00.yaml"]
    assert _stored(images, tree) == {row.digest}

    # Completing saves the index again with directory listings (the same rows, so the
    # same inode numbers), then streams the whole layer (digest-checked) and stores
    # every file.
    def version() -> int:
        return int(json.loads(images.index_path(ready.name).read_bytes())["version"])

    assert version() == index.INLINE_VERSION  # one file on the publish path
    images._complete(ready.name)
    assert version() == index.FORMAT_VERSION and images.load(ready.name).rows == tree.rows
    assert ready.name not in images.lazy.broken
    stored = {images.files.path(r.digest).read_bytes() for r in tree.files()}
    assert stored == set(contents.values())


@pytest.mark.registry
def test_a_file_whose_bytes_do_not_match_the_toc_is_refused(
    tmp_path: Path, registry: RegistryServer
) -> None:
    ref = f"{registry.host}/estargz/tampered:v1"
    _build(tmp_path, ref, "--push")

    images, ready = _ensure_lazily(tmp_path, ref)
    tree = images.load(ready.name)
    row_id = tree.lookup("manifests/01.yaml")
    assert row_id is not None
    row = tree.rows[row_id]
    # A TOC that names other content than the layer holds: the fetched bytes are refused.
    plan = images.lazy._plan(ready.name)
    plan["files"]["sha256:" + "0" * 64] = plan["files"][row.digest]
    fake = index.Row(row.parent, row.name, row.kind, row.mode, row.size, "sha256:" + "0" * 64,
                     row.target, row.mtime)  # fmt: skip
    with pytest.raises(errors.DataLoss, match="hashes to"):
        images.lazy.fetch(ready.name, fake)
    assert not _stored(images, tree) and not images.files.has(fake.digest)


def _stored(images: FuseImages, tree: index.Index) -> set[str]:
    """The digests of the tree's files the store holds (beside the tree's listings)."""
    return {row.digest for row in tree.files() if images.files.has(row.digest)}


@contextlib.contextmanager
def _no_background(images: FuseImages) -> Iterator[None]:
    """Keep the background completion from running, so the test sees the lazy state."""
    original = images.lazy.complete
    images.lazy.complete = lambda tree: None  # type: ignore[method-assign]
    try:
        yield
    finally:
        images.lazy.complete = original  # type: ignore[method-assign]


def _ensure_lazily(tmp_path: Path, ref: str) -> tuple[FuseImages, Ready]:
    """Pull ``ref`` into a fresh FUSE store, its background completion held back."""

    def factory(credentials: Credentials | None) -> Puller:
        return RegistryClient(credentials=credentials)

    images = FuseImages(tmp_path / "fuse", puller_factory=factory)
    with _no_background(images):
        ready = images.ensure(ref, platform=Platform.parse("linux/amd64"),
                              pull_policy=PullPolicy.IF_NOT_PRESENT)  # fmt: skip
    return images, ready


def test_the_reader_parses_the_writers_footer() -> None:
    assert lazy.parse_footer(estargz.footer(12345)) == 12345
    with pytest.raises(errors.InvalidArgument):
        lazy.parse_footer(b"\x1f\x8b" + b"\0" * 49)


@pytest.mark.registry
def test_a_hostile_toc_gets_the_same_rules_as_bind_mode(
    tmp_path: Path, registry: RegistryServer
) -> None:
    plain = io.BytesIO()
    with tarfile.open(fileobj=plain, mode="w", format=tarfile.USTAR_FORMAT) as tar:
        for name, kind, link in [
            ("../escape", tarfile.REGTYPE, ""),
            ("ok.yaml", tarfile.REGTYPE, ""),
            ("up", tarfile.SYMTYPE, "../../etc/passwd"),
            ("dev", tarfile.CHRTYPE, ""),
        ]:
            info = tarfile.TarInfo(name)
            info.type, info.linkname, info.mode = kind, link, 0o4755
            data = b"data" if kind == tarfile.REGTYPE else b""
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data) if data else None)
    plain.seek(0)
    layer = io.BytesIO()
    written = estargz.convert(plain, layer)
    ref = Reference.parse(f"{registry.host}/estargz/hostile:v1")
    with RegistryClient() as client:
        config = client.push_blob(ref, b"{}", media_type=mediatypes.OCI_CONFIG)
        desc = client.push_blob(ref, layer.getvalue(), media_type=mediatypes.OCI_LAYER_GZIP)
        desc.annotations = written.annotations()
        manifest = Manifest(mediatypes.OCI_MANIFEST, config, [desc])
        client.push_manifest(ref, manifest.to_json(), mediatypes.OCI_MANIFEST)

    images, ready = _ensure_lazily(tmp_path, str(ref))
    tree = images.load(ready.name)
    assert sorted(tree.children[0]) == ["ok.yaml"]
    ok = tree.rows[tree.children[0]["ok.yaml"]]
    assert ok.mode == 0o555  # setuid dropped, executable kept


def _no_puller(_credentials: Credentials | None) -> Puller:
    raise AssertionError("no pull expected")


def test_after_a_reboot_torn_lazy_indexes_go_and_whole_ones_stay(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from rukpak.store import commit as cachesync

    monkeypatch.setattr(cachesync, "boot_id", lambda: "boot-1")
    images = FuseImages(tmp_path, puller_factory=_no_puller)
    names = ("a" * 64, "b" * 64, "c" * 64, "d" * 64, "e" * 64)
    whole, torn_index, torn_plan, orphan, torn_listing = names
    for n, name in enumerate((whole, torn_index, torn_plan, torn_listing)):
        builder = index.Builder(image="img")
        builder.add_dir((f"dir-{n}",), mtime=0)  # a listing of its own (the root's too)
        index.save(
            images.index_path(name), f"sha256:{name}", builder.finish(), files=images.files,
            extra={"lazy": True}, durable=False,
        )  # fmt: skip
        images.lazy.plan_path(name).write_text(json.dumps({"files": {}}))
    images.index_path(torn_index).write_bytes(b"")  # what a power loss leaves
    images.lazy.plan_path(torn_plan).write_bytes(b'{"files": {"sha')
    images.lazy.plan_path(orphan).write_text("{}")
    listing = index.named_files(json.loads(images.index_path(torn_listing).read_bytes()),
                                images.files, set())  # fmt: skip
    images.files.delete(next(listing))  # its root listing, never synced: lost with the power

    FuseImages(tmp_path, puller_factory=_no_puller)  # the same boot: a plugin restart
    assert images.index_path(torn_index).exists()  # the page cache still holds it

    monkeypatch.setattr(cachesync, "boot_id", lambda: "boot-2")
    FuseImages(tmp_path, puller_factory=_no_puller)
    assert sorted(p.stem for p in images.trees_dir.glob("*.json")) == [whole]
    assert sorted(p.stem for p in images.lazy.lazy_dir.glob("*.json")) == [whole]
    assert (tmp_path / "boot_id").read_text() == "boot-2"
