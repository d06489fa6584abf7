"""The registry client against Debian's real docker-registry (no auth, basic, token).

Each test uses its own repository, so the session-wide registries can be shared.
"""

from __future__ import annotations

import base64
import http.server
import io
import json
import logging
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
import requests

from rukpak.common import errors
from rukpak.oci import auth, mediatypes
from rukpak.oci import client as client_module
from rukpak.oci import digest as digests
from rukpak.oci.client import RegistryClient
from rukpak.oci.manifest import Descriptor, Index, Manifest, Platform
from rukpak.oci.reference import Reference
from tests.httpreply import reply
from tests.registry import READONLY_USER, RegistryServer, free_port
from tests.source_servers import local_http

pytestmark = pytest.mark.registry


def repo_ref(server: RegistryServer, tag: str = "v1") -> Reference:
    return Reference.parse(f"{server.host}/test/{uuid.uuid4().hex[:12]}:{tag}")


@pytest.fixture
def ref(registry: RegistryServer) -> Reference:
    """A tag in a repository of its own in the test registry."""
    return repo_ref(registry)


def basic_client(server: RegistryServer, password: str | None = None) -> RegistryClient:
    assert server.username is not None and server.password is not None
    credential = auth.Credential(server.username, password or server.password)
    return RegistryClient(credentials=auth.Credentials({server.host: credential}), retries=1)


def push_image(
    client: RegistryClient,
    ref: Reference,
    layers: list[bytes],
    *,
    media_type: str = mediatypes.OCI_MANIFEST,
    push_as: Reference | None = None,
) -> tuple[str, Manifest]:
    docker = media_type == mediatypes.DOCKER_MANIFEST
    config = client.push_blob(
        ref, b"{}", media_type=mediatypes.DOCKER_CONFIG if docker else mediatypes.OCI_CONFIG
    )
    layer_type = mediatypes.DOCKER_LAYER_GZIP if docker else mediatypes.OCI_LAYER_TAR
    descs = [client.push_blob(ref, data, media_type=layer_type) for data in layers]
    manifest = Manifest(media_type, config, descs)
    digest = client.push_manifest(push_as or ref, manifest.to_json(), media_type)
    return digest, manifest


@pytest.fixture
def client() -> Iterator[RegistryClient]:
    with RegistryClient(retries=1) as c:
        yield c


# -- pushing and pulling ---------------------------------------------------


def test_a_pushed_blob_can_be_fetched_to_a_file(
    ref: Reference, client: RegistryClient, tmp_path: Path
) -> None:
    desc = client.push_blob(ref, b"bundle bytes", media_type=mediatypes.OCI_LAYER_TAR)
    assert desc == Descriptor(mediatypes.OCI_LAYER_TAR, digests.of(b"bundle bytes"), 12)
    seen: list[tuple[int, int]] = []
    client.fetch_blob(ref, desc, tmp_path / "blob", progress=lambda d, t: seen.append((d, t)))
    assert (tmp_path / "blob").read_bytes() == b"bundle bytes"
    assert seen[-1] == (12, 12)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["blob"]


def test_pushing_a_blob_that_exists_uploads_nothing(
    registry: RegistryServer, ref: Reference, client: RegistryClient
) -> None:
    client.push_blob(ref, b"once")
    path = f"/v2/{ref.repository}/blobs/uploads/"
    before = registry.count_requests("POST", path)
    client.push_blob(ref, b"once")
    assert registry.count_requests("POST", path) == before == 1
    assert client.blob_exists(ref, digests.of(b"once"))
    assert not client.blob_exists(ref, digests.of(b"never pushed"))


def test_a_large_file_is_pushed_in_chunks_and_pulled_back_intact(
    registry: RegistryServer, ref: Reference, client: RegistryClient, tmp_path: Path
) -> None:
    source = tmp_path / "big"
    with source.open("wb") as out:
        for i in range(18):
            out.write(bytes([i]) * (1 << 20))
    desc = client.push_blob(ref, source)
    assert registry.count_requests("PATCH", f"/v2/{ref.repository}/blobs/uploads/") == 2
    client.fetch_blob(ref, desc, tmp_path / "copy")
    assert digests.of((tmp_path / "copy").read_bytes()) == desc.digest


