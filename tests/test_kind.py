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
import re
import subprocess
import sys
import tarfile
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from tests.kind import capfilter, ociarchive
from tests.registry import free_port

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


class _Registry401(BaseHTTPRequestHandler):
    """Answers as a registry that wants a login, and remembers the paths asked."""

    asked: list[str] = []

    def do_GET(self) -> None:
        self.asked.append(self.path)
        self.send_response(401)
        self.send_header("Content-Length", "0")
        self.end_headers()

    def log_message(self, *args: object) -> None:
        return None


def test_a_registry_container_is_waited_for_until_it_answers() -> None:
    """``start_registry`` returns once the registry listens, not when its container runs
    (a push right after met "connection refused" once)."""
    from tests.kind import cluster

    port = free_port()
    listening: list[ThreadingHTTPServer] = []

    def listen_late() -> None:
        time.sleep(0.3)  # the container's process starting
        server = ThreadingHTTPServer(("127.0.0.1", port), _Registry401)
        listening.append(server)
        server.serve_forever()

    thread = threading.Thread(target=listen_late, daemon=True)
    thread.start()
    try:
        cluster.wait_serving(f"127.0.0.1:{port}", "kind-registry", timeout=30)
        assert listening, "returned before the registry listened"
        assert "/v2/" in _Registry401.asked
    finally:
        thread.join(5)
        for server in listening:
            server.shutdown()
            server.server_close()


def test_a_registry_that_never_answers_is_named_with_where_to_look() -> None:
    from tests.kind import cluster

    port = free_port()  # nothing listens there
    with pytest.raises(RuntimeError) as raised:
        cluster.wait_serving(f"127.0.0.1:{port}", "kind-registry", timeout=0.5)
    message = str(raised.value)
    assert f"kind-registry does not answer at 127.0.0.1:{port}" in message
    assert "docker logs kind-registry" in message


@pytest.fixture(scope="module")
def engine() -> object:
    from tests.kind import engine as engines

    try:
        return engines.ensure()
    except engines.EngineUnavailable as exc:
        pytest.skip(f"kind needs a container engine, and none runs here: {exc}")


DOWN_KEEPING_THE_ENGINE = "from tests.kind import cluster; cluster.down(stop_engine=False)"
STEPS = (
    "A pod reads the bundle through an inline CSI volume",
    "A failing upgrade rolled back without a pod, the registry stopped",
    "Deleting the BundleDeployment: what it installed goes too",
)


def python(args: list[str], env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """This interpreter with ``args`` in the repository, output captured (10 minutes)."""
    return subprocess.run(
        [sys.executable, *args],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
        check=False,
    )


def run_demo(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    """``make kind-run``'s script with ``env``; asserts it ended well and showed every step."""
    env = {**env, "CLUSTER": "kind", "VENV": str(Path(sys.executable).parent.parent)}
    env.pop("KUBECONFIG", None)
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
    for step in STEPS:
        assert step in done.stdout
    assert "Total " in done.stdout
    return done


@pytest.mark.kind
@pytest.mark.slow
def test_kind_run_uses_a_users_own_cluster_named_by_kind_cluster(
    engine: object, tmp_path: Path
) -> None:
    """``KIND_CLUSTER=name``: a cluster the user made with kind's CLI (kind's local-registry
    patch, no registry of ours in its config) is told about the registry and gets the
    whole demonstration; a cluster without the patch is refused naming it. Runs before the
    test below, whose ``kind-down`` stops an engine started here."""
    from tests.kind import cluster, nodeimage
    from tests.kind import engine as engines

    assert isinstance(engine, engines.Engine)
    own = f"{NAME}-own"
    config = tmp_path / "kind.json"
    patches = [cluster.LOCAL_REGISTRY_PATCH, *cluster._oom_patch()]
    config.write_text(
        json.dumps(
            {
                "kind": "Cluster",
                "apiVersion": "kind.x-k8s.io/v1alpha4",
                "networking": {"disableDefaultCNI": True},  # the node image brings its CNI
                "containerdConfigPatches": patches,
            }
        )
    )
    env = {**os.environ, "RUKPAK_KIND_NAME": NAME, "KIND_CLUSTER": own}
    create = [cluster.kind_binary(), "create", "cluster", "--name", own, "--wait", "120s"]
    create += ["--image", nodeimage.ensure(engine), "--config", str(config)]
    try:
        made = subprocess.run(create, capture_output=True, text=True, timeout=600, check=False)
        assert made.returncode == 0, made.stderr[-3000:]
        done = run_demo(env)
        assert f"the kind cluster {own} (a node image built here" in done.stdout
        registry = re.search(rf"cluster: {own}; registry: (\S+)", done.stdout)
        assert registry is not None, done.stdout[:3000]
        (node,) = cluster._kind("get", "nodes", "--name", own).stdout.split()
        hosts = engine.text("exec", node, "cat", f"{cluster.CERTS_D}/{registry[1]}/hosts.toml")
        assert f'server = "http://{registry[1]}"' in hosts
        # the same cluster, its containerd no longer reading certs.d: refused, naming the fix
        config_toml = "/etc/containerd/config.toml"
        engine.run("exec", node, "sed", "-i", f"s#{cluster.CERTS_D}#/nowhere#", config_toml)
        refused = python(["-m", "tests.kind", "up", "--dir", str(tmp_path / "again")], env)
        assert refused.returncode != 0
        assert f"KIND_CLUSTER={own}: node {node}'s containerd does not read" in refused.stderr
        assert "local-registry" in refused.stderr
    finally:
        subprocess.run(
            [cluster.kind_binary(), "delete", "cluster", "--name", own],
            capture_output=True,
            timeout=300,
            check=False,
        )
        # its registries, not the engine (the next test uses it)
        cleaned = python(["-c", DOWN_KEEPING_THE_ENGINE], env)
    assert cleaned.returncode == 0, cleaned.stderr
    assert own not in cluster.clusters()


@pytest.mark.kind
@pytest.mark.slow
def test_make_kind_run_shows_what_make_run_shows_and_kind_down_removes_it(engine: object) -> None:
    env = {**os.environ, "RUKPAK_KIND_NAME": NAME}
    env.pop("KIND_CLUSTER", None)
    try:
        done = run_demo(env)
        assert f"the kind cluster {NAME} (a node image built here" in done.stdout
    finally:
        down = python(["-m", "tests.kind", "down"], env)
    assert down.returncode == 0, down.stderr
    from tests.kind import cluster
    from tests.kind import engine as engines

    docker = engines.client()
    if docker is not None and engines.answers(docker):  # the user's engine: still running
        assert NAME not in cluster.clusters()
    else:  # the engine started for the test: the cluster went first, then the engine
        assert "stopped the dockerd started for kind" in down.stderr
