"""Registry TLS per source (issue 37): ``certificateData`` and ``insecureSkipTLSVerify``.

Against real docker-registry processes serving HTTPS (``tests.registry``) with
certificates made here (``tests.tls_helpers``): one signed by a private CA, one
self-signed, one expired, one naming another host. Checked in the manager's code path
(``resolution.resolve`` with the manager's ``RegistryResolver``) and in the node
plugin's publish path over its real gRPC socket:

- a source's CA is trusted for that source only: the shared client, another volume and
  a concurrent publish of another volume never trust it;
- a refused certificate is FailedPrecondition naming the host and why (unknown
  authority, expired, hostname mismatch), at once;
- ``insecureSkipTLSVerify`` still verifies content by digest;
- certificateData that is not PEM, and TLS attributes on a tag, are InvalidArgument.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import hashlib
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import grpc
import pytest

from csi.proto import csi_pb2, csi_pb2_grpc
from provisioner.engine.kube.kube import Kube
from provisioner.manager import resolution
from provisioner.manager.acting import actuate
from provisioner.manager.planning import sources
from rukpak.common import errors
from rukpak.oci import tls as source_tls
from rukpak.oci.client import RegistryClient
from rukpak.oci.tls import SourceTLS
from rukpak.sources import git, http
from tests import csi_helpers, source_servers, tls_helpers
from tests.registry import RegistryServer, ServingCert

pytestmark = [pytest.mark.registry]

plugin = csi_helpers.plugin_fixture("tls")
node = csi_helpers.node_fixture()
NOT_PEM = "this is not a certificate"


@dataclasses.dataclass(frozen=True)
class TLSRegistries(tls_helpers.Served[RegistryServer]):
    wrong_name: RegistryServer  # signed by ``ca`` for registry.invalid only


@pytest.fixture(scope="module")
def tls_registries(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TLSRegistries]:
    work = tmp_path_factory.mktemp("tls-registries")
    certs = tls_helpers.server_certs(work / "pki", wrong_name=True)
    with tls_helpers.serving(
        certs.roles, lambda role, cert: RegistryServer.start(work / role, tls=cert)
    ) as started:
        yield TLSRegistries.of(certs, started, wrong_name=started["wrong_name"])


_repos = iter(range(10_000))


def push(registry: RegistryServer, text: str, *, trust: SourceTLS) -> csi_helpers.PushedImage:
    """A one-layer image (``manifests/cm.yaml`` holding ``text``) pushed over TLS."""
    with source_tls.using(trust):
        return csi_helpers.push_image(
            registry.host,
            f"tls/app{next(_repos)}",
            "v1",
            [[("manifests/", "dir"), ("manifests/cm.yaml", "file", text.encode())]],
        )


def refusal(
    node: csi_pb2_grpc.NodeStub, request: csi_pb2.NodePublishVolumeRequest
) -> tuple[grpc.StatusCode, str]:
    """The code and details the node plugin refuses NodePublishVolume of ``request`` with."""
    with pytest.raises(grpc.RpcError) as refused:
        node.NodePublishVolume(request)
    return refused.value.code(), str(refused.value.details())


def pinned(image: csi_helpers.PushedImage) -> str:
    return f"{image.ref.rsplit(':', 1)[0]}@{image.manifest_digest}"


# --- the manager: resolving a tag --------------------------------------------------


class NoKube:
    """An image source without a pullSecret reads nothing from the API."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the API was used ({name}) to resolve an image source")


def resolve(image: dict[str, object], resolver: actuate.RegistryResolver) -> resolution.Resolution:
    return resolution.resolve(
        cast(Kube, NoKube()),
        {"type": "image", "image": image},
        namespace="rukpak-system",
        resolve_image=resolver,
    )


@pytest.fixture
def resolver() -> Iterator[actuate.RegistryResolver]:
    shared = RegistryClient(retries=0)
    yield actuate.RegistryResolver(shared)
    shared.close()


