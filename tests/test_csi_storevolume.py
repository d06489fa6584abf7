"""The store volume over the node plugin's real socket, against the real registries.

One plugin process, started with ``--store-volume-allow rukpak-system/provisioner``,
serves the module. A store volume is published as kubelet would (pod info in the
volume context); content is asked for through ``rukpak.sources.storeclient`` on the
socket the plugin serves inside the mounted target, and read at ``<target>/<digest>``.
Everything mounted is unmounted at the end (``running_plugin``).
"""

from __future__ import annotations

import contextlib
import hashlib
import itertools
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from csi.proto import csi_pb2, csi_pb2_grpc
from rukpak.common import errors
from rukpak.sources import storeprotocol as protocol
from rukpak.sources.storeclient import StoreClient
from tests.csi_helpers import (
    PluginProcess,
    PushedImage,
    assert_read_only,
    code_of,
    dockerconfig,
    mount_capability,
    node_fixture,
    push_image,
    running_plugin,
    simple_image,
    target,
    unique_private_image,
)
from tests.registry import READONLY_USER, RegistryServer
from tests.source_servers import PASSWORD, USERNAME, SourceServer, make_repo, serving, tarball

pytestmark = [pytest.mark.registry]

ALLOWED = ("rukpak-system", "provisioner")
_pods = itertools.count()


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PluginProcess]:
    workdir = tmp_path_factory.mktemp("storevol")
    with running_plugin(workdir, "--store-volume-allow", "/".join(ALLOWED)) as proc:
        yield proc


node = node_fixture()


def store_request(
    path: str, *, namespace: str = ALLOWED[0], account: str = ALLOWED[1], **extra: str
) -> csi_pb2.NodePublishVolumeRequest:
    n = next(_pods)
    context = {
        "kind": "store",
        "csi.storage.k8s.io/ephemeral": "true",
        "csi.storage.k8s.io/pod.namespace": namespace,
        "csi.storage.k8s.io/pod.name": f"provisioner-{n}",
        "csi.storage.k8s.io/pod.uid": f"uid-{n}",
        "csi.storage.k8s.io/serviceAccount.name": account,
        **extra,
    }
    return csi_pb2.NodePublishVolumeRequest(
        volume_id=f"store-{n}",
        target_path=path,
        volume_capability=mount_capability("SINGLE_NODE_WRITER"),
        volume_context=context,
    )


def pinned(image: PushedImage) -> str:
    return f"{image.ref.rsplit(':', 1)[0]}@{image.manifest_digest}"


class Store:
    """A published store volume and a client on its socket."""

    def __init__(self, node: csi_pb2_grpc.NodeStub, path: str) -> None:
        self.node = node
        self.request = store_request(path)
        node.NodePublishVolume(self.request)
        self.mount = Path(path)
        self.client = StoreClient(self.mount, timeout=60)

    def unpublish(self) -> None:
        self.client.close()
        self.node.NodeUnpublishVolume(
            csi_pb2.NodeUnpublishVolumeRequest(
                volume_id=self.request.volume_id, target_path=self.request.target_path
            )
        )


@pytest.fixture
def store(plugin: PluginProcess, node: csi_pb2_grpc.NodeStub) -> Iterator[Store]:
    published = Store(node, target(plugin))
    try:
        yield published
    finally:
        published.unpublish()


@pytest.fixture(scope="module")
def public_image(registry: RegistryServer) -> PushedImage:
    return simple_image(registry.host, "storevol/public", text="from the store")


@pytest.fixture
def private(token_registry: RegistryServer) -> tuple[str, PushedImage]:
    """A private image of its own (its own digest); the dockerconfigjson that reads it."""
    secret, image = unique_private_image(token_registry, "storevol/private")
    return secret[".dockerconfigjson"], image


def wrong_secret(registry: RegistryServer) -> str:
    return dockerconfig(registry.host, READONLY_USER, "not-the-password")[".dockerconfigjson"]


# --- publishing ---------------------------------------------------------------------


