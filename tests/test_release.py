"""``make release``: what lands in dist/, and that it installs.

Where it sits: tests ``hack/release/`` (release.sh, ocindex.py, chart.py, sbom.py, push.sh)
and ``charts/rukpak``. The chart is checked against kustomize (it must install what the
matching overlay of ``deploy/`` installs, for every combination of its switches) and by
``helm lint``; the multi-arch index is checked from small layouts made here with the
image tool (two architectures, cheap), and the release itself is built for the host's
architecture only (``ARCHES=amd64``: the cached base layer, seconds); the two-arch build
is ``make release``'s, measured in docs/install.md. The release is pushed to the real
registry and signed with ``rukpak bundle sign``, which real cosign verifies; its wheel is
installed into a new venv; and, on the local cluster, it is installed from ``dist/`` only
with real ``helm`` (the chart, the image archive), rolled out, and made to install a
BundleDeployment.
"""

from __future__ import annotations

import hashlib
import importlib.util
import itertools
import json
import os
import shutil
import subprocess
import sys
import tarfile
import time
import venv
from collections.abc import Iterator
from pathlib import Path
from types import ModuleType
from typing import Any

import pytest
import yaml

from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import ObjectRef
from rukpak.oci import mediatypes
from rukpak.oci.client import RegistryClient
from rukpak.oci.reference import Reference
from tests import e2e_helpers as e2e
from tests import install_helpers as inst
from tests.polling import eventually
from tests.signing_helpers import PASSWORD, Cosign, cosign3

__all__ = ["cosign3"]  # the session fixture, used by name

REPO = Path(__file__).resolve().parent.parent
RELEASE = REPO / "hack" / "release"
CHART = REPO / "charts" / "rukpak"
OCITOOL = REPO / "hack" / "image" / "ocitool.py"
VERSION = "0.2.0"


def _tool(name: str) -> ModuleType:
    """A module of hack/release (scripts, not a package), imported by path."""
    spec = importlib.util.spec_from_file_location(f"rukpak_release_{name}", RELEASE / f"{name}.py")
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    spec.loader.exec_module(module)
    return module


chart_tool = _tool("chart")
ocindex = _tool("ocindex")


def _gotool(name: str) -> str:
    done = subprocess.run(
        ["bash", str(REPO / "hack" / "gotool.sh"), name, "--quiet"],
        capture_output=True, text=True, timeout=900, check=False,
    )  # fmt: skip
    assert done.returncode == 0, f"hack/gotool.sh {name}: {done.stdout}{done.stderr}"
    return subprocess.run(
        ["bash", str(REPO / "hack" / "gotool.sh"), name, "--print-path"],
        capture_output=True, text=True, check=True,
    ).stdout.strip()  # fmt: skip


@pytest.fixture(scope="session")
def helm() -> str:
    return _gotool("helm")


@pytest.fixture(scope="session")
def kustomize() -> list[str]:
    return [_gotool("kustomize"), "build"]


def _run(*argv: str, timeout: float = 120, env: dict[str, str] | None = None) -> str:
    done = subprocess.run(
        list(argv), capture_output=True, text=True, timeout=timeout, check=False,
        env={**os.environ, **(env or {})},
    )  # fmt: skip
    if done.returncode != 0:
        raise AssertionError(
            f"{' '.join(argv)} failed ({done.returncode}):\n{done.stdout}{done.stderr}"
        )
    return done.stdout


def _objects(text: str) -> dict[tuple[str, str], dict[str, Any]]:
    return {(d["kind"], d["metadata"]["name"]): d for d in yaml.safe_load_all(text) if d}


# --- the chart ---------------------------------------------------------------------------


def test_the_committed_chart_is_what_deploy_generates(tmp_path: Path) -> None:
    copy = tmp_path / "rukpak"
    shutil.copytree(CHART, copy)
    chart_tool.generate(copy)
    for path in sorted(CHART.rglob("*")):
        if path.is_file():
            rel = path.relative_to(CHART)
            assert (copy / rel).read_text() == path.read_text(), (
                f"charts/rukpak/{rel} is stale: run `python hack/release/chart.py generate`"
            )
    assert sorted(p.relative_to(copy) for p in copy.rglob("*")) == sorted(
        p.relative_to(CHART) for p in CHART.rglob("*")
    )


