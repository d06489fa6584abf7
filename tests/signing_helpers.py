"""Helpers for the signature tests: cosign built from its module, key pairs, a local test
CA that issues certificates as Fulcio does.

Where it sits: used by ``tests/test_signing.py`` (real registry, real cosign),
``tests/test_signing_keyless.py`` (pure) and the end-to-end signature tests. ``cosign``
is built by ``hack/gotool.sh cosign`` (``make cosign``, part of ``make test``'s set-up;
cold about 140 s, then cached) and run with a private ``HOME`` and no network beyond the
test registry on loopback (``--allow-http-registry``, no transparency log upload).
"""

from __future__ import annotations

import os
import subprocess
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, ed25519, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from rukpak.signing import keyless

REPO = Path(__file__).resolve().parent.parent
GOTOOL = REPO / "hack" / "gotool.sh"
PASSWORD = "test-password"

NOW = datetime.now(UTC).replace(microsecond=0)
OIDC = "https://accounts.example.com"
EMAIL = "dev@example.com"

SigningKey = ec.EllipticCurvePrivateKey | rsa.RSAPrivateKey | ed25519.Ed25519PrivateKey


@dataclass
class CA:
    key: ec.EllipticCurvePrivateKey
    cert: x509.Certificate


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_ca(
    cn: str,
    issuer: CA | None = None,
    *,
    ca: bool = True,
    path_length: int | None = None,
    until: datetime = NOW + timedelta(days=1),
    cert_sign: bool | None = None,
    key_id: bool = False,
) -> CA:
    """A CA named ``cn``, signed by ``issuer`` (by itself when None); with ``cert_sign``
    set, a KeyUsage that does (True) or does not (False) allow signing certificates; with
    ``key_id``, a SubjectKeyIdentifier."""
    key = ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(cn))
        .issuer_name(issuer.cert.subject if issuer else _name(cn))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(NOW - timedelta(days=1))
        .not_valid_after(until)
        .add_extension(x509.BasicConstraints(ca=ca, path_length=path_length), critical=True)
    )
    if cert_sign is not None:
        usage = x509.KeyUsage(True, False, False, False, False, cert_sign, True, False, False)
        builder = builder.add_extension(usage, critical=True)
    if key_id:
        builder = builder.add_extension(
            x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False
        )
    return CA(key, builder.sign(issuer.key if issuer else key, hashes.SHA256()))


def der_utf8(text: str) -> bytes:
    raw = text.encode()
    return bytes([0x0C, len(raw)]) + raw


