"""``rukpak bundle build|push|inspect`` against the real docker-registry."""

from __future__ import annotations

import argparse
import base64
import gzip
import io
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import zstandard

from provisioner.cli import bundle as bundle_cli
from provisioner.cli import main as cli_main
from provisioner.runtime import flags
from rukpak.common import backoff
from rukpak.oci import mediatypes
from rukpak.oci.client import RegistryClient
from rukpak.oci.manifest import Manifest
from rukpak.oci.reference import Reference
from tests.registry import RegistryServer, free_port

NAMESPACE = "apiVersion: v1\nkind: Namespace\nmetadata:\n  name: hello\n"
CONFIGMAP = (
    "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: greeting\n  namespace: hello\n"
    "data:\n  message: hi\n"
)


class Result:
    def __init__(self, code: int, out: str, err: str) -> None:
        self.code, self.out, self.err = code, out, err

    def json(self) -> Any:
        return json.loads(self.out)


@dataclass
class Rukpak:
    """Runs the CLI in-process; usage errors (SystemExit) become exit codes too."""

    capsys: pytest.CaptureFixture[str]

    def __call__(self, *argv: str | Path) -> Result:
        try:
            code = cli_main.main([str(a) for a in argv])
        except SystemExit as exc:
            code = int(exc.code or 0)
        captured = self.capsys.readouterr()
        return Result(code, captured.out, captured.err)

    def ok(self, *argv: str | Path) -> Result:
        """Run, and fail the test (showing stderr) unless the command exits 0."""
        result = self(*argv)
        assert result.code == 0, result.err
        return result

    def fails(self, *argv: str | Path) -> Result:
        """Run, and fail the test unless the command exits 1 (an error, not a usage error)."""
        result = self(*argv)
        assert result.code == 1, result.out + result.err
        return result


@pytest.fixture
def rukpak(capsys: pytest.CaptureFixture[str]) -> Rukpak:
    return Rukpak(capsys)


def make_bundle(root: Path, files: dict[str, str] | None = None) -> Path:
    (root / "manifests").mkdir(parents=True)
    for name, text in (files or {"01_ns.yaml": NAMESPACE, "02_cm.yaml": CONFIGMAP}).items():
        (root / "manifests" / name).write_text(text)
    return root


@dataclass
class RegistryCli(Rukpak):
    """The CLI for the tests against the session's registry, with the test's temp dir."""

    registry: RegistryServer
    tmp_path: Path

    def ref(self, repo_and_tag: str) -> str:
        """``<registry host>/cli/<repo_and_tag>``."""
        return f"{self.registry.host}/cli/{repo_and_tag}"

    def bundle(self, files: dict[str, str] | None = None) -> Path:
        """A bundle directory in the temp dir (see :func:`make_bundle`)."""
        return make_bundle(self.tmp_path / "b", files)


@pytest.fixture
def cli(
    capsys: pytest.CaptureFixture[str], registry: RegistryServer, tmp_path: Path
) -> RegistryCli:
    return RegistryCli(capsys, registry, tmp_path)


def file_paths(inspection: dict[str, Any]) -> list[str]:
    return [f["path"] for layer in inspection["layers"] for f in layer["files"]]


# -- build, push, inspect ------------------------------------------------------------


@pytest.mark.registry
def test_build_push_and_inspect_a_single_platform_bundle(cli: RegistryCli) -> None:
    ref = cli.ref("single:v1")
    built = cli.ok("bundle", "build", cli.bundle(), "--tag", ref, "--push")
    assert f"pushed {ref}@sha256:" in built.err
    assert "(2 blobs," in built.err  # the config and the layer; manifests are counted apart

    inspected = cli.ok("bundle", "inspect", ref, "--json")
    report = inspected.json()
    assert report["mediaType"] == mediatypes.OCI_MANIFEST
    assert report["digest"] in built.err
    assert report["platforms"] == []
    assert report["annotations"]["io.rukpak.bundle.format"] == "plain+v0"
    (layer,) = report["layers"]
    assert layer["mediaType"] == mediatypes.OCI_LAYER_GZIP
    assert file_paths(report) == ["manifests", "manifests/01_ns.yaml", "manifests/02_cm.yaml"]
    sizes = {f["path"]: f["size"] for f in layer["files"]}
    assert sizes["manifests/01_ns.yaml"] == len(NAMESPACE)


