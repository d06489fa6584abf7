"""Pre-staged rollouts: the words the manager and the node plugins exchange, and their rules.

Where it sits: the shared core, below both sides (no Kubernetes client here, only the
keys, the formats and pure functions over them). The manager
(``provisioner.manager.acting.prestage``) asks, before a BundleDeployment pivots to a new pin,
that the nodes which will need the new content fetch it first; each node plugin
(``csi.node.prestage``) follows those asks, fetches, and answers on its own Node object.
See docs/prestage.md.

The conversation, all in object metadata:

- **the ask**: annotation :data:`REQUEST_ANNOTATION` on the BundleDeployment, JSON
  ``{"images": ["registry/repo@sha256:...", ...], "at": "<RFC 3339>"}``;
- **who answers**: label :data:`ENABLED_LABEL` ``"true"`` on each Node whose plugin follows
  asks (set at the plugin's start);
- **the answers**: annotation :data:`STATE_ANNOTATION` on the Node, JSON
  ``{"sha256:...": {"state": "fetching|cached|skipped|failed", "bytes": N, "total": M,
  "message": "...", "at": unix seconds}}``, at most :data:`MAX_STATES` entries (newest
  kept);
- **the advert**: one label per digest the node holds, ``cached.csi.rukpak.io/<the first
  63 hex digits>: "true"`` (:func:`cached_label`), at most the plugin's
  ``--advertise-max`` of them (newest kept), for ``nodeAffinity`` preferred terms.
"""

from __future__ import annotations

import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field

REQUEST_ANNOTATION = "prestage.rukpak.io/images"
"""On a BundleDeployment: the pinned images its next pivot needs on the nodes."""
TIMEOUT_ANNOTATION = "prestage.rukpak.io/timeout"
"""On a BundleDeployment: seconds its pivots wait for pre-staging (overrides the manager's
``--prestage-timeout``; ``0`` turns it off for this BundleDeployment)."""
ENABLED_LABEL = "prestage.csi.rukpak.io/enabled"
"""On a Node: its node plugin follows pre-stage asks (the nodes the manager waits for)."""
STATE_ANNOTATION = "prestage.csi.rukpak.io/state"
"""On a Node: what its plugin did with each asked digest."""
CACHED_PREFIX = "cached.csi.rukpak.io/"
"""Label prefix of the advert: ``<prefix><hex[:63]>`` on a node that holds the digest."""
LABEL_NAME_MAX = 63
"""A label key's name part, and a label value, are at most 63 characters (Kubernetes)."""
MAX_STATES = 32
"""Answers a Node's state annotation keeps (newest first); older ones are dropped."""
MAX_IMAGES = 16
"""Images one ask may name; more are refused by the manager, ignored by the plugins."""
MESSAGE_MAX = 200

FETCHING, CACHED, SKIPPED, FAILED = "fetching", "cached", "skipped", "failed"
FINAL = frozenset({CACHED, SKIPPED, FAILED})
"""Answers after which the manager stops waiting for that node."""

_PINNED = re.compile(r"^[^\s@]+@sha256:[0-9a-f]{64}$")
_DIGEST = re.compile(r"^sha256:[0-9a-f]{64}$")


def is_pinned(image: str) -> bool:
    """``registry/repo@sha256:<64 hex>`` (a tag beside the digest is not accepted)."""
    return bool(_PINNED.match(image)) and ":" not in image.split("@", 1)[0].rsplit("/", 1)[-1]


def digest_of(image: str) -> str:
    return image.rsplit("@", 1)[1]


def repository_of(image: str) -> str:
    """``registry/repo`` of a reference, without tag or digest (as written, not normalised)."""
    name = image.split("@", 1)[0]
    last = name.rsplit("/", 1)
    if len(last) == 2 and ":" in last[1]:
        return f"{last[0]}/{last[1].split(':', 1)[0]}"
    return name


def cached_label(digest: str) -> str:
    """The advert label key of ``digest`` (``sha256:<hex>``): the name part is the first 63
    hex digits (252 bits: no two digests meet in practice)."""
    if not _DIGEST.match(digest):
        raise ValueError(f"{digest!r} is not a sha256 digest")
    return CACHED_PREFIX + digest.removeprefix("sha256:")[:LABEL_NAME_MAX]


def request_value(images: Iterable[str], at: str) -> str:
    return json.dumps({"images": sorted(set(images)), "at": at}, sort_keys=True)


def parse_request(text: str | None) -> list[str]:
    """The pinned images of an ask; lenient (a plugin never fails on someone's annotation):
    what is not JSON, not pinned, or beyond :data:`MAX_IMAGES` is left out."""
    if not text:
        return []
    try:
        doc = json.loads(text)
    except ValueError:
        return []
    images = doc.get("images") if isinstance(doc, dict) else None
    if not isinstance(images, list):
        return []
    return [i for i in images if isinstance(i, str) and is_pinned(i)][:MAX_IMAGES]


def asked_at(text: str | None) -> str:
    """The ``at`` of an ask (what its answers repeat); "" when there is none."""
    try:
        doc = json.loads(text or "")
    except ValueError:
        return ""
    return str(doc.get("at") or "")[:40] if isinstance(doc, dict) else ""


@dataclass(frozen=True)
class Answer:
    """One node's answer for one digest."""

    state: str
    bytes: int = 0
    total: int = 0
    message: str = ""
    at: float = 0.0
    """When the node answered (its clock, unix seconds): which answers are newest."""
    asked: str = ""
    """The ``at`` of the ask this answers (the manager's words, compared as they are)."""

    def to_json(self) -> dict[str, object]:
        doc: dict[str, object] = {"state": self.state, "at": round(self.at, 3)}
        if self.asked:
            doc["asked"] = self.asked[:40]
        if self.total:
            doc["bytes"], doc["total"] = self.bytes, self.total
        if self.message:
            doc["message"] = self.message[:MESSAGE_MAX]
        return doc

    @property
    def percent(self) -> int:
        return int(100 * self.bytes / self.total) if self.total else 0


