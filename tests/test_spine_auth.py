"""Revoked credentials: a cached private image is refused in both publish modes.

Issue 18, item 1: after the registry revoked a password, FUSE mode still served a
cached private image to a publish with that password and to one with
``pullPolicy: Never`` for about a minute, whatever ``--private-image-auth-ttl``
said; bind mode refused both once the TTL passed. Both now ask one rule,
``rukpak.image.grants``, with the plugin's TTL. Against the token-auth registry; the
revoked user is this test's own, so the session's registry stays as it was.
"""

from __future__ import annotations

import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from rukpak.common import errors
from rukpak.image.grants import Grants
from rukpak.image.seams import PullPolicy
from rukpak.image.settings import CacheSettings
from rukpak.oci.auth import Credentials
from tests.csi_helpers import dockerconfig, push_image
from tests.registry import RegistryServer
from tests.spine_helpers import MODES, Node, registry_client

pytestmark = [pytest.mark.registry]

TTL = 0.5
REFUSED = (errors.Unauthenticated, errors.PermissionDenied)


def credentials(registry: RegistryServer, user: str, password: str) -> Credentials:
    return Credentials.from_dockerconfigjson(
        dockerconfig(registry.host, user, password)[".dockerconfigjson"]
    )


@pytest.fixture
def revocable(token_registry: RegistryServer) -> Iterator[tuple[str, Credentials]]:
    """A user of the token registry that the test may revoke (removed afterwards)."""
    issuer = token_registry.token_issuer
    assert issuer is not None
    user, password = f"u{secrets.token_hex(4)}", secrets.token_hex(8)
    issuer.users[user] = password
    try:
        yield user, credentials(token_registry, user, password)
    finally:
        issuer.users.pop(user, None)


@pytest.mark.parametrize("mode", MODES)
def test_a_revoked_password_is_refused_once_the_ttl_passed(
    tmp_path: Path,
    token_registry: RegistryServer,
    revocable: tuple[str, Credentials],
    mode: str,
) -> None:
    assert token_registry.username and token_registry.password and token_registry.token_issuer
    owner = credentials(token_registry, token_registry.username, token_registry.password)
    repo = f"spine/private-{mode}-{secrets.token_hex(3)}"
    image = push_image(
        token_registry.host, repo, "v1", [[("secret.txt", "file", b"s")]], credentials=owner
    )
    user, creds = revocable
    node = Node(mode, tmp_path, auth_ttl=TTL)
    assert node.publish_image(image.ref, credentials=creds) == {"secret.txt": "file:s"}
    # Still valid: served from the cache, for both policies.
    for policy in (PullPolicy.IF_NOT_PRESENT, PullPolicy.NEVER):
        assert node.publish_image(image.ref, credentials=creds, policy=policy)

    del token_registry.token_issuer.users[user]  # the registry revokes the password
    time.sleep(TTL + 0.2)
    for policy in (PullPolicy.IF_NOT_PRESENT, PullPolicy.NEVER):
        with pytest.raises(REFUSED, match="private"):
            node.publish_image(image.ref, credentials=creds, policy=policy)
    # The owner's credentials still read it.
    assert node.publish_image(image.ref, credentials=owner) == {"secret.txt": "file:s"}


def test_fuse_mode_can_share_bind_modes_grants(tmp_path: Path) -> None:
    from csi.fuse.images import FuseImages

    grants = Grants(registry_client, ttl=TTL)
    fuse = FuseImages(tmp_path, puller_factory=registry_client, shared_grants=grants)
    assert fuse.grants is grants
    own = FuseImages(
        tmp_path / "b", puller_factory=registry_client, settings=CacheSettings(auth_ttl=7)
    )
    assert own.grants.ttl == 7
