"""rukpak.signing's pure parts: cosign's format, keys, policies and one policy's check.

No registry, no network, no subprocess: keys come from ``cryptography``, cosign's
encrypted private keys are built here as ``cosign generate-key-pair`` builds them
(scrypt, then NaCl secretbox), and signatures are hand-made ``Found`` objects.
"""

from __future__ import annotations

import base64
import hashlib
import json
import os
from collections.abc import Callable
from functools import cache
from typing import Any

import nacl.secret
import pytest
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import dsa, ec, ed448, ed25519, padding, rsa, x448
from cryptography.hazmat.primitives.asymmetric.types import PublicKeyTypes

from rukpak.common import errors
from rukpak.oci.reference import Reference
from rukpak.signing import cosign, keyless, keys, policy, verify
from rukpak.signing.discover import Found
from rukpak.signing.policy import KeyAuthority, KeylessAuthority, Policy
from tests import signing_helpers

DIGEST = "sha256:" + "a" * 64
OTHER_DIGEST = "sha256:" + "b" * 64
IMAGE = "registry.example.com/bundles/app"
WHERE = f"{IMAGE}:sha256-{'a' * 64}.sig"

KEY_KINDS = ("p256", "p384", "p521", "rsa2048", "ed25519")


# --- helpers -------------------------------------------------------------------------


def _generate(kind: str) -> keys.PrivateKey:
    if kind == "p256":
        return ec.generate_private_key(ec.SECP256R1())
    if kind == "p384":
        return ec.generate_private_key(ec.SECP384R1())
    if kind == "p521":
        return ec.generate_private_key(ec.SECP521R1())
    if kind == "rsa2048":
        return rsa.generate_private_key(public_exponent=65537, key_size=2048)
    assert kind == "ed25519"
    return ed25519.Ed25519PrivateKey.generate()


@cache
def private_key(kind: str, n: int = 0) -> keys.PrivateKey:
    """Key number ``n`` of a kind, made once per test run (RSA keys take a while)."""
    return _generate(kind)


def spki(key: PublicKeyTypes) -> bytes:
    return key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def public_pem(key: keys.PrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def pkcs8_pem(key: Any, password: bytes | None = None) -> bytes:
    encryption: serialization.KeySerializationEncryption = (
        serialization.BestAvailableEncryption(password)
        if password
        else serialization.NoEncryption()
    )
    data: bytes = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, encryption
    )
    return data


