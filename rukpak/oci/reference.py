"""Image references: ``[registry/]repository[:tag][@digest]``, parsed like Docker.

The first step of every pull (``rukpak.oci.client``) and of a Bundle's image
source: the text a user wrote in ``volumeAttributes.image`` or a Bundle spec is
parsed here, with Docker's defaults, into a frozen :class:`Reference`. Bad text
fails fast with InvalidArgument naming the text and what is wrong with it.

Defaults (as ``docker pull`` applies them): no registry means ``docker.io``;
a one-component name on Docker Hub gets ``library/``; ``index.docker.io`` is
an alias of ``docker.io``; neither tag nor digest means ``:latest``. The first
path component is a registry when it contains a dot or a colon, is
``localhost``, or has uppercase letters (Docker's rule).
"""

from __future__ import annotations

import dataclasses
import re
from dataclasses import dataclass
from typing import Final

from rukpak.common import errors
from rukpak.oci import digest as digests

DOCKER_HUB: Final[str] = "docker.io"
DOCKER_HUB_ALIASES: Final[frozenset[str]] = frozenset({"index.docker.io", "registry-1.docker.io"})
# Docker Hub's API endpoint, which differs from the name people write.
DOCKER_HUB_API: Final[str] = "registry-1.docker.io"
DEFAULT_TAG: Final[str] = "latest"
NAME_MAX: Final[int] = 255
TAG_MAX: Final[int] = 128

_DOMAIN_COMPONENT = r"(?:[a-zA-Z0-9]|[a-zA-Z0-9][a-zA-Z0-9-]*[a-zA-Z0-9])"
_DOMAIN = re.compile(
    rf"^(?:{_DOMAIN_COMPONENT}(?:\.{_DOMAIN_COMPONENT})*|\[[0-9a-fA-F:.]+\])(?::[0-9]{{1,5}})?$"
)
_PATH_COMPONENT = re.compile(r"^[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*$")
_TAG = re.compile(r"^[A-Za-z0-9_][A-Za-z0-9_.-]*$")
_HEX64 = re.compile(r"^[a-f0-9]{64}$")


@dataclass(frozen=True)
class Reference:
    """A parsed, normalised image reference.

    ``tag`` and ``digest`` may both be set (``name:tag@sha256:...``); the
    digest then decides what is pulled and the tag is informational, as in
    Docker. At least one of them is always set by :meth:`parse`.
    """

    registry: str
    repository: str
    tag: str | None = None
    digest: str | None = None

    @classmethod
    def parse(cls, text: str) -> Reference:
        """Parse ``text``; raise InvalidArgument naming it and the problem."""
        if not isinstance(text, str):
            raise errors.InvalidArgument(f"image reference must be a string, not {type(text)}")
        return _parse(text)

    @property
    def name(self) -> str:
        """``registry/repository``, without tag or digest."""
        return f"{self.registry}/{self.repository}"

    @property
    def identifier(self) -> str:
        """What goes after ``/manifests/`` in the API: the digest if any, else the tag."""
        if self.digest is not None:
            return self.digest
        return self.tag if self.tag is not None else DEFAULT_TAG

    @property
    def api_host(self) -> str:
        """The host serving the registry API (Docker Hub's differs from its name)."""
        return DOCKER_HUB_API if self.registry == DOCKER_HUB else self.registry

    def with_digest(self, digest: str) -> Reference:
        """The same image pinned to ``digest`` (the tag, if any, is kept for display)."""
        return dataclasses.replace(self, digest=digests.check(digest, what=str(self)))

    def at_digest(self, digest: str) -> Reference:
        """The same repository at ``digest`` alone: no tag (a push goes to the digest)."""
        return dataclasses.replace(self, tag=None, digest=digests.check(digest, what=str(self)))

    def with_tag(self, tag: str) -> Reference:
        """The same repository at ``tag`` (any digest is dropped)."""
        _check_tag(tag, str(self))
        return dataclasses.replace(self, tag=tag, digest=None)

    def __str__(self) -> str:
        text = self.name
        if self.tag is not None:
            text += f":{self.tag}"
        if self.digest is not None:
            text += f"@{self.digest}"
        return text


