"""The kind cluster for ``make kind-run``, its registries and its kubeconfig.

Where it sits: ``python -m tests.kind up|down|registry`` (``tests.kind.__main__``), which
``hack/run.sh`` calls with ``CLUSTER=kind``. ``up`` makes sure of the engine
(``tests.kind.engine``), the kind CLI (``hack/gotool.sh kind``) and the node image
(``tests.kind.nodeimage``), starts a registry container on kind's Docker network (Debian's
``docker-registry`` in an image made here) and creates the cluster ``rukpak``
(``$RUKPAK_KIND_NAME``; one node, ``disableDefaultCNI``: the node image carries its CNI
config; containerd pulls from the registry over plain HTTP), or reuses it when it exists.
With ``KIND_CLUSTER=name`` it uses that existing cluster instead (made with kind's own
node images): its nodes are told about the registry
(``/etc/containerd/certs.d/<host>/hosts.toml``, where kind's images look) and nothing
else of it is changed.

Addresses: registries listen inside their containers, on kind's network; this machine
reaches them over the bridge (as the nodes and, masqueraded by the CNI, the pods do).
Nothing is published on this machine but the API server's port, which kind publishes on
127.0.0.1.
"""

from __future__ import annotations

import functools
import json
import os
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from dataclasses import dataclass
from pathlib import Path

from tests.cluster import images
from tests.kind import capfilter, nodeimage, ociarchive
from tests.kind import engine as engines

REPO = Path(__file__).resolve().parents[2]
GOTOOL = REPO / "hack" / "gotool.sh"
NETWORK = "kind"
CLUSTER = os.environ.get("RUKPAK_KIND_NAME", "rukpak")
"""The cluster ``up`` makes (``RUKPAK_KIND_NAME``; the tests use their own)."""
REGISTRY = f"{CLUSTER}-registry"
"""Registry containers are named after it: ``<cluster>-registry`` and ``<...>-<suffix>``."""
REGISTRY_PORT = 5000
REGISTRY_CONFIG = b"""version: 0.1
storage:
  filesystem: {rootdirectory: /var/lib/registry}
  delete: {enabled: true}
http: {addr: "0.0.0.0:5000"}
"""


def log(message: str) -> None:
    print(f"kind: {message}", file=sys.stderr, flush=True)


@functools.cache
def kind_binary() -> str:
    subprocess.run(["bash", str(GOTOOL), "kind", "--quiet"], check=True)
    out = subprocess.run(
        ["bash", str(GOTOOL), "kind", "--print-path"], capture_output=True, text=True, check=True
    )
    return out.stdout.strip()


def _kind(*args: str, check: bool = True) -> subprocess.CompletedProcess[str]:
    done = subprocess.run([kind_binary(), *args], capture_output=True, text=True, check=False)
    if check and done.returncode != 0:
        raise RuntimeError(f"kind {' '.join(args)} failed ({done.returncode}):\n{done.stderr}")
    return done


def clusters() -> list[str]:
    return _kind("get", "clusters").stdout.split()


def registry_image(engine: engines.Engine) -> str:
    """Debian's ``docker-registry`` and its libraries, imported as a one-layer image."""
    binary = Path("/usr/bin/docker-registry")
    with tempfile.TemporaryDirectory() as work:
        config = Path(work) / "config.yml"
        config.write_bytes(REGISTRY_CONFIG)
        layer = ociarchive.layer(
            {"/usr/local/bin/docker-registry": binary, "/etc/docker/registry/config.yml": config},
            extra=["/var/lib/registry"],
        )
    tag = f"{REGISTRY}:{images._digest(layer).partition(':')[2][:12]}"
    if engine.run("image", "inspect", tag, check=False).returncode != 0:
        engine.run(
            "import",
            "--change", 'ENTRYPOINT ["/usr/local/bin/docker-registry", "serve", '
            '"/etc/docker/registry/config.yml"]',
            "-", tag,
            stdin=layer,
        )  # fmt: skip
    return tag


def ensure_network(engine: engines.Engine) -> None:
    if engine.run("network", "inspect", NETWORK, check=False).returncode != 0:
        engine.run("network", "create", "--driver", "bridge", NETWORK)


def address(engine: engines.Engine, container: str) -> str:
    ip = engine.text(
        "inspect", "-f", f'{{{{(index .NetworkSettings.Networks "{NETWORK}").IPAddress}}}}',
        container,
    )  # fmt: skip
    if not ip:
        raise RuntimeError(f"container {container} has no address on network {NETWORK}")
    return f"{ip}:{REGISTRY_PORT}"


def start_registry(engine: engines.Engine, name: str = REGISTRY) -> str:
    """A registry container ``name`` on kind's network (started, or kept); its host:port."""
    ensure_network(engine)
    state = engine.run("inspect", "-f", "{{.State.Running}}", name, check=False)
    if state.returncode != 0:
        engine.run("run", "-d", "--name", name, "--network", NETWORK, registry_image(engine))
    elif state.stdout.decode().strip() != "true":
        engine.run("start", name)
    where = address(engine, name)
    wait_serving(where, name)
    return where


