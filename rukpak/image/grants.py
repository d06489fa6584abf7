"""Who may be served a private image the node already holds: re-authorisation per credential.

Where it sits: both image caches (``rukpak.image.cache``, ``csi.fuse.images``) ask
:meth:`Grants.authorize` before they serve a cached private tree (the pull policy,
``rukpak.image.cache.ImageAsk.committed``, says first whether a cached tree may
serve). A tree pulled anonymously (or readable anonymously, probed once when it was
pulled with credentials) is public and served at once. A private tree is served only
to a pod whose own credentials the registry accepts for that manifest now: a HEAD by
digest (``CheckingPuller.check_manifest_access``), as kubelet's "ensure secret pulled
images" does. Positive answers are remembered per (credential, digest) for ``ttl``
seconds, in memory only (fingerprints, never the secrets), in a bounded table.
``pullPolicy: Never`` with no credentials for the registry is refused without asking it.
"""

from __future__ import annotations

import hashlib
import logging
import threading
import time
from collections.abc import Callable

from rukpak.common import errors
from rukpak.image import seams
from rukpak.image.seams import PullerFactory, PullPolicy
from rukpak.oci import digest as digests
from rukpak.oci.auth import Credentials
from rukpak.oci.manifest import Manifest, Platform
from rukpak.oci.reference import Reference

log = logging.getLogger(__name__)


def not_present(ref: Reference, platform: Platform) -> errors.FailedPrecondition:
    """The error for an image this node does not hold under ``pullPolicy: Never``."""
    return errors.FailedPrecondition(
        f"image {ref} ({platform}) is not present on this node and pullPolicy is "
        "Never; pre-pull it or use pullPolicy IfNotPresent"
    )


DEFAULT_TTL = 60.0
MAX_GRANTS = 4096
_REFUSALS = (errors.Unauthenticated, errors.PermissionDenied, errors.NotFound)


def fingerprint(ref: Reference, credentials: Credentials | None) -> str:
    """A one-way name for the credential ``credentials`` present to ``ref``'s registry."""
    entry = credentials.for_host(ref.api_host) if credentials is not None else None
    if entry is None:
        return "anonymous"
    material = "\0".join(
        (ref.api_host, entry.username, entry.password, entry.identity_token, entry.registry_token)
    )
    return hashlib.sha256(material.encode()).hexdigest()


class Grants:
    """Remembered "this credential may read this manifest" answers, each for ``ttl`` s."""

    def __init__(
        self,
        puller_factory: PullerFactory,
        *,
        ttl: float = DEFAULT_TTL,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._factory = puller_factory
        self.ttl = ttl
        self._clock = clock
        self._lock = threading.Lock()
        self._until: dict[tuple[str, str], float] = {}

    def __len__(self) -> int:
        return len(self._until)

    def grant(self, ref: Reference, digest: str, credentials: Credentials | None) -> None:
        """Remember that ``credentials`` just read ``digest`` (e.g. they resolved it)."""
        now = self._clock()
        with self._lock:
            if len(self._until) >= MAX_GRANTS:
                self._until = {k: t for k, t in self._until.items() if t > now}
                if len(self._until) >= MAX_GRANTS:  # all fresh: drop the oldest half
                    keep = sorted(self._until.items(), key=lambda kv: kv[1])[MAX_GRANTS // 2 :]
                    self._until = dict(keep)
            self._until[(fingerprint(ref, credentials), digest)] = now + self.ttl

    def granted(self, ref: Reference, digest: str, credentials: Credentials | None) -> bool:
        key = (fingerprint(ref, credentials), digest)
        with self._lock:
            return self._until.get(key, 0.0) > self._clock()

    def resolve(
        self,
        puller: seams.Puller,
        ref: Reference,
        platform: Platform,
        credentials: Credentials | None,
    ) -> tuple[str, Manifest]:
        """Resolve ``ref`` with ``puller`` (the pod's credentials); its checked digest and
        manifest. The credentials just read it, so they are granted it."""
        desc, manifest = puller.resolve_image(ref, platform)
        digest = digests.check(desc.digest, what=str(ref))
        self.grant(ref, digest, credentials)
        return digest, manifest

    def pulled_privately(
        self, ref: Reference, digest: str, platform: Platform, credentials: Credentials | None
    ) -> bool:
        """Whether a tree pulled now with ``credentials`` must be re-authorised per pod:
        they are real credentials and anonymous access cannot read it."""
        return fingerprint(ref, credentials) != "anonymous" and (
            not self.is_public(ref, digest, platform)
        )

    def is_public(self, ref: Reference, digest: str, platform: Platform) -> bool:
        """Whether ``digest`` can be read without credentials (asked once, at pull time)."""
        try:
            self._check(ref, digest, None, platform)
        except errors.RukpakError:
            return False  # refused, or the registry did not answer: treat as private
        return True

    def authorize(
        self,
        ref: Reference,
        digest: str,
        credentials: Credentials | None,
        *,
        platform: Platform,
        policy: PullPolicy,
    ) -> None:
        """Return if ``credentials`` may be served private tree ``digest``; raise otherwise."""
        if self.granted(ref, digest, credentials):
            return
        anonymous = fingerprint(ref, credentials) == "anonymous"
        if policy is PullPolicy.NEVER and anonymous:
            raise errors.PermissionDenied(
                f"image {ref} on this node was pulled with credentials and pullPolicy is Never: "
                f"give the pod a pull secret for {ref.api_host} that can read it"
            )
        try:
            self._check(ref, digest, credentials, platform)
        except _REFUSALS as exc:
            log.warning(
                "msg=%r image=%s digest=%s error=%r",
                "private image not served: the pod's credentials were refused",
                ref,
                digest,
                exc.message[:300],
            )
            cls = errors.PermissionDenied if isinstance(exc, errors.NotFound) else type(exc)
            raise cls(
                f"image {ref} is private and the pod's credentials cannot read it: {exc.message}"
            ) from None
        self.grant(ref, digest, credentials)

    def _check(
        self, ref: Reference, digest: str, credentials: Credentials | None, platform: Platform
    ) -> None:
        puller = self._factory(credentials)
        try:
            checker = seams.checking(puller)
            if checker is not None:
                checker.check_manifest_access(ref, digest)
            else:  # a puller without HEAD: resolving by digest proves access too
                puller.resolve_image(ref.with_digest(digest), platform)
        finally:
            seams.close(puller)
