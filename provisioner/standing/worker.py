"""``rukpak-provisioner standing``: the standing provisioner, a long-running pod that takes
instance runs and Bundle checks as work instead of a pod being started for each.

Where it sits: beside the instance process (``instance.process``), whose ``Instance`` it
runs in-process, one per run. The manager writes each run it wants as a run ConfigMap
(``instance.runrecord``); this process watches them, claims one at a time per worker (at most
``--concurrency`` at once), and for each:

1. asks the node plugin for the run's content (an image pinned by digest, a git commit,
   an http tarball pinned by digest) through the store volume mounted at ``--store-dir``
   (``rukpak.sources.storeclient``), with the volume attributes and the publish Secret
   the run's volume names (read from the system namespace): content reaches this pod
   only through the CSI driver, fetched and checked by the rules of a pod's volume; a
   ConfigMaps source is read from the API, as kubelet would project it;
2. runs the instance over that directory exactly as the run pod would have, acting
   as the run's ServiceAccount (``Impersonate-User``): the API server allows it what that
   ServiceAccount is allowed, never this pod's own rights; or, for a v1alpha1 Bundle's
   unpack check, validates the content (``instance.unpack``) without any API request;
3. finishes the run ConfigMap (Succeeded or Failed, with the termination message the pod
   would have left), which the manager reads as the pod's status.

A claimed run is renewed every ``runs.RENEW_EVERY`` seconds; a worker killed mid-run
leaves it Running, and any worker takes it again once ``runs.CLAIM_TTL`` passed (the
instance's Lease keeps two runs of one BundleDeployment from applying at once).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import logging
import os
import queue
import signal
import tempfile
import threading
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path, PurePosixPath
from types import FrameType
from typing import Any

from provisioner.engine.apply import ignore
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef, meta_of
from provisioner.instance import process, unpack
from provisioner.instance import runrecord as runs
from provisioner.runtime import flags, leader, liveness
from rukpak.common import command, errors
from rukpak.kube import listwatch
from rukpak.sources.storeclient import StoreClient
from rukpak.sources.storeprotocol import SOCKET_NAME

log = logging.getLogger("rukpak.standing")


class Unserved(errors.Unavailable):
    """The node store could not serve a run's content volume; the message is the
    FailedMount message kubelet would record for a pod's volume."""


UNFINISHED = "\0unfinished"
"""What ``execute`` says of a run whose instance stopped before installing anything."""
DEFAULT_CONCURRENCY = 8
"""Runs applied at once (each applies one BundleDeployment, under its Lease)."""


def run_args(pod: Obj) -> argparse.Namespace:
    """The arguments of the run pod ``pod``'s command (``instance`` or ``unpack``), parsed
    as that command parses them."""
    containers = (pod.get("spec") or {}).get("containers") or []
    command = [str(c) for c in (containers[0].get("command") if containers else None) or []]
    if len(command) < 2 or command[1] not in ("instance", "unpack"):
        raise errors.InvalidArgument("the run carries no instance or unpack command")
    parser = argparse.ArgumentParser(prog="run", add_help=False)
    commands = parser.add_subparsers(dest="command", required=True)
    process.register(commands)
    unpack.register(commands)
    try:
        return parser.parse_args(command[1:])
    except SystemExit:
        raise errors.InvalidArgument(f"the run's command does not parse: {command!r}") from None


