"""List+watch: the one way RukPak follows a kind of object on the API server.

Sits in the shared core, under everything that reacts to the cluster: the provisioner's
drift correction (``engine.apply.drift``), the manager's controllers, PVC watches, the
node plugin's signature policies (``csi.node.policies``). It speaks to the API server only
through a ``Source`` (a list and a watch call): the provisioner's HTTP adapter
(``provisioner.engine.kube.Kube``) and the official client's (``csi.node.apisource``).
It is client-go's reflector and informer, kept small:

- ``ListWatch`` lists a kind (optionally one namespace, one label selector), then
  watches from the list's resourceVersion with ``allowWatchBookmarks``; every
  event and bookmark advances the resourceVersion it resumes from. A 410 Gone
  (the resourceVersion was compacted away) re-lists; any other failure (server
  unreachable, stream broken) waits a bounded backoff (``rukpak.common.backoff``)
  and resumes. Every request carries a client timeout (``Kube.watch`` sets
  ``_request_timeout``) and asks the server to end the watch after
  ``watch_timeout`` seconds, so a dead connection never hangs a thread.
- ``Informer`` adds a local cache on top: the latest object per
  ``(namespace, name)``, and handlers called for adds, updates and deletes
  (a re-list turns into the adds, updates and deletes it implies, so handlers
  never miss a change across a 410). Reads (``get``, ``items``) cost no request.

Usage::

    informer = listwatch.Informer(
        kube, "v1", "ConfigMap", namespace="demo", label_selector="app=web",
        on_add=lambda obj: ..., on_update=lambda old, new: ..., on_delete=lambda obj: ...,
        # or one handler for all three: on_change=lambda obj: ...
    )
    informer.start()                  # one daemon thread
    informer.wait_synced(timeout=10)  # the first list is in the cache
    cm = informer.get("demo", "settings")   # no request
    informer.stop()

or without a cache, blocking the calling thread until ``stop`` is set::

    ListWatch(kube, "v1", "Pod", on_list=..., on_event=..., stop=stop).run()

Handlers run on the watch thread, one at a time, in the order the server sent
the events; they should be quick (queue work elsewhere) and must not raise:
an exception is logged and the kind is re-listed after a backoff.
"""

from __future__ import annotations

import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import KW_ONLY, dataclass, field
from typing import Any, Protocol, TypedDict, TypeVar, Unpack

from rukpak.common import errors
from rukpak.common.backoff import Backoff

log = logging.getLogger(__name__)

T = TypeVar("T")
Obj = dict[str, Any]
"""An API object as JSON."""
Key = tuple[str, str]
"""``(namespace, name)``; the namespace is "" for cluster-scoped objects."""

WATCH_BACKOFF = Backoff(base=0.5, cap=30.0, jitter=0.1)
"""Pause after a failed list or watch: 0.5 s doubling up to 30 s, reset by a good stream."""


class Gone(errors.Aborted):
    """HTTP 410: the watch's resourceVersion is too old; re-list."""


@dataclass(frozen=True)
class Watch:
    """One watch request: a kind (in one namespace, under one label selector, or all),
    from a resourceVersion, until the server ends it after ``timeout_seconds``."""

    api_version: str
    kind: str
    resource_version: str
    namespace: str = ""
    label_selector: str = ""
    timeout_seconds: int = 60


class Source(Protocol):
    """What ``ListWatch`` needs of an API client: a list and a watch of one kind.

    ``watch`` yields ``(type, object)`` (ADDED, MODIFIED, DELETED, BOOKMARK) and raises
    ``Gone`` for a 410; every failure is a ``rukpak.common.errors.RukpakError``. The
    adapters (``provisioner.engine.kube.Kube``, ``csi.node.apisource.ClientSource``)
    subclass it: they write ``list`` and ``events`` (the stream of one ``Watch``) and
    inherit ``watch``, the call's one spelling.
    """

    def list(
        self, api_version: str, kind: str, *, namespace: str = "", label_selector: str = ""
    ) -> tuple[list[Obj], str]: ...

    def events(self, request: Watch) -> Iterator[tuple[str, Obj]]: ...

    def watch(
        self,
        api_version: str,
        kind: str,
        *,
        resource_version: str,
        namespace: str = "",
        label_selector: str = "",
        timeout_seconds: int = 60,
    ) -> Iterator[tuple[str, Obj]]:
        return self.events(
            Watch(
                api_version,
                kind,
                resource_version,
                namespace=namespace,
                label_selector=label_selector,
                timeout_seconds=timeout_seconds,
            )
        )


def meta_of(obj: Obj) -> dict[str, Any]:
    meta = obj.get("metadata")
    return meta if isinstance(meta, dict) else {}


def key_of(obj: Obj) -> Key:
    meta = obj.get("metadata") or {}
    return str(meta.get("namespace") or ""), str(meta.get("name") or "")


def resource_version_of(obj: Obj) -> str:
    return str(meta_of(obj).get("resourceVersion") or "")


