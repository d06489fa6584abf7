"""TLS of git and http sources: ``certificateData`` (the server's CA, ours: upstream v0.24's
git and http sources have no CA field) and upstream's ``auth.insecureSkipVerify``.

Against real servers on loopback (``tests.source_servers``: git smart HTTP through
``git http-backend``, and files), serving HTTPS with certificates made here
(``tests.tls_helpers``): one signed by a private CA, one self-signed, one expired.
Checked in the fetchers, the manager's resolution (the pin keeps the CA and its volume
hands it on), the manager's content path (``status.contentURL``) and the node plugin's
publish over its real gRPC socket:

- the CA is trusted for that source only: neither a later fetch without it, nor a
  concurrent publish of another volume, trusts it;
- a refused certificate is FailedPrecondition naming the server and why;
- skipping verification still checks an http tree against its pin;
- certificateData that is not PEM, or given for a URL that is not https://, and an image's
  insecureSkipTLSVerify on a git volume are InvalidArgument.
"""

from __future__ import annotations

import concurrent.futures
import dataclasses
import functools
import hashlib
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import grpc
import pytest

from csi.proto import csi_pb2_grpc
from provisioner.engine.kube.kube import Kube
from provisioner.manager import resolution
from provisioner.manager.planning import sources
from provisioner.manager.serving import content
from rukpak.common import errors
from rukpak.oci.tls import SourceTLS
from rukpak.sources import git, http
from rukpak.sources.volume import VolumeSource
from tests import source_servers, tls_helpers
from tests.csi_helpers import (
    code_of,
    node_fixture,
    plugin_fixture,
    publish_request,
    target,
    tree,
    unpublish,
)
from tests.registry import ServingCert

plugin = plugin_fixture("source-tls")
node = node_fixture()
MANIFEST = "kind: ConfigMap\n"


@dataclasses.dataclass(frozen=True)
class Servers(tls_helpers.Served[source_servers.SourceServer]):
    commit: str  # of the repository ``repo`` every server serves
    tarball: bytes  # ``/files/b.tgz`` on every server

    @property
    def digest(self) -> str:
        return f"sha256:{hashlib.sha256(self.tarball).hexdigest()}"


@pytest.fixture(scope="module")
def servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Servers]:
    work = tmp_path_factory.mktemp("source-tls")
    certs = tls_helpers.server_certs(work / "pki", ca_name="rukpak-test-source-ca")
    root = work / "git"
    commit = source_servers.make_repo(root / "repo", {"manifests/a.yaml": MANIFEST})
    data = source_servers.tarball({"manifests/a.yaml": MANIFEST})

    def start(role: str, cert: ServingCert) -> source_servers.SourceServer:
        server = source_servers.SourceServer(git_root=root, tls=cert).start()
        server.files["b.tgz"] = data
        return server

    with tls_helpers.serving(certs.roles, start) as started:
        yield Servers.of(certs, started, commit=commit, tarball=data)


def file_url(server: source_servers.SourceServer) -> str:
    return f"{server.url}/files/b.tgz"


# --- the fetchers -------------------------------------------------------------------


def test_an_http_source_on_a_private_ca_server_is_fetched_with_its_certificate_data_only(
    servers: Servers,
) -> None:
    url = file_url(servers.private)
    assert http.fetch(url, tls=SourceTLS(ca_pem=servers.ca.pem)) == servers.digest
    # the CA widened nothing: the same URL without it is refused, naming the server
    with pytest.raises(errors.FailedPrecondition) as refused:
        http.fetch(url)
    message = refused.value.message
    assert f"server 127.0.0.1:{servers.private.port}" in message
    assert "unknown authority (unable to get local issuer certificate)" in message
    assert "certificateData" in message and "auth.insecureSkipVerify" in message
    with pytest.raises(errors.FailedPrecondition, match="unknown authority"):
        http.fetch(url, tls=SourceTLS(ca_pem=servers.other_ca.pem))


def test_a_git_source_on_a_private_ca_server_resolves_and_fetches_with_its_certificate_data(
    servers: Servers, tmp_path: Path
) -> None:
    url = servers.private.repo_url("repo")
    trust = SourceTLS(ca_pem=servers.ca.pem)
    assert git.resolve(url, {"branch": "main"}, tls=trust) == servers.commit
    repo = git.fetch_commit(url, servers.commit, tmp_path / "bare", tls=trust)
    try:
        assert repo[servers.commit.encode()].id == servers.commit.encode()
    finally:
        repo.close()
    with pytest.raises(errors.FailedPrecondition) as refused:
        git.resolve(url, {"branch": "main"})
    message = refused.value.message
    assert f"git server 127.0.0.1:{servers.private.port}" in message
    assert "unknown authority" in message and "auth.insecureSkipVerify" in message
    with pytest.raises(errors.FailedPrecondition, match="unknown authority"):
        git.fetch_commit(
            url,
            servers.commit,
            tmp_path / "other",
            tls=SourceTLS(ca_pem=servers.other_ca.pem),
        )


