"""Benchmark: upgrades in dependency order, teardown in reverse order, cycles refused at
admission (issue 39 item 4).

Where it sits: a module of ``tests.bench`` (``python -m tests.bench dependencies``). It
starts etcd + kube-apiserver in the work dir (``bench_apply.start_cluster``, stopped by
pid), installs the CRDs and runs the manager's controller in this process with
``tests.manager_harness``, as ``tests/test_dependency_order.py`` does. No kubelet runs: a
``Kubelet`` here plays every run the manager starts as soon as it is listed (polled every
20 ms), on ``PLAYERS`` threads, installing its content with the apply engine and leaving
the record a run would. Images are pinned by made-up digests (the resolver returns them as
is), each naming the bundle a run of it installs.

A set is a CRD provider (a Widget CRD) and ``USERS`` BundleDeployments of one Widget each;
version 2 adds a field to the CRD and sets it in every Widget. Per round, for a set with
``spec.dependsOn`` (each user on the provider) and for the same set without (the baseline),
both made fresh and installed at version 1 first:

- **changed together**: every source switched to version 2, the provider first (as
  ``kubectl apply -f`` of all would); timed until every one is Installed on revision 2.
  From the watch history (resourceVersions: one sequence across kinds) the benchmark
  counts the users that moved (their run created, or revision 2 installed) before the
  provider's revision 2 was Installed and Healthy: 0 with ``dependsOn`` is a target;
  the baseline's count shows what the order costs and buys;
- **deleted at once**: all of the set deleted, the provider first; timed until all are
  gone (``DELETE_TIMEOUT`` at most), then the BundleDeployments still held by a finalizer
  are counted (target 0), and, with ``dependsOn``, the users gone after the provider's CRD
  started to go (target 0).

Before the controller starts, the manager's admission webhook is served on a loopback port
(``tests.webhook_harness``, the shipped BundleDeployment hook, failurePolicy Fail):
a create that closes a cycle (``a`` dependsOn ``b``, which dependsOn ``a``) is refused
``TRIES`` times, against a plain create it admits (deleted after each, untimed),
alternating; medians.
"""

from __future__ import annotations

import hashlib
import threading
import time
import uuid
from collections.abc import Callable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import contextmanager, suppress
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from provisioner.engine.apply import apply
from provisioner.engine.bundle import formats
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef, condition
from provisioner.manager import model
from provisioner.manager.acting import actuate
from provisioner.manager.planning import runs
from provisioner.manager.serving import webhook
from rukpak.common import errors
from tests import manager_harness as harness
from tests import webhook_harness
from tests.bench import Result, against, progress
from tests.bench.bench_apply import start_cluster
from tests.bundles import crd, write_bundle
from tests.crd_helpers import install_crds
from tests.install_helpers import bd_v2
from tests.plan_helpers import as_is
from tests.polling import until

USERS = 20
ROUNDS = 2
TRIES = 20
PLAYERS = 4
"""Runs played at once (a kubelet starts pods side by side)."""
DELETE_TIMEOUT = 180.0
SYSTEM_NS = "rukpak-bench-deps"
USERS_NS = "deps-users"
REPOSITORY = "registry.example/bench/deps"
HOOK = "bundledeployment-dependencies.core.rukpak.io"
SHIPPED_HOOKS = Path(__file__).resolve().parents[2] / "deploy/webhook"
SELECTOR_LABEL = "rukpak-bench-cycles"


def _bd_ref(name: str) -> ObjectRef:
    return actuate.bd_ref(name, model.API_VERSION_V2)


# -- the kubelet's part ------------------------------------------------------------------


