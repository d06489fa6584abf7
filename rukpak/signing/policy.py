"""ClusterBundlePolicy objects as values: which images a policy selects, which signatures
it accepts, and whether it enforces or only warns.

Where it sits: parsed from the custom resource (``core.rukpak.io/v1alpha1``,
``ClusterBundlePolicy``, shaped after sigstore's policy-controller
``ClusterImagePolicy``) by the node plugin's policy watch and by the manager, and read
by ``rukpak.signing.gate``. Pure: a ``secretRef`` is a name here; the edges read the
Secret (in the system namespace) when a check needs it.

The spec::

    images:       [{glob: "registry.example.com/bundles/**"}, ...]   # at least one
    authorities:  # at least one; a signature satisfying any one of them is enough
      - name: release
        key: {data: "<PEM>"} | {secretRef: {name: cosign-keys}}
      - name: ci
        keyless:
          identities: [{issuer|issuerRegExp, subject|subjectRegExp}]
          trustRoot: {fulcioCertificates: "<PEM>", rekorPublicKey: "<PEM>"}
        rfc3161timestamp: {certificateChain: "<PEM>"}   # optional, on either kind: a
                                                        # TSA's timestamp is then required
    mode: enforce | warn                                              # default enforce

A glob is matched against the image's repository with its registry
(``docker.io/library/x`` for ``x``); ``*`` is any run of characters but ``/``, ``**``
any run at all, ``?`` one character but ``/``. Every policy selecting an image must be
satisfied (policies are ANDed, authorities within one are ORed), as in policy-controller.
"""

from __future__ import annotations

import base64
import binascii
import re
from dataclasses import dataclass, field
from functools import lru_cache
from typing import Any, Final, Literal

from cryptography import x509

from rukpak.common import errors
from rukpak.oci.reference import DOCKER_HUB, DOCKER_HUB_ALIASES, Reference
from rukpak.signing import keyless, keys, timestamps

GROUP: Final[str] = "core.rukpak.io"
VERSION: Final[str] = "v1alpha1"
KIND: Final[str] = "ClusterBundlePolicy"
PLURAL: Final[str] = "clusterbundlepolicies"
MODES: Final[tuple[str, ...]] = ("enforce", "warn")
SECRET_KEY: Final[str] = "cosign.pub"
"""The Secret entry read first (what ``cosign generate-key-pair k8s://…`` writes)."""

Mode = Literal["enforce", "warn"]


@dataclass(frozen=True)
class KeyAuthority:
    name: str
    pem: bytes = b""
    secret: str = ""
    """A Secret in the system namespace holding the PEM (``cosign.pub``, or its one entry)."""
    tsa: tuple[x509.Certificate, ...] = field(default=(), repr=False)
    """``rfc3161timestamp.certificateChain``: when set, a signature must carry an RFC 3161
    timestamp that verifies under it (``rukpak.signing.timestamps``)."""


@dataclass(frozen=True)
class KeylessAuthority:
    name: str
    identities: tuple[keyless.Identity, ...]
    root: keyless.TrustRoot = field(repr=False)
    tsa: tuple[x509.Certificate, ...] = field(default=(), repr=False)
    """As :attr:`KeyAuthority.tsa`; its time is then when the certificate must be valid
    (unless a Rekor key gives the log's)."""


Authority = KeyAuthority | KeylessAuthority


@dataclass(frozen=True)
class Policy:
    name: str
    uid: str
    generation: int
    globs: tuple[str, ...]
    authorities: tuple[Authority, ...]
    mode: Mode = "enforce"
    problem: str = ""
    """Why the object is not a valid policy ('' when it is). An invalid policy still
    selects by the globs it could read, and refuses what it selects in enforce mode:
    a broken policy fails closed."""

    @property
    def version(self) -> str:
        """What a remembered verdict is valid for: this policy at this generation."""
        return f"{self.uid or self.name}/{self.generation}"

    def selects(self, image: Reference) -> bool:
        name = f"{image.registry}/{image.repository}"
        return any(_compiled(glob).fullmatch(name) for glob in self.globs)


