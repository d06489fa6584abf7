"""Signed bundles against real components: the test registry (distribution) and cosign
built from its Go module.

cosign signs and rukpak verifies, rukpak signs and cosign verifies; then the outcomes a
policy promises: a tampered signature, another key, no signature, a signature copied
from another image, a warning policy, a keyless signature under a local CA, and the node
plugin's publish spine refusing before it fetches anything.
"""

from __future__ import annotations

import base64
import json
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from csi.node.publish import Publisher
from csi.volume.request import PublishRequest
from rukpak.common import errors
from rukpak.image.cache import ImageCache
from rukpak.oci import mediatypes
from rukpak.oci.auth import Credentials
from rukpak.oci.client import RegistryClient
from rukpak.oci.manifest import Manifest, Platform
from rukpak.oci.reference import Reference
from rukpak.signing import cosign as cosign_format
from rukpak.signing import discover, keys
from rukpak.signing import policy as signing
from rukpak.signing import sign as signer
from rukpak.signing.gate import Gate, SignatureDenied
from rukpak.sources.volume import VolumeSource
from tests.csi_helpers import PushedImage, simple_image
from tests.publish_fakes import FakeMounter
from tests.registry import RegistryServer
from tests.signing_helpers import (
    EMAIL,
    OIDC,
    PASSWORD,
    Cosign,
    cosign,
    make_ca,
    make_leaf,
    pem,
    private_pem,
    public_pem,
)

pytestmark = pytest.mark.registry
__all__ = ["cosign"]  # the session fixture, used by name


def policy_for(
    glob: str,
    *authorities: dict[str, Any],
    name: str = "bundles",
    generation: int = 1,
    mode: str = "enforce",
) -> signing.Policy:
    return signing.parse(
        {
            "metadata": {"name": name, "uid": f"uid-{name}", "generation": generation},
            "spec": {"images": [{"glob": glob}], "authorities": list(authorities), "mode": mode},
        }
    )


def key_authority(public: bytes, name: str = "release") -> dict[str, Any]:
    return {"name": name, "key": {"data": public.decode()}}


def client(credentials: Credentials | None = None) -> RegistryClient:
    return RegistryClient(credentials=credentials, timeout=10)


def gate_of(*policies: signing.Policy) -> Gate:
    def no_secret(name: str) -> bytes:
        raise errors.NotFound(f"no Secret {name}")

    return Gate(policies=lambda: list(policies), read_secret=no_secret, client=client)


def image(registry: RegistryServer, repo: str, text: str = "hello") -> PushedImage:
    return simple_image(registry.host, repo, text=text)


@pytest.fixture(scope="module")
def cosign_keys(cosign: Cosign) -> tuple[Path, Path]:
    return cosign.key_pair("release")


def cosign_private(path: Path) -> keys.PrivateKey:
    return keys.load_private_key(path.read_bytes(), PASSWORD.encode())


# -- interoperability ------------------------------------------------------------------


def test_what_cosign_signs_rukpak_verifies(
    registry: RegistryServer, cosign: Cosign, cosign_keys: tuple[Path, Path]
) -> None:
    pushed = image(registry, "signing/by-cosign")
    cosign.sign(pushed.ref, cosign_keys[0])
    verdict = gate_of(
        policy_for(f"{registry.host}/signing/*", key_authority(cosign_keys[1].read_bytes()))
    ).check(pushed.ref)
    assert verdict is not None
    assert verdict.digest == pushed.manifest_digest
    assert verdict.pinned.endswith("@" + pushed.manifest_digest)
    assert verdict.policies == ("bundles",)


def test_what_rukpak_signs_cosign_verifies_with_a_cosign_key_and_a_pem_key(
    registry: RegistryServer, cosign: Cosign, cosign_keys: tuple[Path, Path], tmp_path: Path
) -> None:
    pushed = image(registry, "signing/by-rukpak")
    with client() as c:
        signed = signer.sign(c, pushed.ref, cosign_private(cosign_keys[0]))
    assert signed.digest == pushed.manifest_digest and signed.added
    assert cosign.verifies(pushed.ref, cosign_keys[1])
    pem_key = ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "k.pub").write_bytes(public_pem(pem_key))
    assert not cosign.verifies(pushed.ref, tmp_path / "k.pub")
    with client() as c:
        signer.sign(c, pushed.ref, keys.load_private_key(private_pem(pem_key), None))
    assert cosign.verifies(pushed.ref, tmp_path / "k.pub")
    assert cosign.verifies(pushed.ref, cosign_keys[1])  # the first signature is kept


