"""The gate: may this image be used? Every policy selecting it, checked once per digest.

Where it sits: the step of the node plugin's publish spine (``csi.node.publish``) before
any content is fetched, and of the manager's resolution of a Bundle's image before it is
pinned (``provisioner.manager``). Under it: ``discover`` and ``verify``; beside it, the
edges that keep the current policies (a watch of ClusterBundlePolicy objects) and read
key Secrets.

:meth:`Gate.check` answers None when no policy selects the image (today's behaviour:
nothing is checked), else a :class:`Verdict` whose ``pinned`` reference (``repo@digest``)
is what the caller must fetch, so the bytes are those verified. An enforcing policy that
is not satisfied raises :class:`SignatureDenied` (PERMISSION_DENIED naming the policy and
the reason); a warning policy adds a line to ``Verdict.warnings`` instead.

Memory: a satisfied check is remembered per (image, the versions of the policies
selecting it): a digest reference for as long as those policies stay unchanged, a tag
for ``ttl`` seconds (it may move). A hot publish then costs one dictionary lookup.
Refusals are not remembered: the next publish checks again (a signature may have been
pushed since).
"""

from __future__ import annotations

import dataclasses
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass

from rukpak.common import errors
from rukpak.oci.auth import Credentials
from rukpak.oci.client import RegistryClient
from rukpak.oci.reference import Reference
from rukpak.signing import discover, verify
from rukpak.signing.policy import Policy

log = logging.getLogger(__name__)

TAG_TTL = 300.0
"""Seconds a tag's verified digest is trusted before the tag is resolved again."""
MEMO_SIZE = 4096

ClientFactory = Callable[[Credentials | None], AbstractContextManager[RegistryClient]]


class SignatureDenied(errors.PermissionDenied):
    """An enforcing policy refused an image; ``policy`` names it, ``reason`` says why."""

    def __init__(self, image: str, policy: str, reason: str) -> None:
        super().__init__(
            f"image {image} is refused by ClusterBundlePolicy {policy!r}: {reason}; sign it "
            "for one of the policy's authorities (rukpak bundle sign, or cosign sign)"
        )
        self.policy = policy
        self.reason = reason


@dataclass(frozen=True)
class Verdict:
    digest: str
    pinned: str
    policies: tuple[str, ...]
    warnings: tuple[str, ...] = ()
    remembered: bool = False
    satisfied: tuple[str, ...] = ()
    """What satisfied each enforcing policy ("ClusterBundlePolicy 'p': signed for authority
    'release'"), for the pod's event (``csi.node.publish``) and logs."""


class Gate:
    """Checks images against the current policies; see the module docstring. Thread-safe."""

    def __init__(
        self,
        *,
        policies: Callable[[], Sequence[Policy]],
        read_secret: verify.SecretReader,
        client: ClientFactory,
        ttl: float = TAG_TTL,
        clock: Callable[[], float] = time.monotonic,
        observe: Callable[[str], object] = lambda result: None,
    ) -> None:
        self._policies = policies
        self._read_secret = read_secret
        self._client = client
        self._ttl = ttl
        self._clock = clock
        self._observe = observe  # "verified", "remembered", "warned" or "refused" (metrics)
        self._lock = threading.Lock()
        self._memo: OrderedDict[tuple[str, tuple[str, ...]], tuple[Verdict, float]] = OrderedDict()

    def selecting(self, ref: Reference) -> list[Policy]:
        return [p for p in self._policies() if p.selects(ref)]

    def check(self, image: str, credentials: Credentials | None = None) -> Verdict | None:
        """None when no policy selects ``image``; else the verdict (see the module
        docstring). SignatureDenied, or the registry's error when it cannot be asked."""
        ref = Reference.parse(image)
        selecting = self.selecting(ref)
        if not selecting:
            return None
        key = (str(ref), tuple(sorted(p.version for p in selecting)))
        now = self._clock()
        with self._lock:
            hit = self._memo.get(key)
            if hit is not None and (ref.digest is not None or now - hit[1] < self._ttl):
                self._memo.move_to_end(key)
                verdict = hit[0]
                self._observe("remembered")
                return dataclasses.replace(verdict, remembered=True)
        with self._client(credentials) as client:
            digest = ref.digest or client.resolve(ref).digest
            found = discover.signatures(client, ref, digest)
        warnings: list[str] = []
        satisfied: list[str] = []
        for policy in selecting:
            outcome = verify.check(policy, found, digest, read_secret=self._read_secret)
            if outcome.ok:
                satisfied.append(f"ClusterBundlePolicy {policy.name!r}: {outcome.reason}")
                continue
            if policy.mode == "enforce":
                log.warning(
                    "msg=%r image=%s digest=%s policy=%s reason=%r",
                    "signature check failed",
                    ref,
                    digest,
                    policy.name,
                    outcome.reason[:400],
                )
                self._observe("refused")
                raise SignatureDenied(str(ref), policy.name, outcome.reason)
            warnings.append(f"ClusterBundlePolicy {policy.name!r} (warn): {outcome.reason}")
        self._observe("warned" if warnings else "verified")
        verdict = Verdict(
            digest=digest,
            pinned=str(ref.with_digest(digest)),
            policies=tuple(p.name for p in selecting),
            warnings=tuple(warnings),
            satisfied=tuple(satisfied),
        )
        log.info(
            "msg=%r image=%s digest=%s policies=%s warnings=%d",
            "signature check passed",
            ref,
            digest,
            ",".join(verdict.policies),
            len(warnings),
        )
        with self._lock:
            self._memo[key] = (verdict, now)
            self._memo.move_to_end(key)
            while len(self._memo) > MEMO_SIZE:
                self._memo.popitem(last=False)
        return verdict