class Standing:
    """The standing provisioner's loop; ``stop`` may be called from a signal handler."""

    def __init__(
        self,
        kube: Kube,
        store: StoreClient,
        *,
        system_namespace: str,
        node: str,
        identity: str,
        concurrency: int = DEFAULT_CONCURRENCY,
        watch_timeout: int = 60,
    ) -> None:
        self.kube = kube
        self.store = store
        self.namespace = system_namespace
        self.node = node
        self.identity = identity
        self.concurrency = max(1, concurrency)
        self.stopping = threading.Event()
        self.work: queue.Queue[str] = queue.Queue()
        self._busy: set[str] = set()
        self._running: set[process.Instance] = set()
        self._lock = threading.Lock()
        self._threads: list[threading.Thread] = []
        self.informer = listwatch.Informer(
            kube,
            "v1",
            "ConfigMap",
            namespace=system_namespace,
            label_selector=runs.RUN_LABEL,
            on_change=self._seen,
            stop=self.stopping,
            watch_timeout=watch_timeout,
        )

    def live(self) -> tuple[bool, str]:
        """Liveness: every worker thread is alive (a stuck run is renewed or taken over by
        its claim's expiry, not by a restart)."""
        dead = [t.name for t in self._threads if not t.is_alive()]
        if dead and not self.stopping.is_set():
            return False, f"worker threads ended: {', '.join(dead)}"
        return True, f"{len(self._threads)} workers"

    def ready(self) -> tuple[bool, str]:
        """Readiness: the runs are listed, and the node plugin's store volume answers here
        (its socket is in the mount); otherwise runs would fail, so say why instead."""
        if not self.informer.synced:
            return False, "run ConfigMaps not listed yet"
        socket_path = self.store.mount / SOCKET_NAME
        if not socket_path.is_socket():
            return False, (
                f"no store volume at {self.store.mount} (no {SOCKET_NAME}): is the node "
                "plugin (daemonset rukpak-csi-node) running on this node?"
            )
        return self.live()

    def _seen(self, cm: Obj) -> None:
        if runs.claimable(cm, datetime.now(UTC)):
            self.work.put(str(meta_of(cm).get("name") or ""))

    def stop(self, why: str) -> None:
        if not self.stopping.is_set():
            log.info(process.kv("stopping", reason=why))
        self.stopping.set()
        with self._lock:
            running = list(self._running)
        for instance in running:  # each releases its Lease and ends its run
            instance.stop("the standing provisioner stops")

    def run(self) -> None:
        """Serve until ``stop``: the informer, the workers, and a sweep that offers runs
        whose holder went silent again."""
        self.informer.start()
        self.informer.wait_synced(timeout=60)
        threads = self._threads = [
            threading.Thread(target=self._worker, name=f"standing-{i}", daemon=True)
            for i in range(self.concurrency)
        ]
        for thread in threads:
            thread.start()
        log.info(process.kv("serving runs", workers=self.concurrency, node=self.node))
        while not self.stopping.wait(runs.CLAIM_TTL / 2):
            for cm in self.informer.items():
                self._seen(cm)
        for _ in threads:
            self.work.put("")
        for thread in threads:
            thread.join(timeout=35)
        self.informer.stop()

    def _worker(self) -> None:
        while not self.stopping.is_set():
            name = self.work.get()
            if not name:
                return
            with self._lock:
                if name in self._busy:
                    continue
                self._busy.add(name)
            try:
                cm = self.informer.get(self.namespace, name)
                if cm is not None and runs.claimable(cm, datetime.now(UTC)):
                    self.take(cm)
            except Exception:  # one run's failure never stops the worker
                log.exception(process.kv("run failed unexpectedly", run=name))
            finally:
                with self._lock:
                    self._busy.discard(name)

    def _ref(self, name: str) -> ObjectRef:
        return ObjectRef("", "v1", "ConfigMap", self.namespace, name)

    def take(self, cm: Obj) -> bool:
        """Claim ``cm`` and run it; False when another worker claimed it first."""
        name = str(meta_of(cm).get("name") or "")
        if self.stopping.is_set():  # stopping: leave it to a provisioner that goes on
            return False
        patch = runs.claim_patch(cm, holder=self.identity, node=self.node, now=datetime.now(UTC))
        try:
            self.kube.merge_patch(self._ref(name), patch)
        except (errors.Aborted, errors.AlreadyExists, errors.NotFound, errors.FailedPrecondition):
            return False  # claimed by another, or gone
        done = threading.Event()
        renewer = threading.Thread(target=self._renew, args=(name, done), daemon=True)
        renewer.start()
        try:
            succeeded, message = self.execute(name, runs.pod_of(cm))
        except Unserved as exc:
            # a Bundle's check whose content the store could not serve waits, as its pod
            # would wait on its volume: Pending with the store's answer, tried again later
            log.info(process.kv("content not served", run=name, error=exc.message))
            with contextlib.suppress(errors.NotFound):
                patch = runs.mount_failed_patch(exc.message, now=datetime.now(UTC))
                self.kube.merge_patch(self._ref(name), patch)
            return True
        finally:
            done.set()
        if succeeded and message == UNFINISHED:
            # stopped before it installed anything: give the run back for the next
            # provisioner rather than finish it unapplied
            log.info(process.kv("run given back", run=name))
            with contextlib.suppress(errors.NotFound):
                self.kube.merge_patch(self._ref(name), runs.release_patch())
            return True
        log.info(process.kv("run finished", run=name, succeeded=succeeded))
        finish = runs.finish_patch(succeeded=succeeded, message=message, now=datetime.now(UTC))
        with contextlib.suppress(errors.NotFound):  # removed meanwhile: a newer revision
            self.kube.merge_patch(self._ref(name), finish)
        return True

    def _renew(self, name: str, done: threading.Event) -> None:
        while not done.wait(runs.RENEW_EVERY):
            patch = {"metadata": {"annotations": {runs.RENEWED: runs.now_text()}}}
            try:
                self.kube.merge_patch(self._ref(name), patch)
            except errors.RukpakError as exc:
                log.warning(process.kv("cannot renew run", run=name, error=exc.message))

    def execute(self, name: str, pod: Obj) -> tuple[bool, str]:
        """Run the instance of ``pod`` over its content from the store; (ok, message)."""
        with contextlib.ExitStack() as stack:
            try:
                args = run_args(pod)
                rules = process.ignore_rules(str(getattr(args, "ignore", "") or ""))
                content = stack.enter_context(self.content(pod, str(args.bundle_dir)))
            except errors.RukpakError as exc:
                if args.command == "unpack" and isinstance(exc, Unserved):
                    raise
                return False, exc.message
            if args.command == "unpack":  # a Bundle's check: no API access, only the content
                result = unpack.validate(content, format=args.format)
                return result.ok, result.to_json()
            return self._install(name, pod, args, content, rules)

    def _install(
        self,
        name: str,
        pod: Obj,
        args: argparse.Namespace,
        content: Path,
        rules: tuple[ignore.Rule, ...] = (),
    ) -> tuple[bool, str]:
        spec = pod.get("spec") or {}
        account = str(spec.get("serviceAccountName") or "default")
        user = f"system:serviceaccount:{self.namespace}:{account}"
        with tempfile.TemporaryDirectory(prefix="rukpak-run-") as tmp:
            log_path = Path(tmp) / "termination-log"
            config = process.Config(
                bundle_dir=content,
                name=args.name,
                namespace=args.namespace,
                system_namespace=args.system_namespace,
                identity=name,
                lease_duration=args.lease_duration,
                lease_timeout=args.lease_timeout,
                bundle_format=args.format,
                termination_log=log_path,
                bundle_name=args.bundle,
                preview=args.preview,
                source_dirs=tuple(
                    content / PurePosixPath(d).relative_to(args.bundle_dir)
                    for d in getattr(args, "source_dir", None) or ()
                ),
                ignore=rules,
            )
            instance = process.Instance(self.kube.impersonating(user), config)
            with self._lock:
                self._running.add(instance)
            if self.stopping.is_set():
                instance.stop("the standing provisioner stops")
            try:
                code = instance.run()
            finally:
                with self._lock:
                    self._running.discard(instance)
            message = log_path.read_text() if log_path.exists() else ""
        if code == process.EXIT_OK and instance.unfinished:
            return True, UNFINISHED
        return code == process.EXIT_OK, message.strip()

    @contextlib.contextmanager
    def content(self, pod: Obj, bundle_dir: str = "/bundle") -> Iterator[Path]:
        """The run's content as a directory standing for its ``bundle_dir``: its one
        content volume, or with several sources a temporary directory holding each
        source's content at its destination (``<bundle_dir>/<destination>`` in the pod;
        a symlink here)."""
        volumes = (pod.get("spec") or {}).get("volumes") or []
        if len(volumes) == 1:
            with self._volume(volumes[0]) as path:
                yield path
            return
        if not runs.several_sources(pod):
            raise errors.InvalidArgument("the run's content is not one volume or several sources")
        containers = (pod.get("spec") or {}).get("containers") or [{}]
        mounts = {
            str(m.get("name")): str(m.get("mountPath"))
            for m in containers[0].get("volumeMounts") or []
        }
        with contextlib.ExitStack() as stack:
            root = Path(stack.enter_context(tempfile.TemporaryDirectory(prefix="rukpak-sources-")))
            for volume in volumes[1:]:
                where = PurePosixPath(mounts.get(str(volume.get("name")), "/"))
                parts = (
                    where.relative_to(bundle_dir).parts if where.is_relative_to(bundle_dir) else ()
                )
                if not parts or ".." in parts:
                    raise errors.InvalidArgument(
                        f"source volume {volume.get('name')!r} is not mounted under {bundle_dir}"
                    )
                link = root.joinpath(*parts)
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(stack.enter_context(self._volume(volume)))
            yield root

    @contextlib.contextmanager
    def _volume(self, volume: Obj) -> Iterator[Path]:
        """One content volume as a directory: our CSI driver's volume asked of the node
        store with its attributes and publish Secret (the rules of a pod's volume), or the
        items of a projected ConfigMap volume written to a temporary directory (removed
        after the run)."""
        attributes = runs.csi_attributes(volume)
        if attributes is not None:
            secret = ((volume.get("csi") or {}).get("nodePublishSecretRef") or {}).get("name")
            secrets = self._secret_data(str(secret)) if secret else {}
            what = attributes.get("image") or attributes.get("git") or attributes.get("url")
            try:
                path = self.store.fetch_volume(attributes, secrets)
            except errors.RukpakError as exc:
                said = f"the node store could not serve {what}: {exc.message}"
                volume_name = str(volume.get("name") or "bundle")
                raise Unserved(runs.mount_message(volume_name, exc.code, said)) from None
            yield path
            return
        items = runs.configmap_items(volume)
        if items is None:
            raise errors.InvalidArgument("the run's content is no CSI or ConfigMap volume")
        with tempfile.TemporaryDirectory(prefix="rukpak-configmaps-") as tmp:
            self._project(items, Path(tmp))
            yield Path(tmp)

    def _project(self, items: list[tuple[str, str, str]], root: Path) -> None:
        """Write each ``(configMap, key, path)`` item under ``root``, as kubelet projects
        it; NotFound naming a ConfigMap or key that is gone, InvalidArgument for a path
        that would leave ``root``."""
        maps: dict[str, Obj] = {}
        for name, key, path in items:
            parts = PurePosixPath(path).parts
            if not parts or path.startswith("/") or ".." in parts:
                raise errors.InvalidArgument(
                    f"ConfigMap item path {path[:200]!r} is outside the bundle directory"
                )
            if name not in maps:
                found = self.kube.get(ObjectRef("", "v1", "ConfigMap", self.namespace, name))
                if found is None:
                    raise errors.NotFound(f"ConfigMap {self.namespace}/{name} not found")
                maps[name] = found
            data = maps[name].get("data") or {}
            binary = maps[name].get("binaryData") or {}
            if key in data:
                raw = str(data[key]).encode()
            elif key in binary:
                raw = base64.b64decode(str(binary[key]))
            else:
                raise errors.NotFound(f"ConfigMap {self.namespace}/{name} has no key {key!r}")
            target = root.joinpath(*parts)
            target.parent.mkdir(parents=True, exist_ok=True)
            target.write_bytes(raw)

    def _secret_data(self, name: str) -> dict[str, str]:
        """A publish Secret's data, decoded, as kubelet hands it to the node plugin."""
        secret = self.kube.get(ObjectRef("", "v1", "Secret", self.namespace, name))
        if secret is None:
            raise errors.NotFound(
                f"Secret {self.namespace}/{name} not found: create it in {self.namespace}"
            )
        data: dict[str, Any] = secret.get("data") or {}
        try:
            return {str(k): base64.b64decode(str(v)).decode() for k, v in data.items()}
        except (ValueError, UnicodeDecodeError):
            raise errors.InvalidArgument(
                f"Secret {self.namespace}/{name} holds data that is not UTF-8 text"
            ) from None