def make_leaf(
    issuer: CA,
    *,
    key: SigningKey | None = None,
    email: str | None = EMAIL,
    uri: str | None = None,
    oidc: str | None = OIDC,
    legacy_oidc: str | None = None,
    issuer_ext: bytes | None = None,
    code_signing: bool = True,
    not_before: datetime | None = None,
) -> tuple[SigningKey, x509.Certificate]:
    """A Fulcio-like leaf, valid for 10 minutes from ``not_before`` (default: a minute before
    the call, not before the import: a long test run must not find it expired)."""
    if not_before is None:
        not_before = datetime.now(UTC).replace(microsecond=0) - timedelta(minutes=1)
    key = key or ec.generate_private_key(ec.SECP256R1())
    builder = (
        x509.CertificateBuilder()
        .subject_name(x509.Name([]))
        .issuer_name(issuer.cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(not_before)
        .not_valid_after(not_before + timedelta(minutes=10))
    )
    sans: list[x509.GeneralName] = []
    if email:
        sans.append(x509.RFC822Name(email))
    if uri:
        sans.append(x509.UniformResourceIdentifier(uri))
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    usage = ExtendedKeyUsageOID.CODE_SIGNING if code_signing else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = builder.add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
    if issuer_ext is None and oidc is not None:
        issuer_ext = der_utf8(oidc)
    if issuer_ext is not None:
        ext = x509.UnrecognizedExtension(keyless.ISSUER_OID, issuer_ext)
        builder = builder.add_extension(ext, critical=False)
    if legacy_oidc is not None:
        ext = x509.UnrecognizedExtension(keyless.LEGACY_ISSUER_OID, legacy_oidc.encode())
        builder = builder.add_extension(ext, critical=False)
    return key, builder.sign(issuer.key, hashes.SHA256())


def pem(*certs: x509.Certificate) -> bytes:
    return b"".join(c.public_bytes(serialization.Encoding.PEM) for c in certs)


@dataclass(frozen=True)
class Cosign:
    """The cosign binary and a directory of its own (HOME, keys)."""

    binary: Path
    home: Path

    def run(self, *args: str, check: bool = True, password: str = PASSWORD) -> str:
        env = {
            "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
            "HOME": str(self.home),
            "COSIGN_PASSWORD": password,
            "COSIGN_EXPERIMENTAL": "1",
            "SIGSTORE_NO_CACHE": "1",
        }
        done = subprocess.run(
            [str(self.binary), *args],
            capture_output=True,
            text=True,
            timeout=120,
            env=env,
            cwd=self.home,
            check=False,
        )
        if check and done.returncode != 0:
            raise AssertionError(f"cosign {' '.join(args)} failed: {done.stderr[-2000:]}")
        return done.stdout + done.stderr

    def key_pair(self, name: str) -> tuple[Path, Path]:
        """A new cosign key pair (encrypted cosign.key format): (private, public)."""
        directory = self.home / name
        directory.mkdir()
        done = subprocess.run(
            [str(self.binary), "generate-key-pair"],
            capture_output=True,
            text=True,
            timeout=120,
            env={"HOME": str(self.home), "COSIGN_PASSWORD": PASSWORD, "PATH": "/usr/bin:/bin"},
            cwd=directory,
            check=False,
        )
        assert done.returncode == 0, done.stderr
        return directory / "cosign.key", directory / "cosign.pub"

    def sign(self, image: str, key: Path, *extra: str) -> str:
        return self.run(
            "sign",
            "--yes",
            "--key",
            str(key),
            "--tlog-upload=false",
            "--allow-http-registry",
            *extra,
            image,
        )

    def verify(self, image: str, key: Path) -> subprocess.CompletedProcess[str]:
        """``cosign verify --key KEY IMAGE`` (no transparency log), however it ended."""
        return subprocess.run(
            [str(self.binary), "verify", "--key", str(key), "--insecure-ignore-tlog",
             "--allow-http-registry", image],
            capture_output=True, text=True, timeout=120, check=False,
            env={"HOME": str(self.home), "PATH": "/usr/bin:/bin"},
        )  # fmt: skip

    def verifies(self, image: str, key: Path) -> bool:
        """Whether ``cosign verify --key`` accepts ``image`` (no transparency log)."""
        done = self.verify(image, key)
        if done.returncode != 0 and "no matching signatures" not in done.stderr:
            raise AssertionError(
                f"cosign verify failed otherwise ({done.returncode}): {done.stderr}"
            )
        return done.returncode == 0


def _gotool(tool: str, flag: str, *, timeout: float) -> subprocess.CompletedProcess[str]:
    """``hack/gotool.sh TOOL FLAG``, its output captured."""
    return subprocess.run(
        ["bash", str(GOTOOL), tool, flag],
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


def build_cosign(tool: str = "cosign") -> Path:
    """cosign from its Go module (hack/gotool.sh, cached): ``cosign`` (2) or ``cosign3``."""
    done = _gotool(tool, "--quiet", timeout=900)
    if done.returncode != 0:
        pytest.fail(
            f"hack/gotool.sh {tool} failed (it needs go, as make k8s-bins does):\n{done.stderr}"
        )
    found = _gotool(tool, "--print-path", timeout=30)
    found.check_returncode()
    return Path(found.stdout.strip())


@pytest.fixture(scope="session")
def cosign(tmp_path_factory: pytest.TempPathFactory) -> Cosign:
    return Cosign(build_cosign(), tmp_path_factory.mktemp("cosign"))


@pytest.fixture(scope="session")
def cosign3(tmp_path_factory: pytest.TempPathFactory) -> Cosign:
    return Cosign(build_cosign("cosign3"), tmp_path_factory.mktemp("cosign3"))


def public_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )


def private_pem(key: ec.EllipticCurvePrivateKey) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
