"""Pre-staging on the node: fetch a digest before a rollout needs it, and say so.

Where it sits: beside the presentations of the node's one store (``csi.node.publish``,
``refresh``, ``storevolume``), but it presents nothing: it only fills the image cache.
The words it speaks with the manager are ``rukpak.common.prestage``; the Kubernetes side
(following the asks, writing the Node) is ``csi.node.prestagewatch``. This module is the
core: given one asked image, decide whether this node needs it, fetch it through the same
image cache as a publish, and report progress as bytes of the content store.

Which node needs an asked image: one that holds a volume of the same repository (a tree
held by a published target whose image names that repository: the pods that will roll to
the new digest), or one that serves a store volume (a standing provisioner runs here and
will ask for the pin). Others answer ``skipped``.

Credentials: a pre-stage fetch is anonymous (through ``--registry-mirror`` as any public
pull). It never uses a pull Secret: a pod that presents no credential must not be able to
use what a credential fetched. An image anonymous access cannot read answers ``failed``
with the registry's words; the manager goes on without it and the publish fetches it with
the pod's credential as today. What is fetched is only cached (no holder): a later publish
runs the whole publish spine (signature gate, credential checks) as it would on a hit.

Progress: the fetch runs on the caller's thread while a poller sums the bytes of the
manifest's blobs already in the content store plus the bytes of their ingest files (the
store names an ingest ``<hex>-<random>``), every ``interval`` seconds.
"""

from __future__ import annotations

import contextlib
import logging
import os
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from rukpak.common import errors
from rukpak.common import prestage as words
from rukpak.image import seams
from rukpak.image.cache import ImageCache
from rukpak.image.seams import PullerFactory, PullPolicy
from rukpak.oci.manifest import Descriptor, Platform
from rukpak.oci.reference import Reference

log = logging.getLogger(__name__)

PROGRESS_SECONDS = 1.0
"""How often a fetch under way reports its bytes."""

Report = Callable[[words.Answer], None]


@dataclass(frozen=True)
class Need:
    """Whether this node needs an image, and why (for the answer's message)."""

    needed: bool
    why: str