SWITCH_COMBOS = list(itertools.product([False, True], repeat=len(chart_tool.SWITCHES)))


@pytest.mark.parametrize(
    "combo", SWITCH_COMBOS, ids=["-".join(str(int(x)) for x in c) for c in SWITCH_COMBOS]
)
def test_the_chart_installs_what_the_kustomize_overlay_installs(
    combo: tuple[bool, ...], helm: str, kustomize: list[str], tmp_path: Path
) -> None:
    """For every combination of hostNetwork, monitoring and registryMirror, with real
    values, ``helm template`` gives the objects ``kustomize build`` gives for the overlay
    of deploy/ with those components and values."""
    on = dict(zip(chart_tool.SWITCHES, combo, strict=True))
    image = "registry.example.com/rukpak-python@sha256:" + "ab" * 32
    values = {
        "image": {"repository": image.split("@")[0], "digest": image.split("@")[1]},
        "kubeletRoot": "/data/kubelet",
        "stateDir": "/data/rukpak-csi",
        "hostNetwork": {"enabled": on["hostNetwork"], "apiServerHost": "10.1.2.3",
                        "apiServerPort": 6443},
        "monitoring": {"enabled": on["monitoring"]},
        "registryMirror": {"enabled": on["registryMirror"], "upstream": "quay.io"},
    }  # fmt: skip
    (tmp_path / "values.yaml").write_text(yaml.safe_dump(values))
    templated = _run(
        helm,
        "template",
        "rukpak",
        "--kube-version",
        "1.34.4",
        str(CHART),
        "-f",
        str(tmp_path / "values.yaml"),
    )
    overlay = tmp_path / "overlay"
    overlay.mkdir()
    rel = os.path.relpath(REPO / "deploy", overlay)
    components = [c for n, c in chart_tool.SWITCHES.items() if on[n]]
    generators: list[dict[str, Any]] = [
        {"name": "rukpak-node-paths",
         "literals": ["kubeletRoot=/data/kubelet", "stateDir=/data/rukpak-csi"]},
        {"name": "rukpak-apiserver", "namespace": "rukpak-system",
         "literals": ["KUBERNETES_SERVICE_HOST=10.1.2.3", "KUBERNETES_SERVICE_PORT=6443"],
         "options": {"disableNameSuffixHash": True}},
        {"name": "rukpak-registry-mirror", "namespace": "rukpak-system",
         "literals": ["upstream=quay.io"], "options": {"disableNameSuffixHash": True}},
    ]  # fmt: skip
    wanted = {"host-network": 1, "registry-mirror": 2}
    generators = [generators[0]] + [generators[i] for c, i in wanted.items() if c in components]
    kustomization = {
        "resources": [rel],
        "components": [f"{rel}/components/{c}" for c in ["kubelet-root", *components]],
        "configMapGenerator": generators,
        "images": [{"name": "rukpak-python", "newName": image.split("@")[0],
                    "digest": image.split("@")[1]}],
        "patches": [chart_tool.version_patch("0.1.0")],
    }  # fmt: skip
    (overlay / "kustomization.yaml").write_text(yaml.safe_dump(kustomization))
    built = _run(*kustomize, str(overlay))
    assert _objects(templated) == _objects(built)


def test_helm_lint_passes_and_missing_values_fail_clearly(helm: str) -> None:
    assert "0 chart(s) failed" in _run(helm, "lint", "--strict", str(CHART))
    done = subprocess.run(
        [helm, "template", "rukpak", "--kube-version", "1.34.4", str(CHART),
         "--set", "hostNetwork.enabled=true"],
        capture_output=True, text=True, timeout=60, check=False,
    )  # fmt: skip
    assert done.returncode != 0
    assert "hostNetwork.apiServerHost is required when hostNetwork.enabled" in done.stderr


# --- the multi-arch index ----------------------------------------------------------------