def pkcs8_der(key: keys.PrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.DER,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def b64(data: bytes) -> str:
    return base64.b64encode(data).decode()


def cosign_envelope(plaintext: bytes, password: bytes) -> dict[str, Any]:
    """The JSON cosign's ``generate-key-pair`` writes: scrypt (N=32768, r=8, p=1) over a
    32-byte salt, then NaCl secretbox with a 24-byte nonce; only the ciphertext stored."""
    salt, nonce = os.urandom(32), os.urandom(24)
    secret = hashlib.scrypt(password, salt=salt, n=32768, r=8, p=1, dklen=32, maxmem=256 << 20)
    box = nacl.secret.SecretBox(secret).encrypt(plaintext, nonce)
    return {
        "kdf": {"name": "scrypt", "params": {"N": 32768, "r": 8, "p": 1}, "salt": b64(salt)},
        "cipher": {"name": "nacl/secretbox", "nonce": b64(nonce)},
        "ciphertext": b64(box.ciphertext),
    }


def armour(body: bytes, kind: str = "ENCRYPTED SIGSTORE PRIVATE KEY") -> bytes:
    """PEM armour around ``body`` (base64 in lines of 64 characters)."""
    text = b64(body)
    lines = [text[i : i + 64] for i in range(0, len(text), 64)]
    return "\n".join([f"-----BEGIN {kind}-----", *lines, f"-----END {kind}-----", ""]).encode()


def cosign_key(
    key: keys.PrivateKey, password: bytes, kind: str = "ENCRYPTED SIGSTORE PRIVATE KEY"
) -> bytes:
    return armour(json.dumps(cosign_envelope(pkcs8_der(key), password)).encode(), kind)


@cache
def good_envelope() -> str:
    """One valid envelope (as JSON text) for tests that break one of its fields."""
    return json.dumps(cosign_envelope(pkcs8_der(private_key("p256")), b"pw"))


def broken_envelope(change: Callable[[dict[str, Any]], None]) -> bytes:
    envelope: dict[str, Any] = json.loads(good_envelope())
    change(envelope)
    return armour(json.dumps(envelope).encode())


@cache
def ca_pem() -> bytes:
    """A self-signed CA certificate, a keyless trust root."""
    return signing_helpers.pem(signing_helpers.make_ca("test fulcio").cert)


def policy_object(spec: dict[str, Any], **meta: Any) -> dict[str, Any]:
    metadata = {"name": "bundles", "uid": "uid-1", "generation": 3, **meta}
    return {
        "apiVersion": f"{policy.GROUP}/{policy.VERSION}",
        "kind": policy.KIND,
        "metadata": metadata,
        "spec": spec,
    }


def key_authority_spec(name: str = "release", kind: str = "p256") -> dict[str, Any]:
    return {"name": name, "key": {"data": public_pem(private_key(kind)).decode()}}


def problems_of(spec: dict[str, Any]) -> str:
    with pytest.raises(errors.InvalidArgument) as caught:
        policy.parse(policy_object(spec))
    return caught.value.message


def signed(key: keys.PrivateKey, digest: str = DIGEST, where: str = WHERE) -> cosign.Signature:
    body = cosign.payload(IMAGE, digest)
    return cosign.Signature(payload=body, signature=keys.sign(key, body), where=where)


def key_policy(*authorities: policy.Authority, problem: str = "") -> Policy:
    return Policy(
        name="bundles",
        uid="uid-1",
        generation=1,
        globs=("**",),
        authorities=authorities,
        problem=problem,
    )


def no_secrets(name: str) -> bytes:
    raise AssertionError(f"no Secret should be read, but {name!r} was")


# --- cosign: tags --------------------------------------------------------------------


@pytest.mark.parametrize(
    ("digest", "sig_tag", "referrers"),
    [
        (DIGEST, f"sha256-{'a' * 64}.sig", f"sha256-{'a' * 64}"),
        ("sha512:" + "c" * 128, f"sha512-{'c' * 128}.sig", f"sha512-{'c' * 128}"),
    ],
)
def test_the_tags_of_a_digest_replace_its_colon_with_a_dash(
    digest: str, sig_tag: str, referrers: str
) -> None:
    assert cosign.signature_tag(digest) == sig_tag
    assert cosign.referrers_tag(digest) == referrers


@pytest.mark.parametrize(
    "digest",
    [
        "",
        "latest",
        "sha256:" + "a" * 63,
        "sha256:" + "A" * 64,
        "sha256-" + "a" * 64,
        "md5:" + "a" * 32,
        "sha256:" + "g" * 64,
    ],
)
@pytest.mark.parametrize("tag_of", [cosign.signature_tag, cosign.referrers_tag])
def test_an_invalid_digest_has_no_tag(digest: str, tag_of: Callable[[str], str]) -> None:
    with pytest.raises(errors.InvalidArgument, match="signed digest"):
        tag_of(digest)


# --- cosign: the payload -------------------------------------------------------------


def test_the_payload_is_compact_json_in_cosigns_field_order() -> None:
    assert cosign.payload("registry.example.com/bundles/app", DIGEST) == (
        b'{"critical":{"identity":{"docker-reference":"registry.example.com/bundles/app"},'
        b'"image":{"docker-manifest-digest":"' + DIGEST.encode() + b'"},'
        b'"type":"cosign container image signature"},"optional":null}'
    )


@pytest.mark.parametrize("digest", [DIGEST, OTHER_DIGEST, "sha512:" + "d" * 128])
def test_a_payload_round_trips_through_signed_digest(digest: str) -> None:
    assert cosign.signed_digest(cosign.payload("docker.io/library/nginx", digest)) == digest


def _payload_with(critical: Any) -> bytes:
    return json.dumps({"critical": critical, "optional": None}).encode()


@pytest.mark.parametrize(
    ("body", "fragment"),
    [
        (b"not json", "is not JSON"),
        (b"", "is not JSON"),
        (b'{"critical":', "is not JSON"),
        (b"\xc3\x28", "is not JSON"),
        (b"[]", "is not a 'cosign container image signature'"),
        (b'"critical"', "is not a 'cosign container image signature'"),
        (b"null", "is not a 'cosign container image signature'"),
        (b"42", "is not a 'cosign container image signature'"),
        (b"{}", "is not a 'cosign container image signature'"),
        (_payload_with([]), "is not a 'cosign container image signature'"),
        (
            _payload_with({"type": "atomic container signature", "image": {}}),
            "is not a 'cosign container image signature'",
        ),
        (
            _payload_with({"image": {"docker-manifest-digest": DIGEST}}),
            "is not a 'cosign container image signature'",
        ),
        (_payload_with({"type": cosign.PAYLOAD_TYPE}), "no valid docker-manifest-digest"),
        (
            _payload_with({"type": cosign.PAYLOAD_TYPE, "image": DIGEST}),
            "no valid docker-manifest-digest",
        ),
        (
            _payload_with({"type": cosign.PAYLOAD_TYPE, "image": {}}),
            "no valid docker-manifest-digest",
        ),
        (
            _payload_with({"type": cosign.PAYLOAD_TYPE, "image": {"docker-manifest-digest": 7}}),
            "no valid docker-manifest-digest",
        ),
        (
            _payload_with(
                {"type": cosign.PAYLOAD_TYPE, "image": {"docker-manifest-digest": "sha256:ab"}}
            ),
            "no valid docker-manifest-digest",
        ),
        (
            _payload_with(
                {
                    "type": cosign.PAYLOAD_TYPE,
                    "image": {"docker-manifest-digest": "sha256:" + "A" * 64},
                }
            ),
            "no valid docker-manifest-digest",
        ),
    ],
)
def test_signed_digest_refuses_what_is_not_a_cosign_image_signature_payload(
    body: bytes, fragment: str
) -> None:
    with pytest.raises(errors.InvalidArgument) as caught:
        cosign.signed_digest(body)
    assert fragment in caught.value.message


def test_signed_digest_reads_a_payload_of_exactly_payload_max_bytes() -> None:
    body = cosign.payload(IMAGE, DIGEST)
    padded = body + b" " * (cosign.PAYLOAD_MAX - len(body))
    assert len(padded) == cosign.PAYLOAD_MAX
    assert cosign.signed_digest(padded) == DIGEST


def test_signed_digest_refuses_a_payload_one_byte_over_payload_max() -> None:
    body = cosign.payload(IMAGE, DIGEST)
    padded = body + b" " * (cosign.PAYLOAD_MAX + 1 - len(body))
    with pytest.raises(errors.InvalidArgument, match="too large"):
        cosign.signed_digest(padded)


@pytest.mark.parametrize("body", [b"[" * 60000, b'{"critical":' * 4000 + b"1" + b"}" * 4000])
def test_signed_digest_refuses_a_deeply_nested_payload_as_invalid(body: bytes) -> None:
    assert len(body) <= cosign.PAYLOAD_MAX
    with pytest.raises(errors.InvalidArgument):
        cosign.signed_digest(body)


# --- cosign: signature layers --------------------------------------------------------


@pytest.mark.parametrize(
    "annotations",
    [
        {},
        {cosign.SIGNATURE: ""},
        {cosign.SIGNATURE: "not base64!"},
        {cosign.SIGNATURE: "YWJ"},
        {cosign.SIGNATURE: "é"},
        {"dev.cosignproject.cosign/other": b64(b"sig")},
    ],
)
def test_a_layer_without_a_valid_base64_signature_annotation_is_refused(
    annotations: dict[str, str],
) -> None:
    with pytest.raises(errors.InvalidArgument) as caught:
        cosign.Signature.from_layer(b"{}", annotations, where=WHERE)
    assert caught.value.message.startswith(f"{WHERE}: ")
    assert cosign.SIGNATURE in caught.value.message


def test_a_layer_with_only_a_signature_has_no_certificate_chain_or_bundle() -> None:
    sig = cosign.Signature.from_layer(
        b"payload", {cosign.SIGNATURE: b64(b"\x01\x02sig")}, where=WHERE
    )
    assert sig.payload == b"payload"
    assert sig.signature == b"\x01\x02sig"
    assert sig.signature_b64 == b64(b"\x01\x02sig")
    assert sig.where == WHERE
    assert (sig.certificate, sig.chain, sig.bundle) == (None, None, None)


def keyless_layer(certificate: str, chain: str, bundle: str) -> cosign.Signature:
    """The signature of a layer annotated with ``certificate``, ``chain`` and ``bundle``."""
    annotations = {
        cosign.SIGNATURE: b64(b"sig"),
        cosign.CERTIFICATE: certificate,
        cosign.CHAIN: chain,
        cosign.BUNDLE: bundle,
    }
    return cosign.Signature.from_layer(b"p", annotations, where=WHERE)


def test_a_keyless_layer_carries_its_certificate_chain_and_bundle() -> None:
    sig = keyless_layer(
        "-----BEGIN CERTIFICATE-----\nleaf\n",
        "-----BEGIN CERTIFICATE-----\nchain\n",
        '{"SignedEntryTimestamp":"x"}',
    )
    assert sig.certificate == b"-----BEGIN CERTIFICATE-----\nleaf\n"
    assert sig.chain == b"-----BEGIN CERTIFICATE-----\nchain\n"
    assert sig.bundle == '{"SignedEntryTimestamp":"x"}'
    assert "SignedEntryTimestamp" not in repr(sig)


def test_empty_certificate_chain_and_bundle_annotations_count_as_absent() -> None:
    sig = keyless_layer("", "", "")
    assert (sig.certificate, sig.chain, sig.bundle) == (None, None, None)


# --- keys: public keys ---------------------------------------------------------------


@pytest.mark.parametrize("kind", KEY_KINDS)
def test_one_public_key_pem_block_loads_as_that_key(kind: str) -> None:
    key = private_key(kind)
    loaded = keys.load_public_keys(public_pem(key))
    assert [spki(k) for k in loaded] == [spki(key.public_key())]


def test_every_public_key_block_loads_in_order_and_other_blocks_are_skipped() -> None:
    chosen = [private_key("p256"), private_key("rsa2048"), private_key("ed25519")]
    data = (
        b"cosign.pub of the release team\n"
        + public_pem(chosen[0])
        + pkcs8_pem(private_key("p384"))
        + b"\nand the CI key:\n"
        + public_pem(chosen[1])
        + public_pem(chosen[2])
    )
    loaded = keys.load_public_keys(data)
    assert [spki(k) for k in loaded] == [spki(k.public_key()) for k in chosen]


def test_a_private_key_pem_alone_is_not_a_public_key() -> None:
    with pytest.raises(errors.InvalidArgument) as caught:
        keys.load_public_keys(pkcs8_pem(private_key("p256")), what="authority key")
    assert caught.value.message.startswith("authority key: ")
    assert "-----BEGIN PUBLIC KEY-----" in caught.value.message


@pytest.mark.parametrize("data", [b"", b"garbage", b"-----BEGIN PUBLIC KEY-----\nno end\n"])
def test_text_without_a_public_key_block_is_refused(data: bytes) -> None:
    with pytest.raises(errors.InvalidArgument, match="no '-----BEGIN PUBLIC KEY-----' block"):
        keys.load_public_keys(data)


def test_a_public_key_block_with_a_garbage_body_is_refused() -> None:
    data = b"-----BEGIN PUBLIC KEY-----\nbm90IGEga2V5\n-----END PUBLIC KEY-----\n"
    with pytest.raises(errors.InvalidArgument, match="not a valid PEM public key"):
        keys.load_public_keys(data)


def test_public_keys_of_exactly_key_max_bytes_load_and_one_more_byte_is_refused() -> None:
    pem = public_pem(private_key("p256"))
    at_limit = pem + b"\n" * (keys.KEY_MAX - len(pem))
    assert len(keys.load_public_keys(at_limit)) == 1
    with pytest.raises(errors.InvalidArgument, match="too large"):
        keys.load_public_keys(at_limit + b"\n")


UNSUPPORTED: list[tuple[str, Callable[[], Any]]] = [
    ("dsa", lambda: dsa.generate_private_key(2048)),
    ("x448", x448.X448PrivateKey.generate),
    ("ed448", ed448.Ed448PrivateKey.generate),
]


@pytest.mark.parametrize("make", [m for _, m in UNSUPPORTED], ids=[n for n, _ in UNSUPPORTED])
def test_a_public_key_of_an_unsupported_type_is_refused(make: Callable[[], Any]) -> None:
    pem = public_pem(make())
    with pytest.raises(errors.InvalidArgument, match="keys are not supported; use ECDSA"):
        keys.load_public_keys(pem)


@pytest.mark.parametrize("make", [m for _, m in UNSUPPORTED], ids=[n for n, _ in UNSUPPORTED])
def test_a_private_key_of_an_unsupported_type_is_refused(make: Callable[[], Any]) -> None:
    with pytest.raises(errors.InvalidArgument, match="keys are not supported; use ECDSA"):
        keys.load_private_key(pkcs8_pem(make()), None)


def test_public_pem_of_a_private_or_public_key_is_its_public_key() -> None:
    key = private_key("p256")
    assert keys.public_pem(key) == keys.public_pem(key.public_key()) == public_pem(key)


# --- keys: private keys --------------------------------------------------------------


@pytest.mark.parametrize(
    ("kind", "fmt"),
    [
        ("p256", serialization.PrivateFormat.PKCS8),
        ("p256", serialization.PrivateFormat.TraditionalOpenSSL),
        ("rsa2048", serialization.PrivateFormat.PKCS8),
        ("rsa2048", serialization.PrivateFormat.TraditionalOpenSSL),
        ("ed25519", serialization.PrivateFormat.PKCS8),
    ],
)
def test_an_unencrypted_pem_private_key_loads_without_a_password(
    kind: str, fmt: serialization.PrivateFormat
) -> None:
    key = private_key(kind)
    pem = key.private_bytes(serialization.Encoding.PEM, fmt, serialization.NoEncryption())
    loaded = keys.load_private_key(b"\n" + pem + b"\n\n", None)
    assert spki(loaded.public_key()) == spki(key.public_key())


def test_a_password_encrypted_pem_key_loads_with_its_password() -> None:
    key = private_key("p384")
    loaded = keys.load_private_key(pkcs8_pem(key, b"s3cret"), b"s3cret")
    assert spki(loaded.public_key()) == spki(key.public_key())


@pytest.mark.parametrize("password", [None, b""])
def test_an_encrypted_pem_key_without_a_password_asks_for_cosign_password(
    password: bytes | None,
) -> None:
    with pytest.raises(errors.InvalidArgument) as caught:
        keys.load_private_key(pkcs8_pem(private_key("p256"), b"s3cret"), password)
    assert "encrypted" in caught.value.message
    assert "COSIGN_PASSWORD" in caught.value.message


def test_an_encrypted_pem_key_with_the_wrong_password_is_refused() -> None:
    with pytest.raises(errors.InvalidArgument, match="the password is wrong"):
        keys.load_private_key(pkcs8_pem(private_key("p256"), b"s3cret"), b"guess")


def test_an_unencrypted_pem_key_with_a_password_is_not_said_to_be_encrypted() -> None:
    key = private_key("p256")
    try:
        loaded = keys.load_private_key(pkcs8_pem(key), b"exported-cosign-password")
    except errors.InvalidArgument as exc:
        assert "not encrypted" in exc.message, exc.message
    else:
        assert spki(loaded.public_key()) == spki(key.public_key())


def test_garbage_is_not_a_private_key() -> None:
    with pytest.raises(errors.InvalidArgument, match="not a PEM private key or a cosign key"):
        keys.load_private_key(b"garbage", None)


def test_a_private_key_file_over_key_max_bytes_is_refused() -> None:
    pem = pkcs8_pem(private_key("p256"))
    with pytest.raises(errors.InvalidArgument, match="too large"):
        keys.load_private_key(pem + b"\n" * keys.KEY_MAX, None)


# --- keys: cosign's encrypted private keys -------------------------------------------


@pytest.mark.parametrize("kind", keys.COSIGN_PEM_TYPES)
def test_a_cosign_encrypted_key_opens_with_its_password_and_signs_for_its_public_key(
    kind: str,
) -> None:
    key = private_key("p256", 1)
    data = cosign_key(key, b"correct horse", kind)
    lines = data.decode().splitlines()
    assert lines[0] == f"-----BEGIN {kind}-----"
    assert all(len(line) <= 64 for line in lines[1:-1])
    loaded = keys.load_private_key(data, b"correct horse")
    assert spki(loaded.public_key()) == spki(key.public_key())
    body = cosign.payload(IMAGE, DIGEST)
    assert keys.verifies(key.public_key(), keys.sign(loaded, body), body)


def test_a_cosign_key_with_an_empty_password_opens_without_one() -> None:
    key = private_key("p256", 2)
    loaded = keys.load_private_key(cosign_key(key, b""), None)
    assert spki(loaded.public_key()) == spki(key.public_key())


@pytest.mark.parametrize("password", [b"wrong", b"", None])
def test_a_cosign_key_with_the_wrong_password_says_so(password: bytes | None) -> None:
    data = armour(good_envelope().encode())
    with pytest.raises(errors.InvalidArgument) as caught:
        keys.load_private_key(data, password)
    assert "cannot decrypt the cosign key: wrong password" in caught.value.message
    assert "COSIGN_PASSWORD" in caught.value.message


def test_a_cosign_key_whose_plaintext_is_not_pkcs8_is_refused() -> None:
    data = armour(json.dumps(cosign_envelope(b"not a key", b"pw")).encode())
    with pytest.raises(errors.InvalidArgument, match="decrypted key is not PKCS#8"):
        keys.load_private_key(data, b"pw")


def _set(path: tuple[str, ...], value: Any) -> Callable[[dict[str, Any]], None]:
    def change(envelope: dict[str, Any]) -> None:
        target = envelope
        for part in path[:-1]:
            target = target[part]
        target[path[-1]] = value

    return change


def _drop(name: str) -> Callable[[dict[str, Any]], None]:
    def change(envelope: dict[str, Any]) -> None:
        del envelope[name]

    return change


MALFORMED_ENVELOPES: list[tuple[str, bytes]] = [
    ("kdf-argon2", broken_envelope(_set(("kdf", "name"), "argon2"))),
    ("cipher-aes", broken_envelope(_set(("cipher", "name"), "aes-gcm"))),
    ("N-too-large", broken_envelope(_set(("kdf", "params", "N"), 1 << 21))),
    ("N-one", broken_envelope(_set(("kdf", "params", "N"), 1))),
    ("N-not-a-number", broken_envelope(_set(("kdf", "params", "N"), "many"))),
    ("r-zero", broken_envelope(_set(("kdf", "params", "r"), 0))),
    ("p-too-large", broken_envelope(_set(("kdf", "params", "p"), 17))),
    ("salt-not-base64", broken_envelope(_set(("kdf", "salt"), "not base64!"))),
    ("nonce-not-base64", broken_envelope(_set(("cipher", "nonce"), "***"))),
    ("ciphertext-not-base64", broken_envelope(_set(("ciphertext",), "@@@@"))),
    ("no-ciphertext", broken_envelope(_drop("ciphertext"))),
    ("no-kdf", broken_envelope(_drop("kdf"))),
    ("kdf-a-string", broken_envelope(_set(("kdf",), "scrypt"))),
    ("envelope-a-list", armour(b"[]")),
    ("envelope-not-json", armour(b"not json")),
    (
        "armour-not-base64",
        b"-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\n!!!notbase64!!!\n"
        b"-----END ENCRYPTED SIGSTORE PRIVATE KEY-----\n",
    ),
]


@pytest.mark.parametrize(
    "data", [d for _, d in MALFORMED_ENVELOPES], ids=[n for n, _ in MALFORMED_ENVELOPES]
)
def test_a_malformed_cosign_key_envelope_is_refused_as_malformed(data: bytes) -> None:
    with pytest.raises(errors.InvalidArgument) as caught:
        keys.load_private_key(data, b"pw", what="cosign.key")
    assert caught.value.message.startswith("cosign.key: malformed ENCRYPTED SIGSTORE PRIVATE KEY: ")


@pytest.mark.parametrize(
    "params",
    [{"N": 3, "r": 8, "p": 1}, {"N": 1 << 20, "r": 8, "p": 1}],
    ids=["N-not-a-power-of-two", "N-r-over-maxmem"],
)
def test_scrypt_parameters_that_scrypt_refuses_make_a_malformed_envelope(
    params: dict[str, int],
) -> None:
    data = broken_envelope(_set(("kdf", "params"), params))
    with pytest.raises(errors.InvalidArgument, match="malformed"):
        keys.load_private_key(data, b"pw")


# --- keys: signing and verifying -----------------------------------------------------


@pytest.mark.parametrize("kind", KEY_KINDS)
def test_a_signature_verifies_with_the_signing_keys_public_key(kind: str) -> None:
    key = private_key(kind)
    body = cosign.payload(IMAGE, DIGEST)
    assert keys.verifies(key.public_key(), keys.sign(key, body), body)


@pytest.mark.parametrize("kind", KEY_KINDS)
def test_a_signature_does_not_verify_over_a_tampered_message(kind: str) -> None:
    key = private_key(kind)
    body = cosign.payload(IMAGE, DIGEST)
    signature = keys.sign(key, body)
    assert not keys.verifies(key.public_key(), signature, cosign.payload(IMAGE, OTHER_DIGEST))
    assert not keys.verifies(key.public_key(), signature, body + b" ")


@pytest.mark.parametrize("kind", KEY_KINDS)
def test_a_signature_does_not_verify_with_another_key(kind: str) -> None:
    body = cosign.payload(IMAGE, DIGEST)
    signature = keys.sign(private_key(kind), body)
    assert not keys.verifies(private_key(kind, 1).public_key(), signature, body)
    other_kind = "ed25519" if kind != "ed25519" else "p256"
    assert not keys.verifies(private_key(other_kind).public_key(), signature, body)


@pytest.mark.parametrize("kind", KEY_KINDS)
def test_garbage_bytes_are_not_a_signature(kind: str) -> None:
    assert not keys.verifies(private_key(kind).public_key(), b"\x00" * 64, b"data")


def test_a_key_of_a_type_cosign_does_not_sign_with_verifies_nothing() -> None:
    assert not keys.verifies(x448.X448PrivateKey.generate().public_key(), b"sig", b"data")


def _check_scheme(kind: str, public: Any, signature: bytes, data: bytes) -> None:
    if kind == "p256":
        public.verify(signature, data, ec.ECDSA(hashes.SHA256()))
    elif kind == "p384":
        public.verify(signature, data, ec.ECDSA(hashes.SHA384()))
    elif kind == "p521":
        public.verify(signature, data, ec.ECDSA(hashes.SHA512()))
    elif kind == "rsa2048":
        public.verify(signature, data, padding.PKCS1v15(), hashes.SHA256())
    else:
        public.verify(signature, data)


@pytest.mark.parametrize("kind", KEY_KINDS)
def test_each_key_type_signs_with_the_scheme_cosign_uses(kind: str) -> None:
    key = private_key(kind)
    data = b"payload"
    _check_scheme(kind, key.public_key(), keys.sign(key, data), data)  # raises if not


@pytest.mark.parametrize("kind", KEY_KINDS)
def test_a_fingerprint_is_twelve_hex_digits_of_the_spki_sha256_and_stable(kind: str) -> None:
    public = private_key(kind).public_key()
    printed = keys.fingerprint(public)
    assert len(printed) == 12
    assert all(c in "0123456789abcdef" for c in printed)
    assert printed == hashlib.sha256(spki(public)).hexdigest()[:12]
    (reloaded,) = keys.load_public_keys(public_pem(private_key(kind)))
    assert keys.fingerprint(reloaded) == printed
    assert keys.fingerprint(private_key(kind, 1).public_key()) != printed


# --- policy: parsing -----------------------------------------------------------------


def test_a_valid_policy_object_parses_into_its_values() -> None:
    release = public_pem(private_key("p256"))
    obj = policy_object(
        {
            "images": [
                {"glob": "registry.example.com/bundles/**"},
                {"glob": "nginx"},
                {"glob": "org/x"},
            ],
            "authorities": [
                {"name": "release", "key": {"data": release.decode()}},
                {"name": "from-secret", "key": {"secretRef": {"name": "cosign-keys"}}},
                {
                    "name": "ci",
                    "keyless": {
                        "identities": [
                            {"issuer": "https://issuer.example.com", "subject": "ci@example.com"},
                            {"issuerRegExp": "https://.*", "subjectRegExp": ".*@example.com"},
                        ],
                        "trustRoot": {"fulcioCertificates": ca_pem().decode()},
                    },
                },
            ],
        },
        name="bundles",
        uid="uid-7",
        generation=4,
    )
    parsed = policy.parse(obj)
    assert (parsed.name, parsed.uid, parsed.generation) == ("bundles", "uid-7", 4)
    assert parsed.globs == (
        "registry.example.com/bundles/**",
        "docker.io/library/nginx",
        "docker.io/org/x",
    )
    assert parsed.mode == "enforce"
    assert parsed.problem == ""
    first, second, third = parsed.authorities
    assert first == KeyAuthority(name="release", pem=release, secret="")
    assert second == KeyAuthority(name="from-secret", pem=b"", secret="cosign-keys")
    assert isinstance(third, KeylessAuthority)
    assert third.name == "ci"
    assert third.identities == (
        keyless.Identity(issuer="https://issuer.example.com", subject="ci@example.com"),
        keyless.Identity(issuer_regexp="https://.*", subject_regexp=".*@example.com"),
    )
    assert len(third.root.certificates) == 1
    assert third.root.rekor_keys == ()


@pytest.mark.parametrize(("mode", "expected"), [("warn", "warn"), ("enforce", "enforce")])
def test_a_policy_states_its_mode(mode: str, expected: str) -> None:
    spec = {"images": [{"glob": "**"}], "authorities": [key_authority_spec()], "mode": mode}
    assert policy.parse(policy_object(spec)).mode == expected


def test_an_authority_without_a_name_is_named_by_its_path() -> None:
    spec = {"images": [{"glob": "**"}], "authorities": [{"key": key_authority_spec()["key"]}]}
    (authority,) = policy.parse(policy_object(spec)).authorities
    assert authority.name == "spec.authorities[0]"


GOOD_KEY = key_authority_spec()
GOOD_IMAGES = [{"glob": "**"}]


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ({"authorities": [GOOD_KEY]}, "spec.images must list at least one {glob: ...}"),
        ({"images": [], "authorities": [GOOD_KEY]}, "spec.images must list at least one"),
        ({"images": [{}], "authorities": [GOOD_KEY]}, "spec.images[0].glob is required"),
        ({"images": [{"glob": 7}], "authorities": [GOOD_KEY]}, "spec.images[0].glob must be a"),
        ({"images": GOOD_IMAGES}, "spec.authorities must list at least one authority"),
        (
            {"images": GOOD_IMAGES, "authorities": []},
            "spec.authorities must list at least one authority",
        ),
        ({"images": GOOD_IMAGES, "authorities": ["key"]}, "spec.authorities[0] must be an object"),
        (
            {
                "images": GOOD_IMAGES,
                "authorities": [{"name": "a", "key": GOOD_KEY["key"], "keyless": {}}],
            },
            "spec.authorities[0] needs exactly one of key and keyless",
        ),
        (
            {"images": GOOD_IMAGES, "authorities": [{"name": "a"}]},
            "spec.authorities[0] needs exactly one of key and keyless",
        ),
        (
            {
                "images": GOOD_IMAGES,
                "authorities": [
                    {
                        "name": "a",
                        "key": {"data": GOOD_KEY["key"]["data"], "secretRef": {"name": "s"}},
                    }
                ],
            },
            "spec.authorities[0].key needs exactly one of data and secretRef.name",
        ),
        (
            {"images": GOOD_IMAGES, "authorities": [{"name": "a", "key": {}}]},
            "spec.authorities[0].key needs exactly one of data and secretRef.name",
        ),
        (
            {"images": GOOD_IMAGES, "authorities": [{"name": "a", "key": {"secretRef": {}}}]},
            "spec.authorities[0].key needs exactly one of data and secretRef.name",
        ),
        (
            {"images": GOOD_IMAGES, "authorities": [{"name": "a", "key": {"data": "not pem"}}]},
            "spec.authorities[0].key.data: no '-----BEGIN PUBLIC KEY-----' block found",
        ),
        (
            {"images": GOOD_IMAGES, "authorities": [{"name": "a", "keyless": "yes"}]},
            "spec.authorities[0].keyless must be an object",
        ),
        (
            {
                "images": GOOD_IMAGES,
                "authorities": [{"name": "a", "keyless": {"trustRoot": {}}}],
            },
            "spec.authorities[0].keyless.identities must list at least one identity",
        ),
        (
            {
                "images": GOOD_IMAGES,
                "authorities": [
                    {"name": "a", "keyless": {"identities": [{"subject": "me@example.com"}]}}
                ],
            },
            "spec.authorities[0].keyless.identities[0] needs issuer or issuerRegExp",
        ),
        (
            {
                "images": GOOD_IMAGES,
                "authorities": [
                    {"name": "a", "keyless": {"identities": [{"issuer": "https://i"}]}}
                ],
            },
            "spec.authorities[0].keyless.identities[0] needs subject or subjectRegExp",
        ),
        (
            {
                "images": GOOD_IMAGES,
                "authorities": [
                    {
                        "name": "a",
                        "keyless": {"identities": [{"issuer": "https://i", "subjectRegExp": "("}]},
                    }
                ],
            },
            "spec.authorities[0].keyless.identities[0].subjectRegExp is not a regular expression",
        ),
        (
            {
                "images": GOOD_IMAGES,
                "authorities": [
                    {"name": "a", "keyless": {"identities": [{"issuer": "https://i"}]}}
                ],
            },
            "spec.authorities[0].keyless.trustRoot.fulcioCertificates is required",
        ),
        (
            {
                "images": GOOD_IMAGES,
                "authorities": [
                    {
                        "name": "a",
                        "keyless": {
                            "identities": [{"issuer": "https://i", "subject": "s"}],
                            "trustRoot": {"fulcioCertificates": "not a certificate"},
                        },
                    }
                ],
            },
            "spec.authorities[0].keyless.trustRoot: Fulcio trust root is not PEM certificates",
        ),
        (
            {"images": GOOD_IMAGES, "authorities": [GOOD_KEY], "mode": "audit"},
            "spec.mode 'audit' is not one of enforce, warn",
        ),
    ],
)
def test_an_invalid_policy_says_what_is_wrong(spec: dict[str, Any], fragment: str) -> None:
    assert fragment in problems_of(spec)