def test_signing_twice_with_one_key_adds_one_signature(registry: RegistryServer) -> None:
    pushed = image(registry, "signing/twice")
    key = ec.generate_private_key(ec.SECP256R1())
    with client() as c:
        first = signer.sign(c, pushed.ref, key)
        second = signer.sign(c, pushed.ref, key)
        found = discover.signatures(c, Reference.parse(pushed.ref), pushed.manifest_digest)
    assert (first.added, second.added) == (True, False)
    assert len(found.signatures) == 1


def test_cosign_signatures_stored_as_oci_1_1_referrers_are_found(
    registry: RegistryServer, cosign: Cosign, cosign_keys: tuple[Path, Path]
) -> None:
    pushed = image(registry, "signing/referrers")
    cosign.sign(pushed.ref, cosign_keys[0], "--registry-referrers-mode=oci-1-1")
    with client() as c:
        ref = Reference.parse(pushed.ref)
        with pytest.raises(errors.NotFound):
            c.get_manifest(ref.with_tag(cosign_format.signature_tag(pushed.manifest_digest)))
        found = discover.signatures(c, ref, pushed.manifest_digest)
    assert len(found.signatures) == 1
    authority = key_authority(cosign_keys[1].read_bytes())
    assert gate_of(policy_for(f"{registry.host}/signing/referrers", authority)).check(pushed.ref)


# -- what a policy refuses -------------------------------------------------------------


def _sig_manifest(c: RegistryClient, ref: Reference, digest: str) -> Manifest:
    _desc, parsed = c.get_parsed(ref.with_tag(cosign_format.signature_tag(digest)))
    assert isinstance(parsed, Manifest)
    return parsed


def test_a_tampered_signature_is_refused(
    registry: RegistryServer, cosign: Cosign, cosign_keys: tuple[Path, Path]
) -> None:
    pushed = image(registry, "signing/tampered")
    cosign.sign(pushed.ref, cosign_keys[0])
    ref = Reference.parse(pushed.ref)
    with client() as c:
        manifest = _sig_manifest(c, ref, pushed.manifest_digest)
        raw = bytearray(base64.b64decode(manifest.layers[0].annotations[cosign_format.SIGNATURE]))
        raw[-1] ^= 0x01
        manifest.layers[0].annotations[cosign_format.SIGNATURE] = base64.b64encode(raw).decode()
        c.push_manifest(
            ref.with_tag(cosign_format.signature_tag(pushed.manifest_digest)),
            manifest.to_json(),
            mediatypes.OCI_MANIFEST,
        )
    authority = key_authority(cosign_keys[1].read_bytes())
    with pytest.raises(SignatureDenied) as caught:
        gate_of(policy_for(f"{registry.host}/signing/**", authority)).check(pushed.ref)
    assert caught.value.code == "PERMISSION_DENIED"
    assert caught.value.policy == "bundles"
    assert "no signature verifies with key" in caught.value.message


def test_a_signature_by_another_key_is_refused(
    registry: RegistryServer, cosign: Cosign, cosign_keys: tuple[Path, Path]
) -> None:
    pushed = image(registry, "signing/other-key")
    cosign.sign(pushed.ref, cosign_keys[0])
    stranger = ec.generate_private_key(ec.SECP256R1())
    with pytest.raises(SignatureDenied) as caught:
        gate_of(
            policy_for(f"{registry.host}/signing/**", key_authority(public_pem(stranger)))
        ).check(pushed.ref)
    assert keys.fingerprint(stranger.public_key()) in caught.value.message


def test_an_unsigned_image_is_refused_naming_the_policy_and_what_was_looked_for(
    registry: RegistryServer,
) -> None:
    pushed = image(registry, "signing/unsigned")
    key = ec.generate_private_key(ec.SECP256R1())
    with pytest.raises(SignatureDenied) as caught:
        gate_of(
            policy_for(
                f"{registry.host}/signing/unsigned", key_authority(public_pem(key)), name="strict"
            )
        ).check(pushed.ref)
    assert "ClusterBundlePolicy 'strict'" in caught.value.message
    assert cosign_format.signature_tag(pushed.manifest_digest) in caught.value.message


