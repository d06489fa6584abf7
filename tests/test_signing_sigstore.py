"""Sigstore bundles (``rukpak.signing.sigstore``), pure: reading one into a signature, the
policy check over it, and the hostile and broken bundles a registry may hold.

No registry: bundles are built here as cosign 3 builds them (checked against cosign's own
output by ``tests/test_signing_cosign3.py``).
"""

from __future__ import annotations

import base64
import hashlib
import json
import time
from typing import Any

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec

from rukpak.signing import inclusion, keyless, keys, sigstore, verify
from rukpak.signing.discover import Found
from rukpak.signing.policy import Policy
from rukpak.signing.policy import parse as parse_policy
from tests import signing_helpers

DIGEST = "sha256:" + "a" * 64
OTHER = "sha256:" + "b" * 64
NAME = "registry.example.com/bundles/app"
WHERE = f"{NAME}@sha256:{'c' * 64}"


def bundle_of(
    key: ec.EllipticCurvePrivateKey, digest: str = DIGEST, **changes: Any
) -> dict[str, Any]:
    payload = sigstore.statement(NAME, digest)
    signature = keys.sign(key, sigstore.pae(sigstore.IN_TOTO, payload))
    der = key.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    doc: dict[str, Any] = json.loads(
        sigstore.dsse_bundle(payload, signature, key_hint=sigstore.key_hint(der))
    )
    doc.update(changes)
    return doc


def raw(doc: Any) -> bytes:
    return json.dumps(doc).encode()


def key_policy(key: ec.EllipticCurvePrivateKey) -> Policy:
    public = key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return parse_policy(
        {
            "metadata": {"name": "bundles", "uid": "u", "generation": 1},
            "spec": {
                "images": [{"glob": "*"}],
                "authorities": [{"name": "release", "key": {"data": public.decode()}}],
            },
        }
    )


def no_secret(name: str) -> bytes:
    raise AssertionError(f"no Secret is read here ({name})")


def check(policy: Policy, *bodies: bytes, digest: str = DIGEST) -> verify.Outcome:
    found = Found(signatures=[sigstore.signature(b, where=WHERE) for b in bodies])
    return verify.check(policy, found, digest, read_secret=no_secret)


# -- the format ------------------------------------------------------------------------


def test_dsse_signs_the_pre_authentication_encoding_of_type_and_payload() -> None:
    assert sigstore.pae("t", b"hello") == b"DSSEv1 1 t 5 hello"
    assert sigstore.pae(sigstore.IN_TOTO, b"") == b"DSSEv1 28 application/vnd.in-toto+json 0 "


def test_the_statement_names_the_digest_with_cosigns_predicate() -> None:
    doc = json.loads(sigstore.statement(NAME, DIGEST))
    assert doc["_type"] == "https://in-toto.io/Statement/v1"
    assert doc["predicateType"] == "https://sigstore.dev/cosign/sign/v1"
    assert doc["subject"] == [{"name": NAME, "digest": {"sha256": "a" * 64}}]
    assert sigstore.subject_digest(sigstore.statement(NAME, OTHER), where=WHERE) == OTHER


def test_a_key_signed_bundle_satisfies_a_policy_with_that_key() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    outcome = check(key_policy(key), raw(bundle_of(key)))
    assert outcome.ok, outcome.reason


def test_a_bundle_by_another_key_does_not() -> None:
    key, other = ec.generate_private_key(ec.SECP256R1()), ec.generate_private_key(ec.SECP256R1())
    outcome = check(key_policy(other), raw(bundle_of(key)))
    assert not outcome.ok
    assert "no signature verifies with key" in outcome.reason


def test_a_bundle_of_another_digest_does_not_count_for_this_one() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    outcome = check(key_policy(key), raw(bundle_of(key, OTHER)))
    assert not outcome.ok
    assert f"a signature of {OTHER}, not of {DIGEST}" in outcome.reason


def test_a_changed_payload_breaks_the_signature() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    doc = bundle_of(key)
    statement = json.loads(base64.b64decode(doc["dsseEnvelope"]["payload"]))
    statement["predicate"] = {"extra": True}
    doc["dsseEnvelope"]["payload"] = base64.b64encode(json.dumps(statement).encode()).decode()
    assert not check(key_policy(key), raw(doc)).ok


def keyless_policy(root: x509.Certificate, rekor: bytes | None = None) -> Policy:
    identity = {"issuer": signing_helpers.OIDC, "subject": signing_helpers.EMAIL}
    root_pem = signing_helpers.pem(root).decode()
    trust = {"fulcioCertificates": root_pem}
    if rekor is not None:
        trust["rekorPublicKey"] = rekor.decode()
    keyless = {"identities": [identity], "trustRoot": trust}
    return parse_policy(
        {
            "metadata": {"name": "bundles", "uid": "u", "generation": 1},
            "spec": {
                "images": [{"glob": "*"}],
                "authorities": [{"name": "ci", "keyless": keyless}],
            },
        }
    )


