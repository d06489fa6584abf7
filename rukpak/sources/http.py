"""Fetching an http(s) tarball with the rules a bundle source needs.

Where it sits: the manager pins an http source by the digest of what it fetched
(:func:`fetch` with no destination, then :func:`pin_url`); the node cache
(``rukpak.sources.cache``) fetches the pinned URL again into a file and accepts it
only when its digest matches. The pin travels in the URL's fragment
(``https://host/b.tgz#sha256=<hex>``, pip's convention): fragments never reach
the server, so the URL still names the same resource, and upstream's
``resolvedSource`` shape (``{type: http, http: {url}}``) is kept.

TLS: ``tls`` (the source's ``certificateData`` and ``auth.insecureSkipVerify``, see
``rukpak.oci.tls``), else the SourceTLS in force on this thread (the node plugin
publishes a volume under its own), else the system trust store. It applies to this
fetch's session only. A refused certificate is FailedPrecondition naming the server and
why; skipping verification still checks the content against its pin.

Hostile servers: redirects are followed only on the same scheme, host and port
(another host is refused with a message); every read has a timeout and the whole
download a deadline (the caller's ``rukpak.common.backoff.Deadline``, one per
NodePublishVolume on the node, or ``DEADLINE`` seconds), which cuts the timeouts
of each request to what remains of it; the body is capped at ``max_bytes``. A
partial file is removed on any failure.
"""

from __future__ import annotations

import contextlib
import hashlib
import os
from pathlib import Path
from urllib.parse import urljoin, urlsplit, urlunsplit

import requests

from rukpak.common import errors
from rukpak.common.backoff import Deadline
from rukpak.oci import tls as source_tls
from rukpak.sources.auth import SourceAuth

CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 30.0
DEADLINE = 600.0
"""Seconds a whole download may take."""
MAX_BYTES = 512 * 1024**2
"""The largest tarball fetched (compressed); its content has the extractor's budgets."""
MAX_REDIRECTS = 5
CHUNK = 1 << 16
PIN_PREFIX = "sha256="


def pin_url(url: str, digest: str) -> str:
    """``url`` with its content digest in the fragment (replacing any fragment)."""
    parts = urlsplit(url)
    return urlunsplit(parts._replace(fragment=PIN_PREFIX + digest.removeprefix("sha256:")))


def split_pinned(url: str) -> tuple[str, str | None]:
    """(the URL to fetch, ``sha256:<hex>`` or None) of a possibly pinned URL."""
    parts = urlsplit(url)
    bare = urlunsplit(parts._replace(fragment=""))
    if parts.fragment.startswith(PIN_PREFIX):
        hex_ = parts.fragment[len(PIN_PREFIX) :]
        if len(hex_) == 64 and all(c in "0123456789abcdef" for c in hex_):
            return bare, f"sha256:{hex_}"
    return bare, None


def check_url(url: str) -> None:
    """InvalidArgument unless ``url`` is an absolute http(s) URL."""
    parts = urlsplit(url)
    if parts.scheme not in ("http", "https") or not parts.hostname:
        raise errors.InvalidArgument(
            f"http source url {url[:300]!r} is not an absolute http:// or https:// URL"
        )


def display(url: str) -> str:
    """``url`` for a message: no user name or password, no query (it may hold a token)."""
    parts = urlsplit(url)
    host = parts.hostname or ""
    netloc = f"[{host}]" if ":" in host else host
    if parts.port is not None:
        netloc += f":{parts.port}"
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))[:300]


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    port = parts.port or (443 if parts.scheme == "https" else 80)
    return parts.scheme, (parts.hostname or "").lower(), port


def fetch(
    url: str,
    dest: Path | None = None,
    *,
    auth: SourceAuth | None = None,
    insecure: bool = False,
    tls: source_tls.SourceTLS | None = None,
    expect: str | None = None,
    max_bytes: int = MAX_BYTES,
    read_timeout: float = READ_TIMEOUT,
    deadline: Deadline | float = DEADLINE,
) -> str:
    """GET ``url`` (into ``dest`` if given); the ``sha256:`` digest of the body.

    With ``expect``, a body of another digest is FailedPrecondition (the content
    changed since it was pinned) and ``dest`` is removed. ``deadline`` (a
    :class:`Deadline`, or seconds from now) bounds the whole fetch, redirects
    included: DeadlineExceeded naming the URL once it has passed.
    """
    check_url(url)
    action = f"GET {url}"
    until = (
        deadline
        if isinstance(deadline, Deadline)
        else Deadline.after(deadline, what="the download deadline")
    )
    session = requests.Session()
    session.trust_env = False  # no proxies or .netrc from the environment
    session.verify = verify_of(tls, insecure=insecure)
    current = url
    try:
        for _ in range(MAX_REDIRECTS + 1):
            response = _get(session, current, auth=auth, timeout=read_timeout, until=until)
            if response.is_redirect:
                target = urljoin(current, response.headers.get("location", ""))
                response.close()
                if _origin(target) != _origin(url):
                    raise errors.InvalidArgument(
                        f"{action}: redirected to another host ({target[:300]}); an http "
                        "source must not leave its scheme, host and port: use the final URL"
                    )
                current = target
                continue
            with response:
                _check_status(action, response)
                return _body(
                    action,
                    response,
                    dest,
                    expect=expect,
                    max_bytes=max_bytes,
                    until=until,
                )
        raise errors.InvalidArgument(f"{action}: more than {MAX_REDIRECTS} redirects")
    finally:
        session.close()


