"""Certificates for TLS registries in tests, made with the ``cryptography`` package.

A private CA (:func:`make_ca`) signs serving certificates (:func:`issue`), which may be
expired or name another host; ``issue(None, ...)`` makes one that signs itself. Each is
written as PEM files a registry serves (``tests.registry.ServingCert``); the CA's PEM is
what a source gives as ``certificateData``. :func:`server_certs` makes the set the TLS
tests serve (a private CA's, a self-signed, an expired one) and :func:`serving` starts a
server of each, stopped together.
"""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Generic, Protocol, Self, TypeVar

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from tests import signing_helpers
from tests.registry import ServingCert

LOOPBACK_NAMES: tuple[x509.GeneralName, ...] = (
    x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
    x509.DNSName("localhost"),
)


@dataclass(frozen=True)
class CA:
    """A CA's certificate (``pem``) and key."""

    cert: x509.Certificate
    key: ec.EllipticCurvePrivateKey

    @property
    def pem(self) -> str:
        return self.cert.public_bytes(serialization.Encoding.PEM).decode()


def _now() -> datetime.datetime:
    return datetime.datetime.now(datetime.UTC)


def _name(cn: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, cn)])


def make_ca(cn: str = "rukpak-test-registry-ca") -> CA:
    """A CA valid for 30 days: the signature tests' CA (``signing_helpers.make_ca``, which
    may sign certificates) with a subject key identifier, as strict TLS verification
    wants of a CA."""
    made = signing_helpers.make_ca(
        cn, until=_now() + datetime.timedelta(days=30), cert_sign=True, key_id=True
    )
    return CA(made.cert, made.key)


def _write(
    directory: Path, name: str, cert: x509.Certificate, key: ec.EllipticCurvePrivateKey
) -> ServingCert:
    directory.mkdir(parents=True, exist_ok=True)
    pair = ServingCert(directory / f"{name}.crt", directory / f"{name}.key")
    pair.cert.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    pair.key.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    pair.key.chmod(0o600)
    return pair


def issue(
    ca: CA | None,
    directory: Path,
    name: str,
    *,
    names: tuple[x509.GeneralName, ...] = LOOPBACK_NAMES,
    expired: bool = False,
) -> ServingCert:
    """A serving certificate for ``names`` signed by ``ca`` (itself when None), valid now
    or, with ``expired``, for a day that ended an hour ago."""
    key = ec.generate_private_key(ec.SECP256R1())
    subject = _name(f"registry-{name}")
    if expired:
        before, after = _now() - datetime.timedelta(days=2), _now() - datetime.timedelta(hours=1)
    else:
        before, after = _now() - datetime.timedelta(days=1), _now() + datetime.timedelta(days=30)
    builder = (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(ca.cert.subject if ca else subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(before)
        .not_valid_after(after)
        .add_extension(x509.SubjectAlternativeName(list(names)), critical=False)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
    )
    if ca is None:  # self-signed: its own CA, as such certificates usually are
        builder = builder.add_extension(
            x509.BasicConstraints(ca=True, path_length=None), critical=True
        )
        cert = builder.sign(key, hashes.SHA256())
    else:
        builder = builder.add_extension(
            x509.BasicConstraints(ca=False, path_length=None), critical=True
        ).add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca.key.public_key()), False
        )
        cert = builder.sign(ca.key, hashes.SHA256())
    return _write(directory, name, cert, key)


def pem_of(pair: ServingCert) -> str:
    """The certificate of ``pair`` in PEM (a self-signed one is its own CA)."""
    return pair.cert.read_text()


@dataclass(frozen=True)
class ServerCerts:
    """The certificates of the TLS tests' servers: ``roles`` names each server's
    (``private`` and ``expired`` signed by ``ca``, ``self_signed``; ``wrong_name`` signed by
    ``ca`` for registry.invalid only, when asked for); ``other_ca`` signed none of them."""

    ca: CA
    other_ca: CA
    roles: dict[str, ServingCert]


def server_certs(
    pki: Path, *, ca_name: str = "rukpak-test-registry-ca", wrong_name: bool = False
) -> ServerCerts:
    """Issue the TLS tests' server certificates into ``pki``."""
    ca = make_ca(ca_name)
    roles = {
        "private": issue(ca, pki, "private"),
        "self_signed": issue(None, pki, "self-signed"),
        "expired": issue(ca, pki, "expired", expired=True),
    }
    if wrong_name:
        roles["wrong_name"] = issue(
            ca, pki, "wrong-name", names=(x509.DNSName("registry.invalid"),)
        )
    return ServerCerts(ca=ca, other_ca=make_ca("another-ca"), roles=roles)


class Stoppable(Protocol):
    def stop(self) -> None: ...


S = TypeVar("S", bound=Stoppable)


@contextmanager
def serving(
    roles: dict[str, ServingCert], start: Callable[[str, ServingCert], S]
) -> Iterator[dict[str, S]]:
    """A server per role, ``start(role, certificate)``; every one started is stopped when
    the block ends (also when a later one fails to start)."""
    started: dict[str, S] = {}
    try:
        for role, cert in roles.items():
            started[role] = start(role, cert)
        yield started
    finally:
        for server in started.values():
            server.stop()


@dataclass(frozen=True)
class Served(ServerCerts, Generic[S]):
    """The servers a TLS test started with its certificates (a test's dataclass extends it
    with what else its servers hold)."""

    private: S  # signed by ``ca``
    self_signed: S
    expired: S  # signed by ``ca``, expired an hour ago

    @classmethod
    def of(cls, certs: ServerCerts, started: dict[str, S], **more: Any) -> Self:
        return cls(
            ca=certs.ca,
            other_ca=certs.other_ca,
            roles=certs.roles,
            private=started["private"],
            self_signed=started["self_signed"],
            expired=started["expired"],
            **more,
        )

    @property
    def self_signed_pem(self) -> str:
        return pem_of(self.roles["self_signed"])