def test_every_problem_of_a_policy_is_listed_at_once() -> None:
    spec = {
        "authorities": [
            {"name": "both", "key": GOOD_KEY["key"], "keyless": {}},
            {"name": "neither"},
            {"name": "data-and-secret", "key": {"data": "x", "secretRef": {"name": "s"}}},
            {"name": "bad-pem", "key": {"data": "not pem"}},
            {
                "name": "no-issuer",
                "keyless": {
                    "identities": [{"subjectRegExp": "["}],
                    "trustRoot": {"fulcioCertificates": ca_pem().decode()},
                },
            },
        ],
        "mode": "audit",
    }
    message = problems_of(spec)
    expected = [
        "spec.images must list at least one {glob: ...}",
        "spec.authorities[0] needs exactly one of key and keyless",
        "spec.authorities[1] needs exactly one of key and keyless",
        "spec.authorities[2].key needs exactly one of data and secretRef.name",
        "spec.authorities[3].key.data: no '-----BEGIN PUBLIC KEY-----' block found",
        "spec.authorities[4].keyless.identities[0] needs issuer or issuerRegExp",
        "spec.authorities[4].keyless.identities[0].subjectRegExp is not a regular expression",
        "spec.mode 'audit' is not one of enforce, warn",
    ]
    positions = [message.find(fragment) for fragment in expected]
    assert -1 not in positions, message
    assert positions == sorted(positions), message
    assert "spec.authorities[4].keyless.trustRoot" not in message