def test_a_self_signed_server_is_trusted_with_its_own_certificate_or_without_verification(
    servers: Servers,
) -> None:
    url, repo = file_url(servers.self_signed), servers.self_signed.repo_url("repo")
    own = SourceTLS(ca_pem=servers.self_signed_pem)
    assert http.fetch(url, tls=own) == http.fetch(url, insecure=True) == servers.digest
    assert git.resolve(repo, {"branch": "main"}, tls=own) == servers.commit
    assert git.resolve(repo, {"branch": "main"}, tls=SourceTLS(skip_verify=True)) == servers.commit
    with pytest.raises(errors.FailedPrecondition, match=r"unknown authority \(self-signed"):
        git.resolve(repo, {"branch": "main"}, tls=SourceTLS(ca_pem=servers.ca.pem))


def test_an_expired_certificate_is_refused_even_with_its_ca_and_skipping_keeps_the_pin(
    servers: Servers,
) -> None:
    url, repo = file_url(servers.expired), servers.expired.repo_url("repo")
    trust = SourceTLS(ca_pem=servers.ca.pem)
    for call in (
        functools.partial(http.fetch, url, tls=trust),
        functools.partial(git.resolve, repo, {"tag": "none"}, tls=trust),
    ):
        with pytest.raises(errors.FailedPrecondition) as refused:
            call()
        message = refused.value.message
        assert f"127.0.0.1:{servers.expired.port}" in message
        assert "certificate has expired" in message
    skipping = SourceTLS(ca_pem=servers.ca.pem, skip_verify=True)
    assert http.fetch(url, tls=skipping, expect=servers.digest) == servers.digest
    with pytest.raises(errors.FailedPrecondition, match="changed since"):
        http.fetch(url, tls=skipping, expect="sha256:" + "0" * 64)


# --- the manager: pinning, the volume it hands on, and contentURL ----------------------


class NoKube:
    """A source without an auth Secret reads nothing from the API."""

    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the API was used ({name}) to resolve a source")


def resolve(source: dict[str, Any]) -> resolution.Resolution:
    return resolution.resolve(
        cast(Kube, NoKube()),
        source,
        namespace="rukpak-system",
        resolve_image=lambda ref, credentials=None: ref,
    )


def test_the_manager_pins_git_and_http_sources_with_their_ca_and_hands_it_to_the_volume(
    servers: Servers,
) -> None:
    ca = servers.ca.pem
    git_source = {"repository": servers.private.repo_url("repo"), "ref": {"branch": "main"}}
    pinned_git = resolve({"type": "git", "git": {**git_source, "certificateData": ca}}).resolved
    assert pinned_git["git"]["ref"] == {"commit": servers.commit}
    assert pinned_git["git"]["certificateData"] == ca
    http_source = {"url": file_url(servers.private), "certificateData": ca}
    pinned_http = resolve({"type": "http", "http": http_source}).resolved
    assert pinned_http["http"]["url"].endswith("#sha256=" + servers.digest.removeprefix("sha256:"))
    for pinned in (pinned_git, pinned_http):
        attributes = sources.volume(pinned)["csi"]["volumeAttributes"]
        assert attributes["certificateData"] == ca
        parsed = VolumeSource.from_attributes(attributes)
        assert parsed.fetch is not None and parsed.fetch.ca_pem == ca.strip() + "\n"
        assert parsed.tls == SourceTLS(ca_pem=parsed.fetch.ca_pem)
    with pytest.raises(errors.FailedPrecondition, match="unknown authority"):
        resolve({"type": "git", "git": git_source})


def test_the_content_url_path_fetches_a_git_source_with_its_ca(
    servers: Servers, tmp_path: Path
) -> None:
    ca = servers.ca.pem
    source = {"repository": servers.private.repo_url("repo"), "ref": {"branch": "main"}}
    pinned = resolve({"type": "git", "git": {**source, "certificateData": ca}}).resolved
    serving = content.Content(cast(Kube, NoKube()), system_namespace="rukpak-system")
    serving._materialize(pinned, tmp_path / "tree", tmp_path / "cache")
    assert (tmp_path / "tree" / "manifests" / "a.yaml").read_text() == MANIFEST
    without = {**pinned, "git": {k: v for k, v in pinned["git"].items() if k != "certificateData"}}
    with pytest.raises(errors.FailedPrecondition, match="unknown authority"):
        serving._materialize(without, tmp_path / "tree2", tmp_path / "cache2")


@pytest.mark.parametrize(
    ("kind", "url", "certificate_data", "match"),
    [
        (
            "git",
            "https://git.example.com/r.git",
            "not PEM",
            r"must hold the server's CA certificate\(s\) in PEM",
        ),
        ("http", "https://files.example.com/b.tgz", "not PEM", r"must hold the server's CA"),
        ("http", "http://files.example.com/b.tgz", "CA", r"is for https:// URLs only"),
        ("git", "ssh://git@git.example.com/r.git", "CA", r"is for https:// URLs only"),
    ],
)
def test_bad_certificate_data_of_a_git_or_http_source_is_invalid_argument(
    servers: Servers, kind: str, url: str, certificate_data: str, match: str
) -> None:
    """``certificate_data`` "CA" stands for the servers' CA; the error names the field."""
    spec: dict[str, Any] = {
        "repository" if kind == "git" else "url": url,
        "certificateData": servers.ca.pem if certificate_data == "CA" else certificate_data,
    }
    if kind == "git":
        spec["ref"] = {"branch": "main"}
    with pytest.raises(errors.InvalidArgument, match=rf"source\.{kind}\.certificateData {match}"):
        resolve({"type": kind, kind: spec})


