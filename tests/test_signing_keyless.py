"""rukpak.signing.keyless: Fulcio certificate paths, identities and Rekor bundles.

A local test CA (root, intermediate) issues ten-minute leaf certificates as Fulcio
does, a local Rekor key signs bundles; nothing touches the network.
"""

from __future__ import annotations

import base64
import hashlib
import json
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa

from rukpak.common import errors
from rukpak.signing import keyless
from rukpak.signing.keyless import Identity, KeylessError, TrustRoot
from tests.signing_helpers import (
    CA,
    EMAIL,
    NOW,
    OIDC,
    SigningKey,
    make_ca,
    make_leaf,
    pem,
)

PAYLOAD = b'{"critical":{"identity":{"docker-reference":"example.com/b"}},"optional":null}'


def sign(key: SigningKey, data: bytes) -> bytes:
    if isinstance(key, ec.EllipticCurvePrivateKey):
        algo = hashes.SHA384() if isinstance(key.curve, ec.SECP384R1) else hashes.SHA256()
        return key.sign(data, ec.ECDSA(algo))
    if isinstance(key, rsa.RSAPrivateKey):
        return key.sign(data, padding.PKCS1v15(), hashes.SHA256())
    return key.sign(data)


def log_id(key: ec.EllipticCurvePrivateKey) -> str:
    der = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(der).hexdigest()


def entry(payload: bytes, signature: bytes, cert_pem: bytes) -> dict[str, Any]:
    return {
        "apiVersion": "0.0.1",
        "kind": "hashedrekord",
        "spec": {
            "data": {"hash": {"algorithm": "sha256", "value": hashlib.sha256(payload).hexdigest()}},
            "signature": {
                "content": base64.b64encode(signature).decode(),
                "publicKey": {"content": base64.b64encode(cert_pem).decode()},
            },
        },
    }


def bundle(
    rekor: ec.EllipticCurvePrivateKey, body: Any, at: datetime, *, logid: str | None = None
) -> dict[str, Any]:
    raw = body if isinstance(body, bytes) else json.dumps(body).encode()
    payload = {
        "body": base64.b64encode(raw).decode(),
        "integratedTime": int(at.timestamp()),
        "logIndex": 42,
        "logID": logid or log_id(rekor),
    }
    canonical = json.dumps(payload, sort_keys=True, separators=(",", ":")).encode()
    set_sig = rekor.sign(canonical, ec.ECDSA(hashes.SHA256()))
    return {"SignedEntryTimestamp": base64.b64encode(set_sig).decode(), "Payload": payload}


@dataclass
class Scene:
    """A root, an intermediate, a leaf under the intermediate, a Rekor key and a bundle."""

    root: CA
    inter: CA
    rekor: ec.EllipticCurvePrivateKey
    key: SigningKey
    leaf: x509.Certificate
    signature: bytes
    at: datetime
    identities: list[Identity] = field(default_factory=lambda: [Identity(OIDC, EMAIL)])

    @property
    def cert_pem(self) -> bytes:
        return pem(self.leaf)

    @property
    def chain_pem(self) -> bytes:
        return pem(self.inter.cert, self.root.cert)

    def trust(self, *, rekor: bool = True) -> TrustRoot:
        rekor_pem = self.rekor.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return TrustRoot.from_pem(pem(self.root.cert), rekor_pem if rekor else None)

    def entry(self) -> dict[str, Any]:
        return entry(PAYLOAD, self.signature, self.cert_pem)

    def bundle(self, body: Any = None, **kw: Any) -> str:
        return json.dumps(bundle(self.rekor, body or self.entry(), self.at, **kw))

    def verify(self, *, bundle_json: str | None = "", rekor: bool = True, **kw: Any) -> None:
        args: dict[str, Any] = {
            "cert_pem": self.cert_pem,
            "chain_pem": self.chain_pem,
            "bundle_json": self.bundle() if bundle_json == "" else bundle_json,
            "signature_b64": base64.b64encode(self.signature).decode(),
            "payload": PAYLOAD,
            "root": self.trust(rekor=rekor),
            "identities": self.identities,
        }
        keyless.verify(**{**args, **kw})


