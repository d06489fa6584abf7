"""The user's docker ``config.json``: ``auths``, ``credHelpers`` and ``credsStore``.

Where it sits: under the ``rukpak`` commands that talk to a registry
(``provisioner.runtime.flags.load_credentials``), beside ``rukpak.oci.auth`` whose
:class:`~rukpak.oci.auth.Credentials` it extends; the node plugin reads pull secrets
(``auths`` only) and never comes here.

A registry's credential comes, as the docker CLI finds it, from the helper
``credHelpers`` names for its host, else from the ``credsStore`` helper, else from its
``auths`` entry (which is also what a helper that knows nothing of the host leaves).
A helper is the program ``docker-credential-<name>`` on ``PATH``, run as
``docker-credential-<name> get`` with the server address on stdin (``https://index.
docker.io/v1/`` for Docker Hub, the host otherwise), answering
``{"ServerURL": ..., "Username": ..., "Secret": ...}``; the user name ``<token>`` means the
secret is an identity token (docker-credential-helpers' protocol). A helper is asked at
most once per host and command, only when that registry is talked to, and is killed
(with whatever it started) after ``timeout`` seconds.

Errors name the helper and the host, never what the helper printed: it may hold a secret.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import subprocess
import threading
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from rukpak.common import errors
from rukpak.oci import auth

HELPER_PREFIX = "docker-credential-"
HELPER_TIMEOUT = 30.0
"""Seconds a helper may take (a keychain may ask the user to unlock it)."""
TOKEN_USERNAME = "<token>"
"""docker-credential-helpers: the Secret is an identity token, not a password."""
NOT_FOUND = "credentials not found in native keychain"
"""docker-credential-helpers' ``ErrCredentialsNotFound``: the helper has nothing for it."""
DOCKER_HUB_SERVER = "https://index.docker.io/v1/"
"""The server address docker stores Docker Hub's credential under."""

Runner = Callable[[str, str], "auth.Credential | None"]
"""(helper name, registry host) -> its credential, None when it has none."""


def default_path() -> Path:
    """``$DOCKER_CONFIG/config.json``, else ``~/.docker/config.json``."""
    base = os.environ.get("DOCKER_CONFIG")
    return Path(base) / "config.json" if base else Path.home() / ".docker" / "config.json"


def load(path: Path | None, *, timeout: float = HELPER_TIMEOUT) -> auth.Credentials | None:
    """The credentials of the docker config at ``path`` (which must exist), else of the
    user's (``default_path``) when there is one; None when there is none."""
    explicit = path is not None
    if path is None:
        path = default_path()
        if not path.is_file():
            return None
    try:
        data = path.read_bytes()
    except OSError as exc:
        how = "check the --registry-config path" if explicit else "fix or remove it"
        raise errors.InvalidArgument(f"cannot read {path}: {exc.strerror}; {how}") from None
    return parse(data, where=str(path), timeout=timeout)


def parse(data: bytes | str, *, where: str, timeout: float = HELPER_TIMEOUT) -> auth.Credentials:
    """Credentials from the text of a docker config (``where`` names it in errors)."""
    try:
        document = json.loads(data)
    except ValueError as exc:
        raise errors.InvalidArgument(f"{where} is not valid JSON: {exc}") from None
    if not isinstance(document, dict):
        raise errors.InvalidArgument(f"{where} must hold a JSON object with an 'auths' object")
    try:
        entries = auth.Credentials.from_dockerconfigjson(
            json.dumps({"auths": document.get("auths") or {}})
        )
    except errors.RukpakError as exc:
        raise type(exc)(f"{where}: {exc.message}") from None
    helpers = document.get("credHelpers") or {}
    store = document.get("credsStore") or ""
    if not isinstance(helpers, dict) or not all(
        isinstance(k, str) and isinstance(v, str) and v for k, v in helpers.items()
    ):
        raise errors.InvalidArgument(
            f"{where}: 'credHelpers' must map registry hosts to helper names "
            '(e.g. {"gcr.io": "gcloud"})'
        )
    if not isinstance(store, str):
        raise errors.InvalidArgument(f"{where}: 'credsStore' must be a helper name (a string)")
    if not helpers and not store:
        return entries
    return HelperCredentials(
        entries,
        helpers={auth.normalize_host(k): v for k, v in helpers.items()},
        store=store,
        run=lambda helper, host: get(helper, host, timeout=timeout),
    )