def test_an_image_manifest_resolves_and_pulls(ref: Reference, client: RegistryClient) -> None:
    digest, manifest = push_image(client, ref, [b"layer one", b"layer two"])
    resolved = client.resolve(ref)
    assert (resolved.digest, resolved.media_type) == (digest, mediatypes.OCI_MANIFEST)
    desc, pulled = client.resolve_image(ref)
    assert desc.digest == digest
    assert pulled == manifest
    by_digest, body = client.get_manifest(ref.with_digest(digest))
    assert by_digest.digest == digest == digests.of(body)


def test_open_blob_streams_verified_content(ref: Reference, client: RegistryClient) -> None:
    data = b"0123456789" * 100_000
    desc = client.push_blob(ref, data)
    with client.open_blob(ref, desc) as stream:
        assert stream.read(10) == b"0123456789"
        assert stream.read() == data[10:]


def test_a_docker_schema2_manifest_pulls_like_an_oci_one(
    ref: Reference, client: RegistryClient
) -> None:
    digest, _manifest = push_image(client, ref, [b"gz"], media_type=mediatypes.DOCKER_MANIFEST)
    desc, pulled = client.resolve_image(ref)
    assert (desc.digest, desc.media_type) == (digest, mediatypes.DOCKER_MANIFEST)
    assert pulled.layers[0].media_type == mediatypes.DOCKER_LAYER_GZIP


@pytest.mark.parametrize(
    ("index_type", "image_type"),
    [
        (mediatypes.OCI_INDEX, mediatypes.OCI_MANIFEST),
        (mediatypes.DOCKER_LIST, mediatypes.DOCKER_MANIFEST),
    ],
)
def test_a_multi_platform_image_resolves_to_each_platforms_manifest(
    registry: RegistryServer, client: RegistryClient, index_type: str, image_type: str
) -> None:
    ref = repo_ref(registry, "multi")
    entries = []
    for platform in ("linux/amd64", "linux/arm64/v8"):
        digest, manifest = push_image(
            client, ref, [platform.encode()], media_type=image_type,
            push_as=ref.with_tag(platform.replace("/", "-")),
        )  # fmt: skip
        entries.append(
            Descriptor(image_type, digest, len(manifest.to_json()), Platform.parse(platform))
        )
    index = Index(index_type, entries)
    index_digest = client.push_manifest(ref, index.to_json(), index_type)
    assert client.resolve(ref).digest == index_digest
    wanted = {"linux/amd64": "linux/amd64", "linux/arm64": "linux/arm64/v8"}
    for entry, (asked, pushed) in zip(entries, wanted.items(), strict=True):
        desc, manifest = client.resolve_image(ref, Platform.parse(asked))
        assert desc.digest == entry.digest
        assert desc.platform == Platform.parse(pushed)
        with client.open_blob(ref, manifest.layers[0]) as stream:
            assert stream.read() == pushed.encode()
    with pytest.raises(errors.NotFound) as caught:
        client.resolve_image(ref, Platform.parse("linux/s390x"))
    assert "linux/amd64" in caught.value.message and "linux/arm64/v8" in caught.value.message
    assert str(ref) in caught.value.message


# -- errors ----------------------------------------------------------------


def test_a_missing_image_is_not_found_naming_the_reference(
    registry: RegistryServer, client: RegistryClient
) -> None:
    ref = repo_ref(registry, "nope")
    for call in (client.resolve, client.get_manifest, client.resolve_image):
        with pytest.raises(errors.NotFound) as caught:
            call(ref)
        assert str(ref) in caught.value.message and "check the name and tag" in caught.value.message


def test_a_missing_blob_is_not_found_and_writes_nothing(
    ref: Reference, client: RegistryClient, tmp_path: Path
) -> None:
    client.push_blob(ref, b"present")
    desc = Descriptor(mediatypes.OCI_LAYER_TAR, digests.of(b"absent"), 6)
    with pytest.raises(errors.NotFound, match=desc.digest):
        client.fetch_blob(ref, desc, tmp_path / "blob")
    assert list(tmp_path.iterdir()) == []