class Options(TypedDict, total=False):
    """What to follow and how; every key is optional."""

    namespace: str
    """Only this namespace ("" = all namespaces, the default)."""
    label_selector: str
    stop: threading.Event
    """Set it to end the loop (default: a new Event; ``Informer.stop`` sets it)."""
    watch_timeout: int
    """Seconds after which the server ends each watch (default 60)."""
    relist_every: float | None
    """Re-list this often even when the watch is healthy (default: never)."""
    backoff: Backoff
    """Pause after failures (default ``WATCH_BACKOFF``)."""
    on_error: Callable[[str], object]
    """Called with the failure's message when following starts failing, or fails with
    another message (not on every retry); ``ListWatch.error`` holds it until a list
    succeeds."""


@dataclass(eq=False, repr=False)
class ListWatch:
    """List, then watch from there, until ``stop`` is set; see the module docstring.

    ``on_list(items, resource_version)`` gets every (re-)list, ``on_event(type, obj)``
    each ADDED / MODIFIED / DELETED event, ``on_bookmark(resource_version)`` each
    bookmark. The keyword options are those of ``Options``; ``relist_every`` (seconds)
    re-lists periodically even when the watch is healthy (a resync that only reads).
    """

    kube: Source
    api_version: str
    kind: str
    _: KW_ONLY
    on_list: Callable[[list[Obj], str], object] = lambda items, rv: None
    on_event: Callable[[str, Obj], object] = lambda type_, obj: None
    on_bookmark: Callable[[str], object] = lambda rv: None
    namespace: str = ""
    label_selector: str = ""
    stop: threading.Event = field(default_factory=threading.Event)
    watch_timeout: int = 60
    relist_every: float | None = None
    backoff: Backoff = WATCH_BACKOFF
    on_error: Callable[[str], object] = lambda message: None
    error: str = field(default="", init=False)
    """The last failure's message while following fails ("" once a list succeeds)."""
    resource_version: str = field(default="", init=False)
    """The resourceVersion the next watch starts from ("" = list first)."""
    lists: int = field(default=0, init=False)
    """Lists done so far (the first one, then one per 410 Gone or resync)."""
    watches: int = field(default=0, init=False)
    """Watch requests started so far."""
    ended: bool = field(default=False, init=False)
    """Set by :meth:`end`: this loop alone is to stop (``stop`` may be shared)."""

    def __repr__(self) -> str:
        where = f" in {self.namespace}" if self.namespace else ""
        sel = f" ({self.label_selector})" if self.label_selector else ""
        return f"list+watch {self.kind}{where}{sel}"

    def end(self) -> None:
        """End this loop without setting ``stop``, which others may share: it returns after
        the watch or the pause under way (at the latest one server timeout or one backoff
        delay later)."""
        self.ended = True

    def run(self) -> None:
        """Follow the kind until ``stop`` is set (at the latest one server timeout later)
        or :meth:`end` is called."""
        failures = 0
        listed_at = 0.0
        while not (self.stop.is_set() or self.ended):
            try:
                due = self.relist_every is not None and (
                    time.monotonic() - listed_at > self.relist_every
                )
                if not self.resource_version or due:
                    self._list()
                    listed_at = time.monotonic()
                self._watch()
                failures = 0
            except Gone as err:
                log.info("msg='watch expired, re-listing' watch=%r error=%r", self, err.message)
                self.resource_version = ""
            except errors.RukpakError as err:
                delay = self.backoff.delay(failures)
                failures += 1
                log.warning(
                    "msg='watch failed' watch=%r retry_in=%.1fs error=%r", self, delay, err.message
                )
                if err.message != self.error:
                    self.error = err.message
                    self.on_error(err.message)
                self.stop.wait(delay)
            except Exception:  # a handler's bug: keep following, from a fresh list
                delay = self.backoff.delay(failures)
                failures += 1
                log.exception("msg='watch handler failed' watch=%r retry_in=%.1fs", self, delay)
                self.resource_version = ""
                self.stop.wait(delay)

    def _list(self) -> None:
        items, rv = self.kube.list(
            self.api_version,
            self.kind,
            namespace=self.namespace,
            label_selector=self.label_selector,
        )
        self.lists += 1
        self.error = ""
        self.on_list(items, rv)
        self.resource_version = rv

    def _watch(self) -> None:
        self.watches += 1
        for type_, obj in self.kube.watch(
            self.api_version,
            self.kind,
            namespace=self.namespace,
            resource_version=self.resource_version,
            label_selector=self.label_selector,
            timeout_seconds=self.watch_timeout,
        ):
            if self.stop.is_set() or self.ended:
                return
            rv = resource_version_of(obj) or self.resource_version
            if type_ == "BOOKMARK":
                self.resource_version = rv
                self.on_bookmark(rv)
                continue
            obj.setdefault("apiVersion", self.api_version)
            obj.setdefault("kind", self.kind)
            self.on_event(type_, obj)
            self.resource_version = rv