def _arch_layout(root: Path, arch: str, content: str) -> Path:
    """A one-layer image layout for ``arch`` made with the image tool, as build.sh does."""
    files = root / f"rootfs-{arch}"
    (files / "etc").mkdir(parents=True)
    (files / "etc" / "arch").write_text(content)
    layer = root / f"layer-{arch}.tar.gz"
    _run(sys.executable, str(OCITOOL), "layer", str(files), str(layer), "--mtime", "0")
    layout = root / f"layout-{arch}"
    _run(sys.executable, str(OCITOOL), "layout", "--layer", str(layer), "--entrypoint",
         "/bin/true", "--path", "/bin", "--arch", arch, "--tag", VERSION, str(layout))  # fmt: skip
    return layout


@pytest.fixture
def two_arch_archive(tmp_path: Path) -> Path:
    layouts = [_arch_layout(tmp_path, a, f"i am {a}\n") for a in ("arm64", "amd64")]
    ocindex.merge(layouts, tmp_path / "oci", tag=VERSION)
    out = tmp_path / "image.oci.tar"
    ocindex.archive(tmp_path / "oci", out)
    return out


def test_two_arch_layouts_merge_into_one_reproducible_index(
    two_arch_archive: Path, tmp_path: Path
) -> None:
    with ocindex.opened(two_arch_archive) as layout:
        summary = ocindex.check(layout)
    assert summary["tag"] == VERSION
    assert sorted(summary["platforms"]) == ["amd64", "arm64"]
    # the same inputs, merged and packed again elsewhere: the same bytes
    again = tmp_path / "again"
    again.mkdir()
    layouts = [_arch_layout(again, a, f"i am {a}\n") for a in ("amd64", "arm64")]
    ocindex.merge(layouts, again / "oci", tag=VERSION)
    ocindex.archive(again / "oci", again / "image.oci.tar")
    digest = hashlib.sha256(two_arch_archive.read_bytes()).hexdigest()
    assert hashlib.sha256((again / "image.oci.tar").read_bytes()).hexdigest() == digest


def test_a_corrupt_blob_or_a_doubled_arch_is_refused(
    two_arch_archive: Path, tmp_path: Path
) -> None:
    with ocindex.opened(two_arch_archive) as layout:
        summary = ocindex.check(layout)
        config_layer = json.loads(
            (layout / "blobs" / "sha256" / summary["platforms"]["amd64"][7:]).read_bytes()
        )["layers"][0]["digest"]
        shutil.copytree(layout, tmp_path / "broken")
    (tmp_path / "broken" / "blobs" / "sha256" / config_layer[7:]).write_bytes(b"not a layer")
    with pytest.raises(ocindex.LayoutError, match="does not match its digest"):
        ocindex.check(tmp_path / "broken")
    (tmp_path / "one").mkdir()
    one = _arch_layout(tmp_path / "one", "amd64", "x\n")
    with pytest.raises(ocindex.LayoutError, match="two layouts for one architecture"):
        ocindex.merge([one, one], tmp_path / "twice", tag=VERSION)


# --- the release, built for the host's architecture --------------------------------------


@pytest.fixture(scope="session")
def release_dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """``hack/release/release.sh VERSION`` for amd64 into a dist/ of its own."""
    dist = tmp_path_factory.mktemp("dist")
    started = time.monotonic()
    _run("bash", str(RELEASE / "release.sh"), VERSION, timeout=1800,
         env={"ARCHES": "amd64", "DIST": str(dist), "PYTHON": sys.executable,
              "IMAGE_REPO": "registry.example.com/rukpak/rukpak-python"})  # fmt: skip
    print(f"\nrelease.sh (amd64, this tree) took {time.monotonic() - started:.1f}s")
    return dist


def test_the_release_holds_every_artefact_checksummed(release_dist: Path) -> None:
    names = sorted(p.name for p in release_dist.iterdir())
    assert names == sorted([
        "IMAGE", "SHA256SUMS", "rukpak.yaml", f"rukpak-{VERSION}.tgz",
        f"rukpak-python-{VERSION}.oci.tar", f"rukpak-python-{VERSION}.spdx.json",
        f"rukpak_python-{VERSION}-py3-none-any.whl", f"rukpak_python-{VERSION}.tar.gz",
    ])  # fmt: skip
    done = subprocess.run(["sha256sum", "--check", "--strict", "SHA256SUMS"], cwd=release_dist,
                          capture_output=True, text=True, check=False)  # fmt: skip
    assert done.returncode == 0, done.stdout + done.stderr
    assert done.stdout.count(": OK") == 6