class Kubelet:
    """Plays every active run of the system namespace once, as soon as it is listed.

    ``content`` maps an image digest to the bundle a run of it installs; ``namespaces``
    a BundleDeployment to its install namespace. A run whose install fails ends Failed
    (``failed_runs`` names its BundleDeployment); a run that could not be played at all is
    kept in ``failures``, raised by ``check``.
    """

    def __init__(self, kube: Kube) -> None:
        self.kube = kube
        self.content: dict[str, formats.Bundle] = {}
        self.namespaces: dict[str, str] = {}
        self.failures: list[str] = []
        self.failed_runs: list[str] = []
        self._played: set[str] = set()
        self._stop = threading.Event()
        self._pool = ThreadPoolExecutor(max_workers=PLAYERS, thread_name_prefix="kubelet")
        self._thread = threading.Thread(target=self._loop, name="kubelet", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        self._thread.join(timeout=30)
        self._pool.shutdown(wait=True)

    def check(self) -> None:
        if self.failures:
            raise RuntimeError(f"runs failed to play: {self.failures[:3]}")

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                items, _ = self.kube.list("v1", "Pod", namespace=SYSTEM_NS)
            except errors.RukpakError as exc:
                progress(f"dependencies: listing runs failed: {exc}")
                items = []
            for pod in items:
                name = pod["metadata"]["name"]
                if name in self._played or not runs.is_active(pod):
                    continue
                self._played.add(name)
                future: Future[None] = self._pool.submit(self._play, pod)
                future.add_done_callback(self._failed)
            self._stop.wait(0.02)

    def _failed(self, future: Future[None]) -> None:
        exc = future.exception()
        if exc is not None:
            self.failures.append(repr(exc))

    def _play(self, run: Obj) -> None:
        """Install the run's content; a run that cannot ends Failed, as its pod would."""
        bd_name = run["metadata"]["labels"][model.BD_LABEL]
        bundle = self.content[harness.mounted(run).rsplit("@", 1)[1]]
        options = apply.Options(
            name=bd_name, namespace=self.namespaces[bd_name], system_namespace=SYSTEM_NS
        )
        try:
            harness.play_run(self.kube, run, bundle, options)
        except errors.RukpakError as exc:
            self.failed_runs.append(bd_name)
            progress(f"dependencies: a run of {bd_name} failed: {exc}")
            pod = ObjectRef("", "v1", "Pod", SYSTEM_NS, run["metadata"]["name"])
            harness.end_container(self.kube, pod, "run", message=str(exc)[:200], ok=False)


# -- a set: a CRD provider and its users --------------------------------------------------


@dataclass
class Set:
    """One round's provider and users; ``ordered``: the users depend on the provider."""

    label: str
    ordered: bool
    group: str
    provider: str
    users: list[str]
    refs: dict[tuple[str, int], str] = field(default_factory=dict)

    @property
    def names(self) -> list[str]:
        return [self.provider, *self.users]


def _make_set(ordered: bool, round_: int) -> Set:
    tag = f"{'dep' if ordered else 'flat'}{round_}-{uuid.uuid4().hex[:4]}"
    return Set(
        label="with dependsOn" if ordered else "without dependsOn",
        ordered=ordered,
        group=f"{tag}.example.com",
        provider=f"{tag}-crds",
        users=[f"{tag}-user-{i:02d}" for i in range(USERS)],
    )


def _widget(group: str, user: str, version: int) -> Obj:
    spec: Obj = {"size": version}
    if version >= 2:
        spec["colour"] = "blue"  # the field the provider's version 2 adds
    return {
        "apiVersion": f"{group}/v1",
        "kind": "Widget",
        "metadata": {"name": user, "namespace": USERS_NS},
        "spec": spec,
    }


def _publish(kubelet: Kubelet, workdir: Path, name: str, version: int, docs: list[Obj]) -> str:
    """A made-up pinned image of ``docs``; a run of it installs them."""
    digest = "sha256:" + hashlib.sha256(f"{name}:{version}".encode()).hexdigest()
    kubelet.content[digest] = write_bundle(workdir / name / str(version), {"00.yaml": docs})
    return f"{REPOSITORY}/{name}@{digest}"


def _prepare(kubelet: Kubelet, workdir: Path, s: Set) -> None:
    for version in (1, 2):
        props: Obj = {"size": {"type": "integer"}}
        if version >= 2:
            props["colour"] = {"type": "string"}
        s.refs[s.provider, version] = _publish(
            kubelet, workdir, s.provider, version, [crd(s.group, spec_props=props)]
        )
        for user in s.users:
            docs = [_widget(s.group, user, version)]
            s.refs[user, version] = _publish(kubelet, workdir, user, version, docs)
    kubelet.namespaces[s.provider] = "default"
    kubelet.namespaces.update(dict.fromkeys(s.users, USERS_NS))


def _listed(kube: Kube, s: Set) -> dict[str, Obj]:
    items, _ = kube.list(model.API_VERSION_V2, model.BUNDLE_DEPLOYMENT)
    wanted = set(s.names)
    return {bd["metadata"]["name"]: bd for bd in items if bd["metadata"]["name"] in wanted}


def _installed_at(bd: Obj | None, revision: int, *, healthy: bool = False) -> bool:
    if bd is None or (bd.get("status") or {}).get("installedRevision") != revision:
        return False
    kinds = ("Installed", "Healthy") if healthy else ("Installed",)
    return all((condition(bd, k) or {}).get("status") == "True" for k in kinds)


def _all_at(kube: Kube, s: Set, revision: int) -> bool:
    live = _listed(kube, s)
    return all(_installed_at(live.get(n), revision) for n in s.names)


def _install(kube: Kube, s: Set) -> None:
    """The set created at version 1, the provider first (the users' Widgets need its CRD)
    and waited for until all are Installed and Healthy."""
    kube.create(bd_v2(s.provider, s.refs[s.provider, 1], installNamespace="default"))
    until(
        lambda: _installed_at(kube.get(_bd_ref(s.provider)), 1, healthy=True),
        timeout=120,
        what=f"{s.provider} installed",
    )
    for user in s.users:
        needs = {"dependsOn": [{"name": s.provider}]} if s.ordered else {}
        kube.create(bd_v2(user, s.refs[user, 1], installNamespace=USERS_NS, **needs))

    def ready() -> bool:
        live = _listed(kube, s)
        return all(_installed_at(live.get(n), 1, healthy=True) for n in s.names)

    until(ready, timeout=120, what=f"the set {s.label} installed", interval=0.1)


def _history(kube: Kube, api_version: str, kind: str, since: str, **options: str) -> list[Obj]:
    """Every (type, object) event after resourceVersion ``since``, in the store's order."""
    return [
        {"type": type_, "object": obj, "rv": int(obj["metadata"]["resourceVersion"])}
        for type_, obj in kube.watch(
            api_version, kind, resource_version=since, timeout_seconds=2, **options
        )
    ]


def _first(events: list[Obj], predicate: Callable[[str, Obj], bool]) -> int | None:
    return next((e["rv"] for e in events if predicate(e["type"], e["object"])), None)


def _moved_early(kube: Kube, s: Set, since: str) -> tuple[int, str]:
    """The users whose run was created, or whose revision 2 was installed, before the
    provider's revision 2 was Installed and Healthy (in the store's order); how it went."""
    bds = _history(kube, model.API_VERSION_V2, model.BUNDLE_DEPLOYMENT, since)
    pods = _history(kube, "v1", "Pod", since, namespace=SYSTEM_NS)
    ready = _first(
        bds,
        lambda _, o: o["metadata"]["name"] == s.provider and _installed_at(o, 2, healthy=True),
    )
    if ready is None:
        raise AssertionError(f"{s.provider}: revision 2 Installed and Healthy not in the history")
    early: list[str] = []
    for user in s.users:

        def ran_(type_: str, obj: Obj, user: str = user) -> bool:
            labels = obj["metadata"].get("labels") or {}
            return type_ == "ADDED" and labels.get(model.BD_LABEL) == user

        def moved_(_: str, obj: Obj, user: str = user) -> bool:
            revision = (obj.get("status") or {}).get("installedRevision")
            return bool(obj["metadata"]["name"] == user and revision == 2)

        ran, moved = _first(pods, ran_), _first(bds, moved_)
        if ran is None or moved is None:
            raise AssertionError(f"{user}: its run or revision 2 not in the history")
        if min(ran, moved) <= ready:
            early.append(user)
    return len(early), f"provider ready at rv {ready}; moved before it: {early[:3]}"


def _change(kube: Kube, s: Set) -> tuple[float, int, str]:
    """Every source switched to version 2, the provider first; the seconds until all are
    Installed on revision 2, and the users that moved early."""
    _, since = kube.list(model.API_VERSION_V2, model.BUNDLE_DEPLOYMENT)
    started = time.monotonic()
    for name in s.names:
        source = {"type": "image", "image": {"ref": s.refs[name, 2]}}
        kube.merge_patch(_bd_ref(name), {"spec": {"source": source}})
    until(
        lambda: _all_at(kube, s, 2),
        timeout=120,
        what=f"the set {s.label} at revision 2",
        interval=0.02,
    )
    took = time.monotonic() - started
    early, how = _moved_early(kube, s, since)
    return took, early, how


def _delete(kube: Kube, s: Set) -> tuple[float, int, int]:
    """All of the set deleted at once, the provider first; the seconds until all are gone
    (``DELETE_TIMEOUT`` if not), the BundleDeployments still held by a finalizer, and the
    users gone only after the CRD started to go (reverse order broken)."""
    _, since = kube.list(model.API_VERSION_V2, model.BUNDLE_DEPLOYMENT)
    started = time.monotonic()
    for name in s.names:
        kube.delete(_bd_ref(name))
    with suppress(TimeoutError):  # what is left is counted below
        until(
            lambda: not _listed(kube, s),
            timeout=DELETE_TIMEOUT,
            what=f"{s.label} gone",
            interval=0.02,
        )
    took = time.monotonic() - started
    left = _listed(kube, s)
    stuck = [n for n, bd in left.items() if bd["metadata"].get("finalizers")]
    if left:
        progress(f"dependencies: {s.label}: left after {took:.0f}s, held: {sorted(stuck)}")
        for name in left:  # release them, so later rounds start clean
            kube.merge_patch(_bd_ref(name), {"metadata": {"finalizers": None}})
    crds = _history(kube, "apiextensions.k8s.io/v1", "CustomResourceDefinition", since)
    crd_going = _first(
        crds,
        lambda _, o: (
            o["metadata"]["name"] == f"widgets.{s.group}"
            and bool(o["metadata"].get("deletionTimestamp"))
        ),
    )
    if crd_going is None:
        raise AssertionError(f"{s.label}: the CRD's deletion is not in the history")
    bds = _history(kube, model.API_VERSION_V2, model.BUNDLE_DEPLOYMENT, since)
    late = 0
    for user in s.users:

        def deleted(type_: str, obj: Obj, user: str = user) -> bool:
            return type_ == "DELETED" and bool(obj["metadata"]["name"] == user)

        gone = _first(bds, deleted)
        if gone is None or gone > crd_going:
            late += 1
    return took, len(stuck), late


# -- admission ----------------------------------------------------------------------------


def _cycles_hook(base_url: str) -> Obj:
    """The shipped BundleDeployment webhook, served at ``base_url``, for the labelled
    BundleDeployments only; failurePolicy Fail (a webhook that does not answer fails)."""
    shipped = yaml.safe_load((SHIPPED_HOOKS / "validatingwebhookconfiguration.yaml").read_text())
    hook: Obj = next(h for h in shipped["webhooks"] if h["name"] == HOOK)
    hook["clientConfig"] = {"url": f"{base_url}{webhook.BD_PATH}"}
    hook["objectSelector"] = {"matchLabels": {SELECTOR_LABEL: "yes"}}
    hook["failurePolicy"] = "Fail"
    return hook


def _labelled(name: str, *needs: str) -> Obj:
    doc = bd_v2(name, f"{REPOSITORY}/cycle@sha256:" + "1" * 64)
    if needs:
        doc["spec"]["dependsOn"] = [{"name": n} for n in needs]
    doc["metadata"]["labels"] = {SELECTOR_LABEL: "yes"}
    return doc


def _timed_create(kube: Kube, doc: Obj) -> tuple[float, str]:
    """Seconds the create took, and the refusal's message ("" when it was admitted)."""
    started = time.monotonic()
    try:
        kube.create(doc)
    except errors.RukpakError as exc:
        return time.monotonic() - started, exc.message
    return time.monotonic() - started, ""


def _admission(kube: Kube) -> list[Result]:
    """Cycle-closing creates refused against plain creates admitted, through the webhook."""

    def probe() -> bool:
        name = f"probe-{uuid.uuid4().hex[:5]}"
        kube.create(_labelled(name))
        kube.delete(_bd_ref(name))
        return True

    refused: list[float] = []
    admitted: list[float] = []
    with webhook_harness.serving(
        kube,
        SYSTEM_NS,
        "rukpak-bench-cycles",
        _cycles_hook,
        lambda old, new: {},
        deployments=webhook.deployments_from(kube),
        probe=probe,
    ):
        kube.create(_labelled("cycle-b", "cycle-a"))  # cycle-a does not exist: admitted
        expected = "spec.dependsOn closes a cycle: cycle-a -> cycle-b -> cycle-a"
        for i in range(TRIES + 1):  # the first of each is a warm-up
            took, message = _timed_create(kube, _labelled("cycle-a", "cycle-b"))
            if expected not in message:
                raise AssertionError(
                    f"a cycle-closing create was not refused naming it: {message!r}"
                )
            plain = f"plain-{i:02d}"
            took_plain, message = _timed_create(kube, _labelled(plain))
            if message:
                raise AssertionError(f"a plain create was refused: {message}")
            kube.delete(_bd_ref(plain))
            if i:
                refused.append(took)
                admitted.append(took_plain)
        kube.delete(_bd_ref("cycle-b"))
    if kube.get(_bd_ref("cycle-a")) is not None:
        raise AssertionError("a refused create was stored")
    progress(
        f"dependencies: refused {[round(x * 1000) for x in refused]} ms, "
        f"admitted {[round(x * 1000) for x in admitted]} ms"
    )
    return [
        against(
            "dependencies: create closing a dependsOn cycle -> refused naming it (webhook)",
            refused,
            admitted,
            note=(
                f"median of {TRIES} after a warm-up against a plain create admitted through the "
                f"same webhook; refused {[round(x, 3) for x in refused]}, admitted "
                f"{[round(x, 3) for x in admitted]}"
            ),
        )
    ]


# -- the run ------------------------------------------------------------------------------


@dataclass
class Figures:
    """Samples per set kind (True: with dependsOn)."""

    changed: dict[bool, list[float]] = field(default_factory=lambda: {True: [], False: []})
    early: dict[bool, list[int]] = field(default_factory=lambda: {True: [], False: []})
    deleted: dict[bool, list[float]] = field(default_factory=lambda: {True: [], False: []})
    stuck: dict[bool, list[int]] = field(default_factory=lambda: {True: [], False: []})
    late: dict[bool, list[int]] = field(default_factory=lambda: {True: [], False: []})
    failed: dict[bool, list[int]] = field(default_factory=lambda: {True: [], False: []})


def _round(kube: Kube, kubelet: Kubelet, workdir: Path, figures: Figures, i: int) -> None:
    for ordered in (True, False) if i % 2 == 0 else (False, True):
        s = _make_set(ordered, i)
        _prepare(kubelet, workdir, s)
        _install(kube, s)
        before = len(kubelet.failed_runs)
        took, early, how = _change(kube, s)
        failed = len(kubelet.failed_runs) - before
        gone, stuck, late = _delete(kube, s)
        kubelet.check()
        progress(
            f"dependencies: round {i} {s.label}: changed -> all at revision 2 in {took:.2f}s "
            f"({early} users moved early, {failed} runs failed; {how}); "
            f"deleted -> all gone in {gone:.2f}s, "
            f"{stuck} held by a finalizer, {late} users gone after the CRD started to go"
        )
        figures.changed[ordered].append(took)
        figures.early[ordered].append(early)
        figures.failed[ordered].append(failed)
        figures.deleted[ordered].append(gone)
        figures.stuck[ordered].append(stuck)
        figures.late[ordered].append(late)


def _samples(values: list[float]) -> str:
    return str([round(v, 2) for v in values])


def _with_against_without(name: str, samples: dict[bool, list[float]], more: str = "") -> Result:
    """The median seconds with dependsOn against the same set's without."""
    return against(
        name,
        samples[True],
        samples[False],
        note=(
            f"median of {len(samples[True])}, with dependsOn {_samples(samples[True])} against "
            f"the same set without {_samples(samples[False])}{more}"
        ),
    )


def _none_with(name: str, counts: dict[bool, list[int]], unit: str, note: str) -> Result:
    """The most ``unit`` counted in a round with dependsOn, which should be none."""
    return Result(name=name, measured=max(counts[True]), unit=unit, target=0, note=note)


def _results(f: Figures) -> list[Result]:
    n = len(f.changed[True])
    what = f"a CRD provider + {USERS} users"
    return [
        _with_against_without(
            f"dependencies: {what} changed together -> all Installed on revision 2",
            f.changed,
            f"; runs that failed: {f.failed[True]} with, {f.failed[False]} without",
        ),
        _none_with(
            "dependencies: users moved before the provider's revision 2 was ready",
            f.early,
            "users",
            f"most of {n} rounds, with dependsOn (the order held when 0); without "
            f"dependsOn: {f.early[False]} of {USERS}",
        ),
        _with_against_without(f"dependencies: {what} deleted at once -> all gone", f.deleted),
        _none_with(
            "dependencies: BundleDeployments left with a finalizer after deleting the set",
            f.stuck,
            "BDs",
            f"most of {n} rounds with dependsOn; without: {f.stuck[False]}",
        ),
        _none_with(
            "dependencies: users gone only after their provider's CRD started to go",
            f.late,
            "users",
            f"most of {n} rounds with dependsOn (reverse order); without: {f.late[False]}",
        ),
    ]


@contextmanager
def _kubelet(kube: Kube) -> Iterator[Kubelet]:
    kubelet = Kubelet(kube)
    kubelet.start()
    try:
        yield kubelet
    finally:
        kubelet.stop()


def run(workdir: Path) -> list[Result]:
    cluster = start_cluster(workdir)
    try:
        kube = Kube.from_kubeconfig(str(cluster.kubeconfig))
        install_crds(kube)
        harness.prepare_system_namespace(kube, SYSTEM_NS)
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": USERS_NS}})
        admission = _admission(kube)
        figures = Figures()
        player = Kube.from_kubeconfig(str(cluster.kubeconfig))
        with (
            harness.running_controller(
                kube, SYSTEM_NS, image="registry.example/rukpak:bench", resolve=as_is
            ),
            _kubelet(player) as kubelet,
        ):
            for i in range(ROUNDS):
                _round(kube, kubelet, workdir, figures, i)
        return [*_results(figures), *admission]
    finally:
        cluster.stop()
