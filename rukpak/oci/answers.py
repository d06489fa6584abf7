"""What a registry request is about (``Target``) and what the registry's answer means.

Where it sits: beside ``rukpak.oci.transport``, which sends the requests: every
operation of ``rukpak.oci.client`` and ``rukpak.oci.upload`` names its ``Target`` (the
auth scope and the words of its error messages), and :func:`raise_for_status`
maps a non-success answer to a ``rukpak.common.errors`` code with a message that
names the reference and says what to do.
"""

from __future__ import annotations

import json
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Final

import requests

from rukpak.common import errors
from rukpak.oci import auth
from rukpak.oci.reference import Reference

RETRY_STATUS: Final[frozenset[int]] = frozenset({429, 500, 502, 503, 504})


@dataclass(frozen=True)
class Target:
    """What a request is about, for auth scopes and error messages."""

    host: str  # registry API host[:port]
    repository: str
    subject: str  # e.g. "image quay.io/a/b:v1" or "blob sha256:... of quay.io/a/b"
    push: bool = False

    @property
    def scope(self) -> str:
        actions = "pull,push" if self.push else "pull"
        return f"repository:{self.repository}:{actions}"


def image_target(ref: Reference, *, push: bool = False) -> Target:
    return Target(ref.api_host, ref.repository, f"image {ref}", push)


def blob_target(ref: Reference, digest: str, *, push: bool = False) -> Target:
    return Target(ref.api_host, ref.repository, f"blob {digest} of {ref.name}", push)


def raise_for_status(
    response: requests.Response,
    target: Target,
    *,
    ok: Iterable[int],
    has_credentials: bool = False,
) -> None:
    """Raise the ``rukpak.common.errors`` exception matching a non-``ok`` registry answer.

    The response is closed when it is an error.
    """
    status = response.status_code
    if status in set(ok):
        return
    codes, detail = _registry_errors(response)
    response.close()
    where = f"registry {target.host}"
    said = f" (registry said: {detail})" if detail else ""
    if status == 404 or codes & {"MANIFEST_UNKNOWN", "NAME_UNKNOWN", "BLOB_UNKNOWN"}:
        raise errors.NotFound(
            f"{target.subject} not found in {where}: check the name and tag{said}"
        )
    if status == 401:
        challenges = auth.parse_challenges(response.headers.get("WWW-Authenticate", ""))
        if has_credentials and any(
            c.params.get("error") == "insufficient_scope" for c in challenges
        ):
            raise errors.PermissionDenied(
                f"{where} denied access to {target.subject}: the credentials for {target.host} "
                f"lack {'push' if target.push else 'pull'} permission on {target.repository}"
                f"{said}"
            )
        if has_credentials:
            raise errors.Unauthenticated(
                f"{where} rejected the credentials for {target.subject}: check the username "
                f"and password (or token) for {target.host} in the pull secret{said}"
            )
        raise errors.Unauthenticated(
            f"{where} requires authentication for {target.subject}: provide credentials "
            f"for {target.host} (a dockerconfigjson pull secret){said}"
        )
    if status == 403 or "DENIED" in codes:
        raise errors.PermissionDenied(
            f"{where} denied access to {target.subject}: the credentials lack "
            f"{'push' if target.push else 'pull'} permission on {target.repository}{said}"
        )
    if status in RETRY_STATUS or status >= 500:
        raise errors.Unavailable(
            f"{where} failed to serve {target.subject}: HTTP {status} after retries; "
            f"retry later{said}"
        )
    if status == 400 and not codes and str(response.url).startswith("http://"):
        # Go's answer to plain HTTP on its TLS port (a HEAD has no body to say so)
        said += (
            f"; if {target.host} speaks HTTPS, give the source its certificateData or "
            "insecureSkipTLSVerify (a loopback registry is otherwise spoken to over plain HTTP)"
        )
    raise errors.InvalidArgument(
        f"{where} refused the request for {target.subject}: HTTP {status}{said}"
    )


def _registry_errors(response: requests.Response) -> tuple[set[str], str]:
    """Codes and a short message from a distribution-spec error body."""
    try:
        body = json.loads(response.content[:65536] or b"{}")
    except (ValueError, requests.RequestException):
        return set(), ""
    items = body.get("errors") if isinstance(body, dict) else None
    if not isinstance(items, list):
        return set(), ""
    codes = {str(e.get("code", "")) for e in items if isinstance(e, dict)}
    messages = [str(e.get("message", "")) for e in items if isinstance(e, dict)]
    return codes, "; ".join(m for m in messages if m)[:300]
