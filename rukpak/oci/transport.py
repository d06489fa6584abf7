"""HTTP to registries: URL scheme, timeouts, bounded retries, auth, error codes.

The one seam of ``rukpak.oci`` that touches the network. ``rukpak.oci.client``
builds API operations on :class:`Transport.request`, which

- picks ``http`` only for loopback hosts and hosts listed as insecure,
  ``https`` for everything else (:func:`scheme_for`); a transport made for one source's
  TLS (``rukpak.oci.tls``: its CA, or no verification) speaks ``https`` to loopback
  hosts too, and verifies with that source's trust only;
- answers FailedPrecondition at once, naming the host and the reason (unknown
  authority, expired, hostname mismatch), when a certificate is refused: retrying
  cannot help;
- sets connect/read timeouts on every request and retries connection errors,
  429 and 5xx a bounded number of times with short exponential backoff, so a
  dead registry fails in seconds;
- under a deadline (``rukpak.common.backoff.within``, one per NodePublishVolume),
  derives each attempt's timeouts and each backoff delay from what remains of it
  and answers DeadlineExceeded, naming the registry, once it has passed;
- authenticates: basic credentials, or bearer tokens fetched per scope and
  cached (``rukpak.oci.auth``), answering a 401 challenge once;
- never logs headers, credentials or tokens.

``rukpak.oci.answers.raise_for_status`` maps registry answers to ``rukpak.common.errors`` codes with
messages that name the reference and say what to do.
"""

from __future__ import annotations

import ipaddress
import logging
import threading
import time
import urllib.parse
from collections.abc import Callable, Iterable
from typing import Final, Protocol, TypedDict

import requests

from rukpak.common import backoff, errors
from rukpak.common.backoff import Backoff
from rukpak.oci import auth
from rukpak.oci import tls as source_tls
from rukpak.oci.answers import (
    RETRY_STATUS,
    Target,
    blob_target,
    image_target,
    raise_for_status,
)

log = logging.getLogger(__name__)

__all__ = [
    "RETRY_STATUS",
    "Target",
    "Transport",
    "blob_target",
    "image_target",
    "raise_for_status",
    "scheme_for",
]

USER_AGENT: Final[str] = "rukpak-python/0.1 (rukpak.oci)"
MAX_BACKOFF: Final[float] = 4.0


class Readable(Protocol):
    """A request body stream: a file, or anything with ``read`` and ``close``."""

    def read(self, size: int = -1, /) -> bytes: ...

    def close(self) -> None: ...


# A request body: bytes, or a factory opening a fresh stream for each attempt
# (a retried or re-authenticated upload must send the whole body again).
Body = bytes | Callable[[], Readable] | None


def is_loopback(host: str) -> bool:
    """True for ``localhost``, ``127.0.0.0/8`` and ``[::1]``, with or without a port."""
    name = host.lower()
    if name.startswith("["):
        name = name[1 : name.find("]")] if "]" in name else name[1:]
    elif name.count(":") == 1:
        name = name.split(":", 1)[0]
    if name == "localhost" or name.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def scheme_for(host: str, insecure: Iterable[str] = (), *, tls_given: bool = False) -> str:
    """``http`` for loopback or explicitly insecure hosts, else ``https``; with
    ``tls_given`` (the source says how to verify its TLS) loopback hosts get ``https``."""
    allowed = {h.lower() for h in insecure}
    bare = host.lower().rsplit(":", 1)[0] if not host.endswith("]") else host.lower()
    if (is_loopback(host) and not tls_given) or host.lower() in allowed or bare in allowed:
        return "http"
    return "https"


class _Retry(Exception):
    """A failed attempt worth retrying: no answer (``reason``), or a 429/5xx ``response``."""

    def __init__(self, reason: str, response: requests.Response | None = None) -> None:
        super().__init__(reason)
        self.reason = reason
        self.response = response