# --- the node plugin ------------------------------------------------------------------


def request(path: str, volume_id: str, **attributes: str) -> Any:
    """A publish request of a git or http volume with ``attributes``."""
    made = publish_request(path, None, volume_id=volume_id)
    made.volume_context.update(attributes)
    return made


def node_commit(servers: Servers, files: Mapping[str, str | bytes]) -> str:
    """A new commit of the repository ``node`` (the others' ``main`` never moves)."""
    return source_servers.make_repo(servers.private.git_root / "node", files)


def test_the_node_publishes_git_and_http_volumes_with_their_certificate_data(
    servers: Servers, node: csi_pb2_grpc.NodeStub, plugin: Any
) -> None:
    ca = servers.ca.pem
    volumes = {
        "git-ca": {"git": servers.private.repo_url("repo"), "commit": servers.commit},
        "http-ca": {"url": file_url(servers.private), "digest": servers.digest},
    }
    for volume_id, attributes in volumes.items():
        path = target(plugin)
        node.NodePublishVolume(request(path, volume_id, certificateData=ca, **attributes))
        try:
            assert tree(Path(path))["manifests/a.yaml"] == f"file:{MANIFEST}"
        finally:
            unpublish(node, path, volume_id=volume_id)


def test_the_node_names_the_server_and_reason_when_it_refuses_a_certificate(
    servers: Servers, node: csi_pb2_grpc.NodeStub, plugin: Any
) -> None:
    commit = node_commit(servers, {"x.yaml": "kind: X\n"})
    cases = [
        (
            {"url": file_url(servers.expired), "digest": servers.digest},
            servers.ca.pem,
            f"server 127.0.0.1:{servers.expired.port} refused: certificate has expired",
        ),
        (
            {"git": servers.private.repo_url("node"), "commit": commit},
            servers.other_ca.pem,
            f"git server 127.0.0.1:{servers.private.port} refused: unknown authority",
        ),
    ]
    for attributes, ca, words in cases:
        with pytest.raises(grpc.RpcError) as refused:
            node.NodePublishVolume(
                request(target(plugin), "refused", certificateData=ca, **attributes)
            )
        assert refused.value.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert words in str(refused.value.details())


def test_a_ca_given_for_one_volume_is_not_used_by_a_concurrent_publish_of_another(
    servers: Servers, node: csi_pb2_grpc.NodeStub, plugin: Any
) -> None:
    with concurrent.futures.ThreadPoolExecutor(max_workers=2) as pool:
        for i in range(3):
            trusted = node_commit(servers, {f"a{i}.yaml": "kind: A\n"})
            other = node_commit(servers, {f"b{i}.yaml": "kind: B\n"})
            paths = target(plugin), target(plugin)
            location = servers.private.repo_url("node")
            with_ca = pool.submit(
                node.NodePublishVolume,
                request(
                    paths[0],
                    f"ca-{i}",
                    git=location,
                    commit=trusted,
                    certificateData=servers.ca.pem,
                ),
            )
            plain = request(paths[1], f"plain-{i}", git=location, commit=other)
            without = pool.submit(code_of, functools.partial(node.NodePublishVolume, plain))
            assert without.result() == grpc.StatusCode.FAILED_PRECONDITION
            with_ca.result()
            assert tree(Path(paths[0]))[f"a{i}.yaml"] == "file:kind: A\n"
            assert not Path(paths[1]).exists() or not any(Path(paths[1]).iterdir())
            unpublish(node, paths[0], volume_id=f"ca-{i}")


def test_bad_tls_attributes_of_git_and_http_volumes_are_invalid_argument(
    servers: Servers, node: csi_pb2_grpc.NodeStub, plugin: Any
) -> None:
    git_volume = {"git": servers.private.repo_url("repo"), "commit": servers.commit}
    cases = [
        ({**git_volume, "insecureSkipTLSVerify": "true"}, "is for image volumes"),
        ({**git_volume, "certificateData": "not PEM"}, "must hold the server's CA"),
        (
            {
                "url": file_url(servers.private).replace("https://", "http://"),
                "digest": servers.digest,
                "certificateData": servers.ca.pem,
            },
            "is for https:// URLs only",
        ),
    ]
    for attributes, words in cases:
        with pytest.raises(grpc.RpcError) as refused:
            node.NodePublishVolume(request(target(plugin), "bad-tls", **attributes))
        assert refused.value.code() == grpc.StatusCode.INVALID_ARGUMENT
        assert words in str(refused.value.details())
