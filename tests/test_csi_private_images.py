"""Private images the node already holds are served only to pods that may read them.

The attack (issue 10, item 1): pod A publishes a private image with valid
credentials; pods B.. then publish the same reference with no secret, a wrong
password or ``pullPolicy: Never`` and used to get A's cached tree. Over the
plugin's socket, against the token-auth registry (two users with pull rights).
"""

from __future__ import annotations

from pathlib import Path

import grpc
import pytest

from csi.proto import csi_pb2_grpc
from tests.csi_helpers import (
    PluginProcess,
    PushedImage,
    code_of,
    dockerconfig,
    node_fixture,
    plugin_fixture,
    publish_request,
    simple_image,
    target,
    unique_private_image,
)
from tests.registry import READONLY_USER, RegistryServer

pytestmark = [pytest.mark.registry]

REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


plugin = plugin_fixture("private")


node = node_fixture()


def owner_secret(registry: RegistryServer) -> dict[str, str]:
    assert registry.username and registry.password
    return dockerconfig(registry.host, registry.username, registry.password)


def reader_secret(registry: RegistryServer) -> dict[str, str]:
    assert registry.token_issuer is not None
    password = registry.token_issuer.users[READONLY_USER]
    return dockerconfig(registry.host, READONLY_USER, password)


@pytest.fixture
def cached_private(
    plugin: PluginProcess, node: csi_pb2_grpc.NodeStub, token_registry: RegistryServer
) -> PushedImage:
    """A private image, published once (so cached) by a pod with valid credentials."""
    secret, image = unique_private_image(token_registry, "private/app")
    path = target(plugin)
    node.NodePublishVolume(publish_request(path, image.ref, secrets=secret))
    assert (Path(path) / "secret.txt").read_bytes() == b"only for the owner"
    return image


@pytest.mark.parametrize(
    ("case", "attributes"),
    [
        ("no secret", {}),
        ("wrong password", {}),
        ("no secret", {"pullPolicy": "Never"}),
        ("wrong password", {"pullPolicy": "Never"}),
    ],
)
def test_cached_private_content_is_refused_without_valid_credentials(
    plugin: PluginProcess,
    node: csi_pb2_grpc.NodeStub,
    token_registry: RegistryServer,
    cached_private: PushedImage,
    case: str,
    attributes: dict[str, str],
) -> None:
    secret = {} if case == "no secret" else dockerconfig(token_registry.host, "rukpak", "wrong")
    path = target(plugin)
    request = publish_request(
        path, cached_private.ref, volume_id="other-pod", secrets=secret, **attributes
    )
    assert code_of(lambda: node.NodePublishVolume(request)) in REFUSED
    assert not Path(path).exists()


def test_two_pods_with_different_valid_credentials_are_both_served(
    plugin: PluginProcess,
    node: csi_pb2_grpc.NodeStub,
    token_registry: RegistryServer,
    cached_private: PushedImage,
) -> None:
    for n, secret in enumerate((reader_secret(token_registry), owner_secret(token_registry))):
        path = target(plugin)
        node.NodePublishVolume(
            publish_request(path, cached_private.ref, volume_id=f"pod-{n}", secrets=secret)
        )
        assert (Path(path) / "secret.txt").read_bytes() == b"only for the owner"


def test_a_valid_credential_is_checked_once_then_remembered(
    plugin: PluginProcess,
    node: csi_pb2_grpc.NodeStub,
    token_registry: RegistryServer,
    cached_private: PushedImage,
) -> None:
    repo = cached_private.ref.split("/", 1)[1].split(":")[0]
    heads = rf"^/v2/{repo}/manifests/sha256:"
    before = token_registry.count_requests("HEAD", heads)
    counts = []
    for n in range(3):
        secret = reader_secret(token_registry)
        node.NodePublishVolume(
            publish_request(target(plugin), cached_private.ref, volume_id=f"r-{n}", secrets=secret)
        )
        counts.append(token_registry.count_requests("HEAD", heads))
    # The first publish asks the registry (a challenge, then the authorised HEAD);
    # the next ones within the TTL ask nothing.
    assert counts[0] > before and counts[1] == counts[2] == counts[0]


def test_public_images_are_served_from_the_cache_without_asking_the_registry(
    plugin: PluginProcess, node: csi_pb2_grpc.NodeStub, registry: RegistryServer
) -> None:
    image = simple_image(registry.host, "public/app")
    node.NodePublishVolume(publish_request(target(plugin), image.ref))
    before = registry.count_requests("HEAD", r"^/v2/public/app/manifests/")
    path = target(plugin)
    node.NodePublishVolume(publish_request(path, image.ref, volume_id="b", pullPolicy="Never"))
    assert (Path(path) / "manifests/cm.yaml").exists()
    assert registry.count_requests("HEAD", r"^/v2/public/app/manifests/") == before
