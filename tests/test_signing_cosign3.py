"""cosign 3's Sigstore bundles against real components: the test registry (distribution 2.8,
which has no referrers API, so bundles are found through the referrers tag schema) and
cosign 3 built from its Go module.

cosign 3 signs and rukpak verifies (the library and ``rukpak bundle verify``), rukpak signs
a bundle and cosign 3 verifies it, both formats side by side, and a bundle copied to
another image's index is refused.
"""

from __future__ import annotations

import dataclasses
import json
import subprocess
import sys
from pathlib import Path

import pytest

from rukpak.oci import mediatypes
from rukpak.oci.client import RegistryClient
from rukpak.oci.manifest import Descriptor, Index
from rukpak.oci.reference import Reference
from rukpak.signing import cosign as cosign_format
from rukpak.signing import discover, keys, sigstore, verify
from rukpak.signing import policy as policy_format
from rukpak.signing import sign as signer
from rukpak.signing.gate import SignatureDenied
from tests.csi_helpers import PushedImage, simple_image
from tests.registry import RegistryServer
from tests.signing_helpers import PASSWORD, Cosign, cosign3
from tests.test_signing import gate_of, key_authority, policy_for, publish, spine

pytestmark = pytest.mark.registry
__all__ = ["cosign3"]  # the session fixture, used by name


@dataclasses.dataclass(frozen=True)
class Cosign3:
    """cosign 3 with a key pair (``release3``) and a signing config that names no service
    (it signs offline with the key)."""

    cosign: Cosign
    private: Path
    public: Path
    config: Path

    def sign(self, pushed: PushedImage) -> None:
        self.cosign.run(
            "sign", "--yes", "--key", str(self.private), "--signing-config", str(self.config),
            "--allow-http-registry", "--allow-insecure-registry", pinned(pushed),
        )  # fmt: skip

    def verify(self, pushed: PushedImage) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [str(self.cosign.binary), "verify", "--key", str(self.public),
             "--insecure-ignore-tlog", "--allow-http-registry", "--allow-insecure-registry",
             pinned(pushed)],
            capture_output=True, text=True, timeout=120, check=False,
            env={"HOME": str(self.cosign.home), "PATH": "/usr/bin:/bin"},
        )  # fmt: skip

    def private_key(self) -> keys.PrivateKey:
        return keys.load_private_key(self.private.read_bytes(), PASSWORD.encode())

    def policy(self, registry: RegistryServer) -> policy_format.Policy:
        """A ClusterBundlePolicy of ``signing3/*`` on ``registry`` trusting the public key."""
        return policy_for(f"{registry.host}/signing3/*", key_authority(self.public.read_bytes()))


@pytest.fixture(scope="module")
def release3(cosign3: Cosign) -> Cosign3:
    private, public = cosign3.key_pair("release3")
    config = cosign3.home / "signing-config.json"
    cosign3.run("signing-config", "create", "--out", str(config))
    return Cosign3(cosign3, private, public, config)


def image(registry: RegistryServer, repo: str) -> PushedImage:
    return simple_image(registry.host, repo, text=repo)


def pinned(pushed: PushedImage) -> str:
    return f"{Reference.parse(pushed.ref).name}@{pushed.manifest_digest}"


def fallback_index(c: RegistryClient, pushed: PushedImage) -> Index:
    ref = Reference.parse(pushed.ref)
    _desc, parsed = c.get_parsed(ref.with_tag(cosign_format.referrers_tag(pushed.manifest_digest)))
    assert isinstance(parsed, Index)
    return parsed


def test_what_cosign3_signs_rukpak_finds_as_a_bundle_and_verifies(
    registry: RegistryServer, release3: Cosign3
) -> None:
    pushed = image(registry, "signing3/by-cosign")
    release3.sign(pushed)
    with RegistryClient(timeout=10) as c:
        index = fallback_index(c, pushed)
        found = discover.signatures(c, Reference.parse(pushed.ref), pushed.manifest_digest)
    assert [m.artifact_type for m in index.manifests] == [sigstore.BUNDLE_V03]
    assert len(found.signatures) == 1, found.skipped
    assert found.signatures[0].subject_digest == pushed.manifest_digest
    policy = release3.policy(registry)
    verdict = gate_of(policy).check(pushed.ref)
    assert verdict is not None and verdict.digest == pushed.manifest_digest


