"""A bundle volume's source: the volume attributes (inline ``volumeAttributes``,
StorageClass parameters or PV ``volumeAttributes``) parsed into a ``VolumeSource``,
and pull credentials from the publish secret.

A volume holds an image (``image``), a git commit (``git`` = repository, ``commit``,
optional ``directory``) or an http tarball (``url`` plus its pinned ``digest``);
git and http volumes carry a ``FetchSource`` and their publish secret holds the
source's auth Secret data (``rukpak.sources.auth``), not a dockerconfigjson.

An image volume may carry its registry's TLS trust, for that volume only
(``rukpak.oci.tls``): ``certificateData`` (PEM CA certificates, added to the system
trust store) and ``insecureSkipTLSVerify`` (``"true"``), upstream's field names. Either
needs an image pinned by digest: what is fetched is then verified by digest whatever
the TLS, so a tree in the node cache is the content of its digest however it came; a
tag's digest learnt with one volume's trust is never handed to another volume. A git or
http volume takes ``certificateData`` too (its https server's CA; an https:// location
only), and ``insecureSkipVerify`` as before: it is pinned by commit or content digest.

A volume may also name what the node caches must keep for its owner (``retainFor``,
e.g. ``bundledeployment/hello/<uid>``, and ``retain``, the owner's kept revisions,
space-separated): images as ``name@sha256:<hex>`` references, git trees as
``git+<repository>@<commit>[:<directory>]`` and http trees as ``<url>@sha256:<hex>``
(``FetchSource.label()``, see :func:`retain_entry`). A publish records them
(``csi.node.publish``) so that eviction spares those trees, in bind mode and in FUSE
mode. Both or neither.

A volume with ``kind: store`` (the default kind is ``bundle``) holds nothing of its own:
the node plugin publishes it to allowed pods, which ask it for content by digest
(``csi.node.storevolume``); it takes no other attribute (:func:`volume_kind`).

Where it sits: the Node service parses publish requests with it and the
Controller service checks CreateVolume parameters with it; both then hand the
plain dataclass on (to ``csi.node.publish`` or the volume records).
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field, replace

from rukpak.common import errors
from rukpak.image.seams import PullPolicy
from rukpak.oci import tls as source_tls
from rukpak.oci.auth import Credentials
from rukpak.oci.manifest import Platform
from rukpak.oci.reference import Reference
from rukpak.oci.tls import SourceTLS
from rukpak.sources.auth import SourceAuth

ATTR_IMAGE = "image"
ATTR_PULL_POLICY = "pullPolicy"
ATTR_PLATFORM = "platform"
ATTR_PUBLISH_MODE = "publishMode"
PUBLISH_MODES = ("bind", "fuse")
ATTR_GIT = "git"
ATTR_COMMIT = "commit"
ATTR_DIRECTORY = "directory"
ATTR_URL = "url"
ATTR_DIGEST = "digest"
ATTR_INSECURE = "insecureSkipVerify"
ATTR_CERTIFICATE_DATA = "certificateData"
ATTR_INSECURE_SKIP_TLS = "insecureSkipTLSVerify"
TLS_ATTRIBUTES = (ATTR_CERTIFICATE_DATA, ATTR_INSECURE_SKIP_TLS)
ATTR_RETAIN_FOR = "retainFor"
ATTR_RETAIN = "retain"
ATTR_KIND = "kind"
ATTR_REFRESH = "refresh"
REFRESH_MIN = 1.0
REFRESH_MAX = 24 * 3600.0
KIND_BUNDLE = "bundle"
KIND_STORE = "store"
KINDS = (KIND_BUNDLE, KIND_STORE)
FETCH_ATTRIBUTES = (ATTR_GIT, ATTR_COMMIT, ATTR_DIRECTORY, ATTR_URL, ATTR_DIGEST, ATTR_INSECURE)
"""A git or http volume's attributes; it also takes ``certificateData`` (its server's CA)."""
RETAIN_ATTRIBUTES = (ATTR_RETAIN_FOR, ATTR_RETAIN)
KNOWN_ATTRIBUTES = (
    ATTR_KIND,
    ATTR_IMAGE,
    ATTR_REFRESH,
    ATTR_PULL_POLICY,
    ATTR_PLATFORM,
    ATTR_PUBLISH_MODE,
    *TLS_ATTRIBUTES,
    *RETAIN_ATTRIBUTES,
    *FETCH_ATTRIBUTES,
)
RETAIN_FOR_MAX = 253
"""Characters of a ``retainFor`` owner key at most (a Kubernetes name's limit)."""
RETAIN_MAX = 32
"""Entries in ``retain`` at most."""
_GIT_LABEL = re.compile(r"^git\+\S+@[0-9a-f]{40}(?::\S*)?$")
_HTTP_LABEL = re.compile(r"^https?://\S+@sha256:[0-9a-f]{64}$")
# Added by Kubernetes (podInfoOnMount, ephemeral flag, provisioner metadata).
K8S_ATTRIBUTE_PREFIX = "csi.storage.k8s.io/"
SECRET_KEYS = (".dockerconfigjson", ".dockercfg")


@dataclass(frozen=True)
class FetchSource:
    """A pinned git commit (``location`` = repository, ``pin`` = commit, ``directory``)
    or http tarball (``location`` = URL, ``pin`` = ``sha256:`` digest of its bytes)."""

    kind: str  # git | http
    location: str
    pin: str
    directory: str = ""
    insecure: bool = False
    auth: SourceAuth | None = field(default=None, repr=False, compare=False)
    ca_pem: str = field(default="", repr=False)
    """The server's CA (PEM, ``certificateData``), trusted beside the system's for this
    volume's fetch only; empty: the system trust store."""

    @property
    def tls(self) -> SourceTLS | None:
        """How to verify the server (``ca_pem``, ``insecure``); None: the default."""
        if not self.ca_pem and not self.insecure:
            return None
        return SourceTLS(ca_pem=self.ca_pem, skip_verify=self.insecure)

    def label(self) -> str:
        """The content in one line (holders, logs): never holds credentials."""
        if self.kind == "git":
            where = f":{self.directory}" if self.directory else ""
            return f"git+{self.location}@{self.pin}{where}"
        return f"{self.location}@{self.pin}"

    @classmethod
    def from_attributes(cls, attributes: Mapping[str, str]) -> FetchSource:
        from rukpak.sources import git, http  # the node and the controller both parse here

        insecure = attributes.get(ATTR_INSECURE, "").strip().lower() == "true"
        location = (attributes.get(ATTR_GIT) or attributes.get(ATTR_URL) or "").strip()
        tls = source_tls.for_url(
            location,
            SourceTLS.from_fields(
                attributes.get(ATTR_CERTIFICATE_DATA, ""),
                insecure,
                where=f"volume attribute {ATTR_CERTIFICATE_DATA!r}",
                server="server",
            ),
            where=f"volume attribute {ATTR_CERTIFICATE_DATA!r}",
        )
        ca_pem = tls.ca_pem if tls is not None else ""
        if attributes.get(ATTR_GIT, "").strip():
            repository = attributes[ATTR_GIT].strip()
            commit = attributes.get(ATTR_COMMIT, "").strip().lower()
            if not git.COMMIT_RE.match(commit):
                raise errors.InvalidArgument(
                    "volume attribute 'commit' must be the full 40-character commit hash a "
                    f"git volume is pinned to (got {commit[:80]!r})"
                )
            directory = attributes.get(ATTR_DIRECTORY, "").strip()
            git.check_directory(directory, repository)
            return cls(
                "git", repository, commit, directory=directory, insecure=insecure, ca_pem=ca_pem
            )
        url = attributes.get(ATTR_URL, "").strip()
        http.check_url(url)
        bare, pinned = http.split_pinned(url)
        digest = attributes.get(ATTR_DIGEST, "").strip() or pinned or ""
        if not (digest.startswith("sha256:") and len(digest) == 71):
            raise errors.InvalidArgument(
                "volume attribute 'digest' must be the sha256:<hex> digest an http volume is "
                f"pinned to (got {digest[:80]!r})"
            )
        return cls("http", bare, digest, insecure=insecure, ca_pem=ca_pem)

    def attributes(self) -> dict[str, str]:
        if self.kind == "git":
            out = {ATTR_GIT: self.location, ATTR_COMMIT: self.pin}
            if self.directory:
                out[ATTR_DIRECTORY] = self.directory
        else:
            out = {ATTR_URL: self.location, ATTR_DIGEST: self.pin}
        if self.insecure:
            out[ATTR_INSECURE] = "true"
        if self.ca_pem:
            out[ATTR_CERTIFICATE_DATA] = self.ca_pem
        return out


@dataclass(frozen=True)
class VolumeSource:
    """What a volume holds: an image, how to pull it, and for which platform; or, for
    git and http volumes, ``fetch`` (and ``image`` is its label)."""

    image: str
    pull_policy: PullPolicy = PullPolicy.IF_NOT_PRESENT
    platform: Platform | None = None
    publish_mode: str | None = None  # bind | fuse; None: the plugin's --publish-mode
    fetch: FetchSource | None = None
    retain_for: str = ""
    """The owner whose kept images ``retain`` lists (empty: no retention)."""
    retain: tuple[str, ...] = ()
    """What the node caches keep for ``retain_for``: image references pinned by digest
    and git or http source labels (:func:`retain_entry`)."""
    tls: SourceTLS | None = field(default=None, repr=False, compare=False)
    """The registry's TLS trust for this volume only (``certificateData``,
    ``insecureSkipTLSVerify``); None: the node plugin's."""
    refresh: float = 0.0
    """Seconds between looks at where the image's tag points (``refresh``); 0: the content
    stays what the publish found (``csi.node.refresh``)."""
    pinned: str = ""
    """Set by the publish spine, never by attributes: ``image`` pinned to the digest a
    signature check verified (``rukpak.signing.gate``); what is fetched when set."""

    def with_secrets(self, secrets: Mapping[str, str]) -> VolumeSource:
        """For a git or http volume: the publish secret's data as the fetch's auth."""
        if self.fetch is None or not secrets:
            return self
        return replace(self, fetch=replace(self.fetch, auth=SourceAuth.from_data(secrets)))

    @classmethod
    def from_attributes(cls, attributes: Mapping[str, str]) -> VolumeSource:
        """Parse volume attributes (or StorageClass parameters); InvalidArgument if wrong."""
        unknown = sorted(
            k
            for k in attributes
            if k not in KNOWN_ATTRIBUTES and not k.startswith(K8S_ATTRIBUTE_PREFIX)
        )
        if unknown:
            raise errors.InvalidArgument(
                f"unknown volume attribute(s) {', '.join(unknown)}; "
                f"supported: {', '.join(KNOWN_ATTRIBUTES)}"
            )
        if volume_kind(attributes) == KIND_STORE:
            raise errors.InvalidArgument(
                "a kind: store volume holds no bundle of its own: it is an inline volume the "
                "node plugin publishes to allowed pods, which ask it for content by digest"
            )
        kinds = [k for k in (ATTR_IMAGE, ATTR_GIT, ATTR_URL) if attributes.get(k, "").strip()]
        if len(kinds) > 1:
            raise errors.InvalidArgument(
                f"volume attributes {' and '.join(kinds)} are exclusive: set exactly one"
            )
        retain_for, retain = _retention(attributes)
        tls_given = [k for k in TLS_ATTRIBUTES if attributes.get(k, "").strip()]
        if kinds and kinds[0] != ATTR_IMAGE and attributes.get(ATTR_REFRESH, "").strip():
            raise errors.InvalidArgument(
                f"volume attribute {ATTR_REFRESH!r} follows an image's tag; a git or http "
                "volume is pinned by its commit or digest"
            )
        if kinds and kinds[0] != ATTR_IMAGE:
            if attributes.get(ATTR_INSECURE_SKIP_TLS, "").strip():
                raise errors.InvalidArgument(
                    f"volume attribute {ATTR_INSECURE_SKIP_TLS!r} is for image volumes; a git "
                    f"or http volume takes {ATTR_INSECURE!r} (and {ATTR_CERTIFICATE_DATA!r})"
                )
            fetch = FetchSource.from_attributes(attributes)
            return cls(
                image=fetch.label(),
                fetch=fetch,
                retain_for=retain_for,
                retain=retain,
                tls=fetch.tls,
            )
        image = attributes.get(ATTR_IMAGE, "").strip()
        if not image:
            raise errors.InvalidArgument(
                "volume attribute 'image' is required: set it to the bundle image reference, "
                "e.g. quay.io/org/bundle:v1"
            )
        ref = Reference.parse(image)
        tls = SourceTLS.from_fields(
            attributes.get(ATTR_CERTIFICATE_DATA, ""),
            attributes.get(ATTR_INSECURE_SKIP_TLS, ""),
            where=f"volume attribute {ATTR_CERTIFICATE_DATA!r}",
        )
        if tls is not None and (ref.digest is None or not ref.digest.startswith("sha256:")):
            raise errors.InvalidArgument(
                f"volume attribute(s) {', '.join(tls_given)} need an image pinned by digest "
                f"(name@sha256:<hex>), so that what is fetched is verified whatever the TLS; "
                f"got {image[:300]!r}"
            )
        policy = PullPolicy.parse(attributes.get(ATTR_PULL_POLICY) or "IfNotPresent")
        platform_text = attributes.get(ATTR_PLATFORM, "").strip()
        platform = Platform.parse(platform_text) if platform_text else None
        mode = attributes.get(ATTR_PUBLISH_MODE, "").strip() or None
        if mode is not None and mode not in PUBLISH_MODES:
            raise errors.InvalidArgument(
                f"publishMode {mode!r} is invalid: use bind or fuse (or leave it unset for the "
                "plugin's default)"
            )
        refresh = _refresh(attributes.get(ATTR_REFRESH, ""), ref, mode, tls)
        return cls(
            image=image,
            pull_policy=policy,
            platform=platform,
            publish_mode=mode,
            retain_for=retain_for,
            retain=retain,
            tls=tls,
            refresh=refresh,
        )

    def attributes(self) -> dict[str, str]:
        if self.fetch is not None:
            out = self.fetch.attributes()
        else:
            out = {ATTR_IMAGE: self.image, ATTR_PULL_POLICY: self.pull_policy.value}
            if self.platform is not None:
                out[ATTR_PLATFORM] = str(self.platform)
            if self.publish_mode is not None:
                out[ATTR_PUBLISH_MODE] = self.publish_mode
            if self.tls is not None and self.tls.ca_pem:
                out[ATTR_CERTIFICATE_DATA] = self.tls.ca_pem
            if self.tls is not None and self.tls.skip_verify:
                out[ATTR_INSECURE_SKIP_TLS] = "true"
            if self.refresh:
                out[ATTR_REFRESH] = f"{self.refresh:g}s"
        if self.retain_for:
            out[ATTR_RETAIN_FOR] = self.retain_for
            out[ATTR_RETAIN] = " ".join(self.retain)
        return out


_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ms|s|m|h)?$")
_UNIT = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0, None: 1.0}