def test_an_allowed_pod_gets_an_empty_read_only_volume_with_the_request_socket(
    store: Store,
) -> None:
    assert sorted(os.listdir(store.mount)) == [protocol.SOCKET_NAME]
    assert_read_only(store.mount / "x")


def test_publishing_a_store_volume_twice_is_ok(store: Store) -> None:
    store.node.NodePublishVolume(store.request)
    assert (store.mount / protocol.SOCKET_NAME).exists()


@pytest.mark.parametrize(
    ("namespace", "account"), [("rukpak-system", "default"), ("tenant", "provisioner")]
)
def test_a_pod_not_on_the_allow_list_is_permission_denied(
    plugin: PluginProcess, node: csi_pb2_grpc.NodeStub, namespace: str, account: str
) -> None:
    path = target(plugin)
    request = store_request(path, namespace=namespace, account=account)
    with pytest.raises(grpc.RpcError) as info:
        node.NodePublishVolume(request)
    assert info.value.code() == grpc.StatusCode.PERMISSION_DENIED
    assert f"ServiceAccount {account}" in (info.value.details() or "")
    assert not Path(path).exists()


def test_a_request_without_pod_info_is_permission_denied(
    plugin: PluginProcess, node: csi_pb2_grpc.NodeStub
) -> None:
    request = store_request(target(plugin))
    del request.volume_context["csi.storage.k8s.io/serviceAccount.name"]
    assert code_of(lambda: node.NodePublishVolume(request)) == grpc.StatusCode.PERMISSION_DENIED


def test_a_store_volume_with_an_image_is_invalid(
    plugin: PluginProcess, node: csi_pb2_grpc.NodeStub
) -> None:
    request = store_request(target(plugin), image="quay.io/a/b:v1")
    assert code_of(lambda: node.NodePublishVolume(request)) == grpc.StatusCode.INVALID_ARGUMENT


# --- asking for content ---------------------------------------------------------------


def test_content_appears_by_digest_after_its_request(
    store: Store, public_image: PushedImage
) -> None:
    where = store.mount / public_image.manifest_digest
    assert not where.exists()
    path = store.client.fetch(pinned(public_image))
    assert path == where
    assert (path / "manifests" / "cm.yaml").read_text() == "from the store"
    assert_read_only(path / "manifests" / "new.yaml")
    assert store.client.fetch(pinned(public_image)) == where  # asking again is OK


def test_a_wrong_credential_for_a_private_image_is_refused_and_nothing_appears(
    store: Store, private: tuple[str, PushedImage], token_registry: RegistryServer
) -> None:
    good, image = private
    where = store.mount / image.manifest_digest
    with pytest.raises((errors.PermissionDenied, errors.Unauthenticated)):
        store.client.fetch(pinned(image), dockerconfigjson=wrong_secret(token_registry))
    with pytest.raises((errors.PermissionDenied, errors.Unauthenticated)):
        store.client.fetch(pinned(image))  # anonymous
    assert not where.exists()
    assert store.client.fetch(pinned(image), dockerconfigjson=good) == where
    assert (where / "secret.txt").read_bytes() == b"only for the owner"


def test_a_digest_cached_with_another_credential_is_checked_for_each_request(
    plugin: PluginProcess,
    node: csi_pb2_grpc.NodeStub,
    store: Store,
    private: tuple[str, PushedImage],
    token_registry: RegistryServer,
) -> None:
    good, image = private
    assert store.client.fetch(pinned(image), dockerconfigjson=good).is_dir()  # now cached
    other = Store(node, target(plugin))
    try:
        with pytest.raises((errors.PermissionDenied, errors.Unauthenticated)):
            other.client.fetch(pinned(image), dockerconfigjson=wrong_secret(token_registry))
        assert not (other.mount / image.manifest_digest).exists()
        # visible in the first volume, and still refused there for a wrong credential
        with pytest.raises((errors.PermissionDenied, errors.Unauthenticated)):
            store.client.fetch(pinned(image), dockerconfigjson=wrong_secret(token_registry))
        assert token_registry.token_issuer is not None
        reader = dockerconfig(
            token_registry.host, READONLY_USER, token_registry.token_issuer.users[READONLY_USER]
        )[".dockerconfigjson"]
        assert other.client.fetch(pinned(image), dockerconfigjson=reader).is_dir()
    finally:
        other.unpublish()


