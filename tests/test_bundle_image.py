"""Building plain+v0 bundle images into an OCI layout, without a registry."""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import socket
import stat
import tarfile
import tempfile
from collections.abc import Callable
from pathlib import Path

import pytest

from provisioner.bundle import build as bundle_build
from provisioner.bundle import layout as bundle_layout
from provisioner.bundle import validate as bundle_validate
from rukpak.common import errors
from rukpak.oci import mediatypes
from rukpak.oci.manifest import Index, Manifest, Platform

NAMESPACE = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: hello\n"
CONFIGMAP = (
    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: greeting\n  namespace: hello\n"
    "data:\n  message: hi\n"
)


def make_bundle(root: Path, files: dict[str, str] | None = None) -> Path:
    manifests = root / "manifests"
    manifests.mkdir(parents=True)
    for name, text in (files or {"01_namespace.yaml": NAMESPACE, "02_cm.yml": CONFIGMAP}).items():
        (manifests / name).write_text(text)
    return root


def build(
    bundle: Path,
    layout_dir: Path,
    platforms: tuple[str, ...] = (),
    overrides: tuple[str, ...] = (),
) -> bundle_build.BuildResult:
    layout = bundle_layout.OciLayout.create(layout_dir)
    sources = bundle_build.plan_sources(
        bundle,
        bundle_build.parse_platforms(platforms),
        [bundle_build.parse_platform_dir(o) for o in overrides],
    )
    return bundle_build.build(layout, sources, name="example.com/b:v1", ref_name="v1")


def blob_bytes(layout_dir: Path, digest: str) -> bytes:
    return (layout_dir / "blobs" / "sha256" / digest.removeprefix("sha256:")).read_bytes()


# -- determinism -----------------------------------------------------------------


def test_the_same_files_give_the_same_digest_whatever_their_times_and_modes(
    tmp_path: Path,
) -> None:
    first = build(make_bundle(tmp_path / "a"), tmp_path / "layout-a")
    second_bundle = make_bundle(tmp_path / "b")
    for path in (second_bundle / "manifests").iterdir():
        os.utime(path, (1_700_000_000, 1_700_000_000))
        path.chmod(0o600)
    second = build(second_bundle, tmp_path / "layout-b")
    assert first.image.digest == second.image.digest
    assert first.images[0].layer.blob.digest == second.images[0].layer.blob.digest


def test_a_changed_file_gives_a_different_digest(tmp_path: Path) -> None:
    first = build(make_bundle(tmp_path / "a"), tmp_path / "layout-a")
    changed = make_bundle(tmp_path / "b", {"01_namespace.yaml": NAMESPACE.replace("hello", "bye")})
    assert build(changed, tmp_path / "layout-b").image.digest != first.image.digest


def test_the_layer_is_a_plain_ustar_with_zero_times_and_owners(tmp_path: Path) -> None:
    result = build(make_bundle(tmp_path / "b"), tmp_path / "layout")
    compressed = blob_bytes(tmp_path / "layout", result.images[0].layer.blob.digest)
    assert compressed[4:8] == b"\0\0\0\0"  # gzip MTIME
    assert not compressed[3] & 0x08  # no FNAME in the gzip header
    raw = gzip.decompress(compressed)
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
        members = tar.getmembers()
    assert [m.name for m in members] == [
        "manifests",
        "manifests/01_namespace.yaml",
        "manifests/02_cm.yml",
    ]
    assert all(m.mtime == 0 and m.uid == 0 and m.gid == 0 and m.uname == "" for m in members)
    assert [m.mode for m in members] == [0o755, 0o644, 0o644]
    assert all(m.type in (tarfile.DIRTYPE, tarfile.REGTYPE) for m in members)  # no PAX headers
    assert raw[257:263] == b"ustar\x00"