def _refresh(text: str, ref: Reference, mode: str | None, tls: SourceTLS | None) -> float:
    """Seconds of a ``refresh`` attribute (``30s``, ``5m``, ``1h``, or plain seconds); 0
    when unset. InvalidArgument when it cannot hold for this volume."""
    text = text.strip()
    if not text:
        return 0.0
    match = _DURATION.match(text)
    seconds = float(match.group(1)) * _UNIT[match.group(2)] if match else -1.0
    if not REFRESH_MIN <= seconds <= REFRESH_MAX:
        raise errors.InvalidArgument(
            f"volume attribute {ATTR_REFRESH!r} {text[:40]!r} is invalid: a duration from "
            f"{REFRESH_MIN:g}s to {REFRESH_MAX / 3600:g}h, such as 30s or 5m"
        )
    if ref.digest is not None:
        raise errors.InvalidArgument(
            f"volume attribute {ATTR_REFRESH!r} follows a tag, and {ref} is pinned by digest: "
            "name the image by tag"
        )
    if mode == "fuse":
        raise errors.InvalidArgument(
            f"volume attribute {ATTR_REFRESH!r} is served in bind mode; leave publishMode unset"
        )
    if tls is not None:
        raise errors.InvalidArgument(
            f"volume attribute {ATTR_REFRESH!r} cannot go with certificateData or "
            "insecureSkipTLSVerify, which need an image pinned by digest"
        )
    return seconds