def test_a_bad_version_is_refused_at_once(tmp_path: Path) -> None:
    done = subprocess.run(
        ["bash", str(RELEASE / "release.sh"), "1.2"], capture_output=True, text=True,
        timeout=30, check=False, env={**os.environ, "DIST": str(tmp_path)},
    )  # fmt: skip
    assert done.returncode == 2
    assert "usage: release.sh VERSION (semver x.y.z, got '1.2')" in done.stderr
    assert not any(tmp_path.iterdir())  # nothing written


def test_a_tampered_dist_is_not_pushed(release_dist: Path, tmp_path: Path) -> None:
    tampered = tmp_path / "dist"
    shutil.copytree(release_dist, tampered)
    with (tampered / "rukpak.yaml").open("a") as f:
        f.write("# changed after the release\n")
    done = subprocess.run(
        ["bash", str(RELEASE / "push.sh"), str(tampered), "127.0.0.1:1/rukpak-python"],
        capture_output=True, text=True, timeout=60, check=False,
        env={**os.environ, "PYTHON": sys.executable},
    )  # fmt: skip
    assert done.returncode == 1
    assert "does not match its SHA256SUMS" in done.stderr


def test_the_same_tree_released_again_gives_the_same_bytes(
    release_dist: Path, tmp_path: Path
) -> None:
    """Reproducible: a second release of this tree (same cached base layer) has the same
    image archive, index digest, manifest and SBOM."""
    _run("bash", str(RELEASE / "release.sh"), VERSION, timeout=1800,
         env={"ARCHES": "amd64", "DIST": str(tmp_path), "PYTHON": sys.executable,
              "IMAGE_REPO": "registry.example.com/rukpak/rukpak-python"})  # fmt: skip
    for name in ("IMAGE", f"rukpak-python-{VERSION}.oci.tar", "rukpak.yaml",
                 f"rukpak-python-{VERSION}.spdx.json"):  # fmt: skip
        assert (tmp_path / name).read_bytes() == (release_dist / name).read_bytes(), name


def test_the_manifest_and_the_chart_pin_the_archive_index_by_digest(
    release_dist: Path, helm: str
) -> None:
    with ocindex.opened(release_dist / f"rukpak-python-{VERSION}.oci.tar") as layout:
        digest = ocindex.check(layout)["digest"]
    image = f"registry.example.com/rukpak/rukpak-python@{digest}"
    assert (release_dist / "IMAGE").read_text().strip() == image
    objects = _objects((release_dist / "rukpak.yaml").read_text())
    manager = objects[("Deployment", "rukpak-manager")]
    assert manager["metadata"]["labels"]["app.kubernetes.io/version"] == VERSION
    images = {
        c["image"]
        for d in objects.values()
        if d["kind"] in ("Deployment", "DaemonSet")
        for c in d["spec"]["template"]["spec"]["containers"]
    }
    assert images == {image}
    templated = _objects(
        _run(
            helm,
            "template",
            "rukpak",
            "--kube-version",
            "1.34.4",
            str(release_dist / f"rukpak-{VERSION}.tgz"),
        )
    )
    chart_manager = templated[("Deployment", "rukpak-manager")]
    assert chart_manager["spec"]["template"]["spec"]["containers"][0]["image"] == image
    assert chart_manager["metadata"]["labels"]["app.kubernetes.io/version"] == VERSION


def test_the_sbom_lists_the_images_debian_and_python_packages(release_dist: Path) -> None:
    doc = json.loads((release_dist / f"rukpak-python-{VERSION}.spdx.json").read_text())
    assert doc["spdxVersion"] == "SPDX-2.3"
    names = {p["name"] for p in doc["packages"]}
    assert {"python3.11", "libfuse3-3", "grpcio", "rukpak-python", "pyfuse3"} <= names
    ids = {p["SPDXID"] for p in doc["packages"]}
    assert all(r["relatedSpdxElement"] in ids for r in doc["relationships"])