def _parse(text: str) -> Reference:
    if not text:
        raise errors.InvalidArgument(
            "image reference is empty: give one like 'quay.io/org/bundle:v1' or "
            "'registry.example.com/org/bundle@sha256:<64 hex>'"
        )
    if text != text.strip() or any(c.isspace() for c in text):
        raise errors.InvalidArgument(f"image reference {text!r} contains whitespace: remove it")
    if _HEX64.match(text):
        raise errors.InvalidArgument(
            f"image reference {text!r} is a bare 64-character hex string, which is ambiguous: "
            "write 'name@sha256:<hex>' to refer to content by digest"
        )
    if "://" in text:
        raise errors.InvalidArgument(
            f"image reference {text!r} must not include a URL scheme: "
            "write 'host[:port]/repository:tag'"
        )

    rest, at, digest = text.partition("@")
    if at:
        if "@" in digest:
            raise errors.InvalidArgument(f"image reference {text!r} contains more than one '@'")
        digests.check(digest, what=f"image reference {text!r}")
    else:
        digest = ""

    tag: str | None = None
    slash = rest.rfind("/")
    colon = rest.rfind(":")
    if colon > slash:
        rest, tag = rest[:colon], rest[colon + 1 :]
        _check_tag(tag, text)

    registry, path = _split_registry(rest, text)
    if registry == DOCKER_HUB and "/" not in path:
        path = f"library/{path}"
    _check_path(path, text)
    if len(f"{registry}/{path}") > NAME_MAX:
        raise errors.InvalidArgument(
            f"image reference {text!r}: name is longer than {NAME_MAX} characters"
        )
    if tag is None and not digest:
        tag = DEFAULT_TAG
    return Reference(registry=registry, repository=path, tag=tag, digest=digest or None)


def _split_registry(name: str, text: str) -> tuple[str, str]:
    first, slash, remainder = name.partition("/")
    is_registry = slash and (
        "." in first or ":" in first or first == "localhost" or first.lower() != first
    )
    if not is_registry:
        return DOCKER_HUB, name
    if not _DOMAIN.match(first):
        raise errors.InvalidArgument(
            f"image reference {text!r}: {first!r} is not a valid registry host[:port]"
        )
    if first in DOCKER_HUB_ALIASES:
        first = DOCKER_HUB
    return first, remainder


def _check_path(path: str, text: str) -> None:
    if not path:
        raise errors.InvalidArgument(f"image reference {text!r} has no repository name")
    for component in path.split("/"):
        if _PATH_COMPONENT.match(component):
            continue
        if component.lower() != component and _PATH_COMPONENT.match(component.lower()):
            raise errors.InvalidArgument(
                f"image reference {text!r}: repository names must be lowercase "
                f"({component!r} is not)"
            )
        if not component:
            why = "has an empty path component ('//' or a trailing '/')"
        else:
            why = (
                f"has an invalid path component {component!r}: use lowercase letters, digits "
                "and single '.', '_', '__' or '-' separators between them"
            )
        raise errors.InvalidArgument(f"image reference {text!r} {why}")


def _check_tag(tag: str, text: str) -> None:
    if not tag:
        raise errors.InvalidArgument(f"image reference {text!r} has an empty tag after ':'")
    if len(tag) > TAG_MAX:
        raise errors.InvalidArgument(
            f"image reference {text!r}: tag is {len(tag)} characters long; the limit is {TAG_MAX}"
        )
    if not _TAG.match(tag):
        raise errors.InvalidArgument(
            f"image reference {text!r}: tag {tag!r} is invalid: use letters, digits, '_', "
            "'.' and '-', not starting with '.' or '-'"
        )