def volume_kind(attributes: Mapping[str, str]) -> str:
    """The volume's ``kind``: ``bundle`` (the default: one image, git or http tree) or
    ``store`` (content by digest on request, ``csi.node.storevolume``); a store volume
    takes no other attribute of ours. InvalidArgument naming what is wrong."""
    kind = attributes.get(ATTR_KIND, "").strip() or KIND_BUNDLE
    if kind not in KINDS:
        raise errors.InvalidArgument(
            f"volume attribute 'kind' {kind[:80]!r} is invalid: use bundle (the default) or store"
        )
    if kind == KIND_STORE:
        extra = sorted(
            k for k in attributes if k != ATTR_KIND and not k.startswith(K8S_ATTRIBUTE_PREFIX)
        )
        if extra:
            raise errors.InvalidArgument(
                f"a kind: store volume takes no other volume attributes (got {', '.join(extra)}): "
                "its pod asks for content by digest on the volume's socket"
            )
    return kind


def _retention(attributes: Mapping[str, str]) -> tuple[str, tuple[str, ...]]:
    """``retainFor`` and ``retain`` checked: both or neither, every reference pinned by
    digest (duplicates dropped, order kept, then counted); InvalidArgument naming what is
    wrong."""
    owner = attributes.get(ATTR_RETAIN_FOR, "").strip()
    refs = tuple(dict.fromkeys(attributes.get(ATTR_RETAIN, "").split()))
    if not owner and not refs:
        return "", ()
    if not owner or not refs:
        missing, present = (
            (ATTR_RETAIN_FOR, ATTR_RETAIN) if refs else (ATTR_RETAIN, ATTR_RETAIN_FOR)
        )
        raise errors.InvalidArgument(
            f"volume attribute {present!r} needs {missing!r}: set both (the owner key and the "
            "space-separated image references pinned by digest it keeps) or neither"
        )
    if len(owner) > RETAIN_FOR_MAX or not owner.isprintable() or any(c.isspace() for c in owner):
        raise errors.InvalidArgument(
            f"volume attribute 'retainFor' {owner[:80]!r} must be at most {RETAIN_FOR_MAX} "
            "printable characters without whitespace, e.g. bundledeployment/<name>/<uid>"
        )
    if len(refs) > RETAIN_MAX:
        raise errors.InvalidArgument(
            f"volume attribute 'retain' lists {len(refs)} entries; at most {RETAIN_MAX} may "
            "be retained: keep fewer revisions"
        )
    for text in refs:
        if text.startswith("git+") or "://" in text:
            if not is_fetch_label(text):
                raise errors.InvalidArgument(
                    f"volume attribute 'retain': {text[:300]!r} is not a pinned source: write "
                    "git+<repository>@<40-hex commit>[:<directory>] or <url>@sha256:<64 hex>"
                )
            continue
        try:
            ref = Reference.parse(text)
        except errors.InvalidArgument as exc:
            raise errors.InvalidArgument(f"volume attribute 'retain': {exc.message}") from None
        if ref.digest is None or not ref.digest.startswith("sha256:"):
            raise errors.InvalidArgument(
                f"volume attribute 'retain': image {text[:300]!r} is not pinned by digest: "
                "write it as name@sha256:<64 hex>"
            )
    return owner, refs