def wait_serving(where: str, container: str, *, timeout: float = 30.0) -> None:
    """Return once the registry at ``where`` answers ``GET /v2/``: a container just started
    is running before its registry listens. RuntimeError after ``timeout`` seconds."""
    opener = urllib.request.build_opener(urllib.request.ProxyHandler({}))
    deadline = time.monotonic() + timeout
    while True:
        try:
            with opener.open(f"http://{where}/v2/", timeout=2):
                return
        except urllib.error.HTTPError:
            return  # an answer all the same (401 from a registry that wants a login)
        except OSError as exc:
            if time.monotonic() > deadline:
                raise RuntimeError(
                    f"registry container {container} does not answer at {where} after "
                    f"{timeout:.0f} s ({exc}); see its log: docker logs {container}"
                ) from None
            time.sleep(0.1)


def stop_registry(engine: engines.Engine, name: str) -> None:
    engine.run("rm", "-f", name, check=False)


def config(node_image: str, registry: str) -> str:
    mirror = (
        f'[plugins."io.containerd.grpc.v1.cri".registry.mirrors."{registry}"]\n'
        f'  endpoint = ["http://{registry}"]'
    )
    return json.dumps(
        {
            "kind": "Cluster",
            "apiVersion": "kind.x-k8s.io/v1alpha4",
            "name": CLUSTER,
            "networking": {"disableDefaultCNI": True},
            "nodes": [{"role": "control-plane", "image": node_image}],
            "containerdConfigPatches": [mirror, *_oom_patch()],
        },
        indent=1,
    )


def _oom_patch() -> list[str]:
    """Without CAP_SYS_RESOURCE (sandboxes) no process may lower its oom_score_adj, which
    kind's containerd config asks runc to do for every pod: keep it at containerd's own."""
    if "CAP_SYS_RESOURCE" not in capfilter.missing():
        return []
    return ['[plugins."io.containerd.grpc.v1.cri"]\n  restrict_oom_score_adj = true']


CERTS_D = "/etc/containerd/certs.d"
LOCAL_REGISTRY_PATCH = (
    f'[plugins."io.containerd.grpc.v1.cri".registry]\n  config_path = "{CERTS_D}"'
)
"""The containerd patch of kind's local-registry guide: the nodes read ``certs.d``."""


def trust_registry(engine: engines.Engine, cluster: str, registry: str) -> None:
    """Tell an existing cluster's nodes (kind's own images) to pull ``registry`` over HTTP;
    RuntimeError naming the fix when a node's containerd does not read ``certs.d``."""
    for node in _kind("get", "nodes", "--name", cluster).stdout.split():
        config = engine.run("exec", node, "cat", "/etc/containerd/config.toml", check=False)
        if CERTS_D.encode() not in config.stdout:
            raise RuntimeError(
                f"KIND_CLUSTER={cluster}: node {node}'s containerd does not read {CERTS_D}, "
                "so it cannot be told about the registry; create the cluster with kind's "
                "local-registry patch (containerdConfigPatches: "
                f"{LOCAL_REGISTRY_PATCH!r}), as https://kind.sigs.k8s.io/docs/user/"
                "local-registry/ shows"
            )
        hosts = f'server = "http://{registry}"\n[host."http://{registry}"]\n'
        engine.run(
            "exec", "-i", node, "sh", "-c",
            f"mkdir -p /etc/containerd/certs.d/{registry} && "
            f"cat > /etc/containerd/certs.d/{registry}/hosts.toml",
            stdin=hosts.encode(),
        )  # fmt: skip
        engine.run("network", "connect", NETWORK, node, check=False)


@dataclass(frozen=True)
class Up:
    name: str
    kubeconfig: Path
    registry: str
    busybox: str


def up(workdir: Path, *, existing: str = "") -> Up:
    """The cluster, up (see the module docstring)."""
    engine = engines.ensure()
    registry = start_registry(engine)
    busybox = images.push(
        f"http://{registry}", "rukpak-kind/busybox", "1.35", images.busybox_image()
    )
    workdir.mkdir(parents=True, exist_ok=True)
    kubeconfig = workdir / "kubeconfig"
    name = existing or CLUSTER
    if existing:
        if existing not in clusters():
            raise RuntimeError(f"KIND_CLUSTER={existing}: kind has no such cluster ({clusters()})")
        trust_registry(engine, existing, registry)
    elif CLUSTER not in clusters():
        node_image = nodeimage.ensure(engine)
        path = workdir / "kind-config.json"
        path.write_text(config(node_image, registry))
        log(f"kind create cluster --name {CLUSTER} --image {node_image}")
        done = subprocess.run(
            [kind_binary(), "create", "cluster", "--config", str(path), "--wait", "120s"],
            check=False,
        )
        if done.returncode != 0:
            raise RuntimeError(f"kind create cluster failed ({done.returncode}); see above")
    kubeconfig.write_text(_kind("get", "kubeconfig", "--name", name).stdout)
    return Up(name, kubeconfig, registry, busybox)


def down(*, stop_engine: bool = True) -> None:
    """Delete the cluster and the registries; stop a ``dockerd`` started by ``up``."""
    docker = engines.client()
    if docker is None or not engines.answers(docker):
        log("no Docker engine answers: nothing to delete")
        return
    engine = engines.Engine(docker, started_here=False)
    if CLUSTER in clusters():
        _kind("delete", "cluster", "--name", CLUSTER)
    for name in engine.text("ps", "-a", "--format", "{{.Names}}").split():
        if name.startswith(REGISTRY):
            stop_registry(engine, name)
    if stop_engine and engines.ours() is not None:
        engine.run("network", "rm", NETWORK, check=False)  # its bridge outlives dockerd
    if stop_engine and engines.stop():
        log("stopped the dockerd started for kind")