@pytest.mark.registry
def test_a_registry_v1_bundle_keeps_its_metadata_in_the_image(cli: RegistryCli) -> None:
    ref = cli.ref("with-metadata:v1")
    bundle = cli.bundle()
    (bundle / "metadata").mkdir()
    annotations = "annotations:\n  operators.operatorframework.io.bundle.package.v1: hello\n"
    (bundle / "metadata" / "annotations.yaml").write_text(annotations)
    (bundle / ".git").mkdir()
    built = cli.ok("bundle", "build", bundle, "--tag", ref, "--push")
    assert "left out hidden entries: .git" in built.err

    report = cli("bundle", "inspect", ref, "--json").json()
    assert file_paths(report) == [
        "manifests",
        "manifests/01_ns.yaml",
        "manifests/02_cm.yaml",
        "metadata",
        "metadata/annotations.yaml",
    ]
    sizes = {f["path"]: f["size"] for f in report["layers"][0]["files"]}
    assert sizes["metadata/annotations.yaml"] == len(annotations)
    text = cli("bundle", "inspect", ref)
    assert "metadata/annotations.yaml" in text.out

    local = cli("bundle", "build", bundle, "-t", ref, "-o", cli.tmp_path / "layout")
    assert local.code == 0 and "; 3 files)" in local.err, local.err


def test_a_socket_beside_manifests_is_refused_naming_it(tmp_path: Path, rukpak: Rukpak) -> None:
    bundle = make_bundle(tmp_path / "b")
    (bundle / "metadata").mkdir()
    with socket.socket(socket.AF_UNIX) as sock:
        sock.bind(str(bundle / "metadata" / "agent.sock"))
        result = rukpak.fails(
            "bundle", "build", bundle, "-t", "example.com/b:v1", "-o", tmp_path / "o"
        )
    assert f"error: {bundle / 'metadata' / 'agent.sock'} is a socket" in result.err


@pytest.mark.registry
def test_a_multi_platform_index_carries_each_platforms_own_files(cli: RegistryCli) -> None:
    ref = cli.ref("multi:v1")
    common = make_bundle(cli.tmp_path / "common")
    arm = make_bundle(cli.tmp_path / "arm", {"arm-only.yaml": CONFIGMAP})
    built = cli(
        "bundle", "build", common, "--tag", ref, "--push",
        "--platform", "linux/amd64", "--platform", "linux/s390x",
        "--platform-dir", f"linux/arm64={arm}",
    )  # fmt: skip
    assert built.code == 0, built.err

    arm_report = cli("bundle", "inspect", ref, "--platform", "linux/arm64", "--json").json()
    assert arm_report["mediaType"] == mediatypes.OCI_INDEX
    assert arm_report["platforms"] == ["linux/amd64", "linux/s390x", "linux/arm64/v8"]
    assert arm_report["platform"] == "linux/arm64/v8"
    assert file_paths(arm_report) == ["manifests", "manifests/arm-only.yaml"]

    amd_report = cli("bundle", "inspect", ref, "--platform", "linux/amd64", "--json").json()
    assert amd_report["digest"] == arm_report["digest"]
    assert file_paths(amd_report) == ["manifests", "manifests/01_ns.yaml", "manifests/02_cm.yaml"]

    text = cli.ok("bundle", "inspect", ref, "--platform", "linux/arm64")
    assert "Platforms:  linux/amd64, linux/s390x, linux/arm64/v8" in text.out
    assert "manifests/arm-only.yaml" in text.out


@pytest.mark.registry
def test_a_layout_is_pushed_to_the_reference_it_was_built_for(cli: RegistryCli) -> None:
    ref = cli.ref("layout:v2")
    layout = cli.tmp_path / "layout"
    cli.ok("bundle", "build", cli.bundle(), "-t", ref, "-o", layout)
    assert (layout / "oci-layout").is_file()

    first = cli.ok("bundle", "push", layout)
    assert f"pushed {ref}@sha256:" in first.err

    second = cli.ok("bundle", "push", layout, cli.ref("layout-copy:v2"))
    assert "(0 blobs," not in second.err  # another repository gets its own blobs