class Options(TypedDict, total=False):
    """The keyword options of :class:`Transport`, every one optional, for a caller that
    passes them on (``RegistryClient``); their defaults and meaning are Transport's."""

    credentials: auth.Credentials | None
    insecure: Iterable[str]
    timeout: float
    connect_timeout: float | None
    retries: int
    backoff: float
    user_agent: str
    ca_bundle: str | None
    proxies_from_env: bool
    sleep: Callable[[float], object]
    tls: source_tls.SourceTLS | None


class Transport:
    """A ``requests.Session`` with the policies above; safe to share between threads."""

    def __init__(
        self,
        *,
        credentials: auth.Credentials | None = None,
        insecure: Iterable[str] = (),
        timeout: float = 30.0,
        connect_timeout: float | None = None,
        retries: int = 3,
        backoff: float = 0.2,
        user_agent: str = USER_AGENT,
        ca_bundle: str | None = None,
        proxies_from_env: bool = True,
        sleep: Callable[[float], object] = time.sleep,
        tls: source_tls.SourceTLS | None = None,
    ) -> None:
        """``tls`` is the trust of the one source this transport is made for; by default
        the one in force on this thread (``rukpak.oci.tls.using``), else the system's."""
        self.ca_bundle = ca_bundle
        chosen = tls if tls is not None else source_tls.current()
        self.tls = chosen if chosen is not None and chosen.custom else None
        self.verify: str | bool = (
            self.tls.verify(ca_bundle) if self.tls is not None else (ca_bundle or True)
        )
        self.proxies_from_env = proxies_from_env
        self.credentials = credentials or auth.Credentials()
        self.insecure = frozenset(h.lower() for h in insecure)
        self.timeout = (min(timeout, 5.0) if connect_timeout is None else connect_timeout, timeout)
        self.attempts = 1 + max(0, retries)
        self.retries = max(0, retries)
        self.backoff = Backoff(base=backoff, cap=MAX_BACKOFF)
        self.sleep = sleep
        self.session = requests.Session()
        self.session.headers["User-Agent"] = user_agent
        # No ~/.netrc (it would replace our Authorization header); proxies are
        # taken from the environment per request instead (see _send).
        self.session.trust_env = False
        self.tokens = auth.TokenCache()
        self._challenges: dict[str, auth.Challenge] = {}
        self._lock = threading.Lock()

    def close(self) -> None:
        self.session.close()

    def check(self, response: requests.Response, target: Target, *, ok: Iterable[int]) -> None:
        """:func:`raise_for_status`, knowing whether we hold credentials for the host."""
        raise_for_status(
            response,
            target,
            ok=ok,
            has_credentials=self.credentials.for_host(target.host) is not None,
        )

    def base_url(self, host: str) -> str:
        return f"{scheme_for(host, self.insecure, tls_given=self.tls is not None)}://{host}"

    def timeouts(self, deadline: backoff.Deadline | None) -> tuple[float, float]:
        """(connect, read) timeouts of the next attempt: ours, cut to what the deadline
        leaves."""
        if deadline is None:
            return self.timeout
        return deadline.timeout(self.timeout[0]), deadline.timeout(self.timeout[1])

    def doing(self, target: Target) -> str:
        """What a request for ``target`` is, naming the registry, for deadline messages."""
        return f"registry {target.host} at {self.base_url(target.host)}, fetching {target.subject}"

    def request(
        self,
        method: str,
        target: Target,
        path_or_url: str,
        *,
        headers: dict[str, str] | None = None,
        params: dict[str, str] | None = None,
        body: Body = None,
        stream: bool = False,
        retry: bool = True,
    ) -> requests.Response:
        """Send one API request with retries and auth; return the final response.

        The response may have any status; callers pass it to
        :func:`raise_for_status`. Connection failures that outlast the retries
        raise Unavailable.
        """
        url = path_or_url if "://" in path_or_url else self.base_url(target.host) + path_or_url
        authorization = self._cached_authorization(target)
        response = self._send(
            method, url, target, headers, params, body, stream, authorization, retry
        )
        if response.status_code != 401:
            return response
        challenges = auth.parse_challenges(response.headers.get("WWW-Authenticate", ""))
        fresh = self._authorize(target, challenges, stale=authorization)
        if fresh is None:
            return response
        response.close()
        return self._send(method, url, target, headers, params, body, stream, fresh, retry)

    def _send(
        self,
        method: str,
        url: str,
        target: Target,
        headers: dict[str, str] | None,
        params: dict[str, str] | None,
        body: Body,
        stream: bool,
        authorization: str | None,
        retry: bool,
    ) -> requests.Response:
        all_headers = dict(headers or {})
        if authorization:
            all_headers["Authorization"] = authorization
        attempts = 1 + (self.retries if retry else 0)
        retry_after = [0.0]
        deadline = backoff.current()
        made = [0]
        if deadline is not None:
            deadline.check(self.doing(target))

        def attempt() -> requests.Response:
            made[0] += 1
            data = body() if callable(body) else body
            try:
                response = self.session.request(
                    method,
                    url,
                    headers=all_headers,
                    params=params,
                    data=data,
                    stream=stream,
                    timeout=self.timeouts(deadline),
                    allow_redirects=True,
                    proxies=self._proxies(url),
                    verify=self.verify,
                )
            except requests.exceptions.SSLError as exc:
                refused = source_tls.refusal(exc, what=f"registry {target.host}")
                if refused is not None:  # the same certificate again: retrying cannot help
                    raise errors.FailedPrecondition(
                        f"{refused}; {target.subject} not fetched"
                    ) from None
                raise _Retry(_describe(exc)) from exc
            except requests.RequestException as exc:
                raise _Retry(_describe(exc)) from exc
            finally:
                if callable(body) and data is not None and not isinstance(data, bytes):
                    data.close()
            log.debug("registry request method=%s url=%s status=%d",
                      method, _strip_query(url), response.status_code)  # fmt: skip
            if response.status_code in RETRY_STATUS:
                raise _Retry(f"HTTP {response.status_code}", response)
            return response

        def on_retry(n: int, err: BaseException, _delay: float) -> None:
            assert isinstance(err, _Retry)
            log.info("registry request failed method=%s url=%s error=%r attempt=%d",
                     method, _strip_query(url), err.reason, n)  # fmt: skip
            retry_after[0] = 0.0
            if err.response is not None:
                retry_after[0] = _retry_after(err.response)
                err.response.close()

        def pause(delay: float) -> None:
            # The backoff, or the registry's Retry-After when longer (capped), within the deadline.
            wait = max(delay, retry_after[0])
            self.sleep(wait if deadline is None else min(wait, deadline.remaining()))

        try:
            return backoff.retry(
                attempt,
                attempts=attempts,
                backoff=self.backoff,
                retryable=lambda err: isinstance(err, _Retry),
                sleep=pause,
                on_retry=on_retry,
                deadline=deadline,
            )
        except _Retry as final:
            if final.response is not None:
                return final.response  # a 5xx or 429 after the last retry: the caller maps it
            last_error = final.reason
        if deadline is not None and (made[0] < attempts or deadline.expired()):
            raise deadline.exceeded(
                self.doing(target),
                detail=f"{last_error}, after {made[0]} attempt{'s' if made[0] > 1 else ''}",
            )
        raise errors.Unavailable(
            f"registry {target.host} at {self.base_url(target.host)} is unreachable: {last_error} "
            f"(after {attempts} attempt{'s' if attempts > 1 else ''}); {target.subject} could not "
            "be fetched: check the registry address and network, or retry later"
        )

    def _proxies(self, url: str) -> dict[str, str]:
        """HTTP(S)_PROXY / NO_PROXY from the environment, as the kubelet honours them."""
        if not self.proxies_from_env:
            return {}
        return dict(requests.utils.get_environ_proxies(url))

    def _cached_authorization(self, target: Target) -> str | None:
        with self._lock:
            challenge = self._challenges.get(target.host)
        if challenge is None:
            return None
        if challenge.scheme == "basic":
            credential = self.credentials.for_host(target.host)
            return credential.basic_header() if credential and credential.has_basic else None
        token = self.tokens.get((challenge.realm, challenge.service, target.scope))
        if token is None:
            # The registry uses tokens: get one for this scope before asking.
            return self._bearer(target, challenge)
        return f"Bearer {token.value}"

    def _authorize(
        self, target: Target, challenges: list[auth.Challenge], *, stale: str | None
    ) -> str | None:
        """The Authorization value answering ``challenges``, or None if we have none."""
        credential = self.credentials.for_host(target.host)
        for challenge in challenges:
            if challenge.scheme == "bearer":
                with self._lock:
                    self._challenges[target.host] = challenge
                self.tokens.drop((challenge.realm, challenge.service, target.scope))
                fresh = self._bearer(target, challenge)
                return None if fresh == stale else fresh
            if challenge.scheme == "basic" and credential is not None and credential.has_basic:
                with self._lock:
                    self._challenges[target.host] = challenge
                fresh = credential.basic_header()
                return None if fresh == stale else fresh
        return None

    def _bearer(self, target: Target, challenge: auth.Challenge) -> str:
        credential = self.credentials.for_host(target.host)
        if credential is not None and credential.registry_token:
            return f"Bearer {credential.registry_token}"
        realm_host = urllib.parse.urlsplit(challenge.realm).netloc
        if (
            challenge.realm.startswith("http://")
            and credential is not None
            and scheme_for(realm_host, self.insecure, tls_given=self.tls is not None) != "http"
        ):
            raise errors.Unauthenticated(
                f"registry {target.host} asks for credentials to be sent to {challenge.realm} "
                "over plain HTTP; refusing. List that host as insecure only on a trusted network"
            )
        deadline = backoff.current()
        try:
            token = auth.fetch_token(
                self.session,
                challenge,
                target.scope,
                credential,
                timeout=self.timeouts(deadline),
                host=target.host,
                proxies=self._proxies(challenge.realm),
                verify=self.verify,
            )
        except errors.Unavailable as exc:
            if deadline is not None and deadline.expired():
                realm = _strip_query(challenge.realm)
                raise deadline.exceeded(
                    f"token server {realm} of registry {target.host}, authorizing {target.subject}",
                    detail=exc.message,
                ) from None
            raise
        self.tokens.put((challenge.realm, challenge.service, target.scope), token)
        return f"Bearer {token.value}"