@lru_cache(maxsize=512)
def _compiled(glob: str) -> re.Pattern[str]:
    out: list[str] = []
    i = 0
    while i < len(glob):
        if glob.startswith("**", i):
            out.append(".*")
            i += 2
        elif glob[i] == "*":
            out.append("[^/]*")
            i += 1
        elif glob[i] == "?":
            out.append("[^/]")
            i += 1
        else:
            out.append(re.escape(glob[i]))
            i += 1
    return re.compile("".join(out))


def normalize_glob(glob: str) -> str:
    """A glob as matched: ``x`` and ``library/x`` name Docker Hub as references do, and
    so do ``docker.io/x`` and Docker Hub's other names (references use ``docker.io``)."""
    first, _, rest = glob.partition("/")
    if rest and (first == DOCKER_HUB or first in DOCKER_HUB_ALIASES):
        return f"{DOCKER_HUB}/{rest if '/' in rest or '*' in rest else 'library/' + rest}"
    if "/" in glob and ("." in first or ":" in first or first == "localhost"):
        return glob
    if "/" not in glob and glob != "**":
        return f"docker.io/library/{glob}"
    return glob if glob.startswith("**") else f"docker.io/{glob}"


def _text(raw: Any, path: str, problems: list[str], *, required: bool = False) -> str:
    if raw is None or raw == "":
        if required:
            problems.append(f"{path} is required")
        return ""
    if not isinstance(raw, str):
        problems.append(f"{path} must be a string")
        return ""
    return raw


def _identities(raw: Any, path: str, problems: list[str]) -> tuple[keyless.Identity, ...]:
    if not isinstance(raw, list) or not raw:
        problems.append(f"{path} must list at least one identity")
        return ()
    out: list[keyless.Identity] = []
    for i, entry in enumerate(raw):
        where = f"{path}[{i}]"
        entry = entry if isinstance(entry, dict) else {}
        values = {
            key: _text(entry.get(key), f"{where}.{key}", problems)
            for key in ("issuer", "subject", "issuerRegExp", "subjectRegExp")
        }
        if not (values["issuer"] or values["issuerRegExp"]):
            problems.append(f"{where} needs issuer or issuerRegExp")
        if not (values["subject"] or values["subjectRegExp"]):
            problems.append(f"{where} needs subject or subjectRegExp")
        for key in ("issuerRegExp", "subjectRegExp"):
            try:
                re.compile(values[key])
            except re.error as exc:
                problems.append(f"{where}.{key} is not a regular expression: {exc}")
        out.append(
            keyless.Identity(
                issuer=values["issuer"],
                subject=values["subject"],
                issuer_regexp=values["issuerRegExp"],
                subject_regexp=values["subjectRegExp"],
            )
        )
    return tuple(out)


def _authority(raw: Any, path: str, problems: list[str]) -> Authority | None:
    if not isinstance(raw, dict):
        problems.append(f"{path} must be an object")
        return None
    name = _text(raw.get("name"), f"{path}.name", problems) or path
    tsa = _tsa(raw.get("rfc3161timestamp"), f"{path}.rfc3161timestamp", problems)
    if tsa is None:
        return None
    key, free = raw.get("key"), raw.get("keyless")
    if key is not None and not isinstance(key, dict):
        problems.append(f"{path}.key must be an object")
        return None
    if (key is None) == (free is None):
        problems.append(f"{path} needs exactly one of key and keyless")
        return None
    if isinstance(key, dict):
        data = _text(key.get("data"), f"{path}.key.data", problems)
        ref = key.get("secretRef")
        secret = _text(ref.get("name") if isinstance(ref, dict) else None, "", [])
        if bool(data) == bool(secret):
            problems.append(f"{path}.key needs exactly one of data and secretRef.name")
            return None
        if data:
            try:
                keys.load_public_keys(data.encode(), what=f"{path}.key.data")
            except errors.InvalidArgument as exc:
                problems.append(exc.message)
                return None
        return KeyAuthority(name=name, pem=data.encode(), secret=secret, tsa=tsa)
    if not isinstance(free, dict):
        problems.append(f"{path}.keyless must be an object")
        return None
    identities = _identities(free.get("identities"), f"{path}.keyless.identities", problems)
    raw_trust = free.get("trustRoot")
    trust: dict[str, Any] = raw_trust if isinstance(raw_trust, dict) else {}
    fulcio = _text(
        trust.get("fulcioCertificates"),
        f"{path}.keyless.trustRoot.fulcioCertificates",
        problems,
        required=True,
    )
    rekor = _text(trust.get("rekorPublicKey"), f"{path}.keyless.trustRoot.rekorPublicKey", problems)
    if not fulcio:
        return None
    try:
        root = keyless.TrustRoot.from_pem(fulcio.encode(), rekor.encode() if rekor else None)
    except errors.RukpakError as exc:
        problems.append(f"{path}.keyless.trustRoot: {exc.message}")
        return None
    return KeylessAuthority(name=name, identities=identities, root=root, tsa=tsa)


