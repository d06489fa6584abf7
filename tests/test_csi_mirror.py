"""The registry mirror (``csi.mirror``) and the client that uses it
(``RegistryClient(mirrors=...)``), against real docker-registry processes: each digest is
fetched from the registry once however many pull at once, content is verified on both
sides, a mirror that fails or lies costs a fallback to the registry, and the mirror is no
open proxy and holds no private content."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
import requests

from csi.mirror import __main__ as mirror_main
from csi.mirror.server import Mirror, serve
from csi.plugin import main as plugin_main
from rukpak.oci.auth import Credentials
from rukpak.oci.client import RegistryClient
from rukpak.oci.reference import Reference
from tests import csi_helpers
from tests import install_helpers as inst
from tests.registry import RegistryServer

pytestmark = pytest.mark.registry


class Running:
    def __init__(self, mirror: Mirror) -> None:
        self.mirror = mirror
        self.server = serve(mirror, ("127.0.0.1", 0))
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)
        self.thread.start()

    @property
    def host(self) -> str:
        return f"127.0.0.1:{self.server.server_port}"

    def stop(self) -> None:
        self.server.shutdown()
        self.server.server_close()
        self.thread.join(timeout=10)
        self.mirror.close()


StartMirror = Callable[..., Running]


@pytest.fixture
def mirror_of(tmp_path: Path) -> Iterator[StartMirror]:
    started: list[Running] = []

    def start(*upstreams: str, max_bytes: int = 1 << 30) -> Running:
        running = Running(
            Mirror(tmp_path / f"m{len(started)}", upstreams=upstreams, max_bytes=max_bytes)
        )
        started.append(running)
        return running

    yield start
    for running in started:
        running.stop()


def push(registry: RegistryServer, size: int = 64 * 1024) -> csi_helpers.PushedImage:
    data = os.urandom(size)  # no compression shrinks it
    layer: list[csi_helpers.Entry] = [("manifests/", "dir"), ("manifests/blob.bin", "file", data)]
    return csi_helpers.push_image(registry.host, f"mirror-{uuid.uuid4().hex[:6]}", "v1", [layer])


def pull(client: RegistryClient, ref: str, dest: Path) -> None:
    """Everything a node plugin fetches for a pinned image: the manifest, then each blob."""
    dest.mkdir(parents=True, exist_ok=True)
    pinned = Reference.parse(ref)
    _, manifest = client.resolve_image(pinned)
    for blob in [manifest.config, *manifest.layers]:
        client.fetch_blob(pinned, blob, dest / blob.digest.replace(":", "-"))


def blob_gets(registry: RegistryServer, image: csi_helpers.PushedImage) -> int:
    return sum(registry.count_requests("GET", f"/blobs/{digest}$") for digest in image.blob_digests)


def pinned(image: csi_helpers.PushedImage) -> str:
    return image.ref.rsplit(":", 1)[0] + "@" + image.manifest_digest


def test_nodes_pulling_at_once_cost_the_registry_one_fetch_per_blob(
    registry: RegistryServer, mirror_of: StartMirror, tmp_path: Path
) -> None:
    image = push(registry)
    mirror = mirror_of(registry.host)
    ref = pinned(image)

    def node(index: int) -> None:
        dest = tmp_path / f"node-{index}"
        with RegistryClient(mirrors={registry.host: mirror.host}) as client:
            pull(client, ref, dest)

    before = blob_gets(registry, image)
    with ThreadPoolExecutor(max_workers=6) as pool:
        list(pool.map(node, range(6)))
    assert blob_gets(registry, image) - before == len(image.blob_digests)  # one each, not six
    assert mirror.mirror.fetched == 1 + len(image.blob_digests)  # the manifest and the blobs
    for index in range(6):
        assert len(list((tmp_path / f"node-{index}").iterdir())) == len(image.blob_digests)


def test_blobs_of_an_image_named_by_tag_come_from_the_mirror_the_tag_from_the_registry(
    registry: RegistryServer, mirror_of: StartMirror, tmp_path: Path
) -> None:
    image = push(registry)
    mirror = mirror_of(registry.host)
    before = blob_gets(registry, image)
    for node in ("a", "b"):
        with RegistryClient(mirrors={registry.host: mirror.host}) as client:
            pull(client, image.ref, tmp_path / node)  # a tag: resolved by the registry
    assert blob_gets(registry, image) - before == len(image.blob_digests)  # once, by the mirror
    repo = Reference.parse(image.ref).repository
    assert registry.count_requests("GET", f"{repo}/manifests/v1$") >= 2


def test_a_mirror_that_is_down_or_lies_costs_a_fallback_to_the_registry(
    registry: RegistryServer, mirror_of: StartMirror, tmp_path: Path
) -> None:
    image = push(registry)
    ref = pinned(image)
    blobs = len(image.blob_digests)
    before = blob_gets(registry, image)
    with RegistryClient(mirrors={registry.host: "127.0.0.1:9"}, retries=0) as client:
        pull(client, ref, tmp_path / "a")  # nothing listens on port 9: the registry serves
    assert blob_gets(registry, image) - before == blobs
    liar = mirror_of(registry.host)
    with RegistryClient(mirrors={registry.host: liar.host}) as client:
        pull(client, ref, tmp_path / "b")  # fills the mirror's store
    assert blob_gets(registry, image) - before == 2 * blobs
    for digest in image.blob_digests:  # now its copy of every blob is corrupt
        stored = liar.mirror.store.path(digest)
        stored.chmod(0o600)
        stored.write_bytes(b"not the content")
    with RegistryClient(mirrors={registry.host: liar.host}) as client:
        pull(client, ref, tmp_path / "c")
    for digest in image.blob_digests:  # what the client kept is the real content
        kept = tmp_path / "c" / digest.replace(":", "-")
        assert kept.read_bytes() == (tmp_path / "a" / digest.replace(":", "-")).read_bytes()
    assert blob_gets(registry, image) - before == 3 * blobs  # the registry served c again


def test_the_mirror_is_no_open_proxy_and_serves_no_tags(
    registry: RegistryServer, mirror_of: StartMirror
) -> None:
    image = push(registry)
    mirror = mirror_of("registry.example:5000")  # not this registry
    repo = Reference.parse(image.ref).repository
    base = f"http://{mirror.host}/v2/{repo}"
    refused = requests.get(
        f"{base}/manifests/{image.manifest_digest}?ns={registry.host}", timeout=10
    )
    assert refused.status_code == 403 and "not an upstream" in refused.text
    allowed = mirror_of(registry.host)
    tag = requests.get(
        f"http://{allowed.host}/v2/{repo}/manifests/v1?ns={registry.host}", timeout=10
    )
    assert tag.status_code == 404 and "by digest" in tag.text
    assert requests.get(f"http://{allowed.host}/v2/", timeout=10).status_code == 200
    escape = requests.get(f"http://{allowed.host}/v2/../etc/passwd?ns={registry.host}", timeout=10)
    assert escape.status_code == 404
    assert allowed.mirror.fetched == mirror.mirror.fetched == 0


def test_private_content_goes_to_its_registry_only(
    auth_registry: RegistryServer, mirror_of: StartMirror, tmp_path: Path
) -> None:
    secret, image = csi_helpers.private_image(
        auth_registry, f"private-{uuid.uuid4().hex[:6]}",
        [("manifests/", "dir"), ("manifests/a.yaml", "file", b"kind: ConfigMap\n")],
    )  # fmt: skip
    mirror = mirror_of(auth_registry.host)
    repo = Reference.parse(image.ref).repository
    asked = requests.get(
        f"http://{mirror.host}/v2/{repo}/manifests/{image.manifest_digest}?ns={auth_registry.host}",
        timeout=10,
    )
    assert asked.status_code == 404  # the mirror has no login: it cannot fetch, nor leak
    creds = Credentials.from_dockerconfigjson(secret[".dockerconfigjson"])
    with RegistryClient(credentials=creds, mirrors={auth_registry.host: mirror.host}) as client:
        pull(client, pinned(image), tmp_path / "p")  # a client with a login skips the mirror
    assert mirror.mirror.fetched == 0


def test_the_store_keeps_to_its_budget_least_recently_served_first(
    registry: RegistryServer, mirror_of: StartMirror, tmp_path: Path
) -> None:
    first, second = push(registry, 256 * 1024), push(registry, 256 * 1024)
    mirror = mirror_of(registry.host, max_bytes=300 * 1024)
    with RegistryClient(mirrors={registry.host: mirror.host}) as client:
        pull(client, pinned(first), tmp_path / "a")
        pull(client, pinned(second), tmp_path / "b")
    store = mirror.mirror.store
    assert store.total_size() <= 300 * 1024
    layer_of = {image.manifest_digest: image.blob_digests[-1] for image in (first, second)}
    assert not store.has(layer_of[first.manifest_digest])  # served first: gone first
    assert store.has(layer_of[second.manifest_digest])


def test_the_mirror_process_serves_and_stops_on_sigterm(
    registry: RegistryServer, tmp_path: Path
) -> None:
    process = subprocess.Popen(
        [sys.executable, "-m", "csi.mirror", "--listen", "127.0.0.1:0", "--root",
         str(tmp_path / "store"), "--upstream", registry.host],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert process.stdout is not None
        address = process.stdout.readline().strip()
        assert address.startswith("127.0.0.1:") and not address.endswith(":0"), address
        image = push(registry)
        repo = Reference.parse(image.ref).repository
        url = f"http://{address}/v2/{repo}/manifests/{image.manifest_digest}?ns={registry.host}"
        served = requests.get(url, timeout=10)
        assert served.status_code == 200
        assert served.headers["Docker-Content-Digest"] == image.manifest_digest
    finally:
        process.terminate()
        assert process.wait(timeout=20) == 0


def test_a_plugin_flag_that_is_not_registry_equals_mirror_is_refused() -> None:
    parser = plugin_main.build_parser()
    args = parser.parse_args(["--registry-mirror", "registry.example.com=mirror.svc:5000"])
    assert args.registry_mirror == [("registry.example.com", "mirror.svc:5000")]
    for bad in ("registry.example.com", "=mirror:5000", "a/b=c", "reg="):
        with pytest.raises(SystemExit):
            parser.parse_args(["--registry-mirror", bad])


def test_the_deploy_component_points_every_node_plugin_at_the_mirror(tmp_path: Path) -> None:
    docs = inst.render_overlay(
        tmp_path,
        inst.DEPLOY / "components" / "registry-mirror",
        configMapGenerator=[
            {
                "name": "rukpak-registry-mirror",
                "namespace": "rukpak-system",
                "literals": ["upstream=registry.example.com"],
                "options": {"disableNameSuffixHash": True},
            }
        ],
    )
    plugin = docs[("DaemonSet", "rukpak-csi-node")]["spec"]["template"]["spec"]["containers"][0]
    mirror_at = "rukpak-registry-mirror.rukpak-system.svc:5000"
    assert f"--registry-mirror=$(RUKPAK_MIRROR_UPSTREAM)={mirror_at}" in plugin["args"]
    assert f"--insecure-registry={mirror_at}" in plugin["args"]
    assert any(e["name"] == "RUKPAK_MIRROR_UPSTREAM" for e in plugin["env"])
    mirror = docs[("Deployment", "rukpak-registry-mirror")]["spec"]["template"]["spec"]
    assert mirror["containers"][0]["command"][-2:] == ["-m", "csi.mirror"]
    assert mirror["containers"][0]["securityContext"]["readOnlyRootFilesystem"] is True
    assert docs[("Service", "rukpak-registry-mirror")]["spec"]["ports"][0]["port"] == 5000
    assert (
        docs[("ConfigMap", "rukpak-registry-mirror")]["data"]["upstream"] == "registry.example.com"
    )
    # the mirror's own flags parse as the Deployment gives them
    args = [
        a.replace("$(RUKPAK_MIRROR_UPSTREAM)", "registry.example.com")
        for a in mirror["containers"][0]["args"]
    ]
    parsed = mirror_main.build_parser().parse_args(args)
    assert parsed.upstream == ["registry.example.com"]