def test_a_digest_the_registry_does_not_have_is_a_clear_error(
    store: Store, public_image: PushedImage
) -> None:
    missing = pinned(public_image).rsplit("@", 1)[0] + "@sha256:" + "0" * 64
    with pytest.raises(errors.RukpakError) as info:
        store.client.fetch(missing)
    assert info.value.code in ("NOT_FOUND", "PERMISSION_DENIED")
    assert "0" * 64 in info.value.message
    assert sorted(os.listdir(store.mount)) == [protocol.SOCKET_NAME]


def test_retention_is_recorded_for_the_owner(
    plugin: PluginProcess, store: Store, public_image: PushedImage
) -> None:
    store.client.fetch(pinned(public_image), retain_for="bundledeployment/hello/uid-1", retain=[])
    assert "owner=bundledeployment/hello/uid-1" in plugin.log()


# --- content in a bundle volume's terms: images, git commits, http tarballs ------------


@pytest.fixture(scope="module")
def sources(tmp_path_factory: pytest.TempPathFactory) -> Iterator[SourceServer]:
    root = tmp_path_factory.mktemp("storevol-sources")
    with serving(root / "repos", auth=True) as server:
        yield server


def test_an_image_asked_in_a_volumes_terms_appears_by_digest_with_its_secret(
    store: Store, private: tuple[str, PushedImage], token_registry: RegistryServer
) -> None:
    good, image = private
    attributes = {"image": pinned(image), "pullPolicy": "IfNotPresent"}
    with pytest.raises((errors.PermissionDenied, errors.Unauthenticated)):
        store.client.fetch_volume(attributes, {".dockerconfigjson": wrong_secret(token_registry)})
    assert not (store.mount / image.manifest_digest).exists()
    path = store.client.fetch_volume(attributes, {".dockerconfigjson": good})
    assert path == store.mount / image.manifest_digest
    assert (path / "secret.txt").read_bytes() == b"only for the owner"


def test_a_git_commit_appears_under_its_key_only_for_the_credential_that_fetched_it(
    store: Store, sources: SourceServer
) -> None:
    commit = make_repo(
        sources.git_root / "storevol-git",
        {"bundle/manifests/cm.yaml": "kind: ConfigMap\n", "README": "not in the directory"},
    )
    attributes = {
        "git": sources.repo_url("storevol-git"),
        "commit": commit,
        "directory": "bundle",
        "retainFor": "bundledeployment/git/uid-1",
        "retain": f"git+{sources.repo_url('storevol-git')}@{commit}:bundle",
    }
    auth = {"username": USERNAME, "password": PASSWORD}
    with pytest.raises(errors.RukpakError) as refused:
        store.client.fetch_volume(attributes, {"username": USERNAME, "password": "wrong"})
    assert refused.value.code in ("PERMISSION_DENIED", "UNAUTHENTICATED")
    path = store.client.fetch_volume(attributes, auth)
    assert (path / "manifests" / "cm.yaml").read_text() == "kind: ConfigMap\n"
    assert not (path / "README").exists()
    assert_read_only(path / "manifests" / "new.yaml")
    assert store.client.fetch_volume(attributes, auth) == path  # asking again is OK
    visible = set(os.listdir(store.mount))
    with pytest.raises(errors.RukpakError):  # the tree fetched with auth is not lent out
        store.client.fetch_volume(attributes, {})
    assert set(os.listdir(store.mount)) == visible


def test_an_http_tarball_pinned_by_digest_appears_and_other_bytes_are_refused(
    store: Store, sources: SourceServer
) -> None:
    data = tarball({"manifests/cm.yaml": "from http\n"})
    sources.files["bundle.tgz"] = data
    digest = "sha256:" + hashlib.sha256(data).hexdigest()
    attributes = {"url": f"{sources.url}/files/bundle.tgz", "digest": digest}
    auth = {"username": USERNAME, "password": PASSWORD}
    path = store.client.fetch_volume(attributes, auth)
    assert (path / "manifests" / "cm.yaml").read_text() == "from http\n"
    sources.files["moved.tgz"] = tarball({"manifests/cm.yaml": "other bytes\n"})
    moved = {"url": f"{sources.url}/files/moved.tgz", "digest": digest}
    with pytest.raises(errors.RukpakError) as info:
        store.client.fetch_volume(moved, auth)
    assert info.value.code in ("DATA_LOSS", "FAILED_PRECONDITION", "INVALID_ARGUMENT")
    assert "sha256" in info.value.message


