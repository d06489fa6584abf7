"""A small Docker token issuer for tests: the ``realm`` of a token-auth registry.

``tests.registry`` starts one in-process on loopback for the ``token_registry``
fixture. It checks basic credentials (or a refresh token issued by its own
OAuth2 endpoint) and answers with a JWT signed by an RSA key whose certificate
the registry trusts (``rootcertbundle``). Signing uses the ``openssl`` CLI, so
no crypto package is needed. Every request is recorded so tests can count how
many tokens a client asked for, and for which scopes.

Anonymous requests get a token granting pull on ``public/...`` repositories
and nothing elsewhere (what Docker Hub does for public and private
repositories), so the registry then answers 401.
"""

from __future__ import annotations

import base64
import hashlib
import json
import secrets
import subprocess
import threading
import time
import urllib.parse
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.httpreply import reply

ISSUER = "rukpak-test-issuer"
SERVICE = "rukpak-test-registry"
# Repositories anyone may pull without credentials (like public images on Docker Hub).
PUBLIC_PREFIX = "public/"


def _b64url(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def libtrust_key_id(der_public_key: bytes) -> str:
    """The key ID docker/libtrust derives from a DER public key (distribution's ``kid``)."""
    encoded = base64.b32encode(hashlib.sha256(der_public_key).digest()[:30]).decode().rstrip("=")
    return ":".join(encoded[i : i + 4] for i in range(0, len(encoded), 4))


@dataclass
class TokenRequest:
    """One request the issuer answered."""

    user: str | None
    scopes: tuple[str, ...]
    status: int
    method: str


@dataclass
class TokenIssuer:
    """The running issuer; ``realm`` goes into the registry's ``auth.token``."""

    key_path: Path
    cert_path: Path
    users: dict[str, str]
    expires_in: int = 300
    # Users granted only "pull", whatever they ask for.
    readonly: set[str] = field(default_factory=set)
    requests: list[TokenRequest] = field(default_factory=list)
    _server: ThreadingHTTPServer | None = None
    _kid: str = ""
    _refresh_tokens: dict[str, str] = field(default_factory=dict)
    _lock: threading.Lock = field(default_factory=threading.Lock)

    @classmethod
    def start(cls, workdir: Path, users: dict[str, str]) -> TokenIssuer:
        workdir.mkdir(parents=True, exist_ok=True)
        key, cert = workdir / "token.key", workdir / "token.crt"
        subprocess.run(
            ["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", str(key),
             "-out", str(cert), "-days", "2", "-subj", "/CN=rukpak-test-token-issuer"],
            check=True, capture_output=True,
        )  # fmt: skip
        der = subprocess.run(
            ["openssl", "pkey", "-in", str(key), "-pubout", "-outform", "DER"],
            check=True,
            capture_output=True,
        ).stdout
        issuer = cls(key_path=key, cert_path=cert, users=dict(users))
        issuer._kid = libtrust_key_id(der)
        issuer._server = ThreadingHTTPServer(("127.0.0.1", 0), _handler_for(issuer))
        issuer._server.daemon_threads = True
        threading.Thread(target=issuer._server.serve_forever, daemon=True).start()
        return issuer

    @property
    def realm(self) -> str:
        assert self._server is not None
        return f"http://127.0.0.1:{self._server.server_address[1]}/token"

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    def record(self, entry: TokenRequest) -> None:
        with self._lock:
            self.requests.append(entry)

    def granted(self) -> list[TokenRequest]:
        """The requests that got a token (status 200), in order."""
        with self._lock:
            return [r for r in self.requests if r.status == 200]

    def new_refresh_token(self, user: str) -> str:
        token = secrets.token_urlsafe(24)
        with self._lock:
            self._refresh_tokens[token] = user
        return token

    def user_of_refresh_token(self, token: str) -> str | None:
        with self._lock:
            return self._refresh_tokens.get(token)

    def sign(self, user: str | None, scopes: tuple[str, ...]) -> str:
        """A JWT granting ``user`` everything in ``scopes`` (nothing if anonymous)."""
        access = []
        for scope in scopes:
            kind, _, rest = scope.partition(":")
            name, _, actions = rest.rpartition(":")
            if user is None:
                if not name.startswith(PUBLIC_PREFIX):
                    continue
                granted = ["pull"]
            else:
                granted = ["pull"] if user in self.readonly else actions.split(",")
            access.append({"type": kind, "name": name, "actions": granted})
        now = int(time.time())
        header = {"typ": "JWT", "alg": "RS256", "kid": self._kid}
        claims = {
            "iss": ISSUER,
            "sub": user or "",
            "aud": SERVICE,
            "exp": now + self.expires_in,
            "nbf": now - 5,
            "iat": now,
            "jti": secrets.token_hex(8),
            "access": access,
        }
        signing_input = (
            f"{_b64url(json.dumps(header).encode())}.{_b64url(json.dumps(claims).encode())}"
        )
        signature = subprocess.run(
            ["openssl", "dgst", "-sha256", "-sign", str(self.key_path)],
            input=signing_input.encode(),
            check=True,
            capture_output=True,
        ).stdout
        return f"{signing_input}.{_b64url(signature)}"


def _handler_for(issuer: TokenIssuer) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def log_message(self, format: str, *args: object) -> None:
            return

        def _reply(self, status: int, body: dict[str, object]) -> None:
            data = json.dumps(body).encode()
            reply(self, status, data, headers=[("Content-Type", "application/json")])

        def _basic_user(self) -> tuple[str | None, bool]:
            """(user, ok): no header is (None, True); bad credentials are (name, False)."""
            header = self.headers.get("Authorization", "")
            if not header:
                return None, True
            scheme, _, value = header.partition(" ")
            if scheme.lower() != "basic":
                return None, False
            try:
                user, _, password = base64.b64decode(value).decode().partition(":")
            except ValueError:
                return None, False
            return user, issuer.users.get(user) == password

        def do_GET(self) -> None:
            query = urllib.parse.parse_qs(urllib.parse.urlsplit(self.path).query)
            scopes = tuple(query.get("scope", []))
            user, ok = self._basic_user()
            if not ok or query.get("service", [""])[0] != SERVICE:
                issuer.record(TokenRequest(user, scopes, 401, "GET"))
                self._reply(401, {"errors": [{"code": "UNAUTHORIZED", "message": "bad creds"}]})
                return
            token = issuer.sign(user, scopes)
            issuer.record(TokenRequest(user, scopes, 200, "GET"))
            self._reply(
                200,
                {"token": token, "access_token": token, "expires_in": issuer.expires_in,
                 "issued_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
            )  # fmt: skip

        def do_POST(self) -> None:
            """OAuth2 token endpoint: grant_type password or refresh_token."""
            length = int(self.headers.get("Content-Length", "0"))
            form = urllib.parse.parse_qs(self.rfile.read(length).decode())
            scopes = tuple(" ".join(form.get("scope", [])).split())
            grant = form.get("grant_type", [""])[0]
            user: str | None = None
            if grant == "password":
                name = form.get("username", [""])[0]
                if issuer.users.get(name) == form.get("password", [None])[0]:
                    user = name
            elif grant == "refresh_token":
                user = issuer.user_of_refresh_token(form.get("refresh_token", [""])[0])
            if user is None or form.get("service", [""])[0] != SERVICE:
                issuer.record(TokenRequest(user, scopes, 401, "POST"))
                self._reply(401, {"error": "invalid_grant"})
                return
            token = issuer.sign(user, scopes)
            issuer.record(TokenRequest(user, scopes, 200, "POST"))
            self._reply(
                200,
                {"access_token": token, "expires_in": issuer.expires_in, "scope": " ".join(scopes),
                 "refresh_token": issuer.new_refresh_token(user)},
            )  # fmt: skip

    return Handler