def test_the_wheel_installs_the_cli_into_a_new_venv_without_fuse(
    release_dist: Path, tmp_path: Path
) -> None:
    env_dir = tmp_path / "venv"
    venv.create(env_dir, with_pip=True)
    cache = Path(os.environ.get("RUKPAK_CACHE") or Path.home() / ".cache" / "rukpak")
    wheelhouse = sorted(cache.glob("image/base-*/wheels"))  # the image's, else PyPI
    links = [a for w in wheelhouse[:1] for a in ("--find-links", str(w))]
    wheel = release_dist / f"rukpak_python-{VERSION}-py3-none-any.whl"
    _run(str(env_dir / "bin" / "pip"), "install", "-q", "--disable-pip-version-check",
         *links, str(wheel), timeout=600)  # fmt: skip
    assert "usage: rukpak" in _run(str(env_dir / "bin" / "rukpak"), "--help")
    assert "kubectl rukpak" in _run(str(env_dir / "bin" / "kubectl-rukpak"), "--help")
    no_fuse = subprocess.run([str(env_dir / "bin" / "python"), "-c", "import pyfuse3"],
                             capture_output=True, check=False)  # fmt: skip
    assert no_fuse.returncode != 0  # the FUSE mode is the `node` extra


def test_the_sdist_holds_the_sources_at_the_release_version(release_dist: Path) -> None:
    with tarfile.open(release_dist / f"rukpak_python-{VERSION}.tar.gz") as tar:
        names = tar.getnames()
        pkg_info = tar.extractfile(f"rukpak_python-{VERSION}/PKG-INFO")
        assert pkg_info is not None
        assert f"Version: {VERSION}" in pkg_info.read().decode()
    assert f"rukpak_python-{VERSION}/provisioner/cli/main.py" in names
    assert f"rukpak_python-{VERSION}/provisioner/crds/bundles.yaml" in names or any(
        n.startswith(f"rukpak_python-{VERSION}/provisioner/crds/") for n in names
    )


def test_the_pushed_release_is_signed_and_cosign_verifies_it(
    release_dist: Path, registry: Any, cosign3: Cosign, tmp_path: Path
) -> None:
    key, pub = cosign3.key_pair("release")
    repo = f"{registry.host}/rukpak/rukpak-python"
    out = _run("bash", str(RELEASE / "push.sh"), "--key", str(key), str(release_dist), repo,
               env={"COSIGN_PASSWORD": PASSWORD, "PYTHON": sys.executable})  # fmt: skip
    pushed = out.strip().splitlines()[0]
    digest = (release_dist / "IMAGE").read_text().strip().split("@")[1]
    assert pushed == f"{repo}@{digest}"
    with RegistryClient() as client:
        desc, body = client.get_manifest(Reference.parse(f"{repo}:{VERSION}"))
    assert desc.media_type == mediatypes.OCI_INDEX and desc.digest == digest
    assert [m["platform"]["architecture"] for m in json.loads(body)["manifests"]] == ["amd64"]
    assert cosign3.verifies(pushed, pub)
    _, other_pub = cosign3.key_pair("someone-else")
    refused = cosign3.verify(pushed, other_pub)
    assert refused.returncode != 0 and "Found: 0" in refused.stderr, refused.stderr


# --- installed on the local cluster from dist/ only --------------------------------------


def _helm(helm: str, kubeconfig: Path, *args: str, timeout: float = 300) -> str:
    return _run(helm, "--kubeconfig", str(kubeconfig), *args, timeout=timeout)


def _values(cluster: Any, repo: str, state_dir: Path) -> dict[str, Any]:
    """The chart's values for the local cluster: its kubelet root, no kube-proxy."""
    api = cluster.in_cluster_env()
    return {
        "image": {"repository": repo},
        "kubeletRoot": str(cluster.kubelet_dir),
        "stateDir": str(state_dir),
        "hostNetwork": {"enabled": True, "apiServerHost": api["KUBERNETES_SERVICE_HOST"],
                        "apiServerPort": api["KUBERNETES_SERVICE_PORT"]},
    }  # fmt: skip


