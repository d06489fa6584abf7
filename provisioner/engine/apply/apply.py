"""Install one revision of a bundle: preflight, apply phase by phase, prune, record.

The centre of the flow. ``install`` takes a loaded ``Bundle`` and a ``Kube``
adapter and:

1. prepares every object (``preflight.prepare``: owner label, install
   namespace, digest annotation; unknown kinds refused with file and document);
2. preflights ownership (an object owned by another deployment is never taken
   over; an unowned one only with ``adopt``) and CRD upgrade safety, reading
   the live objects in bulk (``preflight``);
3. records *previous | current* in the inventory before writing anything else,
   so an object applied by a run that fails part way is still pruned later;
4. applies the ordering phases one after another with server-side apply
   (field manager ``rukpak``), objects inside a phase concurrently with a
   bounded pool; an object whose live copy already is what it would apply
   (``ownership.stale_reason``) is left alone, so re-installing unchanged
   content sends no writes; after the CRD phase it waits until the CRDs are
   Established and served; a failing phase stops the run naming every failed
   object; fields ``Options.ignore`` names are sent when an object is created and
   left to the writer that owns them afterwards (``engine.ignore.shape``);
5. prunes what the previous revision applied and this one does not, in
   reverse phase order (``deletion``: only objects still labelled as ours),
   and records *current* alone (the inventory is only written when it changes).

Writes that fail for a temporary reason (5xx, 429, conflicts) are retried
with the project's one backoff (``rukpak.common.backoff``).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

from provisioner.engine import pool
from provisioner.engine.apply import (
    deletion,
    inventory,
    inventorystore,
    optional,
    ordering,
    ownership,
    preflight,
)
from provisioner.engine.apply import ignore as ignore_rules
from provisioner.engine.apply.deletion import DeletionPolicy
from provisioner.engine.bundle.formats import Bundle, Manifest
from provisioner.engine.errors import ApplyFailed
from provisioner.engine.health import health
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef
from rukpak.common import errors
from rukpak.common.backoff import Backoff, retry

Progress = Callable[[str], None]
__all__ = ["Applied", "DeletionPolicy", "Options", "Result", "install"]


def no_progress(_: str) -> None:
    pass


@dataclass(frozen=True)
class Options:
    name: str
    """The deployment's name: the owner label's value and the inventory's key."""
    namespace: str = "default"
    """Install namespace for namespaced objects that do not name one."""
    adopt: bool = False
    """Take over existing objects no deployment owns (never ones another deployment owns)."""
    system_namespace: str = inventory.DEFAULT_SYSTEM_NAMESPACE
    concurrency: int = 16
    crd_timeout: float = 60.0
    """Seconds to wait for applied CRDs to become Established and served."""
    prune: bool = True
    ignore: tuple[ignore_rules.Rule, ...] = ()
    """Fields another writer may own (``engine.ignore``): sent when an object is created,
    left to their other owner afterwards."""


@dataclass(frozen=True)
class Applied:
    manifest: Manifest
    """The prepared manifest (owner label, namespace defaulted), with its bundle source."""
    live: Obj
    """The object as the API server returned it after apply (or as read, when unchanged)."""
    unchanged: bool = False
    """The live object already was what applying would make it: no request was sent."""

    @property
    def ref(self) -> ObjectRef:
        return self.manifest.ref


@dataclass
class Result:
    applied: list[Applied] = field(default_factory=list)
    pruned: list[ObjectRef] = field(default_factory=list)
    orphaned: list[ObjectRef] = field(default_factory=list)
    skipped: list[tuple[ObjectRef, str]] = field(default_factory=list)
    """Refs left alone during deletion, each with the reason."""
    optional: list[optional.Skipped] = field(default_factory=list)
    """Optional objects (``core.rukpak.io/optional: "true"``) not applied: their API is not
    served yet (``optional.summary`` says so in one line)."""

    def add(self, deleted: deletion.Deleted) -> None:
        self.pruned += deleted.pruned
        self.orphaned += deleted.orphaned
        self.skipped += deleted.skipped


# -- apply ------------------------------------------------------------------------


def _wait_crds(kube: Kube, applied: Sequence[Applied], timeout: float) -> None:
    deadline = time.monotonic() + timeout
    for a in applied:
        spec = a.manifest.obj.get("spec") or {}
        kind = (spec.get("names") or {}).get("kind", "")
        served = [v["name"] for v in spec.get("versions") or [] if v.get("served")]
        while True:
            live = kube.get(a.ref)
            state = health.crd(live) if live is not None else health.Health(False, "not found")
            if state.ready:
                group = spec.get("group")
                if all(kube.serves(f"{group}/{version}", kind) for version in served):
                    break
                state = health.Health(False, "established but not yet served")
            if "names not accepted" in state.reason:
                raise ApplyFailed(
                    "crds", [(a.manifest.describe(), errors.InvalidArgument(state.reason))]
                )
            if time.monotonic() > deadline:
                raise ApplyFailed(
                    "crds",
                    [
                        (
                            a.manifest.describe(),
                            errors.DeadlineExceeded(f"not established: {state.reason}"),
                        )
                    ],
                )
            time.sleep(0.2)