def _retry_after(response: requests.Response) -> float:
    value = response.headers.get("Retry-After", "")
    try:
        return min(max(float(value), 0.0), MAX_BACKOFF)
    except ValueError:
        return 0.0


def _describe(exc: requests.RequestException) -> str:
    if isinstance(exc, requests.ConnectTimeout):
        return "connection timed out"
    if isinstance(exc, requests.ReadTimeout):
        return "no answer within the read timeout"
    if isinstance(exc, requests.exceptions.SSLError):
        why = source_tls.reason(exc)
        if why is not None:
            return f"TLS certificate refused: {why}"
        return f"TLS handshake failed (does the server speak plain HTTP?): {_ssl_detail(exc)}"
    if isinstance(exc, requests.ConnectionError):
        text = str(exc)
        if "Connection refused" in text:
            return "connection refused"
        if "Name or service not known" in text or "Temporary failure in name resolution" in text:
            return "host name does not resolve"
        return "connection failed"
    return type(exc).__name__


def _strip_query(url: str) -> str:
    return url.split("?", 1)[0]


def _ssl_detail(exc: BaseException) -> str:
    """The innermost ``ssl`` error's text, e.g. ``[SSL: WRONG_VERSION_NUMBER] ...``."""
    text = str(exc)
    start = text.find("[SSL")
    if start >= 0:
        return text[start:].split("'", 1)[0].rstrip(" ()")
    return type(exc).__name__