def _helm_release(
    cluster: Any, helm: str, dist: Path, workdir: Path, *, version: str, upgrade: bool = False
) -> tuple[inst.RukpakSystem, float]:
    """``helm install`` (or ``upgrade``) of the chart in ``dist`` (a copy of a dist/: its
    image archive pushed to the cluster's registry first), then every rollout waited for.
    The system as installed, and the seconds from helm's start to all rollouts Ready."""
    shipped = workdir / f"dist-{version}"
    shutil.copytree(dist, shipped)
    repo = f"{cluster.registry_host}/rukpak/rukpak-python"
    pushed = _run("bash", str(RELEASE / "push.sh"), str(shipped), repo,
                  env={"PYTHON": sys.executable}).strip()  # fmt: skip
    values = workdir / "values.yaml"
    values.write_text(yaml.safe_dump(_values(cluster, repo, workdir / "plugin-state")))
    kubeconfig = Path(cluster.kubeconfig)
    started = time.monotonic()
    _helm(helm, kubeconfig, "upgrade" if upgrade else "install", "rukpak",
          str(shipped / f"rukpak-{version}.tgz"), "-f", str(values))  # fmt: skip
    manifests = workdir / f"installed-{version}.yaml"
    manifests.write_text(_helm(helm, kubeconfig, "get", "manifest", "rukpak"))
    system = inst.RukpakSystem(
        cluster=cluster,
        kube=Kube.from_kubeconfig(str(kubeconfig)),
        image=pushed,
        workdir=workdir,
        manifests=manifests,
        state_dir=workdir / "plugin-state",
    )
    try:
        inst.rollout(system, system.documents(), timeout=inst.ROLLOUT_TIMEOUT)
    except BaseException:
        _teardown(system, helm)
        raise
    return system, time.monotonic() - started


def _teardown(system: inst.RukpakSystem, helm: str) -> None:
    try:
        inst.uninstall(system)
        _run(helm, "--kubeconfig", str(system.kubeconfig), "uninstall", "rukpak", "--wait",
             "--ignore-not-found", timeout=300)  # fmt: skip
    finally:
        system.kube.close()


def _deploy_hello(system: inst.RukpakSystem, name: str, *, namespace: str, root: Path) -> ObjectRef:
    """Push the hello bundle (its objects in ``namespace``) and create the v1alpha1
    BundleDeployment ``name`` of it; returns the BundleDeployment."""
    ref = f"{system.registry_host}/rukpak-e2e/{name}:v1"
    inst.hello_bundle(root, namespace=namespace, image=system.busybox_image)
    e2e.push_bundle(root, ref)
    system.kube.create(inst.bundle_deployment(name, ref))
    return ObjectRef("core.rukpak.io", "v1alpha1", "BundleDeployment", "", name)


def _manager_log(system: inst.RukpakSystem) -> str:
    """The managers' last log lines, to say what a failed upgrade check saw."""
    try:
        return system.kubectl(
            "logs", "-n", inst.NAMESPACE, "-l", f"app.kubernetes.io/name={inst.MANAGER}",
            "--tail", "60", "--prefix",
        )  # fmt: skip
    except Exception as exc:  # the report, not the test: a log that cannot be read says so
        return f"(no manager log: {exc})"


def _installed(system: inst.RukpakSystem, bd: ObjectRef) -> dict[str, Any] | None:
    """``bd``'s conditions once it is Installed and Healthy, else None."""
    conds = inst.conditions(system.kube.get(bd))
    ok = all(conds.get(t, {}).get("status") == "True" for t in ("Installed", "Healthy"))
    return conds if ok else None


@pytest.fixture
def released_system(
    kube_cluster: Any, release_dist: Path, helm: str, tmp_path: Path
) -> Iterator[inst.RukpakSystem]:
    """The release installed with helm from a copy of dist/ (nothing of the source tree:
    the chart archive and the image archive, pushed to the cluster's registry)."""
    e2e.require_local_node(kube_cluster)
    system, took = _helm_release(kube_cluster, helm, release_dist, tmp_path, version=VERSION)
    print(f"\nhelm install from dist/ -> all rollouts Ready in {took:.1f}s")
    try:
        yield system
    finally:
        _teardown(system, helm)