def test_the_config_names_the_uncompressed_tar_as_its_diff_id(tmp_path: Path) -> None:
    result = build(make_bundle(tmp_path / "b"), tmp_path / "layout")
    layout = bundle_layout.OciLayout.open(tmp_path / "layout")
    manifest = layout.read_manifest(result.image)
    assert isinstance(manifest, Manifest)
    assert manifest.annotations == {"io.rukpak.bundle.format": "plain+v0"}
    assert manifest.layers[0].media_type == mediatypes.OCI_LAYER_GZIP
    assert manifest.config.media_type == mediatypes.OCI_CONFIG
    config = json.loads(layout.read_bytes(manifest.config))
    raw = gzip.decompress(blob_bytes(tmp_path / "layout", manifest.layers[0].digest))
    assert config["rootfs"] == {
        "type": "layers",
        "diff_ids": ["sha256:" + hashlib.sha256(raw).hexdigest()],
    }
    assert (config["os"], config["architecture"]) == ("linux", "amd64")


# -- platforms and the layout ----------------------------------------------------


def test_one_platform_gives_an_image_manifest_tagged_in_the_layout(tmp_path: Path) -> None:
    result = build(make_bundle(tmp_path / "b"), tmp_path / "layout", ("linux/arm64",))
    assert result.image.media_type == mediatypes.OCI_MANIFEST
    (entry,) = bundle_layout.OciLayout.open(tmp_path / "layout").index()
    assert entry.digest == result.image.digest
    assert entry.annotations[bundle_layout.REF_NAME] == "v1"
    assert entry.annotations[bundle_layout.IMAGE_NAME] == "example.com/b:v1"


def test_several_platforms_give_an_index_sharing_one_layer(tmp_path: Path) -> None:
    result = build(make_bundle(tmp_path / "b"), tmp_path / "layout", ("linux/amd64,linux/arm64",))
    layout = bundle_layout.OciLayout.open(tmp_path / "layout")
    index = layout.read_manifest(result.image)
    assert isinstance(index, Index)
    assert [str(m.platform) for m in index.manifests] == ["linux/amd64", "linux/arm64/v8"]
    assert len({i.layer.blob.digest for i in result.images}) == 1
    assert len({i.manifest.digest for i in result.images}) == 2


def test_a_platform_dir_gives_that_platform_its_own_files(tmp_path: Path) -> None:
    arm = make_bundle(tmp_path / "arm", {"only-arm.yaml": CONFIGMAP})
    result = build(
        make_bundle(tmp_path / "b"),
        tmp_path / "layout",
        ("linux/amd64",),
        (f"linux/arm64={arm}",),
    )
    by_platform = {str(i.platform): i for i in result.images}
    assert [f.name for f in by_platform["linux/arm64/v8"].layer.files] == ["only-arm.yaml"]
    assert len(by_platform["linux/amd64"].layer.files) == 2


def test_rebuilding_into_a_layout_replaces_the_entry_of_the_same_tag(tmp_path: Path) -> None:
    build(make_bundle(tmp_path / "a"), tmp_path / "layout")
    second = build(make_bundle(tmp_path / "b", {"x.yaml": CONFIGMAP}), tmp_path / "layout")
    entries = bundle_layout.OciLayout.open(tmp_path / "layout").index()
    assert [e.digest for e in entries] == [second.image.digest]


def test_a_non_empty_directory_that_is_not_a_layout_is_not_written_into(tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "precious.txt").write_text("keep me")
    with pytest.raises(errors.InvalidArgument, match="without an oci-layout file"):
        bundle_layout.OciLayout.create(tmp_path / "out")


def test_opening_a_directory_that_is_not_a_layout_says_how_to_make_one(tmp_path: Path) -> None:
    with pytest.raises(errors.InvalidArgument, match="rukpak bundle build"):
        bundle_layout.OciLayout.open(tmp_path)


def test_a_corrupt_blob_in_a_layout_is_data_loss(tmp_path: Path) -> None:
    result = build(make_bundle(tmp_path / "b"), tmp_path / "layout")
    path = tmp_path / "layout" / "blobs" / "sha256" / result.image.digest.removeprefix("sha256:")
    path.chmod(0o644)
    path.write_bytes(path.read_bytes().replace(b"plain", b"PLAIN"))
    with pytest.raises(errors.DataLoss):
        bundle_layout.OciLayout.open(tmp_path / "layout").read_manifest(result.image)