def test_a_lenient_parse_keeps_what_it_could_read_and_states_the_problem() -> None:
    obj = policy_object(
        {
            "images": [{"glob": "registry.example.com/bundles/*"}, {"glob": ""}, {"glob": "x"}],
            "authorities": [{"name": "broken", "key": {}}, key_authority_spec("release")],
            "mode": "warn",
        },
        name="half",
    )
    with pytest.raises(errors.InvalidArgument) as caught:
        policy.parse(obj)
    lenient = policy.parse(obj, strict=False)
    assert lenient.problem == caught.value.message
    assert "spec.images[1].glob is required" in lenient.problem
    assert "spec.authorities[0].key needs exactly one of data and secretRef.name" in (
        lenient.problem
    )
    assert lenient.name == "half"
    assert lenient.globs == ("registry.example.com/bundles/*", "docker.io/library/x")
    assert [a.name for a in lenient.authorities] == ["release"]
    assert lenient.mode == "warn"
    assert lenient.selects(Reference.parse("registry.example.com/bundles/app:v1"))


def test_a_lenient_parse_of_an_empty_object_is_an_invalid_policy_selecting_nothing() -> None:
    lenient = policy.parse({}, strict=False)
    assert lenient.problem
    assert (lenient.name, lenient.uid, lenient.generation) == ("", "", 0)
    assert lenient.globs == ()
    assert lenient.authorities == ()
    assert not lenient.selects(Reference.parse("nginx"))