def test_a_signature_copied_from_another_image_is_refused(registry: RegistryServer) -> None:
    signed = image(registry, "signing/copy-from", text="one")
    target = image(registry, "signing/copy-to", text="two")
    key = ec.generate_private_key(ec.SECP256R1())
    with client() as c:
        signer.sign(c, signed.ref, key)
        manifest = _sig_manifest(c, Reference.parse(signed.ref), signed.manifest_digest)
        to = Reference.parse(target.ref)
        for blob in (manifest.config, *manifest.layers):
            with c.open_blob(Reference.parse(signed.ref), blob) as stream:
                c.push_blob(to, stream.read(), media_type=blob.media_type)
        c.push_manifest(
            to.with_tag(cosign_format.signature_tag(target.manifest_digest)),
            manifest.to_json(),
            mediatypes.OCI_MANIFEST,
        )
    with pytest.raises(SignatureDenied) as caught:
        gate_of(policy_for(f"{registry.host}/signing/**", key_authority(public_pem(key)))).check(
            target.ref
        )
    assert f"a signature of {signed.manifest_digest}, not of {target.manifest_digest}" in (
        caught.value.message
    )


def test_a_hostile_signature_manifest_is_skipped_with_its_reason(registry: RegistryServer) -> None:
    pushed = image(registry, "signing/hostile")
    ref = Reference.parse(pushed.ref)
    with client() as c:
        config = c.push_blob(ref, b"{}", media_type=mediatypes.OCI_CONFIG)
        payload = c.push_blob(ref, b"not json", media_type=cosign_format.SIMPLE_SIGNING)
        huge = c.push_blob(ref, b"x", media_type=cosign_format.SIMPLE_SIGNING)
        huge.size = 50 << 20  # claims 50 MiB: never read
        payload.annotations = {cosign_format.SIGNATURE: base64.b64encode(b"sig").decode()}
        unsigned = c.push_blob(ref, b"{}", media_type=cosign_format.SIMPLE_SIGNING)
        body = json.dumps(
            {
                "schemaVersion": 2,
                "mediaType": mediatypes.OCI_MANIFEST,
                "config": config.to_json(),
                "layers": [payload.to_json(), huge.to_json(), unsigned.to_json()],
            }
        ).encode()
        c.push_manifest(
            ref.with_tag(cosign_format.signature_tag(pushed.manifest_digest)),
            body,
            mediatypes.OCI_MANIFEST,
        )
        found = discover.signatures(c, ref, pushed.manifest_digest)
    assert len(found.signatures) == 1  # the one with a signature annotation: not JSON
    assert any("50" in s or "52428800" in s for s in found.skipped)
    assert any(cosign_format.SIGNATURE in s for s in found.skipped)
    key = ec.generate_private_key(ec.SECP256R1())
    with pytest.raises(SignatureDenied) as caught:
        gate_of(
            policy_for(f"{registry.host}/signing/hostile", key_authority(public_pem(key)))
        ).check(pushed.ref)
    assert "not JSON" in caught.value.message


# -- what a policy allows, and when it asks ----------------------------------------------


def test_an_image_no_policy_selects_is_not_checked(registry: RegistryServer) -> None:
    pushed = image(registry, "signing-unselected/x")
    key = ec.generate_private_key(ec.SECP256R1())
    gate = gate_of(policy_for(f"{registry.host}/signing/**", key_authority(public_pem(key))))
    before = registry.count_requests("GET", r"^/v2/signing-unselected/")
    assert gate.check(pushed.ref) is None
    assert registry.count_requests("GET", r"^/v2/signing-unselected/") == before


