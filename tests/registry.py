"""The real OCI registry for tests: Debian's ``docker-registry`` (distribution 2.8).

A pytest plugin (``pytest_plugins`` in ``tests/conftest.py``). Session
fixtures start one registry each on a free loopback port, with filesystem
storage under the session's temp dir, and stop it by pid at the end:

- ``registry``: no authentication;
- ``auth_registry``: htpasswd basic auth (``username``/``password``);
- ``token_registry``: Docker token auth, with ``tests.tokenissuer`` as realm
  (plus a pull-only user, ``READONLY_USER``, password in ``token_issuer.users``).

``RegistryServer.start(..., tls=ServingCert)`` serves HTTPS with that certificate and
key (``tests.tls_helpers`` makes them); its :attr:`RegistryServer.url` is then https.

Tests may tamper with ``storage_dir`` (see :meth:`RegistryServer.blob_path`)
and read ``log_path``, which holds the registry's log including one access
line per HTTP request (:meth:`RegistryServer.count_requests`).
"""

from __future__ import annotations

import contextlib
import ctypes
import re
import secrets
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Literal, NoReturn

import pytest
import requests

from tests import tokenissuer

REGISTRY_BINARY = "/usr/bin/docker-registry"
START_TIMEOUT = 15.0
PR_SET_PDEATHSIG = 1
# In token mode, a second user the issuer grants only "pull".
READONLY_USER = "reader"

AuthMode = Literal["none", "htpasswd", "token"]


@dataclass(frozen=True)
class ServingCert:
    """PEM files of a serving certificate (with its chain) and its key."""

    cert: Path
    key: Path


def _die_with_parent() -> None:
    """In the child: get SIGTERM if pytest dies without tearing down (Linux prctl)."""
    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libc.so.6", use_errno=True).prctl(PR_SET_PDEATHSIG, signal.SIGTERM)