@pytest.mark.parametrize(
    ("platforms", "overrides", "message"),
    [
        (("linux",), (), "os/architecture"),
        (("linux/amd64,",), (), "empty entry"),
        ((), ("linux/arm64",), "os/arch=DIR"),
        ((), ("linux/arm64=a", "linux/arm64=b"), "twice"),
    ],
)
def test_bad_platform_arguments_are_refused(
    platforms: tuple[str, ...], overrides: tuple[str, ...], message: str
) -> None:
    with pytest.raises(errors.InvalidArgument, match=message):
        bundle_build.plan_sources(
            Path("."),
            bundle_build.parse_platforms(platforms),
            [bundle_build.parse_platform_dir(o) for o in overrides],
        )


def test_no_platform_means_linux_amd64() -> None:
    assert bundle_build.plan_sources(Path("."), [], []) == [(Platform("linux", "amd64"), Path("."))]


# -- bundles that are refused ----------------------------------------------------


def refused(root: Path) -> str:
    with pytest.raises(errors.InvalidArgument) as caught:
        bundle_validate.validate_bundle(root)
    return caught.value.message


def test_a_bundle_without_manifests_dir_is_refused(tmp_path: Path) -> None:
    assert "has no manifests/ directory" in refused(tmp_path)


def test_a_missing_bundle_directory_is_refused(tmp_path: Path) -> None:
    assert "does not exist" in refused(tmp_path / "nope")


def test_an_empty_manifests_dir_is_refused(tmp_path: Path) -> None:
    (tmp_path / "manifests").mkdir()
    assert "is empty" in refused(tmp_path)


def test_a_subdirectory_in_manifests_is_refused(tmp_path: Path) -> None:
    make_bundle(tmp_path)
    (tmp_path / "manifests" / "nested").mkdir()
    message = refused(tmp_path)
    assert "nested is a directory" in message and "must be flat" in message


def test_a_symlink_in_manifests_is_refused(tmp_path: Path) -> None:
    make_bundle(tmp_path)
    (tmp_path / "outside.yaml").write_text(NAMESPACE)
    (tmp_path / "manifests" / "link.yaml").symlink_to(tmp_path / "outside.yaml")
    assert "link.yaml is a symlink" in refused(tmp_path)


def test_a_symlinked_manifests_dir_is_refused(tmp_path: Path) -> None:
    make_bundle(tmp_path / "real")
    (tmp_path / "b").mkdir()
    (tmp_path / "b" / "manifests").symlink_to(tmp_path / "real" / "manifests")
    assert "must be a directory" in refused(tmp_path / "b")


def test_a_file_that_is_not_yaml_or_json_is_refused(tmp_path: Path) -> None:
    make_bundle(tmp_path, {"ns.yaml": NAMESPACE, "README.md": "# hi"})
    assert "README.md: only .yaml, .yml, .json" in refused(tmp_path)


def test_invalid_yaml_names_the_file_and_the_document(tmp_path: Path) -> None:
    make_bundle(tmp_path, {"ns.yaml": NAMESPACE + "---\n" + CONFIGMAP + "---\nkind: [unclosed\n"})
    message = refused(tmp_path)
    assert "manifests/ns.yaml document 3 (line " in message and "invalid YAML" in message


def test_invalid_json_names_the_file(tmp_path: Path) -> None:
    make_bundle(tmp_path, {"cm.json": '{"apiVersion": "v1", "kind":'})
    assert "manifests/cm.json document 1 (line 1): invalid JSON" in refused(tmp_path)


def test_a_document_that_is_not_an_object_is_refused(tmp_path: Path) -> None:
    make_bundle(tmp_path, {"ns.yaml": NAMESPACE + "---\n- just\n- a list\n"})
    message = refused(tmp_path)
    assert 'unable to decode "manifests/ns.yaml": json: cannot unmarshal array' in message
    assert "(document 2, line 6: expected an object)" in message


def test_a_document_without_kind_is_refused(tmp_path: Path) -> None:
    make_bundle(tmp_path, {"ns.yaml": "apiVersion: v1\nmetadata: {name: x}\n"})
    assert "document 1 (line 1): kind is missing" in refused(tmp_path)


def test_the_deploy_time_rules_apply_at_build_time(tmp_path: Path) -> None:
    make_bundle(tmp_path, {"a.yaml": CONFIGMAP, "b.yaml": CONFIGMAP})
    assert "defined twice" in refused(tmp_path)


