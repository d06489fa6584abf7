"""The holder registry: which published volume holds which tree, one small file each.

Where it sits: below the image cache (``rukpak.image.cache``, bind mode and the git and
http trees of ``rukpak.sources.cache``) and the FUSE publisher (``csi.fuse.publisher``),
which record a holder when they present a tree on a target and release it after the
unmount; the collectors (``rukpak.image.eviction``, ``csi.fuse.collect`` through the FUSE
publisher) spare every tree :meth:`Holders.held` names. One registry per node, for
every mode: a record says which tree store its tree lives in (``store``: ``tree`` for the
image cache's unpacked trees, ``fuse`` for the FUSE store).

Layout: ``<root>/<h>.json``, one file per holder, ``<h>`` the first 32 hex digits of the
sha256 of its target (a target presents one volume at a time; one volume may be
presented on several targets, as the store volume does). A hold writes its one file
with the project's commit recipe (``rukpak.common.fsio``: temp file, rename, fsync of
the file and of the directory); a release unlinks it, then the directory is synced.
Neither reads or rewrites any other record, so a publish costs the same with 1 or 1,000
volumes held. The fsyncs run in a background thread (``sync``, one batch for every
record changed meanwhile), as a tree's durability follows its commit
(``rukpak.store.commit``): the publish returns after the rename, which a crash of the
plugin cannot undo; what a power loss could take in the milliseconds before the batch
is the record of a mount the power loss ended anyway (and a record torn so is set aside
at start, below). With ``durable=False`` (``--no-durable-commit``) nothing is fsynced.

Start: every ``*.json`` is loaded. A file that is not a whole record (a torn write of a
power loss, a hand edit) is logged and set aside as ``<name>.bad-<ns>``, never fatal:
the publish core adopts every mount of a cached tree at start anyway
(``csi.node.publish.Publisher.reconcile``). Temp files a crash left are removed once
``STALE_TEMP`` old (a younger one may be another registry's write in flight: two opened on
one directory, as a restarted plugin's next start and tests do, never remove each
other's writes).
Every record is in its file before :meth:`Holders.hold` or :meth:`Holders.release`
returns (only the fsyncs wait): a registry opened afterwards, in this process or
another, loads it.

Migration: records of the formats before this registry (the ``holders`` table of the
image cache's ``state.json``, the FUSE publisher's ``publishes.json``) are handed to
:meth:`Holders.adopt` by their former owners at start, written here, and only then
dropped from the old files: a crash in between adopts them again (idempotent).

Thread-safety: the records are kept in memory under one lock; the files are written
outside it, under a lock per stripe of targets, each write putting the record's newest
state (so two changes of one target never leave the older one on disk).
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import logging
import os
import threading
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path

from rukpak.common.background import Chore
from rukpak.common.fsio import fsync_dir, write_bytes_atomic

log = logging.getLogger(__name__)

TREE = "tree"
"""``store`` of a tree in the image cache's ``unpacked/`` (bind mode, git and http)."""
FUSE = "fuse"
"""``store`` of a tree of the FUSE store (``csi.fuse.images``)."""

_STRIPES = 64
STALE_TEMP = 60.0
"""Seconds after which a temp file is a write a crash interrupted (removed at start); a
younger one may be the write of another registry open on the directory, made in
microseconds (see the module docstring)."""


@dataclass(frozen=True)
class Record:
    """One holder: ``target`` presents ``volume_id``, which holds tree ``digest``
    (``sha256:<hex>``) of tree store ``store``; ``image`` is what the volume asked for,
    ``meta`` what the presentation keeps besides (FUSE: ``presentation``)."""

    target: str
    volume_id: str
    digest: str
    store: str
    image: str = ""
    meta: Mapping[str, str] = field(default_factory=dict)

    @property
    def hex(self) -> str:
        return self.digest.removeprefix("sha256:")

    def to_json(self) -> dict[str, object]:
        return {
            "target": self.target,
            "volume_id": self.volume_id,
            "digest": self.digest,
            "store": self.store,
            "image": self.image,
            "meta": dict(self.meta),
        }

    @classmethod
    def from_json(cls, doc: object) -> Record:
        """A record from its file's JSON; ValueError naming what is wrong."""
        if not isinstance(doc, dict):
            raise ValueError("not a JSON object")
        text = {}
        for name in ("target", "volume_id", "digest", "store", "image"):
            value = doc.get(name, "")
            if not isinstance(value, str):
                raise ValueError(f"{name} is not a string")
            text[name] = value
        if not text["target"] or not text["store"]:
            raise ValueError("target or store missing")
        meta = doc.get("meta", {})
        if not isinstance(meta, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in meta.items()
        ):
            raise ValueError("meta is not an object of strings")
        return cls(meta=dict(meta), **text)


def file_name(target: str) -> str:
    """The name of ``target``'s record file."""
    return hashlib.sha256(target.encode("utf-8", "surrogateescape")).hexdigest()[:32] + ".json"


