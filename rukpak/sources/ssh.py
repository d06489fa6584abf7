"""Git over SSH without an ``ssh`` binary: a dulwich SSH vendor on paramiko.

Where it sits: ``rukpak.sources.git`` builds a dulwich ``SSHGitClient`` with
:class:`SecretKeyVendor` for ``ssh://`` and scp-like (``git@host:path``)
repositories. The private key comes from the auth Secret (``ssh-privatekey``) and is
never written to disk. The server's host key must be listed in the Secret's
``ssh-knownhosts`` (OpenSSH known_hosts lines) unless ``insecureSkipVerify`` is set,
as upstream RukPak does; an unknown or changed host key is refused. Connect, banner,
auth and read timeouts bound a server that never answers.
"""

from __future__ import annotations

import io
import logging
from typing import Any

import paramiko
from dulwich.client import SSHVendor

from rukpak.common import errors
from rukpak.sources.auth import SourceAuth

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 10.0
KEY_TYPES: tuple[type[paramiko.PKey], ...] = (
    paramiko.Ed25519Key,
    paramiko.ECDSAKey,
    paramiko.RSAKey,
)


def private_key(text: str) -> paramiko.PKey:
    """The key in ``ssh-privatekey`` (OpenSSH or PEM; unencrypted)."""
    for cls in KEY_TYPES:
        try:
            return cls.from_private_key(io.StringIO(text))
        except (paramiko.SSHException, ValueError):
            continue
    raise errors.InvalidArgument(
        "the auth secret's ssh-privatekey is not an unencrypted ed25519, ECDSA or RSA private key"
    )


def host_keys(text: str) -> paramiko.HostKeys:
    """``ssh-knownhosts`` lines as paramiko host keys (bad lines are refused)."""
    keys = paramiko.HostKeys()
    for number, line in enumerate(text.splitlines(), 1):
        if not line.strip() or line.lstrip().startswith("#"):
            continue
        try:
            entry = paramiko.hostkeys.HostKeyEntry.from_line(line, number)
        except (paramiko.SSHException, ValueError):
            entry = None
        if entry is None or entry.key is None:
            raise errors.InvalidArgument(
                f"the auth secret's ssh-knownhosts line {number} is not a known_hosts entry"
            )
        for name in entry.hostnames:
            keys.add(name, entry.key.get_name(), entry.key)
    return keys


class _Channel:
    """The socket-like object dulwich's protocol reads from and writes to."""

    def __init__(self, client: paramiko.SSHClient, channel: paramiko.Channel) -> None:
        self._client = client
        self._channel = channel

    def read(self, n: int | None = None) -> bytes:
        """Exactly ``n`` bytes unless the stream ends first (as a buffered pipe reads)."""
        chunks: list[bytes] = []
        want = n if n is not None else -1
        got = 0
        try:
            while want < 0 or got < want:
                data = self._channel.recv(65536 if want < 0 else want - got)
                if not data:
                    break
                chunks.append(data)
                got += len(data)
        except TimeoutError:
            raise errors.Unavailable("ssh: no answer from the git server in time") from None
        return b"".join(chunks)

    def write(self, data: bytes) -> int:
        self._channel.sendall(data)
        return len(data)

    def can_read(self) -> bool:
        return bool(self._channel.recv_ready())

    def close(self, timeout: int | None = None) -> None:
        self._channel.close()
        self._client.close()


class SecretKeyVendor(SSHVendor):
    """Opens dulwich's SSH commands with the auth Secret's key and known hosts."""

    def __init__(self, auth: SourceAuth | None, *, insecure: bool, read_timeout: float) -> None:
        self.auth = auth
        self.insecure = insecure
        self.read_timeout = read_timeout

    def run_command(  # type: ignore[override]
        self,
        host: str,
        command: bytes | str,
        username: str | None = None,
        port: int | None = None,
        **_: Any,
    ) -> _Channel:
        if self.auth is None or not self.auth.ssh_key:
            raise errors.InvalidArgument(
                f"git over ssh to {host} needs an auth secret with ssh-privatekey"
            )
        client = paramiko.SSHClient()
        if self.insecure:
            client.set_missing_host_key_policy(paramiko.AutoAddPolicy())
        else:
            if not self.auth.known_hosts:
                raise errors.InvalidArgument(
                    f"git over ssh to {host}: the auth secret has no ssh-knownhosts; add the "
                    "server's known_hosts line, or set auth.insecureSkipVerify"
                )
            for name, keys in host_keys(self.auth.known_hosts).items():
                for kind, key in keys.items():
                    client.get_host_keys().add(name, kind, key)
            client.set_missing_host_key_policy(paramiko.RejectPolicy())
        where = f"{host}:{port or 22}"
        try:
            client.connect(
                host,
                port=port or 22,
                username=username or "git",
                pkey=private_key(self.auth.ssh_key),
                timeout=CONNECT_TIMEOUT,
                banner_timeout=self.read_timeout,
                auth_timeout=self.read_timeout,
                look_for_keys=False,
                allow_agent=False,
            )
            transport = client.get_transport()
            assert transport is not None
            channel = transport.open_session(timeout=self.read_timeout)
            channel.settimeout(self.read_timeout)
            channel.exec_command(command.decode() if isinstance(command, bytes) else command)
        except errors.RukpakError:
            client.close()
            raise
        except paramiko.AuthenticationException:
            client.close()
            raise errors.PermissionDenied(
                f"git over ssh to {where}: the server refused the auth secret's key"
            ) from None
        except paramiko.BadHostKeyException:
            client.close()
            raise errors.PermissionDenied(
                f"git over ssh to {where}: the server's host key does not match ssh-knownhosts"
            ) from None
        except paramiko.SSHException as exc:
            client.close()
            text = str(exc)[:200]
            if "not found in known_hosts" in text:
                raise errors.PermissionDenied(
                    f"git over ssh to {where}: host key unknown: add it to the auth secret's "
                    "ssh-knownhosts"
                ) from None
            raise errors.Unavailable(f"git over ssh to {where}: {text}") from None
        except (OSError, TimeoutError) as exc:
            client.close()
            raise errors.Unavailable(
                f"git over ssh to {where}: no answer in time or refused: {str(exc)[:200]}"
            ) from None
        return _Channel(client, channel)