class Informer:
    """A ``ListWatch`` feeding a cache of the latest object per key, with change handlers.

    ``on_add(obj)``, ``on_update(old, new)`` and ``on_delete(last_known)`` run after
    the cache holds the change; ``on_sync()`` after each (re-)list has been applied.
    ``on_change(obj)`` is the common case of one handler for all three: it gets the
    added object, the new one of an update, the last known one of a delete, wherever
    ``on_add``, ``on_update`` or ``on_delete`` is not given. ``on_gone(cached, last)``
    also runs on a delete, with the version the cache held before it (``last`` is the
    delete's own, which may differ: an object dropping out of a label selector).
    ``wait`` blocks until a predicate holds after some change, bookmark or list: tests
    and callers use it to know the informer has seen a given write (the proof that a
    handler had its chance to react).
    """

    def __init__(
        self,
        kube: Source,
        api_version: str,
        kind: str,
        *,
        on_change: Callable[[Obj], object] = lambda obj: None,
        on_add: Callable[[Obj], object] | None = None,
        on_update: Callable[[Obj, Obj], object] | None = None,
        on_delete: Callable[[Obj], object] | None = None,
        on_gone: Callable[[Obj, Obj], object] | None = None,
        on_sync: Callable[[], object] = lambda: None,
        **options: Unpack[Options],
    ) -> None:
        self.on_gone = on_gone or (lambda cached, last: None)
        self.on_add = on_add or on_change
        self.on_update = on_update or (lambda old, new: on_change(new))
        self.on_delete = on_delete or on_change
        self.on_sync = on_sync
        self._cache: dict[Key, Obj] = {}
        self._cond = threading.Condition()
        self._synced = threading.Event()
        self._thread: threading.Thread | None = None
        self.handled = ""
        """The resourceVersion of the last list, event or bookmark whose handlers have run."""
        self.listwatch = ListWatch(
            kube,
            api_version,
            kind,
            on_list=self._listed,
            on_event=self._event,
            on_bookmark=self._bookmark,
            **options,
        )

    # -- reading the cache ----------------------------------------------------------------

    def get(self, namespace: str, name: str) -> Obj | None:
        """The latest object seen under that key, or None (not there, or not listed yet)."""
        with self._cond:
            return self._cache.get((namespace, name))

    def items(self) -> list[Obj]:
        """Every cached object, in key order."""
        with self._cond:
            return [self._cache[k] for k in sorted(self._cache)]

    def keys(self) -> list[Key]:
        with self._cond:
            return sorted(self._cache)

    @property
    def synced(self) -> bool:
        """Whether the first list has been applied to the cache."""
        return self._synced.is_set()

    def wait_synced(self, timeout: float | None = None) -> bool:
        return self._synced.wait(timeout)

    def wait(self, predicate: Callable[[], T], timeout: float | None = None) -> T:
        """Block until ``predicate()`` is truthy (checked after every change); its value.

        Raises ``TimeoutError`` naming the informer when ``timeout`` passes first.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._cond:
            while True:
                result = predicate()
                if result:
                    return result
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    raise TimeoutError(f"{self.listwatch!r}: condition not met in {timeout}s")
                self._cond.wait(left)

    # -- lifecycle --------------------------------------------------------------------------

    def start(self) -> None:
        """Follow the kind on a daemon thread."""
        self._thread = threading.Thread(
            target=self.listwatch.run, name=f"informer-{self.listwatch.kind}", daemon=True
        )
        self._thread.start()

    def run(self) -> None:
        """Follow the kind on the calling thread until ``stop``."""
        self.listwatch.run()

    def stop(self, timeout: float = 1.0) -> None:
        """Ask the thread to end (it ends at the latest when the server ends its watch)."""
        self.listwatch.stop.set()
        if self._thread is not None:
            self._thread.join(timeout)

    def end(self) -> None:
        """Stop following, this informer alone (its ``stop`` event may be shared); not
        waited for (``ListWatch.end``)."""
        self.listwatch.end()

    @property
    def running(self) -> bool:
        """Its thread is following the kind (started, not ended yet)."""
        return self._thread is not None and self._thread.is_alive()

    # -- feeding the cache -------------------------------------------------------------------

    def _listed(self, items: list[Obj], resource_version: str) -> None:
        fresh = {key_of(obj): obj for obj in items}
        with self._cond:
            old = self._cache
            self._cache = dict(fresh)
        for key, obj in fresh.items():
            before = old.get(key)
            if before is None:
                self.on_add(obj)
            elif resource_version_of(before) != resource_version_of(obj):
                self.on_update(before, obj)
        for key, gone in old.items():
            if key not in fresh:
                self.on_gone(gone, gone)
                self.on_delete(gone)
        self._synced.set()
        self.on_sync()
        self._notify(resource_version)

    def _event(self, type_: str, obj: Obj) -> None:
        key = key_of(obj)
        with self._cond:
            before = self._cache.get(key)
            if type_ == "DELETED":
                self._cache.pop(key, None)
            else:
                self._cache[key] = obj
        if type_ == "DELETED":
            self.on_gone(before if before is not None else obj, obj)
            self.on_delete(obj)
        elif before is None:
            self.on_add(obj)
        else:
            self.on_update(before, obj)
        self._notify(resource_version_of(obj))

    def _bookmark(self, resource_version: str) -> None:
        self._notify(resource_version)

    def _notify(self, resource_version: str) -> None:
        with self._cond:
            self.handled = resource_version or self.handled
            self._cond.notify_all()