def make_scene(*, key: SigningKey | None = None, **leaf_kw: Any) -> Scene:
    root = make_ca("test fulcio root")
    inter = make_ca("test fulcio intermediate", root)
    leaf_key, leaf = make_leaf(inter, key=key, **leaf_kw)
    at = leaf.not_valid_before_utc + timedelta(minutes=1)
    rekor = ec.generate_private_key(ec.SECP256R1())
    return Scene(root, inter, rekor, leaf_key, leaf, sign(leaf_key, PAYLOAD), at)


@pytest.fixture
def scene() -> Scene:
    return make_scene()


# --- the whole check -------------------------------------------------------------------


def test_a_valid_keyless_signature_with_an_intermediate_in_the_chain_verifies(
    scene: Scene,
) -> None:
    scene.verify()
    key = keyless.verify_certificate(
        scene.cert_pem, scene.chain_pem, scene.trust(), scene.identities
    )
    assert key == scene.leaf.public_key()


def test_a_leaf_issued_directly_by_the_root_verifies_without_a_chain(scene: Scene) -> None:
    _, leaf = make_leaf(scene.root, key=scene.key)
    scene.leaf = leaf
    scene.verify(chain_pem=None)
    with pytest.raises(KeylessError, match="not signed by the trusted Fulcio root"):
        scene.verify(root=TrustRoot.from_pem(pem(scene.inter.cert)), rekor=False)


def test_an_intermediate_given_as_trusted_needs_no_chain(scene: Scene) -> None:
    trust = TrustRoot.from_pem(pem(scene.inter.cert))
    scene.verify(chain_pem=None, root=trust, rekor=False)
    with pytest.raises(KeylessError, match="no trusted or chained issuer"):
        scene.verify(chain_pem=None, rekor=False)


@pytest.mark.parametrize(
    "key",
    [
        pytest.param(lambda: ec.generate_private_key(ec.SECP384R1()), id="ecdsa-p384"),
        pytest.param(lambda: rsa.generate_private_key(65537, 2048), id="rsa"),
        pytest.param(ed25519.Ed25519PrivateKey.generate, id="ed25519"),
    ],
)
def test_other_leaf_key_types_verify_with_their_own_algorithm(
    key: Callable[[], SigningKey],
) -> None:
    scene = make_scene(key=key())
    scene.verify()
    with pytest.raises(KeylessError, match="signature does not verify"):
        scene.verify(payload=PAYLOAD + b" ", rekor=False)


def test_a_tampered_payload_is_refused(scene: Scene) -> None:
    with pytest.raises(KeylessError, match="signature does not verify over the payload"):
        scene.verify(payload=PAYLOAD + b" ", rekor=False)
    with pytest.raises(KeylessError, match="hash does not match the signed payload"):
        scene.verify(payload=PAYLOAD + b" ")


def test_a_signature_by_another_key_is_refused(scene: Scene) -> None:
    other = sign(ec.generate_private_key(ec.SECP256R1()), PAYLOAD)
    with pytest.raises(KeylessError, match="signature does not verify"):
        scene.verify(signature_b64=base64.b64encode(other).decode(), rekor=False)
    with pytest.raises(KeylessError, match="not valid base64"):
        scene.verify(signature_b64="not base64!", rekor=False)


# --- the certificate path --------------------------------------------------------------


def test_a_certificate_from_another_ca_is_refused(scene: Scene) -> None:
    other = make_ca("test fulcio intermediate")
    _, leaf = make_leaf(other)
    with pytest.raises(KeylessError, match="not signed by the trusted Fulcio root"):
        keyless.verify_certificate(pem(leaf), scene.chain_pem, scene.trust(), scene.identities)


def test_a_chain_that_brings_its_own_root_does_not_make_it_trusted(scene: Scene) -> None:
    rogue_root = make_ca("test fulcio root")
    rogue_inter = make_ca("test fulcio intermediate", rogue_root)
    _, leaf = make_leaf(rogue_inter)
    chain = pem(rogue_inter.cert, rogue_root.cert)
    with pytest.raises(KeylessError, match="not signed by the trusted Fulcio root"):
        keyless.verify_certificate(pem(leaf), chain, scene.trust(), scene.identities)


def test_an_issuer_that_is_not_a_ca_cannot_issue(scene: Scene) -> None:
    not_ca = make_ca("not a ca", scene.root, ca=False)
    _, leaf = make_leaf(not_ca)
    with pytest.raises(KeylessError, match="is not a CA"):
        keyless.verify_certificate(pem(leaf), pem(not_ca.cert), scene.trust(), scene.identities)


