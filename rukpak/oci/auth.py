"""Registry credentials and the Docker token protocol.

Sits under ``rukpak.oci.client``: the node plugin turns the dockerconfigjson of a
``nodePublishSecretRef`` into :class:`Credentials` here; the client asks them
for the credential of a registry host, parses the registry's
``WWW-Authenticate`` challenges with :func:`parse_challenges`, and fetches and
caches bearer tokens per (realm, service, scope) with :class:`TokenCache` and
:func:`fetch_token`.

Secrets never appear in a repr, a log line or an error message; malformed
input is reported by position and field name only.
"""

from __future__ import annotations

import base64
import binascii
import json
import logging
import threading
import time
import urllib.parse
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import oras.auth.utils
import oras.defaults
import requests

from rukpak.common import errors

log = logging.getLogger(__name__)

DOCKER_HUB = oras.defaults.registry.index_name  # "docker.io"
_DOCKER_HUB_ALIASES = frozenset(
    {
        DOCKER_HUB,
        oras.defaults.registry.index_hostname,
        "registry-1.docker.io",
        "registry.hub.docker.com",
    }
)
# Tokens are treated as expired this many seconds early, so a request never
# carries one that dies in flight.
EXPIRY_MARGIN = 10.0
# The Docker token spec: tokens without expires_in live 60 seconds.
DEFAULT_TOKEN_LIFETIME = 60


@dataclass(frozen=True)
class Credential:
    """What to present to one registry: a username/password pair, an identity
    token (an OAuth2 refresh token) and/or a registry token (a bearer token)."""

    username: str = field(default="")
    password: str = field(default="", repr=False)
    identity_token: str = field(default="", repr=False)
    registry_token: str = field(default="", repr=False)

    @property
    def has_basic(self) -> bool:
        return bool(self.username or self.password)

    def basic_header(self) -> str:
        """The ``Authorization`` value for HTTP basic auth."""
        return f"Basic {oras.auth.utils.get_basic_auth(self.username, self.password)}"

    def __repr__(self) -> str:
        kinds = [
            name
            for name, value in (
                ("password", self.password),
                ("identity_token", self.identity_token),
                ("registry_token", self.registry_token),
            )
            if value
        ]
        return f"Credential(username={self.username!r}, secrets={kinds})"


def normalize_host(key: str) -> str:
    """``https://index.docker.io/v1/`` -> ``docker.io``; ``HTTP://Quay.io/x`` -> ``quay.io``."""
    text = key.strip()
    if "://" in text:
        text = urllib.parse.urlsplit(text).netloc
    text = text.split("/", 1)[0].lower()
    return DOCKER_HUB if text in _DOCKER_HUB_ALIASES else text


