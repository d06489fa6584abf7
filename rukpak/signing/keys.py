"""Signing keys: public keys from PEM, private keys from PEM or cosign's encrypted format,
and the one signature scheme per key type that cosign uses.

Where it sits: under ``rukpak.signing.verify`` (public keys of a policy's ``key``
authorities) and ``rukpak.signing.sign`` (the key of ``rukpak bundle sign``). The
cryptography is the ``cryptography`` package's; cosign's encrypted private keys
(``cosign generate-key-pair``: scrypt, then NaCl secretbox) are opened with
``hashlib.scrypt`` and PyNaCl.

Schemes, as cosign signs: ECDSA with SHA-256 (P-256; SHA-384 for P-384, SHA-512 for
P-521), RSA PKCS#1 v1.5 with SHA-256, Ed25519. Signatures are DER for ECDSA.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import json
from typing import Any, Final

import nacl.exceptions
import nacl.secret
from cryptography.exceptions import InvalidSignature, UnsupportedAlgorithm
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, padding, rsa
from cryptography.hazmat.primitives.asymmetric.types import PrivateKeyTypes, PublicKeyTypes

from rukpak.common import errors

COSIGN_PEM_TYPES: Final[tuple[str, ...]] = (
    "ENCRYPTED SIGSTORE PRIVATE KEY",
    "ENCRYPTED COSIGN PRIVATE KEY",
)
KEY_MAX: Final[int] = 64 << 10
SCRYPT_MAXMEM: Final[int] = 256 << 20

PublicKey = ec.EllipticCurvePublicKey | rsa.RSAPublicKey | ed25519.Ed25519PublicKey
PrivateKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey


def _supported_public(key: PublicKeyTypes, what: str) -> PublicKey:
    if isinstance(key, ec.EllipticCurvePublicKey | rsa.RSAPublicKey | ed25519.Ed25519PublicKey):
        return key
    raise errors.InvalidArgument(
        f"{what}: {type(key).__name__} keys are not supported; use ECDSA, RSA or Ed25519"
    )


def _supported_private(key: PrivateKeyTypes, what: str) -> PrivateKey:
    if isinstance(key, ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey):
        return key
    raise errors.InvalidArgument(
        f"{what}: {type(key).__name__} keys are not supported; use ECDSA, RSA or Ed25519"
    )


def load_public_keys(data: bytes, *, what: str = "public key") -> list[PublicKey]:
    """Every ``PUBLIC KEY`` block in ``data`` (one or more PEM blocks); InvalidArgument when
    there is none or one does not parse."""
    if len(data) > KEY_MAX:
        raise errors.InvalidArgument(f"{what}: {len(data)} bytes is too large for PEM keys")
    keys: list[PublicKey] = []
    for block in _pem_blocks(data):
        if not block.startswith(b"-----BEGIN PUBLIC KEY-----"):
            continue
        try:
            loaded = serialization.load_pem_public_key(block)
        except (ValueError, UnsupportedAlgorithm) as exc:
            raise errors.InvalidArgument(f"{what}: not a valid PEM public key ({exc})") from None
        keys.append(_supported_public(loaded, what))
    if not keys:
        raise errors.InvalidArgument(
            f"{what}: no '-----BEGIN PUBLIC KEY-----' block found; give the public key in PEM "
            "(for example cosign.pub)"
        )
    return keys


def _pem_blocks(data: bytes) -> list[bytes]:
    blocks: list[bytes] = []
    rest = data
    while True:
        start = rest.find(b"-----BEGIN ")
        if start < 0:
            return blocks
        end = rest.find(b"-----END ", start)
        close = rest.find(b"-----", end + 9) if end >= 0 else -1
        if close < 0:
            return blocks
        blocks.append(rest[start : close + 5] + b"\n")
        rest = rest[close + 5 :]


def load_private_key(
    data: bytes, password: bytes | None, *, what: str = "private key"
) -> PrivateKey:
    """A private key from PEM (PKCS#8, SEC1 or PKCS#1, encrypted or not) or from cosign's
    ``ENCRYPTED SIGSTORE PRIVATE KEY``; InvalidArgument with what to do otherwise."""
    if len(data) > KEY_MAX:
        raise errors.InvalidArgument(f"{what}: {len(data)} bytes is too large for a key")
    text = data.strip()
    for kind in COSIGN_PEM_TYPES:
        if text.startswith(f"-----BEGIN {kind}-----".encode()):
            der = _open_cosign(text, kind, password or b"", what)
            try:
                key = serialization.load_der_private_key(der, password=None)
            except (ValueError, UnsupportedAlgorithm) as exc:
                raise errors.InvalidArgument(
                    f"{what}: decrypted key is not PKCS#8: {exc}"
                ) from None
            return _supported_private(key, what)
    try:
        loaded = serialization.load_pem_private_key(text, password=password or None)
    except TypeError:
        if password:  # a password for a key that has none: $COSIGN_PASSWORD set for another
            return load_private_key(data, None, what=what)
        raise errors.InvalidArgument(
            f"{what} is encrypted: give its password (COSIGN_PASSWORD)"
        ) from None
    except (ValueError, UnsupportedAlgorithm) as exc:
        raise errors.InvalidArgument(
            f"{what}: not a PEM private key or a cosign key, or the password is wrong ({exc})"
        ) from None
    return _supported_private(loaded, what)


def _open_cosign(text: bytes, kind: str, password: bytes, what: str) -> bytes:
    """Decrypt cosign's key envelope: JSON {kdf: scrypt(N, r, p, salt), cipher: secretbox
    (nonce), ciphertext}, base64 inside the PEM armour."""
    lines = text.decode("ascii", "replace").splitlines()
    body = "".join(line for line in lines if line and not line.startswith("-----"))
    try:
        envelope: Any = json.loads(base64.b64decode(body, validate=True))
        kdf, cipher = envelope["kdf"], envelope["cipher"]
        if kdf["name"] != "scrypt" or cipher["name"] != "nacl/secretbox":
            raise ValueError(f"kdf {kdf['name']!r} / cipher {cipher['name']!r}")
        params = kdf["params"]
        n, r, p = int(params["N"]), int(params["r"]), int(params["p"])
        if not (2 <= n <= 1 << 20 and n & (n - 1) == 0 and 1 <= r <= 32 and 1 <= p <= 16):
            raise ValueError("scrypt parameters out of range")
        if 128 * r * n > SCRYPT_MAXMEM // 2:
            raise ValueError(f"scrypt N={n} r={r} needs more memory than allowed")
        salt = base64.b64decode(kdf["salt"], validate=True)
        nonce = base64.b64decode(cipher["nonce"], validate=True)
        ciphertext = base64.b64decode(envelope["ciphertext"], validate=True)
    except (KeyError, TypeError, ValueError, binascii.Error) as exc:
        raise errors.InvalidArgument(f"{what}: malformed {kind}: {exc}") from None
    try:
        secret = hashlib.scrypt(password, salt=salt, n=n, r=r, p=p, dklen=32, maxmem=SCRYPT_MAXMEM)
    except ValueError as exc:
        raise errors.InvalidArgument(f"{what}: malformed {kind}: scrypt: {exc}") from None
    try:
        return bytes(nacl.secret.SecretBox(secret).decrypt(ciphertext, nonce))
    except (nacl.exceptions.CryptoError, ValueError):
        raise errors.InvalidArgument(
            f"{what}: cannot decrypt the cosign key: wrong password (COSIGN_PASSWORD)?"
        ) from None


def public_pem(key: PrivateKey | PublicKey) -> bytes:
    """The ``PUBLIC KEY`` PEM of a key (what cosign writes as cosign.pub)."""
    public = key.public_key() if not isinstance(key, PublicKey) else key
    return public.public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def _ec_hash(curve: ec.EllipticCurve) -> hashes.HashAlgorithm:
    if curve.key_size > 384:
        return hashes.SHA512()
    return hashes.SHA384() if curve.key_size > 256 else hashes.SHA256()


def sign(key: PrivateKey, data: bytes) -> bytes:
    """Sign ``data`` with the scheme cosign uses for the key's type."""
    if isinstance(key, ec.EllipticCurvePrivateKey):
        return key.sign(data, ec.ECDSA(_ec_hash(key.curve)))
    if isinstance(key, rsa.RSAPrivateKey):
        return key.sign(data, padding.PKCS1v15(), hashes.SHA256())
    return key.sign(data)


def verifies(key: PublicKeyTypes, signature: bytes, data: bytes) -> bool:
    """Whether ``signature`` over ``data`` verifies with ``key`` (cosign's schemes)."""
    try:
        if isinstance(key, ec.EllipticCurvePublicKey):
            key.verify(signature, data, ec.ECDSA(_ec_hash(key.curve)))
        elif isinstance(key, rsa.RSAPublicKey):
            key.verify(signature, data, padding.PKCS1v15(), hashes.SHA256())
        elif isinstance(key, ed25519.Ed25519PublicKey):
            key.verify(signature, data)
        else:
            return False
    except (InvalidSignature, ValueError):
        return False
    return True


def fingerprint(key: PublicKey) -> str:
    """A short name for a key in messages: the first 12 hex digits of its SPKI's SHA-256."""
    der = key.public_bytes(
        serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    return hashlib.sha256(der).hexdigest()[:12]