def test_a_tampered_blob_is_data_loss_and_leaves_no_file(
    registry: RegistryServer, ref: Reference, client: RegistryClient, tmp_path: Path
) -> None:
    desc = client.push_blob(ref, b"original content")
    registry.blob_path(desc.digest).write_bytes(b"tampered content")  # same size
    (tmp_path / "dest").write_bytes(b"previous")
    with pytest.raises(errors.DataLoss) as caught:
        client.fetch_blob(ref, desc, tmp_path / "dest")
    assert desc.digest in caught.value.message and ref.name in caught.value.message
    assert "corrupt or was tampered with" in caught.value.message
    assert [p.name for p in tmp_path.iterdir()] == ["dest"]
    assert (tmp_path / "dest").read_bytes() == b"previous"


@pytest.mark.parametrize("replacement", [b"short", b"original content plus more"])
def test_a_blob_of_the_wrong_size_is_data_loss(
    registry: RegistryServer,
    ref: Reference,
    client: RegistryClient,
    tmp_path: Path,
    replacement: bytes,
) -> None:
    desc = client.push_blob(ref, b"original content" + replacement[:0] + uuid.uuid4().bytes)
    registry.blob_path(desc.digest).write_bytes(replacement)
    with pytest.raises(errors.DataLoss, match="bytes arrived"):
        client.fetch_blob(ref, desc, tmp_path / "dest")
    assert list(tmp_path.iterdir()) == []


def test_open_blob_raises_data_loss_even_when_the_reader_stops_early(
    registry: RegistryServer, ref: Reference, client: RegistryClient
) -> None:
    desc = client.push_blob(ref, b"A" * 4096)
    registry.blob_path(desc.digest).write_bytes(b"A" * 4095 + b"B")
    with pytest.raises(errors.DataLoss, match=desc.digest):  # noqa: SIM117
        with client.open_blob(ref, desc) as stream:
            assert stream.read(100) == b"A" * 100


def test_a_manifest_whose_content_does_not_match_its_digest_is_data_loss(
    registry: RegistryServer, ref: Reference, client: RegistryClient
) -> None:
    digest, manifest = push_image(client, ref, [b"layer"])
    body = manifest.to_json()
    tampered = body.replace(b'"size":5', b'"size":6')
    assert len(tampered) == len(body) and tampered != body
    registry.blob_path(digest).write_bytes(tampered)
    for pinned in (ref, ref.with_digest(digest)):
        with pytest.raises(errors.DataLoss, match="tampered"):
            client.get_manifest(pinned)


def test_a_dead_registry_fails_fast_as_unavailable() -> None:
    host = f"127.0.0.1:{free_port()}"
    ref = Reference.parse(f"{host}/a/b:v1")
    waits: list[float] = []
    client = RegistryClient(retries=3, sleep=waits.append)
    with client, pytest.raises(errors.Unavailable) as caught:
        client.resolve(ref)
    # Fails fast: three retries after the first attempt, each wait the short backoff.
    assert waits == [0.2, 0.4, 0.8]
    message = caught.value.message
    assert host in message and f"http://{host}" in message and "connection refused" in message


class _Canned(http.server.BaseHTTPRequestHandler):
    """A broken-registry stand-in: answers every request with one status."""

    status = 503
    hits = 0

    def log_message(self, format: str, *args: object) -> None:
        return

    def _answer(self) -> None:
        type(self).hits += 1
        body = b'{"errors":[{"code":"DENIED","message":"nope"}]}' if self.status == 403 else b""
        reply(self, self.status, body)

    do_GET = do_HEAD = _answer


@pytest.fixture
def canned_server() -> Iterator[tuple[str, type[_Canned]]]:
    handler = type("Handler", (_Canned,), {"hits": 0})
    with local_http(handler) as host:
        yield host, handler


@pytest.mark.parametrize("status", [500, 502, 503, 504, 429])
def test_a_failing_registry_is_unavailable_after_bounded_retries(
    canned_server: tuple[str, type[_Canned]], status: int
) -> None:
    host, handler = canned_server
    handler.status = status
    waits: list[float] = []
    client = RegistryClient(retries=2, sleep=waits.append)
    with client, pytest.raises(errors.Unavailable) as caught:
        client.get_manifest(Reference.parse(f"{host}/a/b:v1"))
    assert handler.hits == 3
    assert waits == [0.2, 0.4]
    assert f"HTTP {status}" in caught.value.message and host in caught.value.message