SHA = "sha256:" + "a" * 64
PINNED_ELSEWHERE = f"registry.example.com/a@{SHA}"


@pytest.mark.parametrize(
    ("doc", "words"),
    [
        ({"volumeAttributes": {"image": "registry.example.com/a:v1"}}, "not pinned by digest"),
        ({"volumeAttributes": {"kind": "store"}}, "not another store"),
        ({"volumeAttributes": {"image": PINNED_ELSEWHERE, "publishMode": "fuse"}}, "bind mounts"),
        (
            {"volumeAttributes": {"csi.storage.k8s.io/pod.name": "someone", "image": "x"}},
            "kubelet's to set",
        ),
        ({"volumeAttributes": {"git": "https://g.example/r", "commit": "main"}}, "40-character"),
        ({"volumeAttributes": {"url": "file:///etc/passwd", "digest": SHA}}, "url"),
        ({"volumeAttributes": {"image": "x"}, "ref": "y"}, "do not go with"),
        ({"volumeAttributes": ["image"]}, "must map strings to strings"),
        ({"volumeAttributes": {"image": "x"}, "secrets": {"k": 1}}, "must map strings to strings"),
        ({"secrets": {}}, "goes with 'volumeAttributes'"),
    ],
    ids=[
        "tag", "store", "fuse", "kubelet-keys", "branch", "file-url", "mixed", "list",
        "secret-type", "secrets-alone",
    ],
)  # fmt: skip
def test_a_hostile_volume_request_is_refused_by_name_and_nothing_appears(
    store: Store, doc: dict[str, object], words: str
) -> None:
    answer = _raw_answer(store.mount, json.dumps(doc).encode() + b"\n")
    assert (answer.ok, answer.code) == (False, "INVALID_ARGUMENT")
    assert words.lower() in answer.message.lower()
    assert sorted(os.listdir(store.mount)) == [protocol.SOCKET_NAME]


# --- hostile input ---------------------------------------------------------------------


def _raw_answer(mount: Path, payload: bytes) -> protocol.StoreAnswer:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(30)
        sock.connect(str(mount / protocol.SOCKET_NAME))
        with contextlib.suppress(OSError):  # closed after the first line was too long
            sock.sendall(payload)
        data = b""
        while not data.endswith(b"\n"):
            chunk = sock.recv(1)
            if not chunk:
                break
            data += chunk
    return protocol.parse_answer(data)


@pytest.mark.parametrize(
    "payload",
    [
        b"\x00\x01garbage\n",
        b'{"ref": "registry.example.com/a@sha256:../../../etc"}\n',
        b'{"ref": "registry.example.com/a:latest"}\n',
        b'{"ref": "registry.example.com/a@sha256:' + b"a" * 64 + b'", "path": "/"}\n',
        b"y" * (protocol.MAX_LINE + 10) + b"\n",
    ],
    ids=["garbage", "traversal", "tag", "unknown-field", "huge-line"],
)
def test_hostile_input_is_answered_and_the_plugin_keeps_serving(
    store: Store, public_image: PushedImage, payload: bytes
) -> None:
    answer = _raw_answer(store.mount, payload)
    assert (answer.ok, answer.code) == (False, "INVALID_ARGUMENT")
    assert sorted(os.listdir(store.mount)) == [protocol.SOCKET_NAME]
    assert store.client.fetch(pinned(public_image)).is_dir()