def test_dotfiles_are_left_out_of_the_image(tmp_path: Path) -> None:
    make_bundle(tmp_path, {"ns.yaml": NAMESPACE, ".gitkeep": "", ".notes.txt": "x"})
    assert [f.name for f in bundle_validate.validate_bundle(tmp_path)] == ["ns.yaml"]


def test_a_bundle_of_only_empty_files_is_refused(tmp_path: Path) -> None:
    make_bundle(tmp_path, {"empty.yaml": "---\n"})
    assert "found zero objects: plain+v0 bundles are required to contain" in refused(tmp_path)


def test_empty_documents_between_objects_are_skipped(tmp_path: Path) -> None:
    make_bundle(tmp_path, {"ns.yaml": "---\n" + NAMESPACE + "---\n---\n" + CONFIGMAP})
    (only,) = bundle_validate.validate_bundle(tmp_path)
    assert only.objects == 2


def layer_members(layout_dir: Path, result: bundle_build.BuildResult) -> dict[str, tarfile.TarInfo]:
    raw = gzip.decompress(blob_bytes(layout_dir, result.images[0].layer.blob.digest))
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
        return {m.name: m for m in tar.getmembers()}


def layer_file(layout_dir: Path, result: bundle_build.BuildResult, name: str) -> bytes:
    raw = gzip.decompress(blob_bytes(layout_dir, result.images[0].layer.blob.digest))
    with tarfile.open(fileobj=io.BytesIO(raw), mode="r:") as tar:
        handle = tar.extractfile(name)
        assert handle is not None
        return handle.read()


ANNOTATIONS = "annotations:\n  operators.operatorframework.io.bundle.mediatype.v1: registry+v1\n"


def test_the_other_top_level_directories_and_files_are_packed_beside_manifests(
    tmp_path: Path,
) -> None:
    bundle = make_bundle(tmp_path / "b")
    (bundle / "metadata").mkdir()
    (bundle / "metadata" / "annotations.yaml").write_text(ANNOTATIONS)
    (bundle / "tests" / "scorecard").mkdir(parents=True)
    (bundle / "tests" / "scorecard" / "run.sh").write_text("#!/bin/sh\n")
    (bundle / "tests" / "scorecard" / "run.sh").chmod(0o755)
    (bundle / "tests" / "empty").mkdir()
    (bundle / "README.md").write_text("# hello\n")
    (bundle / "metadata" / "same.yaml").symlink_to("annotations.yaml")
    result = build(bundle, tmp_path / "layout")

    members = layer_members(tmp_path / "layout", result)
    assert list(members) == [
        "manifests",
        "manifests/01_namespace.yaml",
        "manifests/02_cm.yml",
        "README.md",
        "metadata",
        "metadata/annotations.yaml",
        "metadata/same.yaml",
        "tests",
        "tests/empty",
        "tests/scorecard",
        "tests/scorecard/run.sh",
    ]
    assert layer_file(tmp_path / "layout", result, "metadata/annotations.yaml") == (
        ANNOTATIONS.encode()
    )
    assert members["metadata/same.yaml"].issym()
    assert members["metadata/same.yaml"].linkname == "annotations.yaml"
    assert members["tests/scorecard/run.sh"].mode == 0o755
    assert members["README.md"].mode == 0o644
    assert members["tests/empty"].isdir()
    # the manifests are still what the format loader counts
    assert [f.name for f in result.images[0].layer.files] == ["01_namespace.yaml", "02_cm.yml"]


def test_a_bundle_with_only_manifests_builds_the_same_image_as_before(tmp_path: Path) -> None:
    # nothing beside manifests/: the layer holds exactly manifests/ (digests stay stable)
    result = build(make_bundle(tmp_path / "b"), tmp_path / "layout")
    assert list(layer_members(tmp_path / "layout", result)) == [
        "manifests",
        "manifests/01_namespace.yaml",
        "manifests/02_cm.yml",
    ]
    assert result.images[0].layer.extras.entries == ()