def test_a_v03_certificate_and_an_older_chain_verify_under_the_keyless_root() -> None:
    root = signing_helpers.make_ca("root")
    middle = signing_helpers.make_ca("intermediate", root)
    leaf_key, leaf = signing_helpers.make_leaf(middle)
    assert isinstance(leaf_key, ec.EllipticCurvePrivateKey)
    der = [c.public_bytes(serialization.Encoding.DER) for c in (leaf, middle.cert)]
    chain = [{"rawBytes": base64.b64encode(d).decode()} for d in der]
    doc = bundle_of(leaf_key)
    doc["verificationMaterial"] = {"x509CertificateChain": {"certificates": chain}}
    doc["mediaType"] = "application/vnd.dev.sigstore.bundle+json;version=0.2"
    sig = sigstore.signature(raw(doc), where=WHERE)
    assert sig.certificate is not None and sig.chain is not None
    assert x509.load_pem_x509_certificate(sig.certificate) == leaf
    assert x509.load_pem_x509_certificate(sig.chain) == middle.cert
    outcome = check(keyless_policy(root.cert), raw(doc))
    assert outcome.ok, outcome.reason
    # v0.3 carries the leaf alone: the intermediate is then missing from the path
    doc["verificationMaterial"] = {"certificate": chain[0]}
    doc["mediaType"] = sigstore.BUNDLE_V03
    assert not check(keyless_policy(root.cert), raw(doc)).ok
    assert check(keyless_policy(middle.cert), raw(doc)).ok, "the leaf's issuer as the root"
    other = signing_helpers.make_ca("another root")
    assert not check(keyless_policy(other.cert), raw(doc)).ok


def test_a_log_entry_with_a_promise_becomes_a_rekor_bundle_in_cosign_2s_shape() -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    doc = bundle_of(key)
    doc["verificationMaterial"]["tlogEntries"] = [
        {
            "logIndex": "7",
            "logId": {"keyId": base64.b64encode(b"\x01\x02").decode()},
            "integratedTime": "1700000000",
            "inclusionPromise": {"signedEntryTimestamp": "c2V0"},
            "canonicalizedBody": "Ym9keQ==",
        }
    ]
    rekor = sigstore.signature(raw(doc), where=WHERE).bundle
    assert rekor is not None
    assert json.loads(rekor) == {
        "SignedEntryTimestamp": "c2V0",
        "Payload": {
            "body": "Ym9keQ==",
            "integratedTime": 1700000000,
            "logIndex": 7,
            "logID": "0102",
        },
    }


def logged_keyless_bundle(
    rekor: ec.EllipticCurvePrivateKey, *, change: Any = None, proof: Any = None
) -> tuple[bytes, x509.Certificate]:
    """A v0.3 keyless bundle with a tlog entry as Rekor logs cosign 3's: a ``dsse`` 0.0.1
    body with a signed entry timestamp by ``rekor``; ``change(body)`` edits the body
    before it is signed. Returns (the bundle, the Fulcio root)."""
    root = signing_helpers.make_ca("fulcio")
    leaf_key, leaf = signing_helpers.make_leaf(root)
    assert isinstance(leaf_key, ec.EllipticCurvePrivateKey)
    doc = bundle_of(leaf_key)
    payload = base64.b64decode(doc["dsseEnvelope"]["payload"])
    body: dict[str, Any] = {
        "apiVersion": "0.0.1",
        "kind": "dsse",
        "spec": {
            "envelopeHash": {"algorithm": "sha256", "value": "0" * 64},
            "payloadHash": {"algorithm": "sha256", "value": hashlib.sha256(payload).hexdigest()},
            "signatures": [
                {
                    "signature": doc["dsseEnvelope"]["signatures"][0]["sig"],
                    "verifier": base64.b64encode(signing_helpers.pem(leaf)).decode(),
                }
            ],
        },
    }
    if change is not None:
        change(body)
    body_b64 = base64.b64encode(json.dumps(body).encode()).decode()
    spki = rekor.public_key().public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    log_id = hashlib.sha256(spki).hexdigest()
    integrated = int(time.time())
    signed = {"body": body_b64, "integratedTime": integrated, "logIndex": 9, "logID": log_id}
    canonical = json.dumps(signed, sort_keys=True, separators=(",", ":")).encode()
    promise = rekor.sign(canonical, ec.ECDSA(hashes.SHA256()))
    raw_leaf = base64.b64encode(leaf.public_bytes(serialization.Encoding.DER)).decode()
    doc["verificationMaterial"] = {
        "certificate": {"rawBytes": raw_leaf},
        "tlogEntries": [
            {
                "logIndex": "9",
                "logId": {"keyId": base64.b64encode(bytes.fromhex(log_id)).decode()},
                "kindVersion": {"kind": "dsse", "version": "0.0.1"},
                "integratedTime": str(integrated),
                "inclusionPromise": {"signedEntryTimestamp": base64.b64encode(promise).decode()},
                "canonicalizedBody": body_b64,
            }
        ],
    }
    if proof is not None:
        doc["verificationMaterial"]["tlogEntries"][0]["inclusionProof"] = proof(
            base64.b64decode(body_b64)
        )
    return raw(doc), root.cert