def test_a_verified_tag_is_remembered_until_its_policy_changes(registry: RegistryServer) -> None:
    pushed = image(registry, "signing/remembered")
    key = ec.generate_private_key(ec.SECP256R1())
    with client() as c:
        signer.sign(c, pushed.ref, key)
    current = [policy_for(f"{registry.host}/signing/**", key_authority(public_pem(key)))]
    seen: list[str] = []
    gate = Gate(
        policies=lambda: current, read_secret=lambda n: b"", client=client, observe=seen.append
    )
    first = gate.check(pushed.ref)
    asked = registry.count_requests("GET", r"/signing/remembered/manifests/sha256-")
    second = gate.check(pushed.ref)
    assert first is not None and second is not None
    assert (first.remembered, second.remembered) == (False, True)
    assert registry.count_requests("GET", r"/signing/remembered/manifests/sha256-") == asked
    current[0] = policy_for(
        f"{registry.host}/signing/**", key_authority(public_pem(key)), generation=2
    )
    third = gate.check(pushed.ref)
    assert third is not None and not third.remembered
    assert seen == ["verified", "remembered", "verified"]  # what the plugin's metrics count
    assert registry.count_requests("GET", r"/signing/remembered/manifests/sha256-") > asked


def test_a_warn_policy_reports_what_would_be_refused_and_allows_it(
    registry: RegistryServer,
) -> None:
    pushed = image(registry, "signing/warned")
    key = ec.generate_private_key(ec.SECP256R1())
    verdict = gate_of(
        policy_for(f"{registry.host}/signing/warned", key_authority(public_pem(key)), mode="warn")
    ).check(pushed.ref)
    assert verdict is not None and verdict.digest == pushed.manifest_digest
    assert len(verdict.warnings) == 1 and "(warn): no signature found" in verdict.warnings[0]


def test_an_invalid_policy_refuses_what_it_selects(registry: RegistryServer) -> None:
    pushed = image(registry, "signing/broken-policy")
    broken = signing.parse(
        {
            "metadata": {"name": "broken", "generation": 1},
            "spec": {
                "images": [{"glob": f"{registry.host}/signing/**"}],
                "authorities": [{"name": "k", "key": {"data": "not a key"}}],
            },
        },
        strict=False,
    )
    with pytest.raises(SignatureDenied) as caught:
        gate_of(broken).check(pushed.ref)
    assert "the policy is not valid" in caught.value.message


def test_a_key_from_a_missing_secret_refuses_with_what_to_create(registry: RegistryServer) -> None:
    pushed = image(registry, "signing/missing-secret")
    policy = policy_for(
        f"{registry.host}/signing/**", {"name": "k", "key": {"secretRef": {"name": "release"}}}
    )
    with client() as c:
        signer.sign(c, pushed.ref, ec.generate_private_key(ec.SECP256R1()))
    with pytest.raises(SignatureDenied) as caught:
        gate_of(policy).check(pushed.ref)
    assert "no Secret release" in caught.value.message


def test_a_keyless_signature_made_by_cosign_verifies_under_its_local_root(
    registry: RegistryServer, cosign: Cosign, cosign_keys: tuple[Path, Path], tmp_path: Path
) -> None:
    pushed = image(registry, "signing/keyless")
    root = make_ca("test fulcio root")
    intermediate = make_ca("test fulcio intermediate", root)
    signing_key = cosign_private(cosign_keys[0])
    assert isinstance(signing_key, ec.EllipticCurvePrivateKey)
    _key, leaf = make_leaf(intermediate, key=signing_key)
    (tmp_path / "leaf.pem").write_bytes(pem(leaf))
    (tmp_path / "chain.pem").write_bytes(pem(intermediate.cert, root.cert))
    cosign.sign(
        pushed.ref,
        cosign_keys[0],
        "--certificate",
        str(tmp_path / "leaf.pem"),
        "--certificate-chain",
        str(tmp_path / "chain.pem"),
    )

    def keyless_policy(identity: dict[str, str], roots: bytes) -> signing.Policy:
        authority = {
            "name": "ci",
            "keyless": {
                "identities": [identity],
                "trustRoot": {"fulcioCertificates": roots.decode()},
            },
        }
        return policy_for(f"{registry.host}/signing/keyless", authority)

    good = {"issuer": OIDC, "subject": EMAIL}
    assert gate_of(keyless_policy(good, pem(root.cert))).check(pushed.ref) is not None
    with pytest.raises(SignatureDenied, match="matches none of the policy identities"):
        gate_of(keyless_policy({**good, "subject": "someone@else"}, pem(root.cert))).check(
            pushed.ref
        )
    stranger = make_ca("another root")
    with pytest.raises(SignatureDenied):
        gate_of(keyless_policy(good, pem(stranger.cert))).check(pushed.ref)