def is_fetch_label(text: str) -> bool:
    """Whether ``text`` is a pinned git or http source as ``retain`` lists it."""
    return bool(_GIT_LABEL.match(text) or _HTTP_LABEL.match(text))


def retain_entry(attributes: Mapping[str, str]) -> str | None:
    """The ``retain`` entry naming the content of a volume with ``attributes``: its image
    reference when pinned by digest, its source label for git and http; None when the
    content is not pinned (a tag) or the attributes are invalid."""
    plain = {k: v for k, v in attributes.items() if k not in RETAIN_ATTRIBUTES}
    try:
        source = VolumeSource.from_attributes(plain)
    except errors.RukpakError:
        return None
    if source.fetch is not None:
        label = source.fetch.label()
        return label if is_fetch_label(label) else None  # (whitespace in a directory)
    digest = Reference.parse(source.image).digest
    return source.image if digest is not None and digest.startswith("sha256:") else None


def credentials_from_secrets(
    secrets: Mapping[str, str], source: VolumeSource | None = None
) -> Credentials | None:
    """Pull credentials from a dockerconfigjson Secret's data; None when there is none
    (or when ``source`` is a git or http volume, whose secret is its fetch's auth)."""
    if not secrets or (source is not None and source.fetch is not None):
        return None
    for key in SECRET_KEYS:
        if key in secrets:
            return Credentials.from_dockerconfigjson(secrets[key])
    raise errors.InvalidArgument(
        "the publish secret has no '.dockerconfigjson' key: use a Secret of type "
        "kubernetes.io/dockerconfigjson (kubectl create secret docker-registry)"
    )
