"""Health of installed objects from watches: the manager's ``Healthy`` without polling.

Sits under ``controller``: an informer follows the inventory ConfigMaps in the system
namespace (``engine.inventory``); for every kind an inventory lists, an informer follows
the objects of that kind that carry the owner label (``core.rukpak.io/owner-name``),
cluster-wide, so only what RukPak installed is cached. Those informers read as the
deployment's instance identity (``user_of``: its ServiceAccount, impersonated): the
manager itself is not allowed to read arbitrary kinds (Secrets among them), and a
deployment whose ServiceAccount may not list a kind it installed stays of unknown health
rather than being judged with rights it does not have. The default instance identity
(``wide_user``, allowed everything) has one informer per kind, cluster-wide; any other
identity one per kind and namespace, so an account granted only the namespaces it
installs into can follow what it installed. When a deployment's account changes, its
objects are read as the new one from its next look, and the informers only the old one
read through end; so do those only an uninstalled deployment read through.
``health(name)`` then judges a deployment's inventoried objects with ``engine.health``
from the caches (no request), and every change of an inventory or an owned object calls
``on_change(owner)`` so the controller looks at that BundleDeployment at once, instead
of on a timer. ``lookup`` serves the same caches to drift detection of run-to-completion
instances, and ``last_good`` the version of an object seen just before its field set
changed or it went away (keyed by the hash of our fields then, so the install record
says which one is good): the manager restores drift from it without a run
(``engine.restore``). At most ``LAST_GOOD_LIMIT`` such versions are kept, the oldest
dropped first.

An object whose owner label was removed drops out of the label-selected
cache and is reported "not found"; a kind whose first list has not arrived
yet makes the health unknown (None) rather than wrong. When the API server refuses an
informer (the account may not list or watch the kind), every deployment reading through
it is looked at again and ``unknown_why(name)`` says why its health is unknown: the
account, the kind, the server's words and what to grant.
"""

from __future__ import annotations

import functools
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable

from provisioner.engine.apply import appliedrecord, inventory
from provisioner.engine.apply.ownership import applied_fields
from provisioner.engine.health import health
from provisioner.engine.kube.informers import InformerSet
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import OWNER_LABEL, Obj, ObjectRef, owner_of
from rukpak.common import errors
from rukpak.kube import listwatch

log = logging.getLogger("rukpak.manager")

Verdict = tuple[bool, str]
"""(healthy, message)."""
UserOf = Callable[[str], str | None]
"""A BundleDeployment's name -> the user its installed objects are read as (its
instance's ServiceAccount); None: the caller's own identity."""
LAST_GOOD_LIMIT = 4096