def test_an_authority_whose_key_is_not_an_object_is_told_about_its_key() -> None:
    message = problems_of({"images": GOOD_IMAGES, "authorities": [{"name": "a", "key": "pem"}]})
    assert "spec.authorities[0].key" in message
    assert "keyless" not in message


# --- policy: selection ---------------------------------------------------------------


def selecting(glob: str) -> Policy:
    spec = {"images": [{"glob": glob}], "authorities": [GOOD_KEY]}
    return policy.parse(policy_object(spec))


@pytest.mark.parametrize(
    ("glob", "image", "selected"),
    [
        # * is a run of characters but '/'
        ("registry.example.com/bundles/*", "registry.example.com/bundles/app:v1", True),
        ("registry.example.com/bundles/*", "registry.example.com/bundles/team/app:v1", False),
        ("registry.example.com/*/app", "registry.example.com/team/app", True),
        ("registry.example.com/*/app", "registry.example.com/a/b/app", False),
        # ** is any run at all
        ("registry.example.com/bundles/**", "registry.example.com/bundles/team/app:v1", True),
        ("registry.example.com/**/app", "registry.example.com/a/b/app", True),
        ("registry.example.com/**", f"registry.example.com/a/b/c@{DIGEST}", True),
        ("registry.example.com/**", "registry.example.org/a", False),
        ("**", "registry.example.com/a/b", True),
        ("**", "nginx", True),
        # ? is one character but '/'
        ("registry.example.com/bundles/app?", "registry.example.com/bundles/app1", True),
        ("registry.example.com/bundles/app?", "registry.example.com/bundles/app", False),
        ("registry.example.com/bundles/app?", "registry.example.com/bundles/app12", False),
        ("registry.example.com/bundles/a?b", "registry.example.com/bundles/a/b", False),
        # no wildcard: the repository exactly, whatever the tag or digest
        ("registry.example.com/bundles/app", "registry.example.com/bundles/app:v2", True),
        ("registry.example.com/bundles/app", f"registry.example.com/bundles/app@{DIGEST}", True),
        ("registry.example.com/bundles/app", "registry.example.com/bundles/app2", False),
        ("registry.example.com/bundles/app", "registry.example.com/bundles/app/sub", False),
        ("registry.example.com/bundles/app", "registry.example.com/bundles", False),
        ("registry.example.com/x", "registryaexample.com/x", False),
        # a registry with a port, and localhost
        ("localhost:5000/bundles/*", "localhost:5000/bundles/app:v1", True),
        ("localhost:5000/bundles/*", "localhost:5001/bundles/app:v1", False),
        ("localhost:5000/**", "localhost:5000/a/b", True),
        ("localhost/bundles/app", "localhost/bundles/app", True),
        ("localhost/bundles/app", "localhost:5000/bundles/app", False),
        # Docker Hub's short names, on both sides
        ("nginx", "nginx", True),
        ("nginx", "docker.io/library/nginx:1.25", True),
        ("nginx", "nginx2", False),
        ("nginx", "registry.example.com/nginx", False),
        ("library/nginx", "nginx", True),
        ("org/x", "org/x:v1", True),
        ("org/x", "docker.io/org/x", True),
        ("org/x", "index.docker.io/org/x", True),
        ("org/*", "org/y", True),
        ("org/*", "other/y", False),
        ("*", "nginx", True),
        ("*", "org/x", False),
        ("*/*", "org/x", True),
        ("*/*", "registry.example.com/a/b", False),
        ("docker.io/library/nginx", "nginx", True),
    ],
)
def test_a_glob_selects_repositories(glob: str, image: str, selected: bool) -> None:
    assert selecting(glob).selects(Reference.parse(image)) is selected