def test_a_loop_of_many_requests_is_served_in_bounded_time(
    store: Store, public_image: PushedImage
) -> None:
    store.client.fetch(pinned(public_image))
    started = time.monotonic()
    for _ in range(500):
        store.client.fetch(pinned(public_image))
    elapsed = time.monotonic() - started
    assert elapsed < 30, f"500 requests for a visible digest took {elapsed:.1f} s"
    assert sorted(os.listdir(store.mount)) == sorted(
        [protocol.SOCKET_NAME, public_image.manifest_digest]
    )


# --- unpublishing and restarts ---------------------------------------------------------


def test_unpublish_unmounts_every_digest_and_the_socket(
    plugin: PluginProcess, node: csi_pb2_grpc.NodeStub, public_image: PushedImage
) -> None:
    published = Store(node, target(plugin))
    tree = published.client.fetch(pinned(public_image))
    published.unpublish()
    published.unpublish()  # again: OK
    assert not published.mount.exists()
    assert not tree.exists()
    store_root = plugin.kubelet_dir / "plugins" / "csi.rukpak.io" / "store"
    assert [p for p in store_root.iterdir() if p.suffix != ".json"] == []
    mounts = Path("/proc/self/mountinfo").read_text()
    assert str(store_root) not in mounts


def test_a_restarted_plugin_serves_the_store_volumes_it_finds(
    tmp_path: Path, registry: RegistryServer, public_image: PushedImage
) -> None:
    allow = ("--store-volume-allow", "/".join(ALLOWED))
    with running_plugin(tmp_path, *allow) as first:
        with grpc.insecure_channel(f"unix://{first.socket}") as channel:
            published = Store(csi_pb2_grpc.NodeStub(channel), target(first))
            published.client.fetch(pinned(public_image))
        first.stop()
        first.start()
        assert published.client.fetch(pinned(public_image)).is_dir()  # reconnects
        with grpc.insecure_channel(f"unix://{first.socket}") as channel:
            published.node = csi_pb2_grpc.NodeStub(channel)
            published.unpublish()
        assert not published.mount.exists()


def test_credentials_never_reach_the_plugin_log(
    plugin: PluginProcess,
    store: Store,
    private: tuple[str, PushedImage],
    token_registry: RegistryServer,
) -> None:
    good, image = private
    store.client.fetch(pinned(image), dockerconfigjson=good)
    with pytest.raises((errors.PermissionDenied, errors.Unauthenticated)):
        store.client.fetch(pinned(image), username=READONLY_USER, password="hunter2-wrong")
    log = plugin.log()
    assert "store volume request refused" in log and "store volume request served" in log
    assert token_registry.password and token_registry.password not in log
    assert "hunter2-wrong" not in log
    assert json.loads(good)["auths"][token_registry.host]["auth"] not in log


def test_an_out_of_tree_provisioner_reads_through_the_store_volume_with_no_pull_of_its_own(
    store: Store, registry: RegistryServer, tmp_path: Path
) -> None:
    """The standing pattern of ``provisioner.api`` (``open_store``, ``pin_image``), as the
    helm provisioner uses it with ``--store-dir``: a tag is pinned, the content comes from
    the node plugin by digest, and nothing lands in the provisioner's own cache."""
    from rukpak_helm import content

    from provisioner import api

    image = push_image(
        registry.host, "store/helm", "v1",
        [[("manifests/", "dir"), ("manifests/cm.yaml", "file", b"served by the node")]],
    )  # fmt: skip
    cache = tmp_path / "helm-cache"
    helm_store = content.Store(cache, node_store=store.mount)
    try:
        got, root = helm_store.fetch(image.ref)
        assert got == api.pin_image(image.ref) == pinned(image)
        assert root == store.mount / image.manifest_digest
        assert (root / "manifests" / "cm.yaml").read_bytes() == b"served by the node"
        assert list(cache.iterdir()) == []  # no pull, no copy of its own
    finally:
        helm_store.close()
    client = api.open_store(store.mount)
    try:
        with pytest.raises(errors.RukpakError) as refused:
            client.fetch(f"{registry.host}/store/helm@sha256:{'0' * 64}")
        assert refused.value.code in ("NOT_FOUND", "PERMISSION_DENIED")
        assert "0" * 64 in refused.value.message
    finally:
        client.close()