@dataclass(kw_only=True, eq=False)
class Prestager:
    """Fetches asked images into the node's image cache; thread-safe."""

    images: ImageCache
    puller_factory: PullerFactory
    platform: Platform
    store_present: Callable[[], bool] = lambda: False
    clock: Callable[[], float] = time.time
    interval: float = PROGRESS_SECONDS
    _lock: threading.Lock = field(default_factory=threading.Lock, init=False, repr=False)
    _staged: dict[str, float] = field(default_factory=dict, init=False, repr=False)
    """digest -> when this plugin pre-staged it (this process's memory)."""

    # --- which node needs what ----------------------------------------------------------

    def needs(self, image: str) -> Need:
        """Whether this node will need pinned ``image`` soon (see the module docstring)."""
        repository = _repository(image)
        for holder in self.images.holders().values():
            if holder.image and _repository(holder.image) == repository:
                return Need(True, f"a volume of {repository} is published here")
        if self.store_present():
            return Need(True, "a standing provisioner's store volume is served here")
        return Need(False, f"no volume of {repository} and no store volume on this node")

    def cached_newest_first(self) -> list[str]:
        """Digests to advertise: those in use by a published target, then those pre-staged
        here, newest first; only while their tree is in the cache."""
        held: list[str] = []
        for target in self.images.holders():
            digest = self.images.holder_digest(target)
            if digest and digest not in held:
                held.append(digest)
        with self._lock:
            staged = sorted(self._staged, key=self._staged.__getitem__, reverse=True)
        ordered = [*staged, *(d for d in held if d not in staged)]
        return [d for d in ordered if self.images.has_tree(d)]

    # --- one ask ------------------------------------------------------------------------

    def stage(self, image: str, *, asked: str, report: Report | None = None) -> words.Answer:
        """Answer one asked image: ``cached`` (at once when the tree is here), ``skipped``
        (not needed here), or fetch it reporting ``fetching`` answers on the way. Never
        raises for the registry's or the content's faults: they are a ``failed`` answer."""
        if not words.is_pinned(image):
            return self._answer(words.FAILED, asked, message=f"{image!r} is not pinned")
        digest = words.digest_of(image)
        if self.images.has_tree(digest):
            self._remember(digest)
            return self._answer(words.CACHED, asked, message="already cached")
        need = self.needs(image)
        if not need.needed:
            return self._answer(words.SKIPPED, asked, message=need.why)
        try:
            blobs = self._blobs(image)
        except errors.RukpakError as exc:
            return self._answer(words.FAILED, asked, message=exc.message)
        total = sum(d.size for d in blobs)
        done = threading.Event()
        poller = threading.Thread(
            target=self._poll,
            args=(blobs, total, asked, report, done),
            name="prestage-progress",
            daemon=True,
        )
        started = time.monotonic()
        poller.start()
        try:
            self.images.ensure(image, platform=self.platform, pull_policy=PullPolicy.IF_NOT_PRESENT)
        except errors.RukpakError as exc:
            return self._answer(words.FAILED, asked, message=exc.message, total=total)
        finally:
            done.set()
            poller.join()
        self._remember(digest)
        log.info(
            "msg=%r image=%s bytes=%d seconds=%.3f reason=%r",
            "pre-staged",
            image,
            total,
            time.monotonic() - started,
            need.why,
        )
        return self._answer(words.CACHED, asked, nbytes=total, total=total, message=need.why)

    def _answer(
        self, state: str, asked: str, *, message: str = "", nbytes: int = 0, total: int = 0
    ) -> words.Answer:
        return words.Answer(state, nbytes, total, message, self.clock(), asked)

    def _remember(self, digest: str) -> None:
        with self._lock:
            self._staged[digest] = self.clock()
            while len(self._staged) > words.MAX_STATES:  # the oldest go
                del self._staged[min(self._staged, key=self._staged.__getitem__)]

    def _blobs(self, image: str) -> list[Descriptor]:
        """The distinct blobs of ``image`` for this platform (one manifest request)."""
        puller = self.puller_factory(None)
        try:
            _, manifest = puller.resolve_image(Reference.parse(image), self.platform)
        finally:
            seams.close(puller)
        return list({d.digest: d for d in (manifest.config, *manifest.layers)}.values())

    def fetched_bytes(self, blobs: list[Descriptor]) -> int:
        """Bytes of ``blobs`` in the content store, committed or being ingested."""
        ingest = self.images.store.ingest_dir
        partial: dict[str, int] = {}
        with contextlib.suppress(FileNotFoundError):
            for entry in os.scandir(ingest):
                hex_, _, _ = entry.name.partition("-")
                with contextlib.suppress(FileNotFoundError):
                    partial[hex_] = max(partial.get(hex_, 0), entry.stat().st_size)
        count = 0
        for d in blobs:
            if self.images.store.has(d.digest):
                count += d.size
            else:
                count += min(d.size, partial.get(d.digest.removeprefix("sha256:"), 0))
        return count

    def _poll(
        self,
        blobs: list[Descriptor],
        total: int,
        asked: str,
        report: Report | None,
        done: threading.Event,
    ) -> None:
        while True:
            if report is not None:
                answer = self._answer(
                    words.FETCHING, asked, nbytes=self.fetched_bytes(blobs), total=total
                )
                try:
                    report(answer)
                except Exception as exc:  # a report is a courtesy
                    log.warning("msg=%r error=%r", "cannot report progress", str(exc)[:200])
            if done.wait(self.interval):
                return


def _repository(image: str) -> str:
    try:
        return Reference.parse(image).name
    except errors.RukpakError:
        return words.repository_of(image)