class Holders:
    """The node's holders, one file per target under ``root``; every method is thread-safe."""

    def __init__(self, root: Path, *, durable: bool = True) -> None:
        self.root = root
        self.durable = durable
        root.mkdir(mode=0o700, parents=True, exist_ok=True)
        self._lock = threading.Lock()
        self._records: dict[str, Record] = {}
        self._stripes = [threading.Lock() for _ in range(_STRIPES)]
        self._unsynced: set[str] = set()  # names written or removed since the last sync
        self._sync_lock = threading.Lock()
        self._syncer = Chore("holders-sync", self.sync, failure="cannot sync holder records")
        if durable:
            atexit.register(self.sync)  # what the thread had not synced yet
        self._load()

    def _load(self) -> None:
        for path in sorted(self.root.iterdir()):
            name = path.name
            if name.startswith(".") and name.endswith(".partial"):
                with contextlib.suppress(OSError):
                    if path.stat().st_mtime < time.time() - STALE_TEMP:
                        path.unlink()  # a write a crash interrupted
                continue
            if not name.endswith(".json"):
                continue
            try:
                record = Record.from_json(json.loads(path.read_bytes()))
                if file_name(record.target) != name:
                    raise ValueError("the file name is not its target's")
            except (OSError, ValueError) as exc:
                aside = path.with_name(f"{name}.bad-{time.time_ns()}")
                with contextlib.suppress(OSError):
                    os.replace(path, aside)
                log.error(
                    "msg=%r path=%s kept_as=%s error=%r",
                    "holder record unreadable; ignored (the mount, if any, is adopted)",
                    path,
                    aside,
                    str(exc)[:200],
                )
                continue
            self._records[record.target] = record

    # --- changes ------------------------------------------------------------------

    def hold(self, record: Record) -> None:
        """Record ``record`` (replacing what its target held), in memory and on disk.
        Idempotent. On a write error the target holds what it held before, and it raises."""
        previous = self.stage(record)
        try:
            self.persist(record.target)
        except BaseException:
            self.unstage(record, previous)
            raise

    def stage(self, record: Record) -> Record | None:
        """Record ``record`` in memory only (what the collectors see at once); returns
        what its target held before. :meth:`persist` writes it."""
        with self._lock:
            previous = self._records.get(record.target)
            self._records[record.target] = record
            return previous

    def unstage(self, record: Record, previous: Record | None) -> None:
        """Undo :meth:`stage` when the publish it served failed."""
        with self._lock:
            if self._records.get(record.target) != record:
                return
            if previous is None:
                del self._records[record.target]
            else:
                self._records[record.target] = previous
        self.persist(record.target)

    def release(self, target: str, *, store: str | None = None) -> Record | None:
        """Forget ``target``'s holder (of ``store`` only, when given); returns it.
        Idempotent: None when there was none."""
        with self._lock:
            record = self._records.get(target)
            if record is None or (store is not None and record.store != store):
                return None
            del self._records[target]
        self.persist(target)
        return record

    def persist(self, target: str) -> None:
        """Write ``target``'s newest state: its file, or none when it holds nothing."""
        path = self.root / file_name(target)
        with self._stripes[hash(target) % _STRIPES]:
            with self._lock:
                record = self._records.get(target)
            if record is not None:
                payload = json.dumps(record.to_json(), sort_keys=True).encode()
                write_bytes_atomic(path, payload, durable=False)  # synced in the background
            else:
                try:
                    path.unlink()
                except FileNotFoundError:
                    return
        if self.durable:
            with self._sync_lock:
                self._unsynced.add(path.name)
            self._syncer.wake()

    def sync(self) -> None:
        """Make every record written or removed so far durable: each file still there,
        then the directory (the background thread's work; callable to wait for it)."""
        with self._sync_lock:
            names, self._unsynced = self._unsynced, set()
        if not names:
            return
        try:
            for name in sorted(names):
                try:
                    fd = os.open(self.root / name, os.O_RDONLY | os.O_CLOEXEC)
                except FileNotFoundError:
                    continue  # released: the directory's sync below covers it
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            fsync_dir(self.root)
        except BaseException:
            with self._sync_lock:
                self._unsynced |= names  # tried again with the next change
            raise

    def pending(self) -> int:
        """Records changed and not yet made durable."""
        with self._sync_lock:
            return len(self._unsynced)

    def adopt(self, records: Iterable[Record]) -> int:
        """Write the records of an older format (see the module docstring); a target
        that already holds something here keeps it. Returns how many were adopted."""
        adopted = 0
        for record in records:
            with self._lock:
                if record.target in self._records:
                    continue
            self.hold(record)
            adopted += 1
        if adopted:
            log.info("msg=%r records=%d", "holders taken over from an older state file", adopted)
        return adopted

    # --- queries ------------------------------------------------------------------

    def get(self, target: str, *, store: str | None = None) -> Record | None:
        with self._lock:
            record = self._records.get(target)
        return record if record is not None and store in (None, record.store) else None

    def all(self, *, store: str | None = None) -> dict[str, Record]:
        """Every holder (of ``store``), by target."""
        with self._lock:
            return {t: r for t, r in self._records.items() if store in (None, r.store)}

    def holders_of(self, digest: str, *, store: str | None = None) -> list[Record]:
        """The holders of tree ``digest`` (``sha256:<hex>`` or its hex)."""
        hex_ = digest.removeprefix("sha256:")
        with self._lock:
            return [r for r in self._records.values() if r.hex == hex_ and store in (None, r.store)]

    def held(self, *, store: str) -> set[str]:
        """Hex digests of the trees of ``store`` some target holds."""
        with self._lock:
            return {r.hex for r in self._records.values() if r.store == store and r.digest}

    def count(self, *, store: str | None = None) -> int:
        with self._lock:
            if store is None:
                return len(self._records)
            return sum(1 for r in self._records.values() if r.store == store)