@pytest.mark.registry
def test_pushing_the_same_image_again_sends_no_blob(cli: RegistryCli) -> None:
    ref = cli.ref("again:v1")
    bundle = cli.bundle()
    cli.ok("bundle", "push", "--from-dir", bundle, ref)
    again = cli.ok("bundle", "push", "--from-dir", bundle, ref)
    assert "(0 blobs, 0 B; 2 already present)" in again.err


@pytest.mark.registry
def test_progress_reports_bytes_per_blob_when_asked(cli: RegistryCli) -> None:
    bundle = cli.bundle()
    filler = "x" * 64 + "\n"
    (bundle / "manifests" / "big.yaml").write_text(
        "apiVersion: v1\nkind: ConfigMap\nmetadata: {name: big}\ndata:\n  blob: |\n"
        + "".join(f"    {os.urandom(24).hex()}{filler}" for _ in range(20000))
    )
    result = cli.ok("bundle", "push", "--from-dir", bundle, cli.ref("progress:v1"), "--progress")
    assert re.search(r"\d+\.\d KiB / \d+\.\d KiB +100%", result.err), result.err
    assert "  0%" in result.err


@pytest.mark.registry
@pytest.mark.slow
def test_a_bundle_larger_than_one_upload_chunk_streams_in_parts(cli: RegistryCli) -> None:
    bundle = cli.bundle()
    # ~24 MiB of base64 text compresses to ~18 MiB: more than one 16 MiB PATCH chunk.
    with (bundle / "manifests" / "big.yaml").open("w") as out:
        out.write("apiVersion: v1\nkind: ConfigMap\nmetadata: {name: big}\nbinaryData:\n")
        out.write("  blob: ")
        for _ in range(24):
            out.write(base64.b64encode(os.urandom(3 << 18)).decode())
        out.write("\n")
    ref = cli.ref("large:v1")
    pushed = cli.ok("bundle", "push", "--from-dir", bundle, ref, "--progress")
    assert re.search(r" [1-9]\d%", pushed.err), pushed.err  # a partial step was reported
    report = cli("bundle", "inspect", ref, "--json").json()
    sizes = {f["path"]: f["size"] for f in report["layers"][0]["files"]}
    assert sizes["manifests/big.yaml"] == (bundle / "manifests" / "big.yaml").stat().st_size


# -- failures ------------------------------------------------------------------------


def test_pushing_to_a_dead_registry_fails_fast_with_a_clear_error(
    tmp_path: Path, rukpak: Rukpak, monkeypatch: pytest.MonkeyPatch
) -> None:
    # "fast" is the retry schedule the client asks for, not a stopwatch reading
    asked: list[float] = []
    real_delay = backoff.Backoff.delay

    def recorded(self: backoff.Backoff, n: int) -> float:
        asked.append(real_delay(self, n))
        return asked[-1]

    monkeypatch.setattr(backoff.Backoff, "delay", recorded)
    ref = f"127.0.0.1:{free_port()}/cli/dead:v1"
    result = rukpak.fails("bundle", "push", "--from-dir", make_bundle(tmp_path / "b"), ref)
    assert sum(asked) <= 5.0, f"a refused connection was retried for {asked}"
    assert result.err.startswith("error: registry 127.0.0.1:")
    assert "unreachable" in result.err
    assert "Traceback" not in result.err


@pytest.mark.registry
def test_inspecting_a_missing_tag_exits_1_naming_it(cli: RegistryCli) -> None:
    ref = cli.ref("nothing-here:v9")
    result = cli.fails("bundle", "inspect", ref)
    assert result.err.startswith("error: ")
    assert "cli/nothing-here" in result.err and "not found" in result.err.lower()


@pytest.mark.registry
def test_inspecting_a_platform_the_index_lacks_lists_what_it_offers(cli: RegistryCli) -> None:
    ref = cli.ref("two:v1")
    bundle = cli.bundle()
    cli.ok("bundle", "build", bundle, "-t", ref, "--platform", "linux/amd64,linux/arm64", "--push")
    result = cli.fails("bundle", "inspect", ref, "--platform", "windows/amd64")
    assert "linux/amd64, linux/arm64/v8" in result.err


