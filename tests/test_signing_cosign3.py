"""cosign 3's Sigstore bundles against real components: the test registry (distribution 2.8,
which has no referrers API, so bundles are found through the referrers tag schema) and
cosign 3 built from its Go module.

cosign 3 signs and rukpak verifies (the library and ``rukpak bundle verify``), rukpak signs
a bundle and cosign 3 verifies it, both formats side by side, and a bundle copied to
another image's index is refused.
"""

from __future__ import annotations

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
from rukpak.signing import sign as signer
from rukpak.signing.gate import SignatureDenied
from tests.csi_helpers import PushedImage, simple_image
from tests.registry import RegistryServer
from tests.signing_helpers import PASSWORD, Cosign, cosign3
from tests.test_signing import gate_of, key_authority, policy_for, publish, spine

pytestmark = pytest.mark.registry
__all__ = ["cosign3"]  # the session fixture, used by name


@pytest.fixture(scope="module")
def keys3(cosign3: Cosign) -> tuple[Path, Path]:
    return cosign3.key_pair("release3")


@pytest.fixture(scope="module")
def signing_config(cosign3: Cosign) -> Path:
    """A signing config that names no service: cosign 3 signs offline with a key."""
    out = cosign3.home / "signing-config.json"
    cosign3.run("signing-config", "create", "--out", str(out))
    return out


def sign3(cosign3: Cosign, pushed: PushedImage, key: Path, config: Path) -> None:
    cosign3.run(
        "sign", "--yes", "--key", str(key), "--signing-config", str(config),
        "--allow-http-registry", "--allow-insecure-registry", pinned(pushed),
    )  # fmt: skip


def verify3(cosign3: Cosign, pushed: PushedImage, public: Path) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [str(cosign3.binary), "verify", "--key", str(public), "--insecure-ignore-tlog",
         "--allow-http-registry", "--allow-insecure-registry", pinned(pushed)],
        capture_output=True, text=True, timeout=120, check=False,
        env={"HOME": str(cosign3.home), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip


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
    registry: RegistryServer, cosign3: Cosign, keys3: tuple[Path, Path], signing_config: Path
) -> None:
    pushed = image(registry, "signing3/by-cosign")
    sign3(cosign3, pushed, keys3[0], signing_config)
    with RegistryClient(timeout=10) as c:
        index = fallback_index(c, pushed)
        found = discover.signatures(c, Reference.parse(pushed.ref), pushed.manifest_digest)
    assert [m.artifact_type for m in index.manifests] == [sigstore.BUNDLE_V03]
    assert len(found.signatures) == 1, found.skipped
    assert found.signatures[0].subject_digest == pushed.manifest_digest
    policy = policy_for(f"{registry.host}/signing3/*", key_authority(keys3[1].read_bytes()))
    verdict = gate_of(policy).check(pushed.ref)
    assert verdict is not None and verdict.digest == pushed.manifest_digest


def test_rukpak_bundle_verify_accepts_what_cosign3_signed_and_refuses_another_key(
    registry: RegistryServer,
    cosign3: Cosign,
    keys3: tuple[Path, Path],
    signing_config: Path,
    tmp_path: Path,
) -> None:
    pushed = image(registry, "signing3/cli")
    sign3(cosign3, pushed, keys3[0], signing_config)
    cli = [str(Path(sys.executable).parent / "rukpak"), "bundle", "verify", "--insecure"]
    done = subprocess.run(
        [*cli, "--key", str(keys3[1]), pinned(pushed)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert f"verified: {registry.host}/signing3/cli@{pushed.manifest_digest}" in done.stdout
    other = cosign3.key_pair("other3")[1]
    done = subprocess.run(
        [*cli, "--key", str(other), pinned(pushed)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 1
    assert "no signature verifies with key" in done.stderr


def test_what_rukpak_signs_as_a_bundle_cosign3_verifies(
    registry: RegistryServer, cosign3: Cosign, keys3: tuple[Path, Path]
) -> None:
    pushed = image(registry, "signing3/by-rukpak")
    before = verify3(cosign3, pushed, keys3[1])
    assert before.returncode != 0  # nothing signed yet: cosign refuses
    key = keys.load_private_key(keys3[0].read_bytes(), PASSWORD.encode())
    with RegistryClient(timeout=10) as c:
        signed = signer.sign_bundle(c, pushed.ref, key)
        index = fallback_index(c, pushed)
    assert signed.digest == pushed.manifest_digest
    with RegistryClient(timeout=10) as c:  # the image's tag still names the image
        assert c.resolve(Reference.parse(pushed.ref)).digest == pushed.manifest_digest
    assert [m.digest for m in index.manifests] == [signed.signature_ref.rsplit("@", 1)[1]]
    done = verify3(cosign3, pushed, keys3[1])
    assert done.returncode == 0, done.stderr
    assert pushed.manifest_digest in done.stdout


def test_both_formats_side_by_side_are_found_and_each_verifies(
    registry: RegistryServer, cosign3: Cosign, keys3: tuple[Path, Path], signing_config: Path
) -> None:
    pushed = image(registry, "signing3/both")
    sign3(cosign3, pushed, keys3[0], signing_config)
    key = keys.load_private_key(keys3[0].read_bytes(), PASSWORD.encode())
    with RegistryClient(timeout=10) as c:
        signer.sign(c, pushed.ref, key)  # cosign 2's format, in the .sig tag
        signer.sign_bundle(c, pushed.ref, key)  # a second bundle, beside cosign 3's
        found = discover.signatures(c, Reference.parse(pushed.ref), pushed.manifest_digest)
        index = fallback_index(c, pushed)
    assert len(index.manifests) == 2
    assert sorted(s.subject_digest is not None for s in found.signatures) == [False, True, True]
    policy = policy_for(f"{registry.host}/signing3/*", key_authority(keys3[1].read_bytes()))
    assert gate_of(policy).check(pushed.ref) is not None


def test_a_bundle_listed_for_another_image_is_refused(
    registry: RegistryServer, keys3: tuple[Path, Path]
) -> None:
    signed_image, victim = image(registry, "signing3/a"), image(registry, "signing3/b")
    key = keys.load_private_key(keys3[0].read_bytes(), PASSWORD.encode())
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
    policy = policy_for(f"{registry.host}/signing3/*", key_authority(keys3[1].read_bytes()))
    outcome = verify.check(policy, found, victim.manifest_digest, read_secret=no_secret)
    assert not outcome.ok
    copied = f"a signature of {signed_image.manifest_digest}, not of {victim.manifest_digest}"
    assert copied in outcome.reason


def no_secret(name: str) -> bytes:
    raise AssertionError(f"no Secret is read here ({name})")


def test_the_node_plugins_publish_spine_serves_what_cosign3_signed(
    registry: RegistryServer,
    cosign3: Cosign,
    keys3: tuple[Path, Path],
    signing_config: Path,
    tmp_path: Path,
) -> None:
    pushed = image(registry, "signing3/spine")
    policy = policy_for(f"{registry.host}/signing3/*", key_authority(keys3[1].read_bytes()))
    with spine(tmp_path, policy) as pub:
        with pytest.raises(SignatureDenied):  # not signed yet
            publish(pub, tmp_path, pushed.ref, name="before")
        sign3(cosign3, pushed, keys3[0], signing_config)
        tree = publish(pub, tmp_path, pushed.ref, name="after")
        assert tree == pub.images.tree_path(pushed.manifest_digest)
        assert (tree / "manifests" / "cm.yaml").read_text() == "signing3/spine"
