"""The manager's half of signed bundles: a Bundle's image is checked against the
ClusterBundlePolicy objects before it is pinned, and each policy's status says whether it
is valid.

Where it sits: the controller (``controller``) follows ClusterBundlePolicy objects in one
more informer and hands them here. :class:`SignedResolver` wraps the tag resolver that
``actuate.resolve_bundle`` and ``actuate.resolve_source`` call: a resolved digest that a
policy refuses raises ``rukpak.signing.gate.SignatureDenied``, which those turn into
``Unpacked=False`` with reason :data:`REASON` (the Bundle is Failing; a v1alpha1
BundleDeployment's ``HasValidBundle`` says so with the same reason) and a Warning event,
instead of a pod stuck in ContainerCreating. The node plugin checks again at publish
(``csi.node.publish``): the manager's answer is a fast, early report, the plugin's is the
enforcement.

The pin of a v1alpha2 BundleDeployment (``actuate.resolve_source``) also writes its
``Verified`` condition (:func:`verified`, :func:`with_verified`): True naming each policy
and the key or keyless identity that verified the image; False with what failed (an
enforcing policy's refusal, reason :data:`REASON`; a warn-mode policy's, reason
:data:`REASON_WARNED`); absent when no policy selects its images. The planner carries it
over until the next pin.

:func:`policy_status` is the status of one policy: ``Valid`` True, or False with what to
fix (a broken spec, a key Secret that is missing or holds no public key).
"""

from __future__ import annotations

import logging
import threading
from collections import OrderedDict
from collections.abc import Callable

from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef
from provisioner.manager import model
from provisioner.manager.resolution import ImageResolver
from rukpak.common import errors
from rukpak.oci.auth import Credentials
from rukpak.signing import keys
from rukpak.signing import policy as signing
from rukpak.signing.gate import ClientFactory, Gate, SignatureDenied, Verdict
from rukpak.signing.policy import KeyAuthority

log = logging.getLogger("rukpak.manager")

REASON = model.REASON_SIGNATURE
"""The reason of ``Unpacked`` (and of ``HasValidBundle``) when a policy refused the image."""
API_VERSION = f"{signing.GROUP}/{signing.VERSION}"
VALID = "Valid"
VERIFIED = model.VERIFIED
"""A v1alpha2 BundleDeployment's condition, and a v1alpha1 Bundle's (where a v1alpha1
BundleDeployment's image is pinned): did the policies selecting its images verify them."""
REASON_VERIFIED = "Verified"
REASON_WARNED = "NotVerified"
"""A warn-mode policy was not satisfied: installed anyway, and said so."""


def read_secret(kube: Kube, namespace: str, name: str) -> bytes:
    """The PEM a policy's ``secretRef`` names: its ``cosign.pub`` entry, or its only one."""
    secret = kube.get(ObjectRef("", "v1", "Secret", namespace, name))
    if secret is None:
        raise errors.NotFound(
            f"Secret {namespace}/{name} not found: create it in the system namespace with the "
            f"public key as {signing.SECRET_KEY}"
        )
    return signing.key_from_secret(secret.get("data") or {}, f"{namespace}/{name}")


def gate(
    kube: Kube, objects: Callable[[], list[Obj]], *, namespace: str, client: ClientFactory
) -> Gate:
    """The manager's gate: the policies of the informer's cache, Secrets read when needed."""
    return Gate(
        policies=lambda: [signing.parse(o, strict=False) for o in objects()],
        read_secret=lambda name: read_secret(kube, namespace, name),
        client=client,
    )


class SignedResolver:
    """A tag resolver whose pinned digest must satisfy every policy selecting it; it keeps
    the verdict of each digest it pinned (the last ``MEMO`` of them) for :func:`verified`."""

    MEMO = 1024

    def __init__(self, resolve: ImageResolver, checker: Gate) -> None:
        self._resolve = resolve
        self._gate = checker
        self._lock = threading.Lock()
        self._verdicts: OrderedDict[str, Verdict | None] = OrderedDict()

    def __call__(self, ref: str, /, *, credentials: Credentials | None = None) -> str:
        pinned = self._resolve(ref, credentials=credentials)
        verdict = self._gate.check(pinned, credentials)
        if verdict is not None:
            for warning in verdict.warnings:
                log.warning("msg=%r image=%s %s", "signature policy warning", ref, warning)
        with self._lock:
            self._verdicts[pinned] = verdict
            self._verdicts.move_to_end(pinned)
            while len(self._verdicts) > self.MEMO:
                self._verdicts.popitem(last=False)
        return pinned

    def verdict(self, pinned: str) -> Verdict | None:
        """The verdict of ``pinned`` (``repository@digest``) when this resolver pinned it:
        None when no policy selected it or it was not pinned here."""
        with self._lock:
            return self._verdicts.get(pinned)