def test_a_registry_answering_403_is_permission_denied(
    canned_server: tuple[str, type[_Canned]],
) -> None:
    host, handler = canned_server
    handler.status = 403
    with RegistryClient(retries=2) as client, pytest.raises(errors.PermissionDenied) as caught:
        client.get_manifest(Reference.parse(f"{host}/a/b:v1"))
    assert handler.hits == 1
    assert "a/b" in caught.value.message and "nope" in caught.value.message


# -- authentication ----------------------------------------------------------


def test_basic_auth_pushes_and_pulls(auth_registry: RegistryServer, tmp_path: Path) -> None:
    ref = repo_ref(auth_registry)
    with basic_client(auth_registry) as client:
        digest, _manifest = push_image(client, ref, [b"secret layer"])
        desc, pulled = client.resolve_image(ref)
        client.fetch_blob(ref, pulled.layers[0], tmp_path / "layer")
    assert desc.digest == digest
    assert (tmp_path / "layer").read_bytes() == b"secret layer"


@pytest.mark.parametrize(
    "server", ["auth_registry", "token_registry"], ids=["basic-auth", "token-auth"]
)
def test_a_wrong_password_is_unauthenticated(server: str, request: pytest.FixtureRequest) -> None:
    registry: RegistryServer = request.getfixturevalue(server)
    client = basic_client(registry, "wrong-password")
    with client, pytest.raises(errors.Unauthenticated) as caught:
        client.resolve(repo_ref(registry))
    assert registry.host in caught.value.message
    assert "check the username and password" in caught.value.message
    assert "wrong-password" not in caught.value.message


@pytest.mark.parametrize("fixture", ["auth_registry", "token_registry"])
def test_no_credentials_for_a_private_registry_is_unauthenticated_asking_for_them(
    request: pytest.FixtureRequest, fixture: str
) -> None:
    server: RegistryServer = request.getfixturevalue(fixture)
    with RegistryClient(retries=1) as client, pytest.raises(errors.Unauthenticated) as caught:
        client.resolve(repo_ref(server))
    assert "provide credentials" in caught.value.message and server.host in caught.value.message


def test_public_repositories_pull_with_an_anonymous_token_but_refuse_pushes(
    token_registry: RegistryServer,
) -> None:
    issuer = token_registry.token_issuer
    assert issuer is not None
    ref = Reference.parse(f"{token_registry.host}/public/{uuid.uuid4().hex[:8]}:v1")
    with basic_client(token_registry) as writer:
        digest, _ = push_image(writer, ref, [b"for everyone"])
    with RegistryClient(retries=1) as anonymous:
        assert anonymous.resolve_image(ref)[0].digest == digest
        assert issuer.granted()[-1].user is None
        with pytest.raises(errors.Unauthenticated, match="provide credentials"):
            anonymous.push_blob(ref, b"vandalism")


def test_token_auth_caches_one_token_per_scope(token_registry: RegistryServer) -> None:
    issuer = token_registry.token_issuer
    assert issuer is not None
    source, dest = repo_ref(token_registry), repo_ref(token_registry)
    with basic_client(token_registry) as writer:
        push_image(writer, source, [b"from B"])
    with basic_client(token_registry) as client:
        before = len(issuer.granted())
        _, manifest = client.resolve_image(source)  # pull from repo B
        client.resolve_image(source)
        with client.open_blob(source, manifest.layers[0]) as stream:
            assert stream.read() == b"from B"
        assert len(issuer.granted()) == before + 1
        digest, _ = push_image(client, dest, [b"to A"])  # then push to repo A
        assert client.resolve(dest).digest == digest
    scopes = [r.scopes for r in issuer.granted()[before:]]
    assert scopes == [
        (f"repository:{source.repository}:pull",),
        (f"repository:{dest.repository}:pull,push",),
        (f"repository:{dest.repository}:pull",),
    ]


def test_an_expired_token_is_replaced(token_registry: RegistryServer) -> None:
    issuer = token_registry.token_issuer
    assert issuer is not None
    ref = repo_ref(token_registry)
    with basic_client(token_registry) as client:
        push_image(client, ref, [b"x"])
        before = len(issuer.granted())
        for token in list(client.transport.tokens._tokens.values()):
            object.__setattr__(token, "expires_at", 0.0)
        client.resolve(ref)
    assert len(issuer.granted()) == before + 1