def parse_states(text: str | None) -> dict[str, Answer]:
    """A Node's answers by digest; lenient as :func:`parse_request`."""
    try:
        doc = json.loads(text) if text else {}
    except ValueError:
        return {}
    out: dict[str, Answer] = {}
    if not isinstance(doc, dict):
        return out
    for digest, entry in doc.items():
        if not (_DIGEST.match(str(digest)) and isinstance(entry, dict)):
            continue
        state = entry.get("state")
        if state not in FINAL | {FETCHING}:
            continue
        out[digest] = Answer(
            state=str(state),
            bytes=_count(entry.get("bytes")),
            total=_count(entry.get("total")),
            message=str(entry.get("message") or "")[:MESSAGE_MAX],
            at=float(entry.get("at") or 0) if isinstance(entry.get("at"), int | float) else 0.0,
            asked=str(entry.get("asked") or "")[:40],
        )
    return out


def _count(value: object) -> int:
    return value if isinstance(value, int) and value >= 0 else 0


def dump_states(states: Mapping[str, Answer]) -> str:
    """The state annotation: the :data:`MAX_STATES` newest answers."""
    newest = sorted(states.items(), key=lambda kv: kv[1].at, reverse=True)[:MAX_STATES]
    return json.dumps({d: a.to_json() for d, a in sorted(newest)}, sort_keys=True)


def advert_patch(
    labels: Mapping[str, str], cached_newest_first: Iterable[str], *, limit: int
) -> dict[str, str | None]:
    """The label changes (``None`` removes) that make a Node advertise exactly the first
    ``limit`` digests of ``cached_newest_first``; labels of other prefixes are untouched."""
    wanted: dict[str, None] = {}
    for digest in cached_newest_first:
        if len(wanted) >= limit:
            break
        if _DIGEST.match(digest):
            wanted[cached_label(digest)] = None
    patch: dict[str, str | None] = {
        key: None for key in labels if key.startswith(CACHED_PREFIX) and key not in wanted
    }
    patch.update({key: "true" for key in wanted if labels.get(key) != "true"})
    return patch


@dataclass(frozen=True)
class NodeView:
    """What the manager reads of a Node: its name, labels and annotations."""

    name: str
    labels: Mapping[str, str] = field(default_factory=dict)
    annotations: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def of(cls, obj: Mapping[str, object]) -> NodeView:
        meta = obj.get("metadata")
        meta = meta if isinstance(meta, dict) else {}
        return cls(
            str(meta.get("name") or ""),
            dict(meta.get("labels") or {}),
            dict(meta.get("annotations") or {}),
        )


@dataclass(frozen=True)
class Verdict:
    """Whether the asked digests are where they are needed (:func:`judge`)."""

    ready: bool
    waiting: tuple[str, ...] = ()
    """Nodes still fetching, or not yet answering."""
    cached: tuple[str, ...] = ()
    failed: tuple[str, ...] = ()
    """``node: message`` of the nodes that could not fetch (the pivot does not wait)."""
    progress: tuple[tuple[str, str, Answer], ...] = ()
    """(node, digest, answer) of each fetch under way."""

    def summary(self) -> str:
        parts = []
        if self.cached:
            parts.append(f"cached on {', '.join(self.cached)}")
        for node, digest, answer in self.progress:
            size = f" {_mib(answer.bytes)}/{_mib(answer.total)} MiB" if answer.total else ""
            parts.append(f"{node} fetching {digest[:19]}{size}")
        missing = sorted(set(self.waiting) - {n for n, _, _ in self.progress})
        if missing:
            parts.append(f"no answer yet from {', '.join(missing)}")
        if self.failed:
            parts.append(f"not pre-staged on {'; '.join(self.failed)}")
        return "; ".join(parts) or "no node follows pre-stage asks"


def _mib(n: int) -> str:
    return f"{n / 2**20:.0f}" if n >= 2**20 or n == 0 else f"{math.ceil(n / 2**20 * 10) / 10}"


def judge(nodes: Iterable[NodeView], digests: Iterable[str], *, asked: str) -> Verdict:
    """Whether every node that follows asks (:data:`ENABLED_LABEL`) has answered each of
    ``digests`` finally: ``cached`` (whenever), or ``skipped``/``failed`` for this very ask
    (``asked``: its ``at``; an old ``skipped`` may be stale, the node may need it now)."""
    wanted = sorted(set(digests))
    waiting: list[str] = []
    cached: list[str] = []
    failed: list[str] = []
    progress: list[tuple[str, str, Answer]] = []
    for node in sorted(nodes, key=lambda n: n.name):
        if node.labels.get(ENABLED_LABEL) != "true":
            continue
        states = parse_states(node.annotations.get(STATE_ANNOTATION))
        done = True
        for digest in wanted:
            answer = states.get(digest)
            if answer is not None and answer.state == CACHED:
                continue
            if answer is not None and answer.state == FETCHING:
                done = False
                progress.append((node.name, digest, answer))
                continue
            if answer is None or answer.asked != asked:
                done = False
                continue
            if answer.state == FAILED:
                failed.append(f"{node.name}: {answer.message}")
        if not done:
            waiting.append(node.name)
        elif any(states.get(d) and states[d].state == CACHED for d in wanted):
            cached.append(node.name)
    return Verdict(not waiting, tuple(waiting), tuple(cached), tuple(failed), tuple(progress))