@pytest.mark.registry
@pytest.mark.parametrize("where", ["gzip-trailer", "deflate-stream"])
def test_a_layer_tampered_with_in_the_registry_is_reported_as_data_loss(
    cli: RegistryCli, where: str
) -> None:
    ref = cli.ref(f"tampered-{where}:v1")
    unique = CONFIGMAP.replace("hi", f"tamper-{os.urandom(8).hex()}")
    bundle = cli.bundle({"cm.yaml": unique})
    cli.ok("bundle", "push", "--from-dir", bundle, ref)
    layer = cli("bundle", "inspect", ref, "--json").json()["layers"][0]
    stored = cli.registry.blob_path(layer["digest"])
    data = bytearray(stored.read_bytes())
    # The trailer's CRC-32 is never read by a tar lister (only the digest catches
    # it); a flipped byte in the deflate data breaks decompression first.
    data[-6 if where == "gzip-trailer" else len(data) // 2] ^= 0xFF
    stored.write_bytes(bytes(data))
    result = cli.fails("bundle", "inspect", ref)
    assert layer["digest"] in result.err
    assert "does not match" in result.err


@pytest.mark.registry
def test_an_image_whose_layer_is_not_a_tar_is_not_listed_as_a_bundle(cli: RegistryCli) -> None:
    ref = Reference.parse(cli.ref("not-a-tar:v1"))
    with RegistryClient() as client:
        layer = client.push_blob(
            ref, b"this is not gzip at all", media_type=mediatypes.OCI_LAYER_GZIP
        )
        config = client.push_blob(ref, b"{}", media_type=mediatypes.OCI_CONFIG)
        layer.media_type = mediatypes.OCI_LAYER_GZIP
        config.media_type = mediatypes.OCI_CONFIG
        body = Manifest(mediatypes.OCI_MANIFEST, config, [layer]).to_json()
        client.push_manifest(ref, body, mediatypes.OCI_MANIFEST)
    result = cli.fails("bundle", "inspect", str(ref))
    assert "is not a readable application/vnd.oci.image.layer.v1.tar+gzip" in result.err


def tar_of(files: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for name, data in files.items():
            info = tarfile.TarInfo(name)
            info.size = len(data)
            tar.addfile(info, io.BytesIO(data))
        link = tarfile.TarInfo("manifests/link.yaml")
        link.type, link.linkname = tarfile.SYMTYPE, "cm.yaml"
        tar.addfile(link)
    return buffer.getvalue()


@pytest.mark.registry
@pytest.mark.parametrize(
    ("media_type", "compress"),
    [
        (mediatypes.OCI_LAYER_TAR, lambda data: data),
        (mediatypes.OCI_LAYER_ZSTD, lambda data: zstandard.ZstdCompressor().compress(data)),
        (mediatypes.DOCKER_LAYER_GZIP, gzip.compress),
    ],
    ids=["tar", "zstd", "docker-gzip"],
)
def test_images_built_by_other_tools_are_listed_whatever_their_compression(
    cli: RegistryCli, media_type: str, compress: Any
) -> None:
    tag = media_type.rsplit(".", 1)[-1].replace("+", "-")
    ref = Reference.parse(cli.ref(f"foreign:{tag}"))
    raw = tar_of({"manifests/cm.yaml": CONFIGMAP.encode()})
    with RegistryClient() as client:
        layer = client.push_blob(ref, compress(raw), media_type=media_type)
        config = client.push_blob(ref, b"{}", media_type=mediatypes.OCI_CONFIG)
        body = Manifest(mediatypes.OCI_MANIFEST, config, [layer]).to_json()
        client.push_manifest(ref, body, mediatypes.OCI_MANIFEST)
    result = cli.ok("bundle", "inspect", str(ref))
    assert f"{len(CONFIGMAP)} B  manifests/cm.yaml" in result.out
    assert "manifests/link.yaml  (symlink)" in result.out
    assert media_type in result.out


def test_insecure_allows_plain_http_to_the_named_registry_only() -> None:
    ref = Reference.parse("registry.example.com:5000/team/bundle:v1")
    parser = argparse.ArgumentParser()
    subparsers = parser.add_subparsers()
    bundle_cli.register(subparsers)
    secure = parser.parse_args(["bundle", "inspect", str(ref)])
    insecure = parser.parse_args(["bundle", "inspect", str(ref), "--insecure"])
    with flags.registry_client(secure, ref) as client:
        assert client.base_url(ref) == "https://registry.example.com:5000"
    with flags.registry_client(insecure, ref) as client:
        assert client.base_url(ref) == "http://registry.example.com:5000"
        other = Reference.parse("elsewhere.example.com/x:v1")
        assert client.base_url(other) == "https://elsewhere.example.com"


@pytest.mark.registry
def test_a_layout_missing_a_blob_is_refused_before_the_tag_moves(cli: RegistryCli) -> None:
    ref = cli.ref("incomplete:v1")
    layout = cli.tmp_path / "layout"
    unique = CONFIGMAP.replace("hi", f"missing-{os.urandom(8).hex()}")
    cli.ok("bundle", "build", cli.bundle({"cm.yaml": unique}), "-t", ref, "-o", layout)
    biggest = max((layout / "blobs" / "sha256").iterdir(), key=lambda p: p.stat().st_size)
    biggest.unlink()
    result = cli.fails("bundle", "push", layout)
    assert "is missing blob" in result.err and "rebuild" in result.err
    assert cli("bundle", "inspect", ref).code == 1  # the tag was never pushed


def test_a_broken_bundle_is_refused_before_anything_is_sent(tmp_path: Path, rukpak: Rukpak) -> None:
    bundle = make_bundle(tmp_path / "b", {"bad.yaml": NAMESPACE + "---\nkind: [\n"})
    result = rukpak.fails("bundle", "build", bundle, "-t", "127.0.0.1:1/x:v1", "--push")
    assert "manifests/bad.yaml document 2 (line " in result.err


def test_building_without_output_or_push_says_what_to_add(tmp_path: Path, rukpak: Rukpak) -> None:
    result = rukpak.fails("bundle", "build", make_bundle(tmp_path / "b"), "-t", "example.com/x:v1")
    assert "--output" in result.err and "--push" in result.err


def test_an_output_path_that_cannot_be_created_is_an_error_not_a_traceback(
    tmp_path: Path, rukpak: Rukpak
) -> None:
    (tmp_path / "file").write_text("")
    bundle = make_bundle(tmp_path / "b")
    result = rukpak.fails(
        "bundle", "build", bundle, "-t", "example.com/x:v1", "-o", tmp_path / "file" / "out"
    )
    assert result.err.startswith("error: Not a directory: ")


def test_a_bad_reference_is_an_error_not_a_traceback(tmp_path: Path, rukpak: Rukpak) -> None:
    result = rukpak.fails("bundle", "build", make_bundle(tmp_path / "b"), "-t", "Bad Ref", "--push")
    assert "whitespace" in result.err


@pytest.mark.parametrize(
    "argv",
    [
        ("bundle", "build", "somedir"),  # no --tag
        ("bundle",),  # no subcommand
        ("bundle", "frobnicate"),
        (),
    ],
)
def test_usage_errors_exit_2(argv: tuple[str, ...], rukpak: Rukpak) -> None:
    assert rukpak(*argv).code == 2


def test_push_with_the_wrong_number_of_arguments_shows_usage(rukpak: Rukpak) -> None:
    result = rukpak.fails("bundle", "push")
    assert "usage: rukpak bundle push LAYOUT_DIR [REF]" in result.err


def test_pushing_a_directory_that_is_not_a_layout_says_how_to_make_one(
    tmp_path: Path, rukpak: Rukpak
) -> None:
    result = rukpak.fails("bundle", "push", tmp_path, "example.com/x:v1")
    assert "not an OCI image layout" in result.err


def test_an_unreadable_registry_config_is_named(tmp_path: Path, rukpak: Rukpak) -> None:
    config = tmp_path / "config.json"
    config.write_text("{not json")
    result = rukpak.fails("bundle", "inspect", "127.0.0.1:1/x:v1", "--registry-config", config)
    assert str(config) in result.err and "not valid JSON" in result.err


@pytest.mark.registry
def test_credentials_come_from_the_registry_config(
    auth_registry: RegistryServer, tmp_path: Path, rukpak: Rukpak
) -> None:
    ref = f"{auth_registry.host}/cli/private:v1"
    bundle = make_bundle(tmp_path / "b")
    empty = tmp_path / "empty.json"
    empty.write_text('{"auths": {}}')
    anonymous = rukpak.fails(
        "bundle", "push", "--from-dir", bundle, ref, "--registry-config", empty
    )
    assert anonymous.err.startswith("error: ") and "Traceback" not in anonymous.err
    assert "requires authentication" in anonymous.err and "--registry-config" in anonymous.err

    token = base64.b64encode(f"{auth_registry.username}:{auth_registry.password}".encode()).decode()
    config = tmp_path / "config.json"
    config.write_text(json.dumps({"auths": {auth_registry.host: {"auth": token}}}))
    pushed = rukpak.ok("bundle", "push", "--from-dir", bundle, ref, "--registry-config", config)
    assert auth_registry.password and auth_registry.password not in pushed.err
    rukpak.ok("bundle", "inspect", ref, "--registry-config", config)


# -- the CLI frame ---------------------------------------------------------------------


def test_verbose_logs_the_registry_requests(rukpak: Rukpak) -> None:
    result = rukpak.fails(
        "--verbose", "bundle", "inspect", f"127.0.0.1:{free_port()}/x:v1", "--timeout", "2"
    )
    assert "registry request failed" in result.err


def test_verbose_may_follow_the_subcommand(rukpak: Rukpak) -> None:
    dead = f"127.0.0.1:{free_port()}/x:v1"
    result = rukpak.fails("bundle", "inspect", dead, "--timeout", "2", "-v")
    assert "registry request failed" in result.err


@pytest.mark.registry
def test_index_makes_an_index_for_a_single_platform(cli: RegistryCli) -> None:
    ref = cli.ref("one-in-index:v1")
    bundle = cli.bundle()
    cli.ok("bundle", "build", bundle, "-t", ref, "--index", "--push")
    report = cli("bundle", "inspect", ref, "--json", "--platform", "linux/amd64").json()
    assert report["mediaType"] == mediatypes.OCI_INDEX
    assert report["platforms"] == ["linux/amd64"]


def test_ctrl_c_exits_130(monkeypatch: pytest.MonkeyPatch, rukpak: Rukpak) -> None:
    def interrupted(args: argparse.Namespace) -> int:
        """inspect, interrupted by Ctrl-C (a command's docstring is its help)"""
        raise KeyboardInterrupt

    monkeypatch.setattr(bundle_cli, "run_inspect", interrupted)
    assert rukpak("bundle", "inspect", "example.com/x:v1").code == 130


def test_the_console_scripts_are_installed_and_answer() -> None:
    bindir = Path(sys.executable).parent
    helped = subprocess.run(
        [bindir / "rukpak", "bundle", "build", "--help"], capture_output=True, text=True
    )
    assert helped.returncode == 0
    assert "--platform-dir" in helped.stdout
    manager = subprocess.run([bindir / "rukpak-provisioner"], capture_output=True, text=True)
    assert manager.returncode == 2  # a subcommand is required
    assert "a subcommand is required: instance, manager" in manager.stderr


RUN_TIMEOUT = 400
"""Seconds ``make run`` may take here (about 80 on this machine, alone)."""


@pytest.mark.registry
@pytest.mark.slow
def test_make_run_builds_pushes_inspects_and_stops_its_registry() -> None:
    repo = Path(__file__).resolve().parent.parent
    env = {**os.environ, "VENV": str(Path(sys.executable).parent.parent)}
    proc = subprocess.Popen(
        ["bash", "hack/run.sh"],
        cwd=repo,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stdout, stderr = proc.communicate(timeout=RUN_TIMEOUT)
    except subprocess.TimeoutExpired:
        # SIGTERM: run.sh's trap stops the cluster and registry it started, by pid
        os.killpg(proc.pid, signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
        pytest.fail(f"make run took more than {RUN_TIMEOUT}s:\n{stdout}{stderr}")
    done = subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)
    assert done.returncode == 0, done.stdout + done.stderr
    assert "Platforms:  linux/amd64, linux/arm64/v8" in done.stdout
    assert "already present" in done.stderr
    pid = int(re.search(r"docker-registry \(pid (\d+)\)", done.stdout).group(1))  # type: ignore[union-attr]
    assert not Path(f"/proc/{pid}").exists() or "zombie" in Path(f"/proc/{pid}/status").read_text()