@pytest.mark.parametrize(
    ("glob", "normalised"),
    [
        ("nginx", "docker.io/library/nginx"),
        ("library/nginx", "docker.io/library/nginx"),
        ("org/x", "docker.io/org/x"),
        ("org/**", "docker.io/org/**"),
        ("*", "docker.io/library/*"),
        ("**", "**"),
        ("**/app", "**/app"),
        ("registry.example.com/a", "registry.example.com/a"),
        ("localhost:5000/a", "localhost:5000/a"),
        ("localhost/a", "localhost/a"),
    ],
)
def test_a_glob_is_normalised_as_references_are(glob: str, normalised: str) -> None:
    assert policy.normalize_glob(glob) == normalised


@pytest.mark.parametrize(
    ("glob", "image"),
    [
        ("docker.io/nginx", "nginx"),
        ("docker.io/nginx", "docker.io/nginx:1.25"),
        ("index.docker.io/library/busybox", "busybox"),
        ("index.docker.io/org/*", "org/x"),
    ],
)
def test_a_glob_naming_docker_hub_explicitly_selects_its_images(glob: str, image: str) -> None:
    assert selecting(glob).selects(Reference.parse(image))


def test_a_policys_version_changes_with_its_generation() -> None:
    spec = {"images": GOOD_IMAGES, "authorities": [GOOD_KEY]}
    first = policy.parse(policy_object(spec, uid="uid-1", generation=1))
    second = policy.parse(policy_object(spec, uid="uid-1", generation=2))
    assert first.version == "uid-1/1"
    assert second.version == "uid-1/2"
    assert first.version != second.version