def verified(resolve: object, pinned_images: list[str]) -> tuple[str, str, str] | None:
    """The ``Verified`` condition (status, reason, message) of content whose images are
    ``pinned_images`` (``repository@digest``, as pinned by ``resolve``): True naming each
    policy and the key or identity that verified it; False, :data:`REASON_WARNED`, when a
    warn-mode policy was not satisfied; None when no policy selects any of them."""
    if not isinstance(resolve, SignedResolver):
        return None
    found = [(image, v) for image in pinned_images if (v := resolve.verdict(image)) is not None]
    if not found:
        return None
    warnings = [f"{image}: {w}" for image, v in found for w in v.warnings]
    if warnings:
        return "False", REASON_WARNED, "; ".join(warnings)[:1024]
    said = [f"{image}: {'; '.join(v.verified)}" for image, v in found]
    return "True", REASON_VERIFIED, "; ".join(said)[:1024]


def refused(err: SignatureDenied) -> tuple[str, str, str]:
    """The ``Verified`` condition of an image a policy refused."""
    return "False", REASON, err.message[:1024]


def with_verified(
    status: Obj, condition: tuple[str, str, str] | None, *, now: str, generation: int
) -> Obj:
    """``status`` (a status patch holding every condition) with ``Verified`` set to
    ``condition``, or left out when it is None (no policy selects the content)."""
    old: Obj = next((c for c in status.get("conditions") or [] if c.get("type") == VERIFIED), {})
    conditions = [c for c in status.get("conditions") or [] if c.get("type") != VERIFIED]
    if condition is not None:
        kept, reason, message = condition
        if old.get("status") == kept:
            now = str(old.get("lastTransitionTime") or now)
        conditions.append(
            {
                "type": VERIFIED,
                "status": kept,
                "reason": reason,
                "message": message,
                "lastTransitionTime": now,
                "observedGeneration": generation,
            }
        )
    return {**status, "conditions": conditions}


def policy_status(obj: Obj, *, read: Callable[[str], bytes], now: str) -> Obj:
    """The status a ClusterBundlePolicy should have (``observedGeneration``, ``Valid``)."""
    generation = int((obj.get("metadata") or {}).get("generation") or 0)
    parsed = signing.parse(obj, strict=False)
    status, reason, message = "True", "Valid", _summary(parsed)
    if parsed.problem:
        status, reason, message = "False", "InvalidSpec", parsed.problem
    else:
        for authority in parsed.authorities:
            if isinstance(authority, KeyAuthority) and authority.secret:
                try:
                    keys.load_public_keys(read(authority.secret), what=f"{authority.name} key")
                except errors.RukpakError as exc:
                    status, reason = "False", "KeyUnavailable"
                    message = f"authority {authority.name!r}: {exc.message}"
                    break
    old = next(
        (
            c
            for c in (obj.get("status") or {}).get("conditions") or []
            if isinstance(c, dict) and c.get("type") == VALID
        ),
        {},
    )
    since = old.get("lastTransitionTime", now) if old.get("status") == status else now
    return {
        "observedGeneration": generation,
        "conditions": [
            {
                "type": VALID,
                "status": status,
                "reason": reason,
                "message": message,
                "lastTransitionTime": since,
                "observedGeneration": generation,
            }
        ],
    }


def _summary(parsed: signing.Policy) -> str:
    count = len(parsed.authorities)
    verb = "refuses" if parsed.mode == "enforce" else "reports (warn mode)"
    return (
        f"{verb} images matching {', '.join(parsed.globs)} unless signed for "
        f"{count} authorit{'y' if count == 1 else 'ies'}: "
        + ", ".join(a.name for a in parsed.authorities)
    )


def reconcile_policy(kube: Kube, obj: Obj, *, namespace: str, now: str) -> None:
    """Write the policy's status when it differs from what it should be."""
    wanted = policy_status(obj, read=lambda name: read_secret(kube, namespace, name), now=now)
    current = obj.get("status") or {}
    if all(current.get(k) == v for k, v in wanted.items()):
        return
    name = str((obj.get("metadata") or {}).get("name") or "")
    ref = ObjectRef(signing.GROUP, signing.VERSION, signing.KIND, "", name)
    kube.merge_patch_status(ref, {"status": wanted})