def rukpak_verify(public: Path, pushed: PushedImage) -> subprocess.CompletedProcess[str]:
    """``rukpak bundle verify --insecure --key PUBLIC`` of the pinned image, as a process."""
    cli = [str(Path(sys.executable).parent / "rukpak"), "bundle", "verify", "--insecure"]
    return subprocess.run(
        [*cli, "--key", str(public), pinned(pushed)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip


def test_rukpak_bundle_verify_accepts_what_cosign3_signed_and_refuses_another_key(
    registry: RegistryServer,
    release3: Cosign3,
    tmp_path: Path,
) -> None:
    pushed = image(registry, "signing3/cli")
    release3.sign(pushed)
    done = rukpak_verify(release3.public, pushed)
    assert done.returncode == 0, done.stderr
    assert f"verified: {registry.host}/signing3/cli@{pushed.manifest_digest}" in done.stdout
    other = release3.cosign.key_pair("other3")[1]
    done = rukpak_verify(other, pushed)
    assert done.returncode == 1
    assert "no signature verifies with key" in done.stderr


def test_what_rukpak_signs_as_a_bundle_cosign3_verifies(
    registry: RegistryServer, release3: Cosign3
) -> None:
    pushed = image(registry, "signing3/by-rukpak")
    before = release3.verify(pushed)
    assert before.returncode != 0  # nothing signed yet: cosign refuses
    key = release3.private_key()
    with RegistryClient(timeout=10) as c:
        signed = signer.sign_bundle(c, pushed.ref, key)
        index = fallback_index(c, pushed)
    assert signed.digest == pushed.manifest_digest
    with RegistryClient(timeout=10) as c:  # the image's tag still names the image
        assert c.resolve(Reference.parse(pushed.ref)).digest == pushed.manifest_digest
    assert [m.digest for m in index.manifests] == [signed.signature_ref.rsplit("@", 1)[1]]
    done = release3.verify(pushed)
    assert done.returncode == 0, done.stderr
    assert pushed.manifest_digest in done.stdout


def test_both_formats_side_by_side_are_found_and_each_verifies(
    registry: RegistryServer, release3: Cosign3
) -> None:
    pushed = image(registry, "signing3/both")
    release3.sign(pushed)
    key = release3.private_key()
    with RegistryClient(timeout=10) as c:
        signer.sign(c, pushed.ref, key)  # cosign 2's format, in the .sig tag
        signer.sign_bundle(c, pushed.ref, key)  # a second bundle, beside cosign 3's
        found = discover.signatures(c, Reference.parse(pushed.ref), pushed.manifest_digest)
        index = fallback_index(c, pushed)
    assert len(index.manifests) == 2
    assert sorted(s.subject_digest is not None for s in found.signatures) == [False, True, True]
    policy = release3.policy(registry)
    assert gate_of(policy).check(pushed.ref) is not None


def test_a_bundle_listed_for_another_image_is_refused(
    registry: RegistryServer, release3: Cosign3
) -> None:
    signed_image, victim = image(registry, "signing3/a"), image(registry, "signing3/b")
    key = release3.private_key()
    with RegistryClient(timeout=10) as c:
        signer.sign_bundle(c, signed_image.ref, key)
        index = fallback_index(c, signed_image)
        victim_ref = Reference.parse(victim.ref)
        for entry in index.manifests:  # copy the referrer and list it for the victim
            at = Reference.parse(signed_image.ref).with_digest(entry.digest)
            _desc, body = c.get_manifest(at)
            manifest = json.loads(body)
            for blob in [manifest["config"], *manifest["layers"]]:
                desc = Descriptor(blob["mediaType"], blob["digest"], blob["size"])
                with c.open_blob(at, desc) as stream:
                    c.push_blob(victim_ref, stream.read(), media_type=desc.media_type)
            c.push_manifest(victim_ref.at_digest(entry.digest), body, mediatypes.OCI_MANIFEST)
        tag = victim_ref.with_tag(cosign_format.referrers_tag(victim.manifest_digest))
        c.push_manifest(tag, index.to_json(), mediatypes.OCI_INDEX)
        found = discover.signatures(c, victim_ref, victim.manifest_digest)
    assert len(found.signatures) == 1
    policy = release3.policy(registry)
    outcome = verify.check(policy, found, victim.manifest_digest, read_secret=no_secret)
    assert not outcome.ok
    copied = f"a signature of {signed_image.manifest_digest}, not of {victim.manifest_digest}"
    assert copied in outcome.reason


def no_secret(name: str) -> bytes:
    raise AssertionError(f"no Secret is read here ({name})")


def test_the_node_plugins_publish_spine_serves_what_cosign3_signed(
    registry: RegistryServer,
    release3: Cosign3,
    tmp_path: Path,
) -> None:
    pushed = image(registry, "signing3/spine")
    policy = release3.policy(registry)
    with spine(tmp_path, policy) as pub:
        with pytest.raises(SignatureDenied):  # not signed yet
            publish(pub, tmp_path, pushed.ref, name="before")
        release3.sign(pushed)
        tree = publish(pub, tmp_path, pushed.ref, name="after")
        assert tree == pub.images.tree_path(pushed.manifest_digest)
        assert (tree / "manifests" / "cm.yaml").read_text() == "signing3/spine"