def test_a_policy_without_a_uid_is_versioned_by_its_name() -> None:
    spec = {"images": GOOD_IMAGES, "authorities": [GOOD_KEY]}
    parsed = policy.parse(policy_object(spec, uid="", generation=5, name="local"))
    assert parsed.version == "local/5"


# --- verify.check --------------------------------------------------------------------


def test_a_signature_by_the_authoritys_key_satisfies_the_policy() -> None:
    key = private_key("p256")
    authority = KeyAuthority("release", pem=public_pem(key))
    outcome = verify.check(
        key_policy(authority), Found([signed(key)]), DIGEST, read_secret=no_secrets
    )
    named = f"signed for authority 'release' (key {keys.fingerprint(key.public_key())})"
    assert outcome == verify.Outcome("bundles", True, named)


@pytest.mark.parametrize("kind", KEY_KINDS)
def test_a_signature_by_any_key_of_a_multi_key_authority_satisfies_it(kind: str) -> None:
    pem = public_pem(private_key("p256", 3)) + public_pem(private_key(kind))
    outcome = verify.check(
        key_policy(KeyAuthority("release", pem=pem)),
        Found([signed(private_key(kind))]),
        DIGEST,
        read_secret=no_secrets,
    )
    assert outcome.ok, outcome.reason


def test_a_signature_by_another_key_names_the_authoritys_key() -> None:
    trusted = private_key("p256")
    authority = KeyAuthority("release", pem=public_pem(trusted))
    outcome = verify.check(
        key_policy(authority),
        Found([signed(private_key("p256", 1))]),
        DIGEST,
        read_secret=no_secrets,
    )
    assert not outcome.ok
    assert outcome.reason.startswith(f"none of the 1 signature of {DIGEST} verifies: ")
    assert (
        f"authority 'release': no signature verifies with key "
        f"{keys.fingerprint(trusted.public_key())}" in outcome.reason
    )


def test_a_signature_of_another_digest_does_not_count() -> None:
    key = private_key("p256")
    authority = KeyAuthority("release", pem=public_pem(key))
    sig = signed(key, digest=OTHER_DIGEST, where="elsewhere.sig")
    outcome = verify.check(key_policy(authority), Found([sig]), DIGEST, read_secret=no_secrets)
    assert not outcome.ok
    assert f"elsewhere.sig: a signature of {OTHER_DIGEST}, not of {DIGEST}" in outcome.reason