@pytest.mark.cluster
@pytest.mark.slow
def test_the_release_installs_from_dist_and_installs_a_bundle(
    released_system: inst.RukpakSystem, tmp_path: Path
) -> None:
    system = released_system
    pods = json.loads(system.kubectl("get", "pods", "-n", inst.NAMESPACE, "-o", "json"))["items"]
    images = {c["image"] for p in pods for c in p["spec"]["containers"]}
    assert images == {system.image}
    versions = {
        p["metadata"]["labels"].get("app.kubernetes.io/version")
        for p in pods
        if p["metadata"]["labels"].get("app.kubernetes.io/name") == inst.MANAGER
    }
    assert versions == {VERSION}
    namespace = "release-hello"
    bd = _deploy_hello(system, "hello-release", namespace=namespace, root=tmp_path / "bundle")
    try:
        eventually(
            lambda: _installed(system, bd), timeout=240, what="hello-release Installed and Healthy"
        )
    except AssertionError as e:
        raise AssertionError(f"{e}\n{system.describe()}") from None
    assert inst.greeting(system, namespace) == "Hello from a RukPak bundle"


# --- upgrading from the previous release -------------------------------------------------

# The previous release: there is none published yet, so it is the release this tooling
# builds from a fixed earlier commit of the project (main before the standing provisioner
# stopped its runs through one set: a different provisioner, so a different image), with
# the chart generated from that commit's deploy/, as version 0.1.0.
PREVIOUS_COMMIT = "137ae7830690b66c84f3ab67e974c21c8dcc59ab"
PREVIOUS_VERSION = "0.1.0"


def _previous_tree(tree: Path) -> Path:
    """PREVIOUS_COMMIT's tree at ``tree`` with today's release tooling (hack/release,
    hack/image, hack/gotool.sh, charts/rukpak)."""
    archive = subprocess.run(["git", "-C", str(REPO), "archive", PREVIOUS_COMMIT],
                             capture_output=True, check=True).stdout  # fmt: skip
    subprocess.run(["tar", "-x", "-C", str(tree)], input=archive, check=True)
    for tool in ("hack/release", "hack/image", "charts/rukpak"):
        shutil.rmtree(tree / tool, ignore_errors=True)
        shutil.copytree(REPO / tool, tree / tool)
    shutil.copy2(REPO / "hack" / "gotool.sh", tree / "hack" / "gotool.sh")
    return tree


def test_todays_release_tools_start_on_the_previous_release_tree(tmp_path: Path) -> None:
    """The upgrade test builds the previous release with today's hack/ on the old tree:
    a tool that imports a module the old tree lacks fails here in seconds, not there
    after the image builds."""
    tree = _previous_tree(tmp_path)
    tools = sorted([*(tree / "hack/image").glob("*.py"), *(tree / "hack/release").glob("*.py")])
    assert {t.name for t in tools} >= {"ocitool.py", "ocindex.py", "chart.py", "sbom.py"}
    for tool in tools:
        done = subprocess.run([sys.executable, str(tool), "--help"], cwd=tree,
                              env={**os.environ, "PYTHONPATH": str(tree)},
                              capture_output=True, text=True, timeout=60)  # fmt: skip
        assert done.returncode == 0, (tool.relative_to(tree), done.stderr[-2000:])
        assert "usage:" in done.stdout