# -- the node plugin's publish spine ------------------------------------------------------


@contextmanager
def spine(tmp_path: Path, *policies: signing.Policy) -> Iterator[Publisher]:
    images = ImageCache(tmp_path / "images", puller_factory=client)
    (tmp_path / "kubelet").mkdir()
    yield Publisher(
        images=images,
        mounter=FakeMounter(),
        kubelet_dir=tmp_path / "kubelet",
        platform=Platform.parse("linux/amd64"),
        gate=gate_of(*policies),
    )


def publish(pub: Publisher, tmp_path: Path, ref: str, name: str = "v") -> Path:
    target = tmp_path / "kubelet" / "pods" / name / "volumes" / "vol"
    target.parent.mkdir(parents=True)
    return pub.publish(PublishRequest(f"vol-{name}", str(target), VolumeSource(image=ref)))


def blobs_fetched(registry: RegistryServer, repo: str) -> int:
    return registry.count_requests("GET", rf"^/v2/{repo}/blobs/")


def test_the_publish_spine_refuses_an_unsigned_image_before_fetching_anything(
    registry: RegistryServer, tmp_path: Path
) -> None:
    pushed = image(registry, "signing/spine-unsigned")
    key = ec.generate_private_key(ec.SECP256R1())
    with spine(
        tmp_path, policy_for(f"{registry.host}/signing/**", key_authority(public_pem(key)))
    ) as pub:
        with pytest.raises(SignatureDenied) as caught:
            publish(pub, tmp_path, pushed.ref)
        assert caught.value.code == "PERMISSION_DENIED"
        assert blobs_fetched(registry, "signing/spine-unsigned") == 0
        assert not pub.images.has_tree(pushed.manifest_digest)
        assert list((tmp_path / "images" / "unpacked").iterdir()) == []


def test_the_publish_spine_serves_a_signed_image_pinned_to_the_verified_digest(
    registry: RegistryServer, tmp_path: Path
) -> None:
    pushed = image(registry, "signing/spine-signed")
    key = ec.generate_private_key(ec.SECP256R1())
    with client() as c:
        signer.sign(c, pushed.ref, key)
    with spine(
        tmp_path, policy_for(f"{registry.host}/signing/**", key_authority(public_pem(key)))
    ) as pub:
        tree = publish(pub, tmp_path, pushed.ref)
        assert tree == pub.images.tree_path(pushed.manifest_digest)
        assert (tree / "manifests" / "cm.yaml").read_text() == "hello"
        # the tag moves to unsigned content: the remembered verdict keeps the verified digest
        moved = image(registry, "signing/spine-signed", text="swapped")
        assert moved.manifest_digest != pushed.manifest_digest
        again = publish(pub, tmp_path, pushed.ref, name="w")
        assert again == pub.images.tree_path(pushed.manifest_digest)


def test_a_removed_signature_is_refused_once_the_remembered_verdict_expires(
    registry: RegistryServer,
) -> None:
    pushed = image(registry, "signing/removed")
    key = ec.generate_private_key(ec.SECP256R1())
    with client() as c:
        signer.sign(c, pushed.ref, key)
    now = [0.0]
    gate = Gate(
        policies=lambda: [
            policy_for(f"{registry.host}/signing/**", key_authority(public_pem(key)))
        ],
        read_secret=lambda n: b"",
        client=client,
        ttl=60.0,
        clock=lambda: now[0],
    )
    assert gate.check(pushed.ref) is not None
    ref = Reference.parse(pushed.ref)
    with client() as c:  # the signature tag now holds no signature
        config = c.push_blob(ref, b"{}", media_type=mediatypes.OCI_CONFIG)
        empty = Manifest(media_type=mediatypes.OCI_MANIFEST, config=config, layers=[])
        c.push_manifest(
            ref.with_tag(cosign_format.signature_tag(pushed.manifest_digest)),
            empty.to_json(),
            mediatypes.OCI_MANIFEST,
        )
    now[0] = 30.0
    assert gate.check(pushed.ref) is not None  # remembered within the TTL
    now[0] = 61.0
    with pytest.raises(SignatureDenied, match="no signature found"):
        gate.check(pushed.ref)