def test_a_signature_whose_payload_is_not_json_is_named_with_where_it_was_found() -> None:
    key = private_key("p256")
    sig = cosign.Signature(payload=b"oops", signature=keys.sign(key, b"oops"), where="w.sig")
    outcome = verify.check(
        key_policy(KeyAuthority("release", pem=public_pem(key))),
        Found([sig, signed(key, OTHER_DIGEST)]),
        DIGEST,
        read_secret=no_secrets,
    )
    assert not outcome.ok
    assert outcome.reason.startswith(f"none of the 2 signatures of {DIGEST} verifies: ")
    assert "w.sig: signature payload is not JSON" in outcome.reason


def test_no_signature_at_all_names_the_sig_tag_looked_for() -> None:
    key = private_key("p256")
    outcome = verify.check(
        key_policy(KeyAuthority("release", pem=public_pem(key))),
        Found(),
        DIGEST,
        read_secret=no_secrets,
    )
    assert not outcome.ok
    assert f"no signature found for {DIGEST}" in outcome.reason
    assert f"sha256-{'a' * 64}.sig" in outcome.reason
    assert "skipped" not in outcome.reason


def test_no_signature_lists_the_first_three_skipped_candidates() -> None:
    outcome = verify.check(
        key_policy(KeyAuthority("release", pem=public_pem(private_key("p256")))),
        Found(skipped=["one", "two", "three", "four"]),
        DIGEST,
        read_secret=no_secrets,
    )
    assert not outcome.ok
    assert outcome.reason.endswith("(skipped: one; two; three)")


def test_an_invalid_policy_is_never_satisfied_even_by_a_good_signature() -> None:
    key = private_key("p256")
    invalid = key_policy(
        KeyAuthority("release", pem=public_pem(key)), problem="spec.images must list"
    )
    outcome = verify.check(invalid, Found([signed(key)]), DIGEST, read_secret=no_secrets)
    assert outcome == verify.Outcome(
        "bundles", False, "the policy is not valid: spec.images must list"
    )


def test_a_secret_authority_whose_secret_is_missing_says_why() -> None:
    read: list[str] = []

    def missing(name: str) -> bytes:
        read.append(name)
        raise errors.NotFound(f"secret rukpak-system/{name} not found")

    authority = KeyAuthority("release", secret="cosign-keys")
    outcome = verify.check(
        key_policy(authority), Found([signed(private_key("p256"))]), DIGEST, read_secret=missing
    )
    assert not outcome.ok
    assert "authority 'release': secret rukpak-system/cosign-keys not found" in outcome.reason
    assert read == ["cosign-keys"]


def test_a_secret_authority_whose_secret_holds_the_key_is_satisfied() -> None:
    key = private_key("ed25519")
    read: list[str] = []

    def secret(name: str) -> bytes:
        read.append(name)
        return public_pem(key)

    authority = KeyAuthority("release", secret="cosign-keys")
    outcome = verify.check(key_policy(authority), Found([signed(key)]), DIGEST, read_secret=secret)
    assert outcome.ok, outcome.reason
    assert read == ["cosign-keys"]


def test_a_secret_authority_whose_secret_holds_no_public_key_says_so() -> None:
    authority = KeyAuthority("release", secret="cosign-keys")
    outcome = verify.check(
        key_policy(authority),
        Found([signed(private_key("p256"))]),
        DIGEST,
        read_secret=lambda name: b"not a key",
    )
    assert not outcome.ok
    assert "authority 'release': authority 'release' key: no '-----BEGIN PUBLIC KEY" in (
        outcome.reason
    )


def test_when_only_the_second_authority_is_satisfied_the_policy_is() -> None:
    signer = private_key("rsa2048")
    first = KeyAuthority("first", pem=public_pem(private_key("p256")))
    second = KeyAuthority("second", pem=public_pem(signer))
    outcome = verify.check(
        key_policy(first, second), Found([signed(signer)]), DIGEST, read_secret=no_secrets
    )
    named = f"signed for authority 'second' (key {keys.fingerprint(signer.public_key())})"
    assert outcome == verify.Outcome("bundles", True, named)


def test_a_failing_first_authority_does_not_stop_the_second() -> None:
    signer = private_key("p384")

    def missing(name: str) -> bytes:
        raise errors.NotFound(f"{name} not found")

    first = KeyAuthority("first", secret="gone")
    second = KeyAuthority("second", pem=public_pem(signer))
    outcome = verify.check(
        key_policy(first, second), Found([signed(signer)]), DIGEST, read_secret=missing
    )
    named = f"signed for authority 'second' (key {keys.fingerprint(signer.public_key())})"
    assert outcome == verify.Outcome("bundles", True, named)


def test_a_keyless_authority_refuses_a_signature_without_a_certificate() -> None:
    authority = KeylessAuthority(
        "ci",
        identities=(keyless.Identity(issuer="https://i", subject="s"),),
        root=keyless.TrustRoot(certificates=()),
    )
    outcome = verify.check(
        key_policy(authority),
        Found([signed(private_key("p256"), where="nocert.sig")]),
        DIGEST,
        read_secret=no_secrets,
    )
    assert not outcome.ok
    assert "authority 'ci': nocert.sig has no certificate" in outcome.reason


def test_a_keyless_authority_refuses_a_certificate_that_is_not_pem() -> None:
    authority = KeylessAuthority(
        "ci",
        identities=(keyless.Identity(issuer="https://i", subject="s"),),
        root=keyless.TrustRoot(certificates=()),
    )
    sig = signed(private_key("p256"))
    with_cert = cosign.Signature(
        payload=sig.payload, signature=sig.signature, where=sig.where, certificate=b"junk"
    )
    outcome = verify.check(
        key_policy(authority), Found([with_cert]), DIGEST, read_secret=no_secrets
    )
    assert not outcome.ok
    assert "authority 'ci': signing certificate is not a PEM certificate" in outcome.reason


def test_check_never_raises_for_a_deeply_nested_payload() -> None:
    key = private_key("p256")
    body = b"[" * 60000
    sig = cosign.Signature(payload=body, signature=keys.sign(key, body), where="deep.sig")
    outcome = verify.check(
        key_policy(KeyAuthority("release", pem=public_pem(key))),
        Found([sig]),
        DIGEST,
        read_secret=no_secrets,
    )
    assert not outcome.ok
    assert "deep.sig" in outcome.reason
