"""RukPak on kind, as a user runs it: ``make kind-run``, then ``make kind-down``.

The ``kind``-marked tests run in a pytest run of their own (``make test``'s third), after
the local clusters are gone: a kind cluster is one more Kubernetes on this machine. They
need a Docker engine: the one that answers, or Debian's ``dockerd`` started here
(``tests.kind.engine``); where neither can run they skip and say exactly why. The pure
parts (the capability filter, the image layers) are tested in the ordinary run.
"""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tarfile
from pathlib import Path

import pytest

from tests.kind import capfilter, ociarchive

REPO = Path(__file__).resolve().parent.parent
NAME = "rukpak-test"
RUN_TIMEOUT = 1800  # a new machine installs docker.io, debootstraps and builds the node image


def test_the_capability_filter_keeps_only_what_the_bounding_set_holds(tmp_path: Path) -> None:
    config = tmp_path / "config.json"
    caps = ["CAP_CHOWN", "CAP_SYS_RESOURCE", "CAP_SYS_ADMIN"]
    config.write_text(
        json.dumps({"process": {"capabilities": {"bounding": caps, "effective": caps}}})
    )
    capfilter.filter_config(config, {"CAP_CHOWN", "CAP_SYS_ADMIN"})
    kept = json.loads(config.read_text())["process"]["capabilities"]
    assert kept == {
        "bounding": ["CAP_CHOWN", "CAP_SYS_ADMIN"],
        "effective": ["CAP_CHOWN", "CAP_SYS_ADMIN"],
    }
    spec = tmp_path / "process.json"
    spec.write_text(json.dumps({"args": ["sh"], "capabilities": {"permitted": caps}}))
    capfilter.filter_config(spec, {"CAP_CHOWN"}, process=True)
    assert json.loads(spec.read_text())["capabilities"] == {"permitted": ["CAP_CHOWN"]}


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["--root", "/r", "create", "--bundle", "/b", "id"], "/b"),
        (["create", "--bundle=/c", "id"], "/c"),
        (["exec", "-p", "/p.json", "id"], None),
    ],
)
def test_the_capability_filter_finds_runc_s_bundle(args: list[str], expected: str | None) -> None:
    assert capfilter.option(args, "--bundle", "-b") == expected


def test_the_capability_filter_names_what_this_machine_lacks() -> None:
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    lacking = capfilter.missing()
    assert len(capfilter.bounding()) + len(lacking) == last + 1
    assert not set(lacking) & capfilter.bounding()


def test_an_image_layer_carries_the_libraries_its_binary_loads() -> None:
    binary = Path("/usr/bin/docker-registry")
    if not binary.exists():
        binary = Path("/bin/ls")
    libraries = ociarchive.shared_libraries(binary)
    assert libraries, f"{binary} links no library"
    with tarfile.open(fileobj=io.BytesIO(ociarchive.layer({"/usr/local/bin/x": binary}))) as tar:
        names = set(tar.getnames())
    assert "usr/local/bin/x" in names
    assert {str(lib).lstrip("/") for lib in libraries} <= names
    assert "tmp" in names


def test_an_oci_archive_names_each_image_for_ctr(tmp_path: Path) -> None:
    from tests.cluster import images

    archive = tmp_path / "images.tar"
    ociarchive.write(archive, {"registry.k8s.io/pause:3.10": images.pause_image()})
    with tarfile.open(archive) as tar:
        index = json.loads(tar.extractfile("index.json").read())  # type: ignore[union-attr]
        names = tar.getnames()
    (entry,) = index["manifests"]
    assert entry["annotations"]["io.containerd.image.name"] == "registry.k8s.io/pause:3.10"
    assert f"blobs/sha256/{entry['digest'].partition(':')[2]}" in names
    assert "oci-layout" in names


@pytest.fixture(scope="module")
def engine() -> object:
    from tests.kind import engine as engines

    try:
        return engines.ensure()
    except engines.EngineUnavailable as exc:
        pytest.skip(f"kind needs a container engine, and none runs here: {exc}")


@pytest.mark.kind
@pytest.mark.slow
def test_make_kind_run_shows_what_make_run_shows_and_kind_down_removes_it(engine: object) -> None:
    env = {**os.environ, "RUKPAK_KIND_NAME": NAME, "CLUSTER": "kind"}
    env.pop("KUBECONFIG", None)
    env["VENV"] = str(Path(sys.executable).parent.parent)
    try:
        done = subprocess.run(
            ["bash", "hack/run.sh"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=RUN_TIMEOUT,
            check=False,
        )
        assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-4000:]
        assert f"the kind cluster {NAME} (a node image built here" in done.stdout
        for step in (
            "A pod reads the bundle through an inline CSI volume",
            "A failing upgrade rolled back without a pod, the registry stopped",
            "Deleting the BundleDeployment: what it installed goes too",
        ):
            assert step in done.stdout
        assert "Total " in done.stdout
    finally:
        down = subprocess.run(
            [sys.executable, "-m", "tests.kind", "down"],
            cwd=REPO,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    assert down.returncode == 0, down.stderr
    from tests.kind import cluster
    from tests.kind import engine as engines

    docker = engines.client()
    if docker is not None and engines.answers(docker):  # the user's engine: still running
        assert NAME not in cluster.clusters()
    else:  # the engine started for the test: the cluster went first, then the engine
        assert "stopped the dockerd started for kind" in down.stderr