RETRYABLE = (errors.Unavailable, errors.Aborted)
"""Server busy or a write conflict: worth another attempt with backoff."""

WRITE_BACKOFF = Backoff(base=0.2, factor=3.0, cap=5.0)
"""0.2 s, 0.6 s, 1.8 s between the attempts of one write."""


def apply_with_retry(kube: Kube, obj: Obj, *, attempts: int = 4) -> Obj:
    """``kube.apply`` retrying temporary failures (5xx, 429, conflicts) with backoff."""
    return retry(
        lambda: kube.apply(obj),
        attempts=attempts,
        backoff=WRITE_BACKOFF,
        retryable=lambda err: isinstance(err, RETRYABLE),
        sleep=time.sleep,
    )


def apply_phase(
    kube: Kube,
    phase: ordering.Phase,
    options: Options,
    *,
    live: Mapping[ObjectRef, Obj] | None = None,
    progress: Progress = no_progress,
) -> list[Applied]:
    """Apply one phase's objects concurrently; ``ApplyFailed`` names every failure.

    Objects whose copy in ``live`` is already what applying would make them
    are not sent (``Applied.unchanged``).
    """
    live = live or {}
    bodies = {m.ref: _body(m, live.get(m.ref), options) for m in phase.manifests}
    unchanged = {
        m.ref
        for m in phase.manifests
        if ownership.stale_reason(bodies[m.ref], live.get(m.ref), options.name) is None
    }
    todo = [m for m in phase.manifests if m.ref not in unchanged]
    total = len(todo)
    step = max(100, total // 10)
    done = 0
    lock = threading.Lock()

    def one(m: Manifest) -> Obj:
        nonlocal done
        result = apply_with_retry(kube, bodies[m.ref])
        with lock:
            done += 1
            if done % step == 0 and done < total:
                progress(f"  {phase.name}: {done}/{total}")
        return result

    sent = pool.run_all(todo, one, concurrency=options.concurrency)
    failures = [(m.describe(), got) for m, got in sent if isinstance(got, errors.RukpakError)]
    if failures:
        raise ApplyFailed(phase.name, failures)
    after = {m.ref: got for m, got in sent if not isinstance(got, errors.RukpakError)}
    applied = [
        Applied(m, live[m.ref], unchanged=True) if m.ref in unchanged else Applied(m, after[m.ref])
        for m in phase.manifests
    ]
    if phase.spec.wait_established:
        progress(f"waiting for {len(applied)} CRDs to be established")
        _wait_crds(kube, applied, options.crd_timeout)
    return applied


def _body(manifest: Manifest, live: Obj | None, options: Options) -> Obj:
    """What to apply for ``manifest``: its object, less what ``options.ignore`` leaves to
    another writer once the object exists."""
    if not options.ignore:
        return manifest.obj
    pointers = ignore_rules.pointers_for(options.ignore, manifest.obj)
    return ignore_rules.shape(manifest.obj, live, pointers=pointers) if pointers else manifest.obj


def install(
    kube: Kube, bundle: Bundle, options: Options, *, progress: Progress = no_progress
) -> Result:
    """Make the cluster hold ``bundle`` as deployment ``options.name``; see the module doc.

    Idempotent: installing the same bundle twice changes nothing the second
    time, and sends no write requests (unchanged objects are not re-applied,
    an unchanged inventory is not rewritten).
    """
    kept, set_aside = optional.split(bundle.manifests, kube.serves)
    if set_aside:
        progress(optional.summary(set_aside))
        bundle = Bundle(bundle.format, tuple(kept))
    manifests = preflight.prepare(kube, bundle, name=options.name, namespace=options.namespace)
    current = [m.ref for m in manifests]
    progress(f"{len(manifests)} objects; checking ownership")
    live = preflight.check_ownership(
        kube, manifests, name=options.name, adopt=options.adopt, concurrency=options.concurrency
    )
    preflight.check_crds(kube, manifests, live)

    previous = inventorystore.read_inventory(
        kube, options.name, system_namespace=options.system_namespace
    )
    previous_refs = previous.refs if previous else frozenset()
    stored = inventorystore.write_inventory(
        kube,
        inventory.Inventory(
            options.name, options.namespace, inventory.merged(previous_refs, current)
        ),
        system_namespace=options.system_namespace,
        stored=previous,
    )

    result = Result(optional=set_aside)
    total, done, unchanged = len(manifests), 0, 0
    for phase in ordering.phases(manifests):
        progress(f"applying {phase.name}: {len(phase.manifests)} objects")
        applied = apply_phase(kube, phase, options, live=live, progress=progress)
        result.applied += applied
        done += len(applied)
        unchanged += sum(1 for a in applied if a.unchanged)
        progress(f"applied {done}/{total} ({unchanged} already up to date)")

    if options.prune and previous_refs:
        doomed = inventory.plan_prune(previous_refs, current)
        if doomed:
            progress(f"pruning {len(doomed)} objects")
        result.add(
            deletion.delete_owned(
                kube, doomed, options.name, policy="Delete", concurrency=options.concurrency
            )
        )
    inventorystore.write_inventory(
        kube,
        inventory.Inventory(options.name, options.namespace, frozenset(current)),
        system_namespace=options.system_namespace,
        stored=stored,
    )
    return result
