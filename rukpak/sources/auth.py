"""Credentials of a git or http source, read from the auth Secret's data.

Where it sits: the manager reads the Bundle's auth Secret (system namespace) and the
node plugin receives the same Secret as the volume's publish secret; both turn its
data into :class:`SourceAuth` here. Keys are upstream RukPak's: ``username`` and
``password`` (HTTPS basic auth), ``ssh-privatekey`` and ``ssh-knownhosts`` (SSH).
:func:`fingerprint` names a credential one-way, so the node cache can keep content
fetched with it apart from content fetched with other credentials (or none).
"""

from __future__ import annotations

import base64
import binascii
import hashlib
from collections.abc import Mapping
from dataclasses import dataclass, field

from rukpak.common import errors

USERNAME = "username"
PASSWORD = "password"
SSH_KEY = "ssh-privatekey"
SSH_KNOWN_HOSTS = "ssh-knownhosts"
KEYS = (USERNAME, PASSWORD, SSH_KEY, SSH_KNOWN_HOSTS)


@dataclass(frozen=True)
class SourceAuth:
    """What a fetch presents; never logged (``repr`` hides the values)."""

    username: str = field(default="", repr=False)
    password: str = field(default="", repr=False)
    ssh_key: str = field(default="", repr=False)
    known_hosts: str = field(default="", repr=False)

    @classmethod
    def from_data(cls, data: Mapping[str, str], *, secret: str = "") -> SourceAuth:
        """From decoded Secret data (publish secrets arrive decoded)."""
        if not any(data.get(k) for k in KEYS):
            raise errors.InvalidArgument(
                f"auth secret {secret or '(publish secret)'} has none of the keys "
                f"{', '.join(KEYS)}: set username and password (HTTPS) or ssh-privatekey"
            )
        return cls(
            username=data.get(USERNAME, ""),
            password=data.get(PASSWORD, ""),
            ssh_key=data.get(SSH_KEY, ""),
            known_hosts=data.get(SSH_KNOWN_HOSTS, ""),
        )

    @classmethod
    def from_secret(cls, secret: Mapping[str, object], *, name: str) -> SourceAuth:
        """From a Secret object as the API returns it (``data`` base64-encoded)."""
        raw = secret.get("data") or {}
        decoded: dict[str, str] = {}
        if isinstance(raw, Mapping):
            for key in KEYS:
                value = raw.get(key)
                if not isinstance(value, str):
                    continue
                try:
                    decoded[key] = base64.b64decode(value, validate=True).decode()
                except (binascii.Error, UnicodeDecodeError):
                    raise errors.InvalidArgument(
                        f"auth secret {name}: key {key} is not valid base64 text"
                    ) from None
        return cls.from_data(decoded, secret=name)

    def fingerprint(self) -> str:
        return fingerprint(self)


def fingerprint(auth: SourceAuth | None) -> str:
    """A one-way name for ``auth``: "anonymous" without credentials."""
    if auth is None:
        return "anonymous"
    material = "\0".join((auth.username, auth.password, auth.ssh_key, auth.known_hosts))
    return hashlib.sha256(material.encode()).hexdigest()
