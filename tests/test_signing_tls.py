"""Signatures on a registry whose CA is private: they are found and checked with the
source's TLS (``certificateData``), in the manager and in the node plugin's way.

Real components: a docker-registry serving HTTPS with a certificate of a CA made here
(``tests.tls_helpers``), cosign 2.6.5 and cosign 3.1.3 (built from their Go modules)
signing there with ``--registry-cacert``. The manager resolves an image source with its
``certificateData`` through ``SignedResolver`` (its gate's client is made under the
source's trust); the node plugin's gate runs under the volume's trust
(``rukpak.oci.tls.using`` on the publish's thread, as ``csi.node.server`` does) and
without it cannot read the registry at all.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterator
from pathlib import Path
from typing import Any, cast

import pytest

from provisioner.engine.kube.kube import Kube
from provisioner.manager import resolution, signatures
from provisioner.manager.acting import actuate
from rukpak.common import errors
from rukpak.oci import tls as source_tls
from rukpak.oci.client import RegistryClient
from rukpak.oci.reference import Reference
from rukpak.oci.tls import SourceTLS
from rukpak.signing.gate import SignatureDenied
from tests import tls_helpers
from tests.csi_helpers import PushedImage, simple_image
from tests.registry import RegistryServer
from tests.signing_helpers import Cosign, cosign, cosign3
from tests.test_signing import gate_of, key_authority, policy_for

pytestmark = pytest.mark.registry
__all__ = ["cosign", "cosign3"]  # the session fixtures, used by name


@dataclasses.dataclass(frozen=True)
class PrivateRegistry:
    server: RegistryServer
    ca: tls_helpers.CA
    ca_file: Path

    @property
    def trust(self) -> SourceTLS:
        return SourceTLS(ca_pem=self.ca.pem)


@pytest.fixture(scope="module")
def private(tmp_path_factory: pytest.TempPathFactory) -> Iterator[PrivateRegistry]:
    work = tmp_path_factory.mktemp("signing-tls")
    ca = tls_helpers.make_ca("rukpak-test-signing-ca")
    server = RegistryServer.start(work / "registry", tls=tls_helpers.issue(ca, work, "private"))
    ca_file = work / "ca.pem"
    ca_file.write_text(ca.pem)
    try:
        yield PrivateRegistry(server, ca, ca_file)
    finally:
        server.stop()


def push(registry: PrivateRegistry, repo: str) -> PushedImage:
    with source_tls.using(registry.trust):
        return simple_image(registry.server.host, repo, text=repo)


def pinned(pushed: PushedImage) -> str:
    return f"{Reference.parse(pushed.ref).name}@{pushed.manifest_digest}"


def sign2(c: Cosign, registry: PrivateRegistry, pushed: PushedImage, key: Path) -> None:
    c.sign(pinned(pushed), key, "--registry-cacert", str(registry.ca_file))


def sign3(c: Cosign, registry: PrivateRegistry, pushed: PushedImage, key: Path) -> None:
    config = c.home / "signing-config.json"
    if not config.exists():
        c.run("signing-config", "create", "--out", str(config))
    c.run(
        "sign", "--yes", "--key", str(key), "--signing-config", str(config),
        "--registry-cacert", str(registry.ca_file), pinned(pushed),
    )  # fmt: skip


class NoKube:
    def __getattr__(self, name: str) -> Any:
        raise AssertionError(f"the API was used ({name}) to resolve an image source")


def resolve_signed(ref: str, certificate_data: str, gate: Any) -> str:
    """The manager's resolution of an image source with ``certificateData``, its tag
    pinned by a SignedResolver (as ``controller`` wires it) with a shared client."""
    shared = RegistryClient(retries=0)
    try:
        got = resolution.resolve(
            cast(Kube, NoKube()),
            {"type": "image", "image": {"ref": ref, "certificateData": certificate_data}},
            namespace="rukpak-system",
            resolve_image=signatures.SignedResolver(actuate.RegistryResolver(shared), gate),
        )
    finally:
        shared.close()
    return str(got.resolved["image"]["ref"])


@pytest.mark.parametrize("version", ["cosign2", "cosign3"])
def test_what_cosign_signs_on_a_private_ca_registry_is_verified_with_the_sources_ca(
    version: str, private: PrivateRegistry, request: pytest.FixtureRequest
) -> None:
    c: Cosign = request.getfixturevalue("cosign" if version == "cosign2" else "cosign3")
    key, public = c.key_pair(f"tls-{version}")
    pushed = push(private, f"signed-tls/{version}")
    (sign2 if version == "cosign2" else sign3)(c, private, pushed, key)
    host = private.server.host
    gate = gate_of(policy_for(f"{host}/signed-tls/*", key_authority(public.read_bytes())))
    # the manager: the tag resolved, then its signatures read, with the source's CA
    assert resolve_signed(pushed.ref, private.ca.pem, gate) == pinned(pushed)
    # the node: the gate's client is made under the volume's trust on this thread
    with source_tls.using(private.trust):
        verdict = gate.check(pinned(pushed))
    assert verdict is not None and verdict.digest == pushed.manifest_digest
    # without it nothing is read (a loopback registry is plain HTTP unless TLS is given)
    fresh = gate_of(policy_for(f"{host}/signed-tls/*", key_authority(public.read_bytes())))
    with pytest.raises(errors.InvalidArgument, match="speaks HTTPS"):
        fresh.check(pinned(pushed))
    # and another key's policy refuses what it read: the signatures were really checked
    other = c.key_pair(f"tls-{version}-other")[1]
    refusing = gate_of(policy_for(f"{host}/signed-tls/*", key_authority(other.read_bytes())))
    with pytest.raises(SignatureDenied, match="no signature verifies"):
        resolve_signed(pushed.ref, private.ca.pem, refusing)


def test_an_unsigned_image_on_a_private_ca_registry_is_refused_after_looking_with_the_ca(
    private: PrivateRegistry, cosign: Cosign
) -> None:
    public = cosign.key_pair("tls-unsigned")[1]
    pushed = push(private, "signed-tls/unsigned")
    gate = gate_of(policy_for(f"{private.server.host}/**", key_authority(public.read_bytes())))
    with pytest.raises(SignatureDenied, match="no signature found"):
        resolve_signed(pushed.ref, private.ca.pem, gate)
    with pytest.raises(errors.FailedPrecondition, match="unknown authority"):
        resolve_signed(pushed.ref, tls_helpers.make_ca("another").pem, gate)