def test_an_issuer_whose_key_usage_forbids_certificate_signing_cannot_issue(
    scene: Scene,
) -> None:
    no_sign = make_ca("no cert sign", scene.root, cert_sign=False)
    _, leaf = make_leaf(no_sign)
    with pytest.raises(KeylessError, match="may not sign certificates"):
        keyless.verify_certificate(pem(leaf), pem(no_sign.cert), scene.trust(), scene.identities)
    signs = make_ca("cert sign", scene.root, cert_sign=True)
    _, leaf = make_leaf(signs)
    assert keyless.verify_certificate(pem(leaf), pem(signs.cert), scene.trust(), scene.identities)


def test_a_path_longer_than_the_root_allows_is_refused() -> None:
    root = make_ca("strict root", path_length=0)
    inter = make_ca("intermediate", root)
    _, leaf = make_leaf(inter)
    trust = TrustRoot.from_pem(pem(root.cert))
    with pytest.raises(KeylessError, match="path length of 0"):
        keyless.verify_certificate(pem(leaf), pem(inter.cert), trust, [Identity(OIDC, EMAIL)])


def test_a_leaf_without_the_code_signing_usage_is_refused(scene: Scene) -> None:
    _, leaf = make_leaf(scene.inter, code_signing=False)
    with pytest.raises(KeylessError, match="codeSigning"):
        keyless.verify_certificate(pem(leaf), scene.chain_pem, scene.trust(), scene.identities)


def test_an_expired_certificate_is_refused_at_the_time_asked(scene: Scene) -> None:
    _, leaf = make_leaf(scene.inter, not_before=NOW - timedelta(hours=2))
    trust, ids = scene.trust(), scene.identities
    with pytest.raises(KeylessError, match="certificate expired at"):
        keyless.verify_certificate(pem(leaf), scene.chain_pem, trust, ids)
    with pytest.raises(KeylessError, match="not valid before"):
        keyless.verify_certificate(
            pem(leaf), scene.chain_pem, trust, ids, at=NOW - timedelta(hours=3)
        )
    at = NOW - timedelta(hours=2) + timedelta(minutes=5)
    assert keyless.verify_certificate(pem(leaf), scene.chain_pem, trust, ids, at=at)


def test_an_expired_chain_certificate_is_named(scene: Scene) -> None:
    now = datetime.now(UTC).replace(microsecond=0)
    inter = make_ca("short-lived intermediate", scene.root, until=now)
    _, leaf = make_leaf(inter, not_before=now - timedelta(minutes=1))
    at = now + timedelta(minutes=5)
    assert leaf.not_valid_after_utc > at
    with pytest.raises(KeylessError, match="chain certificate CN=short-lived intermediate expired"):
        keyless.verify_certificate(
            pem(leaf), pem(inter.cert), scene.trust(), scene.identities, at=at
        )


def test_an_expired_certificate_verifies_at_its_rekor_integrated_time() -> None:
    scene = make_scene(not_before=NOW - timedelta(hours=2))
    assert scene.leaf.not_valid_after_utc < NOW
    scene.verify()


def test_an_expired_certificate_is_not_time_checked_without_rekor_keys() -> None:
    scene = make_scene(not_before=NOW - timedelta(hours=2))
    scene.verify(rekor=False, bundle_json=None)
    with pytest.raises(KeylessError, match="expired at"):
        keyless.verify_certificate(scene.cert_pem, scene.chain_pem, scene.trust(), [])


def test_an_integrated_time_outside_the_certificate_validity_is_refused(scene: Scene) -> None:
    with pytest.raises(KeylessError, match="certificate expired at"):
        scene.verify(
            bundle_json=json.dumps(bundle(scene.rekor, scene.entry(), NOW + timedelta(hours=1)))
        )
    with pytest.raises(KeylessError, match="not valid before"):
        scene.verify(
            bundle_json=json.dumps(bundle(scene.rekor, scene.entry(), NOW - timedelta(hours=1)))
        )


# --- identities -----------------------------------------------------------------------


def test_the_identity_is_the_issuer_extension_and_the_first_email() -> None:
    _, leaf = make_leaf(make_ca("ca"), email=EMAIL, uri="https://example.com/wf")
    assert keyless.certificate_identity(leaf) == (OIDC, EMAIL)