def test_a_tag_on_a_private_ca_registry_resolves_with_its_certificate_data_only(
    tls_registries: TLSRegistries, resolver: actuate.RegistryResolver
) -> None:
    regs = tls_registries
    image = push(regs.private, "private-ca", trust=SourceTLS(ca_pem=regs.ca.pem))
    got = resolve({"ref": image.ref, "certificateData": regs.ca.pem}, resolver)
    assert got.resolved["image"]["ref"] == pinned(image)
    assert got.resolved["image"]["certificateData"] == regs.ca.pem
    attributes = sources.volume(got.resolved)["csi"]["volumeAttributes"]
    assert attributes["certificateData"] == regs.ca.pem
    # The resolver's shared client never learnt the CA: without it (a loopback host is
    # spoken to over plain HTTP then), the TLS port refuses, with a hint.
    with pytest.raises(errors.InvalidArgument, match="speaks HTTPS, give the source its cert"):
        resolve({"ref": image.ref}, resolver)
    # Another CA's certificate: unknown authority, naming the host, saying what to do.
    with pytest.raises(errors.FailedPrecondition) as refused:
        resolve({"ref": image.ref, "certificateData": regs.other_ca.pem}, resolver)
    message = refused.value.message
    assert f"registry {regs.private.host}" in message and "unknown authority" in message
    assert "certificateData" in message


def test_a_self_signed_registry_resolves_with_its_certificate_or_without_verification(
    tls_registries: TLSRegistries, resolver: actuate.RegistryResolver
) -> None:
    regs = tls_registries
    image = push(regs.self_signed, "self-signed", trust=SourceTLS(skip_verify=True))
    with_cert = resolve({"ref": image.ref, "certificateData": regs.self_signed_pem}, resolver)
    skipping = resolve({"ref": image.ref, "insecureSkipTLSVerify": True}, resolver)
    assert with_cert.resolved["image"]["ref"] == skipping.resolved["image"]["ref"] == pinned(image)
    assert skipping.resolved["image"]["insecureSkipTLSVerify"] is True
    attributes = sources.volume(skipping.resolved)["csi"]["volumeAttributes"]
    assert attributes["insecureSkipTLSVerify"] == "true" and "certificateData" not in attributes
    with pytest.raises(errors.FailedPrecondition, match=r"unknown authority \(self-signed"):
        resolve({"ref": image.ref, "certificateData": regs.ca.pem}, resolver)  # another CA


@pytest.mark.parametrize(
    ("served_by", "why"),
    [("expired", "certificate has expired"), ("wrong_name", "mismatch")],
    ids=["expired", "another host"],
)
def test_a_certificate_the_resolver_refuses_is_named_with_the_host_and_why(
    tls_registries: TLSRegistries, resolver: actuate.RegistryResolver, served_by: str, why: str
) -> None:
    registry: RegistryServer = getattr(tls_registries, served_by)
    image = push(registry, served_by, trust=SourceTLS(skip_verify=True))
    with pytest.raises(errors.FailedPrecondition) as refused:
        resolve({"ref": image.ref, "certificateData": tls_registries.ca.pem}, resolver)
    message = refused.value.message
    assert f"registry {registry.host}" in message and why in message
    assert registry.count_requests("HEAD", r"/manifests/") == 0  # no request got through
    skipping = resolve({"ref": image.ref, "insecureSkipTLSVerify": True}, resolver)
    assert skipping.resolved["image"]["ref"] == pinned(image)


@pytest.mark.parametrize(
    "data",
    [
        NOT_PEM,
        "-----BEGIN CERTIFICATE-----\nnot base64 at all\n-----END CERTIFICATE-----\n",
    ],
)
def test_certificate_data_that_is_not_pem_is_invalid_argument(
    data: str, resolver: actuate.RegistryResolver
) -> None:
    with pytest.raises(errors.InvalidArgument, match=r"source.image.certificateData .*PEM"):
        resolve({"ref": "registry.example.com/app:v1", "certificateData": data}, resolver)


# --- the node plugin: publishing a pinned image -------------------------------------


def test_a_volume_with_certificate_data_publishes_from_a_private_ca_registry(
    tls_registries: TLSRegistries, node: csi_pb2_grpc.NodeStub, plugin: Any
) -> None:
    regs = tls_registries
    image = push(regs.private, "published", trust=SourceTLS(ca_pem=regs.ca.pem))
    path = csi_helpers.target(plugin)
    node.NodePublishVolume(
        csi_helpers.publish_request(
            path, pinned(image), volume_id="tls-1", certificateData=regs.ca.pem
        )
    )
    try:
        assert csi_helpers.tree(Path(path)) == {
            "manifests": "dir",
            "manifests/cm.yaml": "file:published",
        }
    finally:
        csi_helpers.unpublish(node, path, volume_id="tls-1")


