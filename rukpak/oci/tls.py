"""TLS trust of one source: its own CA bundle (``certificateData``) or no verification
(``insecureSkipTLSVerify``), and why a registry's certificate was refused.

Where it sits: a :class:`SourceTLS` is built from a source's fields by the manager
(``provisioner.manager.resolution``) and from a volume's attributes by the node plugin
(``rukpak.sources.volume``); :class:`rukpak.oci.transport.Transport` and the http and
git fetchers (``rukpak.sources``) turn it into the ``verify`` of their requests. Image
sources name it ``certificateData`` and ``insecureSkipTLSVerify`` (upstream v0.24); git
and http sources ``certificateData`` (ours, the same name) and ``auth.insecureSkipVerify``
(upstream's).

Scope: a SourceTLS applies to the clients made for that one source, never to a shared
one. The CA is *added* to the system trust store for those clients (a registry may
redirect blob downloads to a CDN with a public certificate); nothing else trusts it.
A client made while :func:`using` is in force on the current thread (the publish of one
volume, the resolution of one source) takes that SourceTLS; other threads, and so
concurrent publishes of other volumes, never see it.

:func:`refusal` reads a certificate verification failure out of a ``requests`` error:
which host, and whether the authority is unknown, the certificate expired or does not
name the host; callers answer FailedPrecondition with it instead of retrying.
"""

from __future__ import annotations

import contextlib
import contextvars
import hashlib
import os
import ssl
import tempfile
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Final

import certifi
from cryptography import x509

from rukpak.common import errors

MAX_PEM_BYTES: Final[int] = 256 * 1024
"""A CA bundle larger than this is refused (a volume attribute travels in the pod spec)."""
MAX_CERTS: Final[int] = 64
SKIP_FIELD_IMAGE: Final[str] = "insecureSkipTLSVerify"
"""An image source's field that skips verification (upstream v0.24's name)."""
SKIP_FIELD_FETCH: Final[str] = "auth.insecureSkipVerify"
"""A git or http source's field that skips verification (upstream v0.24's name)."""

_current: contextvars.ContextVar[SourceTLS | None] = contextvars.ContextVar(
    "rukpak_source_tls", default=None
)
_bundle_dir: Path | None = None
_bundle_lock = threading.Lock()


@dataclass(frozen=True)
class SourceTLS:
    """How to verify the servers of one source: with the system trust store plus
    ``ca_pem`` (PEM CA certificates; empty for none), or not at all (``skip_verify``)."""

    ca_pem: str = ""
    skip_verify: bool = False

    @property
    def custom(self) -> bool:
        """Whether this differs from the default (system trust store only)."""
        return bool(self.ca_pem) or self.skip_verify

    def verify(self, base: str | None = None) -> str | bool:
        """The ``verify`` argument of ``requests``: False when skipping verification, the
        path of a bundle of ``base`` (or the system's) plus ``ca_pem``, or ``base``/True."""
        if self.skip_verify:
            return False
        if not self.ca_pem:
            return base or True
        return str(bundle_file(self.ca_pem, base=base))

    @classmethod
    def from_fields(
        cls, certificate_data: object, skip_verify: object, *, where: str, server: str = "registry"
    ) -> SourceTLS | None:
        """From a source's ``certificateData`` and ``insecureSkipTLSVerify`` (a git or http
        source's ``auth.insecureSkipVerify``), the former named ``where`` in errors; None
        when neither is set. InvalidArgument when the data is not PEM certificates (of the
        ``server``'s CA)."""
        text = certificate_data if isinstance(certificate_data, str) else ""
        skip = skip_verify is True or str(skip_verify).strip().lower() == "true"
        if not text.strip() and not skip:
            return None
        pem = check_pem(text, where=where, server=server) if text.strip() else ""
        return cls(ca_pem=pem, skip_verify=skip)


def check_pem(text: str, *, where: str, server: str = "registry") -> str:
    """``text`` when it is a bundle of PEM certificates (at most MAX_CERTS, MAX_PEM_BYTES);
    InvalidArgument naming ``where`` and what to put there (the ``server``'s CA) otherwise."""
    hint = (
        f"{where} must hold the {server}'s CA certificate(s) in PEM "
        "('-----BEGIN CERTIFICATE-----' ...)"
    )
    if len(text.encode()) > MAX_PEM_BYTES:
        raise errors.InvalidArgument(f"{hint}; it has more than {MAX_PEM_BYTES} bytes")
    if "-----BEGIN CERTIFICATE-----" not in text:
        raise errors.InvalidArgument(f"{hint}; it has no PEM certificate")
    try:
        certs = x509.load_pem_x509_certificates(text.encode())
    except ValueError as exc:
        raise errors.InvalidArgument(f"{hint}; it does not parse: {exc}") from None
    if len(certs) > MAX_CERTS:
        raise errors.InvalidArgument(f"{hint}; it has {len(certs)} (at most {MAX_CERTS})")
    try:  # what OpenSSL will be asked to load must load
        ssl.create_default_context(cadata=text)
    except (ssl.SSLError, ValueError) as exc:
        raise errors.InvalidArgument(f"{hint}; OpenSSL refuses it: {exc}") from None
    return text.strip() + "\n"