def free_port() -> int:
    """A TCP port nothing listens on right now (loopback)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@dataclass
class RegistryServer:
    """A running docker-registry process."""

    host: str
    storage_dir: Path
    log_path: Path
    process: subprocess.Popen[bytes]
    auth: AuthMode = "none"
    username: str | None = None
    password: str | None = None
    token_issuer: tokenissuer.TokenIssuer | None = None
    tls: ServingCert | None = None

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://{self.host}"

    @property
    def pid(self) -> int:
        return self.process.pid

    @classmethod
    def start(
        cls, workdir: Path, *, auth: AuthMode = "none", tls: ServingCert | None = None
    ) -> RegistryServer:
        """Start a registry with storage and config under ``workdir``; wait for ``/v2/``.
        With ``tls`` it serves HTTPS with that certificate."""
        if shutil.which(REGISTRY_BINARY) is None:
            raise RuntimeError(
                f"{REGISTRY_BINARY} is missing: run `make setup` (it installs docker-registry)"
            )
        workdir.mkdir(parents=True, exist_ok=True)
        storage = workdir / "storage"
        storage.mkdir(exist_ok=True)
        username = password = None
        issuer = None
        auth_config = ""
        if auth == "htpasswd":
            username, password = "rukpak", f"pw-{secrets.token_hex(6)}"
            htpasswd = subprocess.run(
                ["htpasswd", "-Bbn", username, password], check=True, capture_output=True
            ).stdout
            (workdir / "htpasswd").write_bytes(htpasswd)
            auth_config = (
                f"auth:\n  htpasswd:\n    realm: rukpak-test\n    path: {workdir / 'htpasswd'}\n"
            )
        elif auth == "token":
            username, password = "rukpak", f"pw-{secrets.token_hex(6)}"
            users = {username: password, READONLY_USER: f"pw-{secrets.token_hex(6)}"}
            issuer = tokenissuer.TokenIssuer.start(workdir / "issuer", users)
            issuer.readonly.add(READONLY_USER)
            auth_config = (
                "auth:\n  token:\n"
                f"    realm: {issuer.realm}\n"
                f"    service: {tokenissuer.SERVICE}\n"
                f"    issuer: {tokenissuer.ISSUER}\n"
                f"    rootcertbundle: {issuer.cert_path}\n"
            )
        tls_config = (
            f"  tls:\n    certificate: {tls.cert}\n    key: {tls.key}\n" if tls is not None else ""
        )
        last_error = ""
        for _attempt in range(3):
            port = free_port()
            config = workdir / "config.yml"
            config.write_text(
                "version: 0.1\n"
                "log:\n  level: info\n  accesslog:\n    disabled: false\n"
                f"storage:\n  filesystem:\n    rootdirectory: {storage}\n"
                "  delete:\n    enabled: true\n"
                f"http:\n  addr: 127.0.0.1:{port}\n  secret: {secrets.token_hex(16)}\n"
                + tls_config
                + "health:\n  storagedriver:\n    enabled: false\n"
                + auth_config
            )
            log_path = workdir / f"registry-{port}.log"
            with log_path.open("wb") as log:
                process = subprocess.Popen(
                    [REGISTRY_BINARY, "serve", str(config)],
                    stdout=log,
                    stderr=subprocess.STDOUT,
                    stdin=subprocess.DEVNULL,
                    preexec_fn=_die_with_parent,
                )
            server = cls(
                host=f"127.0.0.1:{port}",
                storage_dir=storage,
                log_path=log_path,
                process=process,
                auth=auth,
                username=username,
                password=password,
                token_issuer=issuer,
                tls=tls,
            )
            if server._wait_ready():
                return server
            # Whatever went wrong (most often the free port was taken before the
            # registry bound it), try again on a new port; report the last failure.
            last_error = f"exit status {process.poll()}; port {port}\n{server.log_tail()}"
            server.stop()
        if issuer is not None:
            issuer.stop()
        raise RuntimeError(f"docker-registry did not start; log tail:\n{last_error}")

    def _wait_ready(self) -> bool:
        deadline = time.monotonic() + START_TIMEOUT
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                return False
            with contextlib.suppress(requests.RequestException):
                requests.get(f"{self.url}/v2/", timeout=1, verify=False)
                return True
            time.sleep(0.05)
        return False

    def stop(self) -> None:
        """Stop the process by its pid (SIGTERM, then SIGKILL) and the token issuer."""
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(timeout=5)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(timeout=5)
        if self.token_issuer is not None:
            self.token_issuer.stop()

    def log_tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log_path.read_text(errors="replace").splitlines()[-lines:])
        except OSError as exc:
            return f"(no log: {exc})"

    def blob_path(self, digest: str) -> Path:
        """Where filesystem storage keeps the bytes of blob ``digest``."""
        algorithm, _, hex_digest = digest.partition(":")
        return (
            self.storage_dir / "docker/registry/v2/blobs" / algorithm / hex_digest[:2]
            / hex_digest / "data"
        )  # fmt: skip

    def count_requests(self, method: str, path_pattern: str) -> int:
        """Access-log lines for ``method`` on a path matching the regex ``path_pattern``."""
        pattern = re.compile(rf'"{re.escape(method)} (/v2/\S*) HTTP/')
        count = 0
        for line in self.log_path.read_text(errors="replace").splitlines():
            match = pattern.search(line)
            if match and re.search(path_pattern, match.group(1)):
                count += 1
        return count


def hold(stop: Callable[[], object], *announce: object) -> NoReturn:
    """Keep a registry this process started until SIGTERM, which runs ``stop`` and exits 0;
    first print ``announce`` on one line (``hack/run.sh`` reads it)."""
    signal.signal(signal.SIGTERM, lambda *_: (stop(), sys.exit(0)))
    print(*announce, flush=True)
    while True:
        signal.pause()


def _serve(factory: pytest.TempPathFactory, name: str, auth: AuthMode) -> Iterator[RegistryServer]:
    server = RegistryServer.start(factory.mktemp(name), auth=auth)
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture(scope="session")
def registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    """A registry without authentication."""
    yield from _serve(tmp_path_factory, "registry", "none")


@pytest.fixture(scope="session")
def auth_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    """A registry with htpasswd basic auth (``username``/``password``)."""
    yield from _serve(tmp_path_factory, "auth-registry", "htpasswd")


@pytest.fixture(scope="session")
def token_registry(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RegistryServer]:
    """A registry with Docker token auth; ``token_issuer`` records token requests."""
    yield from _serve(tmp_path_factory, "token-registry", "token")