REKOR = ec.generate_private_key(ec.SECP256R1())
REKOR_PEM = REKOR.public_key().public_bytes(
    serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
)


def test_a_dsse_log_entry_signed_by_the_rekor_key_satisfies_a_keyless_policy_with_it() -> None:
    body, root = logged_keyless_bundle(REKOR)
    outcome = check(keyless_policy(root, REKOR_PEM), body)
    assert outcome.ok, outcome.reason
    other = ec.generate_private_key(ec.SECP256R1())
    body, root = logged_keyless_bundle(other)
    refused = check(keyless_policy(root, REKOR_PEM), body)
    assert not refused.ok and "matches none of the trusted Rekor keys" in refused.reason


def _other_payload(body: dict[str, Any]) -> None:
    body["spec"]["payloadHash"]["value"] = "1" * 64


def _other_signature(body: dict[str, Any]) -> None:
    body["spec"]["signatures"][0]["signature"] = base64.b64encode(b"another").decode()


def _other_verifier(body: dict[str, Any]) -> None:
    _, cert = signing_helpers.make_leaf(signing_helpers.make_ca("x"))
    body["spec"]["signatures"][0]["verifier"] = base64.b64encode(signing_helpers.pem(cert)).decode()


@pytest.mark.parametrize(
    ("change", "says"),
    [
        (_other_payload, "payloadHash does not match the signed payload"),
        (_other_signature, "signature does not match the image signature"),
        (_other_verifier, "certificate does not match the signing certificate"),
    ],
)
def test_a_dsse_log_entry_for_something_else_is_refused(change: Any, says: str) -> None:
    body, root = logged_keyless_bundle(REKOR, change=change)
    outcome = check(keyless_policy(root, REKOR_PEM), body)
    assert not outcome.ok and says in outcome.reason, outcome.reason


def test_the_dsse_payload_is_read_out_of_the_pre_authentication_encoding() -> None:
    pae = sigstore.pae(sigstore.IN_TOTO, b"a b  c")
    assert keyless.dsse_payload(pae) == b"a b  c"
    for bad in (b"DSSEv1 99 x 1 a", b"DSSEv2 1 x 1 a", b"DSSEv1 1 x 2 a", b"DSSEv1 x"):
        with pytest.raises(keyless.KeylessError, match="not a DSSE pre-authentication"):
            keyless.dsse_payload(bad)


# RFC 6962's definitions, recursive (the verifier under test is iterative, RFC 9162's)
def _mth(leaves: list[bytes]) -> bytes:
    if len(leaves) == 1:
        return hashlib.sha256(b"\x00" + leaves[0]).digest()
    k = 1 << ((len(leaves) - 1).bit_length() - 1)
    return hashlib.sha256(b"\x01" + _mth(leaves[:k]) + _mth(leaves[k:])).digest()


def _path(m: int, leaves: list[bytes]) -> list[bytes]:
    if len(leaves) == 1:
        return []
    k = 1 << ((len(leaves) - 1).bit_length() - 1)
    if m < k:
        return [*_path(m, leaves[:k]), _mth(leaves[k:])]
    return [*_path(m - k, leaves[k:]), _mth(leaves[:k])]


def checkpoint(key: ec.EllipticCurvePrivateKey, size: int, root: bytes) -> str:
    text = f"rekor.test - 42\n{size}\n{base64.b64encode(root).decode()}\n"
    signature = key.sign(text.encode(), ec.ECDSA(hashes.SHA256()))
    blob = inclusion.key_hint(key.public_key()) + signature
    return f"{text}\n\u2014 rekor.test {base64.b64encode(blob).decode()}\n"