class HelperCredentials(auth.Credentials):
    """``auths`` entries, with the credential helpers in front of them (thread-safe: a
    helper runs once per host however many requests ask)."""

    def __init__(
        self,
        entries: auth.Credentials,
        *,
        helpers: Mapping[str, str],
        store: str,
        run: Runner,
    ) -> None:
        super().__init__({h: c for h in entries.hosts() if (c := entries.for_host(h))})
        self._fallback = entries
        self._helpers = dict(helpers)
        self._store = store
        self._run = run
        self._asked: dict[str, auth.Credential | None] = {}
        self._lock = threading.Lock()

    def helper_for(self, host: str) -> str:
        """The helper asked for ``host`` ("" when none is)."""
        return self._helpers.get(auth.normalize_host(host)) or self._store

    def for_host(self, host: str) -> auth.Credential | None:
        wanted = auth.normalize_host(host)
        helper = self.helper_for(wanted)
        if helper:
            with self._lock:
                if wanted not in self._asked:
                    self._asked[wanted] = self._run(helper, wanted)
                found = self._asked[wanted]
            if found is not None:
                return found
        return self._fallback.for_host(wanted)

    def __bool__(self) -> bool:
        """True even without ``auths`` entries (``len`` 0): the helpers answer for hosts no
        entry names, and ``credentials or Credentials()`` must not drop them."""
        return True

    def __repr__(self) -> str:
        return (
            f"HelperCredentials(hosts={self.hosts()}, helpers={sorted(self._helpers)}, "
            f"store={self._store!r})"
        )


def server_address(host: str) -> str:
    """What docker hands a helper for registry ``host``."""
    wanted = auth.normalize_host(host)
    return DOCKER_HUB_SERVER if wanted == auth.DOCKER_HUB else wanted


def get(helper: str, host: str, *, timeout: float = HELPER_TIMEOUT) -> auth.Credential | None:
    """Run ``docker-credential-<helper> get`` for registry ``host``: its credential, or None
    when it has none. Raises FailedPrecondition when the helper is missing, fails or answers
    nonsense, Unavailable when it does not answer within ``timeout`` seconds."""
    program = HELPER_PREFIX + helper
    if os.sep in helper or not helper.strip():
        raise errors.InvalidArgument(
            f"docker credential helper name {helper!r} is not a name: the docker config names "
            f"the program {HELPER_PREFIX}<name> by <name>"
        )
    path = shutil.which(program)
    if path is None:
        raise errors.FailedPrecondition(
            f"docker credential helper {program} (for registry {host}) is not on PATH: "
            "install it, or remove it from credHelpers/credsStore in the docker config"
        )
    process = subprocess.Popen(
        [path, "get"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        start_new_session=True,  # its own process group: a timeout kills all it started
    )
    try:
        out, _ = process.communicate(server_address(host).encode(), timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(process)
        raise errors.Unavailable(
            f"docker credential helper {program} did not answer for registry {host} "
            f"within {timeout:g}s"
        ) from None
    finally:
        if process.poll() is None:  # interrupted: leave nothing behind
            _kill_group(process)
    if process.returncode != 0:
        if out.decode(errors="replace").strip() == NOT_FOUND:
            return None
        raise errors.FailedPrecondition(
            f"docker credential helper {program} failed for registry {host} (exit status "
            f"{process.returncode}); run '{program} get' with {server_address(host)} on "
            "stdin to see why"
        )
    return _credential(out, program, host)


def _credential(out: bytes, program: str, host: str) -> auth.Credential:
    try:
        answer: Any = json.loads(out)
    except ValueError:
        answer = None
    if (
        not isinstance(answer, dict)
        or not isinstance(answer.get("Username", ""), str)
        or not isinstance(answer.get("Secret"), str)
    ):
        raise errors.FailedPrecondition(
            f"docker credential helper {program} answered for registry {host} with something "
            'other than JSON {"Username": ..., "Secret": ...}'
        )
    username, secret = str(answer.get("Username") or ""), str(answer["Secret"])
    if username == TOKEN_USERNAME:
        return auth.Credential(identity_token=secret)
    return auth.Credential(username=username, password=secret)


def _kill_group(process: subprocess.Popen[bytes]) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(process.pid, signal.SIGKILL)
    process.communicate()