def test_a_uri_san_is_the_subject_when_there_is_no_email() -> None:
    uri = "https://github.com/o/r/.github/workflows/release.yaml@refs/heads/main"
    _, leaf = make_leaf(make_ca("ca"), email=None, uri=uri)
    assert keyless.certificate_identity(leaf) == (OIDC, uri)
    _, bare = make_leaf(make_ca("ca"), email=None)
    assert keyless.certificate_identity(bare) == (OIDC, "")


def test_the_legacy_issuer_extension_is_read_when_the_new_one_is_absent() -> None:
    ca = make_ca("ca")
    _, legacy = make_leaf(ca, oidc=None, legacy_oidc="https://legacy.example.com")
    assert keyless.certificate_identity(legacy) == ("https://legacy.example.com", EMAIL)
    _, both = make_leaf(ca, legacy_oidc="https://legacy.example.com")
    assert keyless.certificate_identity(both) == (OIDC, EMAIL)
    _, neither = make_leaf(ca, oidc=None)
    assert keyless.certificate_identity(neither) == ("", EMAIL)


@pytest.mark.parametrize(
    "raw",
    [
        b"\x13\x03abc",
        b"\x0c\x05abc",
        b"\x0c\x02\xff\xfe",
        b"\x0c",
        b"\x0c\x85\x00\x00\x00\x00\x01a",
    ],
    ids=["printable-string", "short", "not-utf8", "truncated", "long-form-length-too-long"],
)
def test_a_malformed_issuer_extension_is_refused(raw: bytes) -> None:
    _, leaf = make_leaf(make_ca("ca"), issuer_ext=raw)
    with pytest.raises(KeylessError, match="issuer extension is not a DER UTF8String"):
        keyless.certificate_identity(leaf)


def test_a_long_issuer_uses_the_long_form_der_length() -> None:
    long_issuer = "https://" + "a" * 200 + ".example.com"
    raw = long_issuer.encode()
    _, leaf = make_leaf(make_ca("ca"), issuer_ext=bytes([0x0C, 0x81, len(raw)]) + raw)
    assert keyless.certificate_identity(leaf)[0] == long_issuer


def test_an_identity_with_another_issuer_is_refused(scene: Scene) -> None:
    scene.identities = [Identity(issuer="https://other.example.com", subject=EMAIL)]
    with pytest.raises(KeylessError, match=f"issuer='{OIDC}' subject='{EMAIL}' matches none"):
        scene.verify()


def test_an_identity_with_another_subject_is_refused(scene: Scene) -> None:
    scene.identities = [Identity(issuer=OIDC, subject="mallory@example.com")]
    with pytest.raises(KeylessError, match="matches none of the policy identities"):
        scene.verify()


def test_any_one_matching_identity_is_enough(scene: Scene) -> None:
    scene.identities = [Identity(OIDC, "mallory@example.com"), Identity(OIDC, EMAIL)]
    scene.verify()
    scene.identities = []
    with pytest.raises(KeylessError, match="matches none"):
        scene.verify()


def test_regexp_identities_must_match_the_whole_value(scene: Scene) -> None:
    scene.identities = [
        Identity(issuer_regexp=r"https://accounts\.example\.com", subject_regexp=r".*@example\.com")
    ]
    scene.verify()
    partial = Identity(issuer_regexp="accounts", subject_regexp=r".*@example\.com")
    assert not partial.matches(OIDC, EMAIL)
    wrong_subject = Identity(issuer=OIDC, subject_regexp=r".*@example\.org")
    assert not wrong_subject.matches(OIDC, EMAIL)
    scene.identities = [partial, wrong_subject]
    with pytest.raises(KeylessError, match="matches none"):
        scene.verify()


def test_every_given_identity_field_must_match() -> None:
    assert Identity(issuer=OIDC).matches(OIDC, "anyone")
    assert Identity(subject=EMAIL).matches("any issuer", EMAIL)
    assert not Identity(issuer=OIDC, subject_regexp="nobody").matches(OIDC, EMAIL)
    assert not Identity(issuer="x", issuer_regexp=".*").matches(OIDC, EMAIL)


def test_an_identity_with_no_field_matches_nothing() -> None:
    assert not Identity().matches("", "")
    assert not Identity().matches(OIDC, EMAIL)


def test_a_regexp_that_does_not_compile_matches_nothing() -> None:
    assert not Identity(issuer_regexp="(", subject=EMAIL).matches("(", EMAIL)
    assert Identity(issuer_regexp=r"\(", subject=EMAIL).matches("(", EMAIL)