def bundle_file(ca_pem: str, *, base: str | None = None) -> Path:
    """A file holding ``base`` (default: certifi's system bundle) then ``ca_pem``, named by
    the digest of what it holds, written once (atomically) in a private directory."""
    base_path = Path(base or certifi.where())
    content = base_path.read_bytes().rstrip(b"\n") + b"\n" + ca_pem.encode()
    name = hashlib.sha256(content).hexdigest() + ".pem"
    directory = _directory()
    path = directory / name
    if not path.is_file():
        fd, tmp = tempfile.mkstemp(dir=directory, prefix=".tmp-")
        try:
            with os.fdopen(fd, "wb") as out:
                out.write(content)
            os.replace(tmp, path)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(tmp)
            raise
    return path


def _directory() -> Path:
    global _bundle_dir
    with _bundle_lock:
        if _bundle_dir is None or not _bundle_dir.is_dir():
            _bundle_dir = Path(tempfile.mkdtemp(prefix="rukpak-ca-"))  # mode 0700
        return _bundle_dir


def current() -> SourceTLS | None:
    """The SourceTLS in force on this thread (see :func:`using`), or None."""
    return _current.get()


@contextlib.contextmanager
def using(tls: SourceTLS | None) -> Iterator[None]:
    """Clients made on this thread within the block take ``tls`` (None: the default)."""
    token = _current.set(tls if tls is not None and tls.custom else None)
    try:
        yield
    finally:
        _current.reset(token)


# OpenSSL X509_V_ERR_* codes (x509_vfy.h) -> what a user reads.
_UNKNOWN_AUTHORITY: Final[dict[int, str]] = {
    2: "unknown authority (unable to get issuer certificate)",
    18: "unknown authority (self-signed certificate)",
    19: "unknown authority (self-signed certificate in certificate chain)",
    20: "unknown authority (unable to get local issuer certificate)",
    21: "unknown authority (unable to verify the first certificate)",
}
_EXPIRED: Final[dict[int, str]] = {
    9: "certificate is not yet valid",
    10: "certificate has expired",
    12: "CRL has expired",
}
_MISMATCH: Final[dict[int, str]] = {
    62: "hostname mismatch",
    64: "IP address mismatch",
}


def _verify_error(exc: BaseException) -> ssl.SSLCertVerificationError | None:
    """The certificate verification error inside ``exc`` (requests wraps urllib3's,
    which wraps ssl's), if any."""
    seen: set[int] = set()
    todo: list[BaseException] = [exc]
    while todo:
        err = todo.pop()
        if id(err) in seen:
            continue
        seen.add(id(err))
        if isinstance(err, ssl.SSLCertVerificationError):
            return err
        todo.extend(a for a in getattr(err, "args", ()) if isinstance(a, BaseException))
        for linked in (err.__cause__, err.__context__, getattr(err, "reason", None)):
            if isinstance(linked, BaseException):
                todo.append(linked)
    return None


def reason(exc: BaseException) -> str | None:
    """Why the peer's certificate was refused ("unknown authority (...)", "certificate has
    expired", "hostname mismatch", ...), or None when ``exc`` is no verification failure."""
    err = _verify_error(exc)
    if err is None:
        return None
    code = int(getattr(err, "verify_code", 0) or 0)
    detail = str(getattr(err, "verify_message", "") or err.reason or err)
    for table in (_UNKNOWN_AUTHORITY, _EXPIRED, _MISMATCH):
        if code in table:
            text = table[code]
            if code in _MISMATCH and detail:
                text = f"{text} ({detail})"
            return text
    return f"certificate verify failed ({detail})" if detail else "certificate verify failed"


def advice(why: str, *, skip_field: str = SKIP_FIELD_IMAGE) -> str:
    """What to do about a refusal ``why`` (from :func:`reason`); ``skip_field`` is the
    source's field that skips verification (an image's ``insecureSkipTLSVerify``, a git or
    http source's ``auth.insecureSkipVerify``)."""
    if why.startswith("unknown authority"):
        pinned = "digest" if skip_field == SKIP_FIELD_IMAGE else "its pin"
        return (
            "give the CA that signed the server's certificate in the source's certificateData "
            f"(PEM), or set {skip_field} (content is still verified by {pinned})"
        )
    if "expired" in why or "not yet valid" in why:
        return (
            "the server's certificate is outside its validity period (check its dates "
            f"and this machine's clock); renew it, or set {skip_field}"
        )
    if "mismatch" in why:
        return "name the server by a host name or address its certificate lists"
    return f"check the server's certificate, or set {skip_field}"


def refusal(exc: BaseException, *, what: str, skip_field: str = SKIP_FIELD_IMAGE) -> str | None:
    """A message for a refused certificate of ``what`` (e.g. "registry host:5000"), or
    None when ``exc`` is no certificate verification failure."""
    why = reason(exc)
    if why is None:
        return None
    return f"TLS certificate of {what} refused: {why}: {advice(why, skip_field=skip_field)}"


def for_url(url: str, tls: SourceTLS | None, *, where: str) -> SourceTLS | None:
    """``tls`` for a git or http source at ``url``: InvalidArgument naming ``where`` when it
    carries a CA (``certificateData``) for a URL that is not ``https://`` (plain HTTP,
    ``git://`` and SSH remotes present no certificate to check it against)."""
    if tls is not None and tls.ca_pem and not url.strip().lower().startswith("https://"):
        raise errors.InvalidArgument(
            f"{where} is for https:// URLs only; {url[:300]!r} presents no TLS certificate "
            "(remove certificateData, or use the server's https:// URL)"
        )
    return tls