def test_a_volume_with_its_own_tls_is_published_in_bind_mode_even_when_fuse_is_asked(
    tls_registries: TLSRegistries, node: csi_pb2_grpc.NodeStub, plugin: Any
) -> None:
    """FUSE reads lazily, later, on threads that carry no one volume's trust; this plugin
    has FUSE off, so a FUSE publish would be refused: the bind publish proves the switch."""
    regs = tls_registries
    image = push(regs.private, "bind-not-fuse", trust=SourceTLS(ca_pem=regs.ca.pem))
    path = csi_helpers.target(plugin)
    request = csi_helpers.publish_request(
        path, pinned(image), volume_id="tls-fuse", publishMode="fuse"
    )
    with pytest.raises(grpc.RpcError, match="publishMode fuse is not enabled"):
        node.NodePublishVolume(request)
    request.volume_context["certificateData"] = regs.ca.pem
    node.NodePublishVolume(request)
    try:
        assert csi_helpers.tree(Path(path))["manifests/cm.yaml"] == "file:bind-not-fuse"
    finally:
        csi_helpers.unpublish(node, path, volume_id="tls-fuse")


@pytest.mark.parametrize(
    ("served_by", "given", "why"),
    [("private", "other_ca", "unknown authority"), ("expired", "ca", "certificate has expired")],
    ids=["another CA", "expired"],
)
def test_a_registry_certificate_the_node_refuses_is_named_with_the_host_and_why(
    tls_registries: TLSRegistries,
    node: csi_pb2_grpc.NodeStub,
    plugin: Any,
    served_by: str,
    given: str,
    why: str,
) -> None:
    regs = tls_registries
    registry: RegistryServer = getattr(regs, served_by)
    image = push(registry, f"refused-{served_by}", trust=SourceTLS(skip_verify=True))
    ca: tls_helpers.CA = getattr(regs, given)
    request = csi_helpers.publish_request(
        csi_helpers.target(plugin),
        pinned(image),
        volume_id=f"tls-{served_by}",
        certificateData=ca.pem,
    )
    code, details = refusal(node, request)
    assert code == grpc.StatusCode.FAILED_PRECONDITION
    assert f"registry {registry.host}" in details and why in details


def test_a_ca_given_for_one_volume_is_not_used_by_a_concurrent_publish_of_another(
    tls_registries: TLSRegistries, node: csi_pb2_grpc.NodeStub, plugin: Any
) -> None:
    regs = tls_registries
    trust = SourceTLS(ca_pem=regs.ca.pem)
    rounds = [(push(regs.private, f"a{i}", trust=trust), push(regs.private, f"b{i}", trust=trust))
              for i in range(4)]  # fmt: skip
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for i, (trusted, other) in enumerate(rounds):
            paths = csi_helpers.target(plugin), csi_helpers.target(plugin)
            with_ca = pool.submit(
                node.NodePublishVolume,
                csi_helpers.publish_request(
                    paths[0], pinned(trusted), volume_id=f"ca-{i}", certificateData=regs.ca.pem
                ),
            )
            plain = csi_helpers.publish_request(paths[1], pinned(other), volume_id=f"plain-{i}")
            without = pool.submit(
                csi_helpers.code_of, functools.partial(node.NodePublishVolume, plain)
            )
            # plain HTTP to the TLS port (loopback, no TLS of its own): refused, never
            # fetched with the other volume's CA
            assert without.result() == grpc.StatusCode.INVALID_ARGUMENT
            with_ca.result()
            assert csi_helpers.tree(Path(paths[0]))["manifests/cm.yaml"] == f"file:a{i}"
            assert not Path(paths[1]).exists() or not any(Path(paths[1]).iterdir())
            csi_helpers.unpublish(node, paths[0], volume_id=f"ca-{i}")