# --- Rekor bundles --------------------------------------------------------------------


def _check(scene: Scene, bundle_json: str, payload: bytes = PAYLOAD) -> datetime:
    return keyless.verify_rekor_bundle(
        bundle_json,
        scene.trust(),
        signature_b64=base64.b64encode(scene.signature).decode(),
        payload=payload,
        cert_pem=scene.cert_pem,
    )


def test_a_valid_bundle_gives_its_integrated_time_in_utc(scene: Scene) -> None:
    got = _check(scene, scene.bundle())
    assert got == scene.at.replace(microsecond=0)
    assert got.tzinfo is UTC


def test_a_tampered_signed_entry_timestamp_is_refused(scene: Scene) -> None:
    doc = json.loads(scene.bundle())
    sig = bytearray(base64.b64decode(doc["SignedEntryTimestamp"]))
    sig[-1] ^= 1
    doc["SignedEntryTimestamp"] = base64.b64encode(bytes(sig)).decode()
    with pytest.raises(KeylessError, match="SignedEntryTimestamp does not verify"):
        _check(scene, json.dumps(doc))


def test_a_changed_integrated_time_breaks_the_signed_entry_timestamp(scene: Scene) -> None:
    doc = json.loads(scene.bundle())
    doc["Payload"]["integratedTime"] += 3600
    with pytest.raises(KeylessError, match="SignedEntryTimestamp does not verify"):
        _check(scene, json.dumps(doc))


def test_a_bundle_with_another_log_id_is_refused(scene: Scene) -> None:
    with pytest.raises(KeylessError, match="matches none of the trusted Rekor keys"):
        _check(scene, scene.bundle(logid="00" * 32))
    other = ec.generate_private_key(ec.SECP256R1())
    with pytest.raises(KeylessError, match="matches none of the trusted Rekor keys"):
        _check(scene, json.dumps(bundle(other, scene.entry(), scene.at)))


def test_a_bundle_is_checked_with_any_of_several_rekor_keys(scene: Scene) -> None:
    old = ec.generate_private_key(ec.SECP256R1())
    pems = b"".join(
        k.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        for k in (old, scene.rekor)
    )
    trust = TrustRoot.from_pem(pem(scene.root.cert), pems)
    assert len(trust.rekor_keys) == 2
    scene.verify(root=trust)


def test_a_body_hash_for_another_payload_is_refused(scene: Scene) -> None:
    body = entry(b"another payload", scene.signature, scene.cert_pem)
    with pytest.raises(KeylessError, match="hash does not match the signed payload"):
        _check(scene, scene.bundle(body))


def test_a_body_signature_for_another_signature_is_refused(scene: Scene) -> None:
    body = entry(PAYLOAD, b"another signature", scene.cert_pem)
    with pytest.raises(KeylessError, match="signature does not match the image signature"):
        _check(scene, scene.bundle(body))


def test_a_body_naming_another_certificate_is_refused(scene: Scene) -> None:
    _, other = make_leaf(scene.inter)
    with pytest.raises(KeylessError, match="certificate does not match"):
        _check(scene, scene.bundle(entry(PAYLOAD, scene.signature, pem(other))))


def test_a_body_of_another_kind_is_refused(scene: Scene) -> None:
    body = scene.entry()
    body["kind"] = "intoto"
    with pytest.raises(KeylessError, match="not a hashedrekord"):
        _check(scene, scene.bundle(body))
    body = scene.entry()
    body["spec"]["data"]["hash"]["algorithm"] = "sha512"
    with pytest.raises(KeylessError, match="not a sha256 hash"):
        _check(scene, scene.bundle(body))