class Credentials:
    """Credentials per registry host (``host[:port]``, normalised).

    Lookup is by exact host first, then by a ``*.domain`` wildcard entry, as
    the kubelet does for pull secrets.
    """

    def __init__(self, entries: Mapping[str, Credential] | None = None) -> None:
        self._entries: dict[str, Credential] = {
            normalize_host(k): v for k, v in (entries or {}).items()
        }

    @classmethod
    def from_dockerconfigjson(cls, data: str | bytes) -> Credentials:
        """Parse a ``.dockerconfigjson`` (``{"auths": {...}}``) or legacy ``.dockercfg``.

        Each entry may hold ``auth`` (base64 of ``user:password``, which wins),
        ``username``/``password``, ``identitytoken`` or ``registrytoken``.
        """
        what = "pull secret (dockerconfigjson)"
        try:
            doc = json.loads(data)
        except json.JSONDecodeError as exc:
            # exc.msg and the position never contain the document's text.
            raise errors.InvalidArgument(
                f"{what} is not valid JSON: {exc.msg} at line {exc.lineno} column {exc.colno}; "
                "create it with 'kubectl create secret docker-registry'"
            ) from None
        except (UnicodeDecodeError, TypeError):
            raise errors.InvalidArgument(f"{what} is not UTF-8 JSON text") from None
        if not isinstance(doc, dict):
            raise errors.InvalidArgument(f"{what} must be a JSON object with an 'auths' object")
        auths = doc.get("auths", doc if "auths" not in doc else None)
        if not isinstance(auths, dict):
            raise errors.InvalidArgument(f"{what}: 'auths' must be an object keyed by registry")
        entries: dict[str, Credential] = {}
        for key, entry in auths.items():
            host = normalize_host(key)
            if not host:
                raise errors.InvalidArgument(f"{what}: an entry has an empty registry name")
            entries[host] = _entry(entry, host, what)
        return cls(entries)

    def for_host(self, host: str) -> Credential | None:
        """The credential for registry ``host``, or None (anonymous)."""
        wanted = normalize_host(host)
        if wanted in self._entries:
            return self._entries[wanted]
        bare = wanted.split(":", 1)[0]
        for key, credential in self._entries.items():
            if (
                key.startswith("*.")
                and bare.endswith(key[1:])
                and bare.count(".") == key.count(".")
            ):
                return credential
        return None

    def hosts(self) -> list[str]:
        return sorted(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __repr__(self) -> str:
        return f"Credentials(hosts={self.hosts()})"


def _entry(entry: Any, host: str, what: str) -> Credential:
    if not isinstance(entry, dict):
        raise errors.InvalidArgument(f"{what}: the entry for {host} is not an object")
    for name in ("auth", "username", "password", "identitytoken", "registrytoken"):
        if name in entry and not isinstance(entry[name], str):
            raise errors.InvalidArgument(f"{what}: field '{name}' for {host} is not a string")
    username = entry.get("username", "")
    password = entry.get("password", "")
    if entry.get("auth"):
        try:
            decoded = base64.b64decode(entry["auth"], validate=True).decode()
        except (binascii.Error, UnicodeDecodeError):
            raise errors.InvalidArgument(
                f"{what}: field 'auth' for {host} is not base64 of 'username:password'"
            ) from None
        username, colon, password = decoded.partition(":")
        if not colon:
            raise errors.InvalidArgument(
                f"{what}: field 'auth' for {host} does not decode to 'username:password'"
            )
    return Credential(
        username=username,
        password=password,
        identity_token=entry.get("identitytoken", ""),
        registry_token=entry.get("registrytoken", ""),
    )


@dataclass(frozen=True)
class Challenge:
    """One ``WWW-Authenticate`` challenge: scheme (lowercased) and parameters."""

    scheme: str
    params: dict[str, str]

    @property
    def realm(self) -> str:
        return self.params.get("realm", "")

    @property
    def service(self) -> str:
        return self.params.get("service", "")

    @property
    def scope(self) -> str:
        return self.params.get("scope", "")


def parse_challenges(header: str) -> list[Challenge]:
    """Parse a ``WWW-Authenticate`` value (RFC 7235) into its challenges.

    Handles several challenges in one header, quoted strings with escapes and
    commas inside quotes (``scope="repository:a:pull,push"``).
    """
    scanner = _Scanner(header)
    challenges: list[Challenge] = []
    while True:
        scanner.skip(" \t,")
        word = scanner.token()
        if not word:
            break
        mark = scanner.pos
        scanner.skip(" \t")
        if scanner.peek() == "=" and challenges:
            scanner.pos += 1
            scanner.skip(" \t")
            value = scanner.quoted() if scanner.peek() == '"' else scanner.token("=")
            challenges[-1].params[word.lower()] = value
        else:
            scanner.pos = mark
            challenges.append(Challenge(word.lower(), {}))
    return challenges


class _Scanner:
    _TOKEN_EXTRA = "!#$%&'*+-.^_`|~/:"

    def __init__(self, text: str) -> None:
        self.text = text
        self.pos = 0

    def peek(self) -> str:
        return self.text[self.pos] if self.pos < len(self.text) else ""

    def skip(self, chars: str) -> None:
        while self.pos < len(self.text) and self.text[self.pos] in chars:
            self.pos += 1

    def token(self, extra: str = "") -> str:
        start = self.pos
        while self.pos < len(self.text) and (
            self.text[self.pos].isalnum() or self.text[self.pos] in self._TOKEN_EXTRA + extra
        ):
            self.pos += 1
        return self.text[start : self.pos]

    def quoted(self) -> str:
        self.pos += 1  # opening quote
        out: list[str] = []
        while self.pos < len(self.text):
            char = self.text[self.pos]
            self.pos += 1
            if char == "\\" and self.pos < len(self.text):
                out.append(self.text[self.pos])
                self.pos += 1
            elif char == '"':
                break
            else:
                out.append(char)
        return "".join(out)


@dataclass(frozen=True)
class Token:
    value: str = field(repr=False)
    expires_at: float  # time.monotonic() deadline

    def valid(self, now: float | None = None) -> bool:
        return (time.monotonic() if now is None else now) < self.expires_at


class TokenCache:
    """Bearer tokens keyed by (realm, service, scope), kept until they expire.

    Thread-safe: the node plugin shares one client between concurrent pulls.
    """

    def __init__(self) -> None:
        self._tokens: dict[tuple[str, str, str], Token] = {}
        self._lock = threading.Lock()

    def get(self, key: tuple[str, str, str]) -> Token | None:
        with self._lock:
            token = self._tokens.get(key)
            if token is not None and not token.valid():
                del self._tokens[key]
                return None
            return token

    def put(self, key: tuple[str, str, str], token: Token) -> None:
        with self._lock:
            self._tokens[key] = token

    def drop(self, key: tuple[str, str, str]) -> None:
        with self._lock:
            self._tokens.pop(key, None)

    def __len__(self) -> int:
        with self._lock:
            return len(self._tokens)


def fetch_token(
    session: requests.Session,
    challenge: Challenge,
    scope: str,
    credential: Credential | None,
    *,
    timeout: tuple[float, float],
    host: str,
    proxies: dict[str, str] | None = None,
    verify: bool | str = True,
) -> Token:
    """Ask the challenge's realm for a token for ``scope`` (space-separated scopes).

    With an identity token this is the OAuth2 refresh-token grant (POST);
    otherwise a GET, with basic credentials when there are any, anonymous
    when not. Raises Unauthenticated when the realm rejects the credentials
    and Unavailable when it cannot be reached or answers nonsense.
    """
    realm = challenge.realm
    if not realm.startswith(("https://", "http://")):
        raise errors.Unavailable(
            f"registry {host} sent a bearer challenge without a usable realm URL"
        )
    scopes = scope.split()
    try:
        if credential is not None and credential.identity_token:
            response = session.post(
                realm,
                data={
                    "grant_type": "refresh_token",
                    "refresh_token": credential.identity_token,
                    "service": challenge.service,
                    "scope": " ".join(scopes),
                    "client_id": "rukpak",
                },
                timeout=timeout,
                proxies=proxies,
                verify=verify,
            )
        else:
            params: dict[str, str | list[str]] = {"scope": scopes}
            if challenge.service:
                params["service"] = challenge.service
            headers = {}
            if credential is not None and credential.has_basic:
                headers["Authorization"] = credential.basic_header()
            response = session.get(
                realm,
                params=params,
                headers=headers,
                timeout=timeout,
                proxies=proxies,
                verify=verify,
            )
    except requests.RequestException as exc:
        raise errors.Unavailable(
            f"token service {_origin(realm)} of registry {host} is unreachable: "
            f"{type(exc).__name__}"
        ) from None
    with response:
        log.debug(
            "token request realm=%s scope=%r status=%d", _origin(realm), scope, response.status_code
        )
        if response.status_code in (401, 403):
            raise errors.Unauthenticated(
                f"registry {host} rejected the credentials for {scope or 'access'}: "
                "check the username and password (or token) in the pull secret"
            )
        if response.status_code != 200:
            raise errors.Unavailable(
                f"token service {_origin(realm)} of registry {host} answered HTTP "
                f"{response.status_code}"
            )
        try:
            body = response.json()
        except ValueError:
            body = None
    value = body.get("token") or body.get("access_token") if isinstance(body, dict) else None
    if not isinstance(value, str) or not value:
        raise errors.Unavailable(
            f"token service {_origin(realm)} of registry {host} sent no token in its answer"
        )
    lifetime = body.get("expires_in") if isinstance(body, dict) else None
    if not isinstance(lifetime, int | float) or isinstance(lifetime, bool) or lifetime <= 0:
        lifetime = DEFAULT_TOKEN_LIFETIME
    return Token(value, time.monotonic() + max(float(lifetime) - EXPIRY_MARGIN, 1.0))


def _origin(url: str) -> str:
    """Scheme, host and path of a URL (never its query, which could carry secrets)."""
    parts = urllib.parse.urlsplit(url)
    port = f":{parts.port}" if parts.port else ""
    return f"{parts.scheme}://{parts.hostname or ''}{port}{parts.path}"