def test_pushing_with_pull_only_credentials_is_permission_denied(
    token_registry: RegistryServer,
) -> None:
    issuer = token_registry.token_issuer
    assert issuer is not None
    ref = repo_ref(token_registry)
    with basic_client(token_registry) as writer:
        push_image(writer, ref, [b"readable"])
    reader = auth.Credential(READONLY_USER, issuer.users[READONLY_USER])
    credentials = auth.Credentials({token_registry.host: reader})
    with RegistryClient(credentials=credentials, retries=1) as client:
        assert client.resolve_image(ref)[1].layers[0].size == len(b"readable")
        with pytest.raises(errors.PermissionDenied) as caught:
            client.push_blob(ref, b"not allowed")
    assert "push permission" in caught.value.message and ref.repository in caught.value.message


@pytest.mark.parametrize("fixture", ["auth_registry", "token_registry"])
@pytest.mark.parametrize("style", ["auth", "username", "scheme-and-path"])
def test_dockerconfigjson_credentials_work(
    request: pytest.FixtureRequest, fixture: str, style: str
) -> None:
    server: RegistryServer = request.getfixturevalue(fixture)
    assert server.username is not None and server.password is not None
    pair = f"{server.username}:{server.password}".encode()
    entry: dict[str, str] = (
        {"auth": base64.b64encode(pair).decode()}
        if style != "username"
        else {"username": server.username, "password": server.password}
    )
    key = f"http://{server.host}/v2/" if style == "scheme-and-path" else server.host
    secret = json.dumps({"auths": {key: entry, "other.example": {"auth": "eDp5"}}})
    ref = repo_ref(server)
    with RegistryClient(credentials=auth.Credentials.from_dockerconfigjson(secret)) as client:
        digest, _ = push_image(client, ref, [b"with a pull secret"])
        assert client.resolve(ref).digest == digest


def test_an_identity_token_is_exchanged_for_access_tokens(token_registry: RegistryServer) -> None:
    issuer = token_registry.token_issuer
    assert issuer is not None and token_registry.username is not None
    refresh = issuer.new_refresh_token(token_registry.username)
    secret = json.dumps({"auths": {token_registry.host: {"identitytoken": refresh}}})
    ref = repo_ref(token_registry)
    with RegistryClient(credentials=auth.Credentials.from_dockerconfigjson(secret)) as client:
        digest, _ = push_image(client, ref, [b"oauth"])
        assert client.resolve(ref).digest == digest
    assert issuer.granted()[-1].method == "POST"


def test_secrets_never_reach_the_logs(
    token_registry: RegistryServer, caplog: pytest.LogCaptureFixture
) -> None:
    assert token_registry.password is not None
    caplog.set_level(logging.DEBUG)
    with basic_client(token_registry) as client:
        push_image(client, repo_ref(token_registry), [b"quiet"])
        tokens = [t.value for t in client.transport.tokens._tokens.values()]
    assert tokens and "token request" in caplog.text
    for secret in [token_registry.password, *tokens]:
        assert secret not in caplog.text


# -- flaky networks, local disks, proxies -------------------------------------