def _edit(path: tuple[str, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def edit(doc: dict[str, Any]) -> None:
        for key in path[:-1]:
            doc = doc[key]
        if value is None:
            del doc[path[-1]]
        else:
            doc[path[-1]] = value

    return edit


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (_edit(("Payload",), None), "lacks Payload.body"),
        (_edit(("SignedEntryTimestamp",), None), "lacks SignedEntryTimestamp"),
        (_edit(("SignedEntryTimestamp",), "not base64!"), "not valid base64"),
        (_edit(("SignedEntryTimestamp",), 7), "not a base64 string"),
        (_edit(("Payload", "integratedTime"), "1700000000"), "integratedTime is not"),
        (_edit(("Payload", "integratedTime"), True), "integratedTime is not"),
        (_edit(("Payload", "logIndex"), -1), "logIndex is not"),
        (_edit(("Payload", "logID"), 5), "must be strings"),
    ],
    ids=[
        "no-payload",
        "no-set",
        "set-not-base64",
        "set-not-string",
        "time-string",
        "time-bool",
        "index-negative",
        "logid-number",
    ],
)
def test_a_malformed_bundle_is_refused(
    scene: Scene, edit: Callable[[dict[str, Any]], None], message: str
) -> None:
    doc = json.loads(scene.bundle())
    edit(doc)
    with pytest.raises(KeylessError, match=message):
        _check(scene, json.dumps(doc))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "rekor bundle is not valid JSON"),
        ("[]", "lacks SignedEntryTimestamp"),
        ("[" * 100_000, "not valid JSON"),
    ],
    ids=["not-json", "a-list", "deeply-nested"],
)
def test_a_bundle_that_is_not_a_json_object_is_refused(
    scene: Scene, text: str, message: str
) -> None:
    with pytest.raises(KeylessError, match=message):
        _check(scene, text)


def test_a_signed_body_that_is_not_base64_json_is_refused(scene: Scene) -> None:
    with pytest.raises(KeylessError, match="rekor bundle body is not valid JSON"):
        _check(scene, scene.bundle(b"not json"))
    with pytest.raises(KeylessError, match="lacks kind"):
        _check(scene, scene.bundle(b"[1]"))


def test_an_oversized_bundle_is_refused_before_parsing(scene: Scene) -> None:
    padded = scene.bundle() + " " * keyless.MAX_BUNDLE_BYTES
    with pytest.raises(KeylessError, match="larger than 1048576 bytes"):
        _check(scene, padded)
    wide = scene.bundle() + "é" * (keyless.MAX_BUNDLE_BYTES // 2)
    with pytest.raises(KeylessError, match="larger than"):
        _check(scene, wide)


def test_a_missing_bundle_is_refused_when_rekor_keys_are_given(scene: Scene) -> None:
    with pytest.raises(KeylessError, match="Rekor bundle is required"):
        scene.verify(bundle_json=None)
    scene.verify(bundle_json=None, rekor=False)


def test_a_bundle_is_not_read_without_rekor_keys(scene: Scene) -> None:
    scene.verify(bundle_json="{not json", rekor=False)
    with pytest.raises(KeylessError, match="not valid JSON"):
        scene.verify(bundle_json="{not json")


# --- inputs ---------------------------------------------------------------------------


def test_an_unparsable_trust_root_is_an_invalid_argument(scene: Scene) -> None:
    with pytest.raises(errors.InvalidArgument, match="Fulcio trust root"):
        TrustRoot.from_pem(b"not a certificate")
    with pytest.raises(errors.InvalidArgument, match="no PEM PUBLIC KEY block"):
        TrustRoot.from_pem(pem(scene.root.cert), b"not a key")
    broken = b"-----BEGIN PUBLIC KEY-----\nAAAA\n-----END PUBLIC KEY-----\n"
    with pytest.raises(errors.InvalidArgument, match="not a valid public key"):
        TrustRoot.from_pem(pem(scene.root.cert), broken)
    assert TrustRoot.from_pem(pem(scene.root.cert)).certificates == (scene.root.cert,)


def test_an_unparsable_certificate_or_chain_is_refused(scene: Scene) -> None:
    with pytest.raises(KeylessError, match="signing certificate is not a PEM certificate"):
        scene.verify(cert_pem=b"not a certificate", rekor=False)
    with pytest.raises(KeylessError, match="certificate chain is not a PEM bundle"):
        scene.verify(chain_pem=b"not a chain", rekor=False)


def test_a_chain_longer_than_the_limit_is_refused(scene: Scene) -> None:
    chain = pem(*[scene.inter.cert] * (keyless.MAX_CHAIN_CERTS + 1))
    with pytest.raises(KeylessError, match="more than 10 certificates"):
        scene.verify(chain_pem=chain, rekor=False)


def test_keyless_errors_are_permission_denied(scene: Scene) -> None:
    scene.identities = []
    with pytest.raises(errors.PermissionDenied) as caught:
        scene.verify()
    assert caught.value.code == "PERMISSION_DENIED"