def proof_of(
    index: int, size: int, *, signer: ec.EllipticCurvePrivateKey = REKOR, lie: str = ""
) -> Any:
    """An inclusion proof maker for the entry body at ``index`` of ``size`` leaves."""

    def make(body: bytes) -> dict[str, Any]:
        leaves = [f"entry {i}".encode() for i in range(size)]
        leaves[index] = body
        root = _mth(leaves)
        hashes_ = _path(index, leaves)
        if lie == "hash":
            hashes_[0] = hashlib.sha256(b"other").digest()
        stated = _mth([b"another tree"]) if lie == "checkpoint" else root
        return {
            "logIndex": str(index),
            "rootHash": base64.b64encode(root).decode(),
            "treeSize": str(size),
            "hashes": [base64.b64encode(h).decode() for h in hashes_],
            "checkpoint": {"envelope": checkpoint(signer, size, stated)},
        }

    return make


@pytest.mark.parametrize(("index", "size"), [(0, 1), (0, 2), (5, 6), (6, 7), (12, 13), (3, 16)])
def test_an_inclusion_proof_to_a_checkpoint_the_rekor_key_signed_is_accepted(
    index: int, size: int
) -> None:
    body, root = logged_keyless_bundle(REKOR, proof=proof_of(index, size))
    assert sigstore.signature(body, where=WHERE).proof is not None
    outcome = check(keyless_policy(root, REKOR_PEM), body)
    assert outcome.ok, outcome.reason


@pytest.mark.parametrize(
    ("proof", "says"),
    [
        (proof_of(3, 7, lie="hash"), "does not lead to its root hash"),
        (proof_of(3, 7, lie="checkpoint"), "checkpoint states another tree"),
        (
            proof_of(3, 7, signer=ec.generate_private_key(ec.SECP256R1())),
            "no signature of the checkpoint verifies",
        ),
    ],
)
def test_an_inclusion_proof_that_does_not_hold_is_refused(proof: Any, says: str) -> None:
    body, root = logged_keyless_bundle(REKOR, proof=proof)
    outcome = check(keyless_policy(root, REKOR_PEM), body)
    assert not outcome.ok and says in outcome.reason, outcome.reason
    # without a Rekor key nothing about the log is checked
    assert check(keyless_policy(root), body).ok


# -- hostile and broken bundles --------------------------------------------------------

KEY = ec.generate_private_key(ec.SECP256R1())


def _no_envelope() -> dict[str, Any]:
    doc = bundle_of(KEY)
    del doc["dsseEnvelope"]
    doc["messageSignature"] = {"messageDigest": {}, "signature": "c2ln"}
    return doc


def _envelope(**changes: Any) -> dict[str, Any]:
    doc = bundle_of(KEY)
    doc["dsseEnvelope"].update(changes)
    return doc


def _statement(**changes: Any) -> dict[str, Any]:
    statement = json.loads(sigstore.statement(NAME, DIGEST))
    statement.update(changes)
    payload = base64.b64encode(json.dumps(statement).encode()).decode()
    return _envelope(payload=payload)


BROKEN: list[tuple[str, bytes, str]] = [
    ("not JSON", b"{", "is not JSON"),
    ("a list", b"[]", "not a Sigstore bundle"),
    ("another media type", raw(bundle_of(KEY, mediaType="text/plain")), "not a Sigstore bundle"),
    ("a message signature", raw(_no_envelope()), "a message signature, which names no image"),
    ("another payload type", raw(_envelope(payloadType="text/plain")), "a DSSE payload of type"),
    ("no payload", raw(_envelope(payload="")), "dsseEnvelope.payload is missing"),
    ("payload not base64", raw(_envelope(payload="%%%")), "not valid base64"),
    ("two signatures", raw(_envelope(signatures=[{"sig": "YQ=="}] * 2)), "exactly one"),
    ("an attestation", raw(_statement(predicateType="https://slsa.dev/v1")), "an attestation"),
    ("two subjects", raw(_statement(subject=[{}, {}])), "exactly one subject"),
    ("a bad digest", raw(_statement(subject=[{"digest": {"sha256": "../x"}}])), "no valid sha256"),
    ("not a statement", raw(_statement(_type="x")), "not an in-toto v1 statement"),
    ("deeply nested", b"[" * 100_000, "is not JSON"),
    ("too large", b" " * (sigstore.BUNDLE_MAX + 1), "larger than"),
]  # fmt: skip


@pytest.mark.parametrize(("body", "says"), [b[1:] for b in BROKEN], ids=[b[0] for b in BROKEN])
def test_a_broken_or_hostile_bundle_is_refused_saying_why(body: bytes, says: str) -> None:
    with pytest.raises(sigstore.BundleError, match=None) as caught:
        sigstore.signature(body, where=WHERE)
    assert says in caught.value.message, caught.value.message
    assert caught.value.message.startswith(WHERE)