class HealthWatch:
    """The inventories and the objects they list, cached per reader; see the module
    docstring; ``start`` it before use."""

    def __init__(
        self,
        kube: Kube,
        *,
        system_namespace: str,
        on_change: Callable[[str], None],
        stop: threading.Event,
        watch_timeout: int = 60,
        user_of: UserOf = lambda _owner: None,
        wide_user: str | None = None,
    ) -> None:
        self._clients: dict[str | None, Kube] = {None: kube}
        """Whom objects are read as -> the client reading as them (None: the manager)."""
        self.system_namespace = system_namespace
        self.on_change = on_change
        self.user_of = user_of
        self.wide_user = wide_user
        self._caches = InformerSet(kube, stop=stop, watch_timeout=watch_timeout)
        self._lock = threading.Lock()
        self._kinds: dict[tuple[str | None, str, str, str], listwatch.Informer] = {}
        """(user, apiVersion, kind, namespace or "" for all) -> the informer of the owned
        objects that user sees there."""
        self._readers: dict[tuple[str | None, str, str, str], set[str]] = {}
        """The same keys -> the deployments whose health is read through that informer."""
        self._read_as: dict[str, str | None] = {}
        """A deployment -> the user its objects were last read as."""
        self._last_good: OrderedDict[tuple[str, str], Obj] = OrderedDict()
        self.inventories = self._caches.add(
            "v1",
            "ConfigMap",
            namespace=system_namespace,
            label_selector=f"{inventory.INVENTORY_LABEL}=true",
            on_change=self._inventory,
            on_delete=self._inventory_gone,
        )

    def start(self) -> None:
        self._caches.start()

    def informers(self) -> list[listwatch.Informer]:
        return list(self._caches)

    def _inventory(self, cm: Obj) -> None:
        try:
            inv = inventory.from_configmap(cm)
        except (KeyError, ValueError, TypeError, errors.RukpakError) as err:
            log.warning("msg='unreadable inventory' configmap=%s error=%r", cm.get("metadata"), err)
            return
        for ref in inv.refs:
            self._informer(inv.name, ref)
        self.on_change(inv.name)

    def _informer(self, owner: str, ref: ObjectRef) -> listwatch.Informer:
        """The informer of ``ref``'s kind as ``owner``'s user, made and started if new (a
        deployment whose ServiceAccount changed, or not known yet when its inventory was
        first seen, is followed from its next look; the informers only its old account
        read through end then, ``_moved``)."""
        user = self.user_of(owner)
        namespace = "" if user == self.wide_user else ref.namespace
        key = (user, ref.api_version, ref.kind, namespace)
        with self._lock:
            for stale in self._moved(owner, user):
                self._caches.drop(stale)
            self._readers.setdefault(key, set()).add(owner)
            informer = self._kinds.get(key)
            if informer is not None:
                return informer
            client = self._clients.get(user)
            if client is None and user is not None:  # one per user, on the manager's pool
                client = self._clients[user] = self._clients[None].impersonating(user)
            informer = self._caches.add(
                ref.api_version,
                ref.kind,
                namespace=namespace,
                label_selector=OWNER_LABEL,
                kube=client,
                on_change=self._owned,
                on_update=self._updated,
                on_gone=self._gone,
                on_error=functools.partial(self._refused, key),
            )
            self._kinds[key] = informer
        self._caches.start()
        return informer

    def _inventory_gone(self, cm: Obj) -> None:
        """A deployment's inventory was deleted (it was uninstalled): the informers only it
        read through end."""
        try:
            name = inventory.from_configmap(cm).name
        except (KeyError, ValueError, TypeError, errors.RukpakError):
            return  # never read, so nothing was made for it
        with self._lock:
            for stale in self._forget(name, self._read_as.pop(name, None)):
                self._caches.drop(stale)
        self.on_change(name)

    def _moved(self, owner: str, user: str | None) -> list[listwatch.Informer]:
        """Record that ``owner`` is read as ``user`` now; when that is another user than
        before (its ServiceAccount changed), what ``_forget`` returns. Under ``_lock``."""
        before = self._read_as.get(owner, user)
        self._read_as[owner] = user
        return [] if before == user else self._forget(owner, before)

    def _forget(self, owner: str, before: str | None) -> list[listwatch.Informer]:
        """``owner`` reads through none of its informers (made as ``before``) any more:
        those nobody else reads through are forgotten, with ``before``'s client when no
        informer is left for it, and returned to be dropped. Under ``_lock``."""
        stale: list[listwatch.Informer] = []
        for key in [k for k, readers in self._readers.items() if owner in readers]:
            readers = self._readers[key]
            readers.discard(owner)
            if not readers:
                del self._readers[key]
                informer = self._kinds.pop(key, None)
                if informer is not None:
                    stale.append(informer)
        if before is not None and all(k[0] != before for k in self._kinds):
            self._clients.pop(before, None)
        return stale

    def _refused(self, key: tuple[str | None, str, str, str], _message: str) -> None:
        """An informer started failing: look again at what reads through it (its
        ``Healthy`` says why it is unknown)."""
        with self._lock:
            readers = sorted(self._readers.get(key, ()))
        for owner in readers:
            self.on_change(owner)

    def unknown_why(self, name: str) -> str:
        """Why deployment ``name``'s health is unknown when a kind it installed cannot be
        read as its account (the API server's refusal); "" otherwise."""
        for ref in self._refs(name) or ():
            informer = self._informer(name, ref)
            error = informer.listwatch.error
            if not informer.synced and error:
                user = self.user_of(name) or "the manager"
                where = f" in namespace {ref.namespace}" if ref.namespace else ""
                return (
                    f"cannot read the {ref.kind} objects it installed{where} as {user}: "
                    f"{error}; grant that account get, list and watch on them"
                )
        return ""

    def _owned(self, obj: Obj) -> None:
        owner = owner_of(obj)
        if owner:
            self.on_change(owner)

    def _updated(self, old: Obj, new: Obj) -> None:
        if applied_fields(old) != applied_fields(new) or owner_of(old) != owner_of(new):
            self._keep(old)
        self._owned(new)

    def _gone(self, cached: Obj, _last: Obj) -> None:
        self._keep(cached)

    def _keep(self, obj: Obj) -> None:
        """Remember ``obj`` as it was before a change of our fields (or its removal)."""
        fields = appliedrecord.fields_hash(obj)
        if not fields:
            return
        key = (appliedrecord.key_of(ObjectRef.of(obj)), fields)
        with self._lock:
            self._last_good[key] = obj
            self._last_good.move_to_end(key)
            while len(self._last_good) > LAST_GOOD_LIMIT:
                self._last_good.popitem(last=False)

    def last_good(self, key: str, fields: str, *, owner: str) -> Obj | None:
        """The latest version of object ``key`` (deployment ``owner``'s) seen with our
        fields hashing to ``fields`` (the cached one when it still does); None when none
        was seen."""
        with self._lock:
            kept = self._last_good.get((key, fields))
        if kept is not None:
            return kept
        live = self.lookup(appliedrecord.ref_of(key), owner=owner)
        if isinstance(live, dict) and appliedrecord.fields_hash(live) == fields:
            return live
        return None

    def lookup(self, ref: ObjectRef, *, owner: str) -> Obj | appliedrecord.Unknown | None:
        """The cached owned object ``ref`` as deployment ``owner``'s user sees it (None: not
        there); UNKNOWN before its kind syncs."""
        informer = self._informer(owner, ref)
        if not informer.synced:
            return appliedrecord.UNKNOWN
        return informer.get(ref.namespace, ref.name)

    def _refs(self, name: str) -> list[ObjectRef] | None:
        """What deployment ``name``'s inventory lists, sorted; None without a readable one."""
        cm = self.inventories.get(self.system_namespace, inventory.configmap_name(name))
        if cm is None:
            return None
        try:
            return sorted(inventory.from_configmap(cm).refs)
        except (KeyError, ValueError, TypeError, errors.RukpakError):
            return None

    def objects(self, name: str) -> list[Obj] | None:
        """The cached objects deployment ``name``'s inventory lists and it still owns (for
        ``spec.healthChecks``); None when unknown (no inventory, a kind not synced)."""
        refs = self._refs(name)
        if refs is None:
            return None
        out: list[Obj] = []
        for ref in refs:
            found = self.lookup(ref, owner=name)
            if isinstance(found, appliedrecord.Unknown):
                return None
            if found is not None and owner_of(found) == name:
                out.append(found)
        return out

    def health(self, name: str) -> Verdict | None:
        """Whether every object deployment ``name`` installed is ready; None when unknown."""
        refs = self._refs(name)
        if refs is None:
            return None
        bad: list[str] = []
        for ref in refs:
            informer = self._informer(name, ref)
            if not informer.synced:
                return None
            obj = informer.get(ref.namespace, ref.name)
            if obj is not None and owner_of(obj) != name:
                bad.append(f"{ref}: no longer owned by it")
                continue
            verdict = health.assess(obj)
            if not verdict.ready:
                bad.append(f"{ref}: {verdict.reason or 'not ready'}")
        if bad:
            more = f" (and {len(bad) - 3} more)" if len(bad) > 3 else ""
            return False, "; ".join(bad[:3]) + more
        return True, f"all {len(refs)} installed objects are ready"