class _Truncating(http.server.BaseHTTPRequestHandler):
    """A broken-network stand-in: the first ``breaks`` blob GETs stop half way."""

    content = b"x" * 100_000
    breaks = 1
    hits = 0

    def log_message(self, format: str, *args: object) -> None:
        return

    def do_GET(self) -> None:
        cls = type(self)
        cls.hits += 1
        self.send_response(200)
        self.send_header("Content-Length", str(len(cls.content)))
        self.end_headers()
        if cls.hits <= cls.breaks:
            self.wfile.write(cls.content[: len(cls.content) // 2])
            self.wfile.flush()
            self.close_connection = True
            return
        self.wfile.write(cls.content)


@pytest.fixture
def truncating_server() -> Iterator[tuple[str, type[_Truncating]]]:
    handler = type("Handler", (_Truncating,), {"hits": 0})
    with local_http(handler) as host:
        yield host, handler


def test_a_download_cut_off_midway_is_retried_from_the_start(
    truncating_server: tuple[str, type[_Truncating]], tmp_path: Path
) -> None:
    host, handler = truncating_server
    desc = Descriptor(mediatypes.OCI_LAYER_TAR, digests.of(handler.content), len(handler.content))
    with RegistryClient(retries=2, backoff=0.01) as client:
        client.fetch_blob(Reference.parse(f"{host}/a/b:v1"), desc, tmp_path / "blob")
    assert handler.hits == 2
    assert (tmp_path / "blob").read_bytes() == handler.content


def test_a_download_that_keeps_breaking_is_unavailable_and_leaves_nothing(
    truncating_server: tuple[str, type[_Truncating]], tmp_path: Path
) -> None:
    host, handler = truncating_server
    handler.breaks = 100
    desc = Descriptor(mediatypes.OCI_LAYER_TAR, digests.of(handler.content), len(handler.content))
    client = RegistryClient(retries=2, backoff=0.01)
    with client, pytest.raises(errors.Unavailable, match="broke during the download"):
        client.fetch_blob(Reference.parse(f"{host}/a/b:v1"), desc, tmp_path / "blob")
    assert handler.hits == 3
    assert list(tmp_path.iterdir()) == []


def test_fetching_into_a_missing_directory_is_failed_precondition(
    ref: Reference, client: RegistryClient, tmp_path: Path
) -> None:
    desc = client.push_blob(ref, b"somewhere")
    with pytest.raises(errors.FailedPrecondition, match="check the directory exists"):
        client.fetch_blob(ref, desc, tmp_path / "missing" / "blob")
    assert list(tmp_path.iterdir()) == []


def test_a_blob_whose_digest_is_wrong_is_refused_by_the_registry(
    ref: Reference, client: RegistryClient
) -> None:
    wrong = digests.of(b"something else")
    with pytest.raises(errors.InvalidArgument, match="does not match the digest"):
        client.push_blob(ref, b"content", digest=wrong)
    assert not client.blob_exists(ref, wrong)


def test_pushing_a_manifest_under_a_digest_it_does_not_have_is_invalid(
    ref: Reference, client: RegistryClient
) -> None:
    config = client.push_blob(ref, b"{}", media_type=mediatypes.OCI_CONFIG)
    body = Manifest(mediatypes.OCI_MANIFEST, config, []).to_json()
    with pytest.raises(errors.InvalidArgument, match="digest is"):
        client.push_manifest(ref.with_digest(digests.of(b"other")), body, mediatypes.OCI_MANIFEST)


def test_proxies_from_the_environment_are_used(
    canned_server: tuple[str, type[_Canned]], monkeypatch: pytest.MonkeyPatch
) -> None:
    proxy, handler = canned_server
    monkeypatch.setenv("HTTP_PROXY", f"http://{proxy}")
    monkeypatch.delenv("NO_PROXY", raising=False)
    monkeypatch.delenv("no_proxy", raising=False)
    ref = Reference.parse("registry.invalid:5000/a/b:v1")
    client = RegistryClient(insecure=["registry.invalid:5000"], retries=0)
    with client, pytest.raises(errors.Unavailable, match="HTTP 503"):
        client.resolve(ref)
    assert handler.hits == 1  # the request went to the proxy, not to registry.invalid


def test_one_client_serves_concurrent_pulls(token_registry: RegistryServer) -> None:
    ref = repo_ref(token_registry)
    with basic_client(token_registry) as writer:
        push_image(writer, ref, [bytes([i]) * 50_000 for i in range(6)])
    failures: list[BaseException] = []
    with basic_client(token_registry) as client:
        _, manifest = client.resolve_image(ref)

        def pull(layer: Descriptor) -> None:
            try:
                with client.open_blob(ref, layer) as stream:
                    assert len(stream.read()) == 50_000
            except BaseException as exc:
                failures.append(exc)

        threads = [threading.Thread(target=pull, args=(layer,)) for layer in manifest.layers * 2]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(timeout=30)
    assert failures == []


@pytest.mark.parametrize(
    ("length_header", "body"),
    [(str(5 << 20), b"{}"), (None, b"x" * ((4 << 20) + 1))],
)
def test_a_manifest_over_4_mib_is_refused_before_it_is_read_whole(
    length_header: str | None, body: bytes
) -> None:
    response = requests.Response()
    response.status_code = 200
    response.raw = io.BytesIO(body)
    if length_header:
        response.headers["Content-Length"] = length_header
    with pytest.raises(errors.InvalidArgument, match="limit"):
        client_module._read_capped(response, client_module.MANIFEST_MAX, "manifest of r/x:1")