def test_hidden_entries_beside_manifests_are_left_out_and_reported(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "b")
    (bundle / ".git").mkdir()
    (bundle / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (bundle / "metadata").mkdir()
    (bundle / "metadata" / ".keep").write_text("")
    result = build(bundle, tmp_path / "layout")
    assert "metadata/.keep" not in layer_members(tmp_path / "layout", result)
    assert result.images[0].layer.extras.left_out == (".git", "metadata/.keep")


def hostile(kind: str, root: Path) -> Path:
    """Put something a bundle image cannot carry at ``root/metadata/x``; its path."""
    metadata = root / "metadata"
    metadata.mkdir()
    target = metadata / "x"
    if kind == "socket":
        with socket.socket(socket.AF_UNIX) as sock:
            sock.bind(str(target))
    elif kind == "fifo":
        os.mkfifo(target)
    elif kind == "absolute symlink":
        target.symlink_to("/etc/passwd")
    elif kind == "symlink outside":
        target.symlink_to("../../elsewhere/secret.yaml")
    elif kind == "device":
        try:
            os.mknod(target, 0o600 | stat.S_IFCHR, os.makedev(1, 3))
        except PermissionError:
            pytest.skip("creating a device node needs CAP_MKNOD")
    return target


@pytest.mark.parametrize(
    ("kind", "says"),
    [
        ("socket", "is a socket"),
        ("fifo", "is a FIFO (named pipe)"),
        ("device", "is a character device"),
        ("absolute symlink", "is a symlink to the absolute path /etc/passwd"),
        ("symlink outside", "is a symlink to ../../elsewhere/secret.yaml, outside the bundle"),
    ],
)
def test_what_a_bundle_image_cannot_carry_is_refused_naming_the_path(
    tmp_path: Path, kind: str, says: str
) -> None:
    bundle = make_bundle(tmp_path / "b")
    path = hostile(kind, bundle)
    with pytest.raises(errors.InvalidArgument) as caught:
        build(bundle, tmp_path / "layout")
    assert f"{path} {says}" in caught.value.message
    # refused before anything was packed: the layout names no image
    assert bundle_layout.OciLayout.open(tmp_path / "layout").index() == []


def _as_nobody(call: Callable[[], object]) -> str:
    """Run ``call`` in a forked child that dropped to uid/gid 65534; what it raised, or ""."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        os.close(read_end)
        said = ""
        try:
            os.setgroups([])
            os.setgid(65534)
            os.setuid(65534)
            call()
        except errors.RukpakError as err:
            said = f"{type(err).__name__}: {err.message}"
        except BaseException as err:
            said = f"unexpected {err!r}"
        os.write(write_end, said.encode() or b"-")
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as pipe:
        said = pipe.read().decode()
    os.waitpid(pid, 0)
    return "" if said == "-" else said


def test_an_unreadable_file_beside_manifests_is_refused() -> None:
    # Root reads every file, so the build runs as an unprivileged user (nobody), as a
    # user's `rukpak bundle build` would, over a tree that user may traverse.
    work = Path(tempfile.mkdtemp(prefix="rk-unreadable-", dir="/tmp"))
    try:
        work.chmod(0o777)
        bundle = make_bundle(work / "b")
        (bundle / "metadata").mkdir()
        secret = bundle / "metadata" / "secret.yaml"
        secret.write_text("x: 1\n")
        secret.chmod(0)
        for path in [bundle, *bundle.rglob("*")]:
            if path.is_dir():
                path.chmod(0o755)
        said = _as_nobody(lambda: build(bundle, work / "layout"))
        assert said.startswith("InvalidArgument: "), said
        assert "secret.yaml cannot be read" in said
    finally:
        shutil.rmtree(work, ignore_errors=True)


def test_a_name_that_is_not_utf8_beside_manifests_is_refused(tmp_path: Path) -> None:
    bundle = make_bundle(tmp_path / "b")
    (bundle / "metadata").mkdir()
    try:
        (bundle / "metadata" / os.fsdecode(b"bad\xff.yaml")).write_text("x: 1\n")
    except (OSError, UnicodeEncodeError):
        pytest.skip("this filesystem refuses non-UTF-8 names")
    with pytest.raises(errors.InvalidArgument, match="file name is not valid UTF-8"):
        build(bundle, tmp_path / "layout")


def test_a_file_name_too_long_for_a_plain_tar_is_refused(tmp_path: Path) -> None:
    make_bundle(tmp_path, {"x" * 120 + ".yaml": NAMESPACE})
    with pytest.raises(errors.InvalidArgument, match="shorten its name"):
        build(tmp_path, tmp_path.parent / "layout")