def _tsa(raw: Any, path: str, problems: list[str]) -> tuple[x509.Certificate, ...] | None:
    """An authority's ``rfc3161timestamp`` (``{certificateChain: PEM}``): the TSA's chain,
    () when absent; None (a problem listed) when it is wrong."""
    if raw is None:
        return ()
    if not isinstance(raw, dict):
        problems.append(f"{path} must be an object")
        return None
    pem = _text(raw.get("certificateChain"), f"{path}.certificateChain", problems, required=True)
    if not pem:
        return None
    try:
        return timestamps.load_chain(pem.encode(), what=f"{path}.certificateChain")
    except errors.InvalidArgument as exc:
        problems.append(exc.message)
        return None


def parse(obj: dict[str, Any], *, strict: bool = True) -> Policy:
    """The policy a ClusterBundlePolicy object states. When it is not valid:
    InvalidArgument listing every problem (what the status's ``Valid`` condition shows),
    or with ``strict=False`` a policy whose ``problem`` says so."""
    raw_meta, raw_spec = obj.get("metadata"), obj.get("spec")
    meta: dict[str, Any] = raw_meta if isinstance(raw_meta, dict) else {}
    spec: dict[str, Any] = raw_spec if isinstance(raw_spec, dict) else {}
    problems: list[str] = []
    globs: list[str] = []
    images = spec.get("images")
    if not isinstance(images, list) or not images:
        problems.append("spec.images must list at least one {glob: ...}")
        images = []
    for i, entry in enumerate(images):
        glob = _text(
            entry.get("glob") if isinstance(entry, dict) else None,
            f"spec.images[{i}].glob",
            problems,
            required=True,
        )
        if glob:
            globs.append(normalize_glob(glob))
    raw_authorities = spec.get("authorities")
    if not isinstance(raw_authorities, list) or not raw_authorities:
        problems.append("spec.authorities must list at least one authority")
        raw_authorities = []
    authorities = [
        _authority(entry, f"spec.authorities[{i}]", problems)
        for i, entry in enumerate(raw_authorities)
    ]
    mode = spec.get("mode") or "enforce"
    if mode not in MODES:
        problems.append(f"spec.mode {mode!r} is not one of enforce, warn")
    if problems and strict:
        raise errors.InvalidArgument("; ".join(problems))
    return Policy(
        name=str(meta.get("name") or ""),
        uid=str(meta.get("uid") or ""),
        generation=_generation(meta.get("generation")),
        globs=tuple(globs),
        authorities=tuple(a for a in authorities if a is not None),
        mode="warn" if mode == "warn" else "enforce",
        problem="; ".join(problems),
    )


def _generation(raw: Any) -> int:
    try:
        return int(raw or 0)
    except (TypeError, ValueError):
        return 0


def key_from_secret(data: dict[str, Any], where: str) -> bytes:
    """The PEM a key Secret's ``data`` holds (base64 values, as the API gives them): its
    ``cosign.pub`` entry, or its only entry; InvalidArgument naming ``where`` otherwise."""
    entry = data.get(SECRET_KEY)
    if entry is None and len(data) == 1:
        entry = next(iter(data.values()))
    if not isinstance(entry, str):
        raise errors.InvalidArgument(
            f"Secret {where} has no {SECRET_KEY} entry and more than one other: name the "
            "public key's entry cosign.pub"
        )
    try:
        return base64.b64decode(entry, validate=True)
    except (binascii.Error, ValueError):
        raise errors.InvalidArgument(f"Secret {where}: {SECRET_KEY} is not base64") from None