@pytest.fixture(scope="session")
def previous_dist(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The previous release's dist/ (amd64): PREVIOUS_COMMIT's tree with today's release
    tooling (hack/release, hack/image, hack/gotool.sh, charts/rukpak regenerated)."""
    tree = _previous_tree(tmp_path_factory.mktemp("previous-tree"))
    _run("git", "init", "-q", str(tree))  # build.sh lists the sources with git ls-files
    _run(sys.executable, str(tree / "hack" / "release" / "chart.py"), "generate",
         env={"PYTHONPATH": str(tree)})  # fmt: skip
    dist = tmp_path_factory.mktemp("previous-dist")
    _run("bash", str(tree / "hack" / "release" / "release.sh"), PREVIOUS_VERSION, timeout=1800,
         env={"ARCHES": "amd64", "DIST": str(dist), "PYTHON": sys.executable,
              "PYTHONPATH": str(tree)})  # fmt: skip
    return dist


@pytest.fixture
def upgraded_system(
    kube_cluster: Any, previous_dist: Path, release_dist: Path, helm: str, tmp_path: Path
) -> Iterator[tuple[inst.RukpakSystem, list[inst.RukpakSystem]]]:
    """The previous release installed with helm; the test upgrades it (``upgrade``)."""
    e2e.require_local_node(kube_cluster)
    before, _ = _helm_release(kube_cluster, helm, previous_dist, tmp_path, version=PREVIOUS_VERSION)
    after: list[inst.RukpakSystem] = []
    try:
        yield before, after
    finally:
        if after:
            before.kube.close()
        _teardown(after[0] if after else before, helm)


@pytest.mark.cluster
@pytest.mark.slow
def test_upgrading_from_the_previous_release_keeps_every_bundledeployment(
    upgraded_system: Any, release_dist: Path, helm: str, tmp_path: Path
) -> None:
    before, after = upgraded_system
    namespace = "release-upgrade"
    bd = _deploy_hello(before, "hello-upgrade", namespace=namespace, root=tmp_path / "bundle")
    hello = ObjectRef("apps", "v1", "Deployment", namespace, "hello")
    conds = eventually(lambda: _installed(before, bd), timeout=240, what="installed before")
    was = {
        "bd": (before.kube.get(bd) or {})["metadata"]["uid"],
        "greeting": (before.kube.get(inst.greeting_ref(namespace)) or {})["metadata"],
        "hello": (before.kube.get(hello) or {})["metadata"],
        "template": (before.kube.get(hello) or {})["spec"]["template"],
        "bundles": sorted(before.kubectl("get", "bundles", "-o", "name").split()),
    }
    system, took = _helm_release(
        before.cluster, helm, release_dist, tmp_path / "new", version=VERSION, upgrade=True
    )
    after.append(system)
    print(f"\nhelm upgrade {PREVIOUS_VERSION} -> {VERSION}: all rollouts Ready in {took:.1f}s")
    assert before.image != system.image  # a different image: the pods were replaced
    pods = json.loads(
        system.kubectl(
            "get",
            "pods",
            "-n",
            inst.NAMESPACE,
            "-l",
            f"app.kubernetes.io/name={inst.MANAGER}",
            "-o",
            "json",
        )
    )
    assert {c["image"] for p in pods["items"] for c in p["spec"]["containers"]} == {system.image}
    # the new managers have the BundleDeployment settled, and nothing was reinstalled
    later = eventually(lambda: _installed(system, bd), timeout=120, what="installed after")
    assert later["Installed"]["lastTransitionTime"] == conds["Installed"]["lastTransitionTime"], (
        "Installed changed status across the upgrade",
        conds["Installed"],
        later["Installed"],
        _manager_log(system),
    )
    assert (system.kube.get(bd) or {})["metadata"]["uid"] == was["bd"]
    # the one change the upgrade makes: upstream's owner-kind label, added by a patch on the
    # new managers' first pass (which may come after the condition above is read)
    added = {"core.rukpak.io/owner-kind": "BundleDeployment"}

    def relabelled() -> dict[str, Any] | None:
        meta = (system.kube.get(inst.greeting_ref(namespace)) or {}).get("metadata") or {}
        return meta if (meta.get("labels") or {}).items() >= added.items() else None

    greeting = eventually(relabelled, timeout=120, what="owner-kind label added")
    assert greeting["uid"] == was["greeting"]["uid"], "re-created, not kept"
    assert greeting.get("labels") == {**(was["greeting"].get("labels") or {}), **added}
    deployment = system.kube.get(hello) or {}  # kept, and its pods not rolled
    assert deployment["metadata"]["uid"] == was["hello"]["uid"]
    assert deployment["spec"]["template"] == was["template"], "the upgrade rolled the pods"
    assert sorted(system.kubectl("get", "bundles", "-o", "name").split()) == was["bundles"]
    assert inst.greeting(system, namespace) == "Hello from a RukPak bundle"