# -- the command line -------------------------------------------------------------------


def register(subparsers: Any) -> None:
    """Add ``standing`` to the ``rukpak-provisioner`` parser."""
    p = command.add(subparsers, "standing", run_standing)
    p.add_argument(
        "--store-dir",
        type=Path,
        required=True,
        help="where the node plugin's store volume (kind: store) is mounted",
    )
    p.add_argument(
        "--concurrency",
        type=int,
        default=DEFAULT_CONCURRENCY,
        help="runs applied at once (default: %(default)s)",
    )
    flags.add_health(p, ready="runs listed, the store volume answering")
    flags.add_system_namespace(p, holds="the run ConfigMaps, pull Secrets and Leases")
    flags.add_cluster(p)


def run_standing(args: argparse.Namespace) -> int:
    """the standing provisioner: take instance runs as work, no pod per change

    Watch the run ConfigMaps the manager writes (--run-mode standing), claim them, fetch
    their content through the store volume at --store-dir, and run each install as its
    ServiceAccount.
    """
    kube = flags.kube(args, pool_size=max(16, args.concurrency * 2))
    store = StoreClient(args.store_dir)
    standing = Standing(
        kube,
        store,
        system_namespace=args.system_namespace,
        node=os.environ.get("NODE_NAME", ""),
        identity=os.environ.get("POD_NAME") or leader.default_identity(),
        concurrency=args.concurrency,
    )

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        standing.stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    server = None
    if args.health_port:
        server = liveness.serve(
            host=args.health_bind, port=args.health_port, live=standing.live, ready=standing.ready
        )
    try:
        standing.run()
    finally:
        if server is not None:
            server.shutdown()
        store.close()
        kube.close()
    return 0