def test_skipping_verification_still_verifies_content_by_digest(
    tls_registries: TLSRegistries, node: csi_pb2_grpc.NodeStub, plugin: Any
) -> None:
    regs = tls_registries
    good = push(regs.self_signed, "skip-ok", trust=SourceTLS(skip_verify=True))
    path = csi_helpers.target(plugin)
    node.NodePublishVolume(
        csi_helpers.publish_request(
            path, pinned(good), volume_id="skip-1", insecureSkipTLSVerify="true"
        )
    )
    assert csi_helpers.tree(Path(path))["manifests/cm.yaml"] == "file:skip-ok"
    csi_helpers.unpublish(node, path, volume_id="skip-1")
    tampered = push(regs.self_signed, "skip-tampered", trust=SourceTLS(skip_verify=True))
    blob = regs.self_signed.blob_path(tampered.blob_digests[1])
    data = bytearray(blob.read_bytes())
    data[-12:] = bytes(b ^ 0xFF for b in data[-12:])  # same size, other bytes
    blob.write_bytes(bytes(data))
    request = csi_helpers.publish_request(
        csi_helpers.target(plugin),
        pinned(tampered),
        volume_id="skip-2",
        insecureSkipTLSVerify="true",
    )
    code, details = refusal(node, request)
    assert code == grpc.StatusCode.DATA_LOSS, details


@pytest.mark.parametrize(
    ("image", "attributes", "words"),
    [
        ("registry.example.com/app@sha256:" + "a" * 64, {"certificateData": NOT_PEM}, "PEM"),
        ("registry.example.com/app:v1", {"insecureSkipTLSVerify": "true"}, "pinned by digest"),
        ("registry.example.com/app:v1", {"certificateData": "x"}, "PEM"),
    ],
)
def test_bad_tls_volume_attributes_are_invalid_argument(
    node: csi_pb2_grpc.NodeStub, plugin: Any, image: str, attributes: dict[str, str], words: str
) -> None:
    request = csi_helpers.publish_request(csi_helpers.target(plugin), image)
    request.volume_context.update(attributes)
    code, details = refusal(node, request)
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert words in details


# --- http and git sources: insecureSkipVerify, and refusals named ---------------------


@pytest.fixture(scope="module")
def source_certs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, ServingCert]:
    work = tmp_path_factory.mktemp("source-pki")
    ca = tls_helpers.make_ca()
    return {
        "self_signed": tls_helpers.issue(None, work, "self-signed"),
        "expired": tls_helpers.issue(ca, work, "expired", expired=True),
    }


def test_an_https_source_refuses_a_self_signed_certificate_naming_the_server(
    tmp_path: Path, source_certs: dict[str, ServingCert]
) -> None:
    data = source_servers.tarball({"manifests/a.yaml": "kind: ConfigMap\n"})
    with source_servers.serving(tmp_path, tls=source_certs["self_signed"]) as server:
        server.files["b.tgz"] = data
        url = f"{server.url}/files/b.tgz"
        with pytest.raises(errors.FailedPrecondition) as refused:
            http.fetch(url)
        message = refused.value.message
        assert f"server 127.0.0.1:{server.port}" in message
        assert "unknown authority (self-signed certificate)" in message
        assert "auth.insecureSkipVerify" in message
        # the pin still decides: skipping verification fetches the same digest
        assert http.fetch(url, insecure=True) == f"sha256:{hashlib.sha256(data).hexdigest()}"
        with pytest.raises(errors.FailedPrecondition, match="changed since"):
            http.fetch(url, insecure=True, expect="sha256:" + "0" * 64)


def test_a_git_server_whose_ca_is_unknown_is_refused_naming_it_and_insecure_skips(
    tmp_path: Path, source_certs: dict[str, ServingCert]
) -> None:
    commit = source_servers.make_repo(tmp_path / "repo", {"manifests/a.yaml": "kind: X\n"})
    with source_servers.serving(tmp_path, tls=source_certs["expired"]) as server:
        url = server.repo_url("repo")
        with pytest.raises(errors.FailedPrecondition) as refused:
            git.resolve(url, {"branch": "main"})
        message = refused.value.message
        assert f"git server 127.0.0.1:{server.port}" in message
        assert "unknown authority (unable to get local issuer certificate)" in message
        assert git.resolve(url, {"branch": "main"}, insecure=True) == commit
