"""Revoked credentials through the real plugin process, in both publish modes.

The core-level test (``tests/test_spine_auth.py``) shows both caches refuse a revoked
password once their TTL passed. Here the TTL comes from the plugin's
``--private-image-auth-ttl``, over its socket, against the token-auth registry,
with FUSE mode on (the /dev/fuse holder started by the test).
"""

from __future__ import annotations

import os
import secrets
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import pytest

from csi.proto import csi_pb2_grpc
from rukpak.oci.auth import Credentials
from tests.csi_helpers import (
    PluginProcess,
    code_of,
    dockerconfig,
    node_fixture,
    publish_request,
    push_image,
    target,
    terminate,
)
from tests.fuse_helpers import start_holder
from tests.registry import RegistryServer

pytestmark = [pytest.mark.registry]

TTL = 1.0
REFUSED = (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.PERMISSION_DENIED)


@pytest.fixture(scope="module")
def plugin(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PluginProcess]:
    if not os.path.exists("/dev/fuse"):
        pytest.fail("no /dev/fuse: FUSE mode needs the fuse kernel module (modprobe fuse)")
    workdir = tmp_path_factory.mktemp("spine-plugin")
    sock = workdir / "holder.sock"
    holder = start_holder(workdir / "fusemnt", sock)
    proc = PluginProcess(
        workdir / "plugin",
        extra_args=(
            "--fuse",
            "--fuse-holder-socket",
            str(sock),
            "--private-image-auth-ttl",
            str(TTL),
        ),
    )
    try:
        proc.start()
        yield proc
    finally:
        proc.stop()
        proc.unmount_all()
        terminate(holder)


node = node_fixture()


@pytest.mark.parametrize(
    "mode",
    ["bind", "fuse"],
)
def test_a_revoked_password_is_refused_after_the_plugins_ttl(
    plugin: PluginProcess,
    node: csi_pb2_grpc.NodeStub,
    token_registry: RegistryServer,
    mode: str,
) -> None:
    issuer = token_registry.token_issuer
    assert issuer is not None and token_registry.username and token_registry.password
    owner = dockerconfig(token_registry.host, token_registry.username, token_registry.password)
    image = push_image(
        token_registry.host,
        f"spine/plugin-{mode}-{secrets.token_hex(3)}",
        "v1",
        [[("secret.txt", "file", b"s")]],
        credentials=Credentials.from_dockerconfigjson(owner[".dockerconfigjson"]),
    )
    user, password = f"u{secrets.token_hex(4)}", secrets.token_hex(8)
    issuer.users[user] = password
    try:
        secret = dockerconfig(token_registry.host, user, password)
        path = target(plugin)
        node.NodePublishVolume(
            publish_request(path, image.ref, volume_id="a", secrets=secret, publishMode=mode)
        )
        assert (Path(path) / "secret.txt").read_bytes() == b"s"
        del issuer.users[user]  # the registry revokes the password
        time.sleep(TTL + 0.5)
        for policy in ("IfNotPresent", "Never"):
            request = publish_request(
                target(plugin),
                image.ref,
                volume_id=f"b-{policy}",
                secrets=secret,
                publishMode=mode,
                pullPolicy=policy,
            )
            assert code_of(lambda: node.NodePublishVolume(request)) in REFUSED  # noqa: B023
    finally:
        issuer.users.pop(user, None)