def verify_of(tls: source_tls.SourceTLS | None, *, insecure: bool = False) -> str | bool:
    """The ``verify`` of a fetch: False when ``insecure`` or ``tls`` skips verification,
    a CA bundle file when ``tls`` (else the thread's, :func:`rukpak.oci.tls.current`) adds
    a CA, True (the system trust store) otherwise."""
    if insecure:
        return False
    trust = tls if tls is not None else source_tls.current()
    return trust.verify() if trust is not None else True


def _get(
    session: requests.Session,
    url: str,
    *,
    auth: SourceAuth | None,
    timeout: float,
    until: Deadline,
) -> requests.Response:
    basic = (auth.username, auth.password) if auth is not None and auth.username else None
    doing = f"GET {display(url)}"
    until.check(doing)
    try:
        return session.get(
            url,
            auth=basic,
            stream=True,
            allow_redirects=False,
            timeout=(until.timeout(CONNECT_TIMEOUT), until.timeout(timeout)),
            headers={"Accept-Encoding": "identity"},
        )
    except requests.RequestException as exc:
        if until.expired():
            raise until.exceeded(doing, detail=type(exc).__name__) from None
        refused = source_tls.refusal(
            exc, what=f"server {urlsplit(url).netloc}", skip_field=source_tls.SKIP_FIELD_FETCH
        )
        if refused is not None:  # the same certificate again: retrying cannot help
            raise errors.FailedPrecondition(f"GET {display(url)}: {refused}") from None
        if not isinstance(exc, requests.Timeout):
            raise errors.Unavailable(f"GET {url}: request failed: {str(exc)[:300]}") from None
        raise errors.Unavailable(
            f"GET {url}: no answer within {timeout:g}s; check the server is up"
        ) from None


def _check_status(action: str, response: requests.Response) -> None:
    code = response.status_code
    if code == 200:
        return
    status = f'unexpected status "{code} {response.reason or ""}"'
    if code in (401, 403):
        raise errors.PermissionDenied(
            f"{action}: {status}: check the auth secret's username and password"
        )
    if code == 404:
        raise errors.NotFound(f"{action}: {status}")
    if code >= 500 or code == 429:
        raise errors.Unavailable(f"{action}: {status}")
    raise errors.InvalidArgument(f"{action}: {status}")


def _body(
    action: str,
    response: requests.Response,
    dest: Path | None,
    *,
    expect: str | None,
    max_bytes: int,
    until: Deadline,
) -> str:
    doing = f"GET {display(response.url or '')}, downloading"
    length = response.headers.get("content-length", "")
    if length.isdigit() and int(length) > max_bytes:
        raise errors.ResourceExhausted(
            f"{action}: the body is {int(length)} bytes, more than the {max_bytes}-byte limit"
        )
    hasher = hashlib.sha256()
    total = 0
    fd = os.open(dest, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o600) if dest else -1
    try:
        try:
            for chunk in response.iter_content(CHUNK):
                total += len(chunk)
                if total > max_bytes:
                    raise errors.ResourceExhausted(
                        f"{action}: the body is more than the {max_bytes}-byte limit"
                    )
                until.check(doing)
                hasher.update(chunk)
                if fd >= 0:
                    os.write(fd, chunk)
        except requests.RequestException as exc:
            if until.expired():
                raise until.exceeded(
                    doing,
                    detail="the download stalled",
                ) from None
            raise errors.Unavailable(
                f"{action}: the download broke off or stalled: {str(exc)[:300]}"
            ) from None
        digest = f"sha256:{hasher.hexdigest()}"
        if expect is not None and digest != expect:
            raise errors.FailedPrecondition(
                f"{action}: the content changed since the Bundle pinned it ({expect} expected, "
                f"{digest} fetched); create a new Bundle to use the new content"
            )
        return digest
    except BaseException:
        if dest is not None:
            with contextlib.suppress(OSError):
                os.close(fd)
                fd = -1
            dest.unlink(missing_ok=True)
        raise
    finally:
        if fd >= 0:
            os.close(fd)
