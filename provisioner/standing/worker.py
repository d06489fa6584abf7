"""``rukpak-provisioner standing``: the standing provisioner, a long-running pod that takes
instance runs and Bundle checks as work instead of a pod being started for each.

Where it sits: beside the instance process (``instance.process``), whose ``Instance`` it
runs in-process, one per run. The manager writes each run it wants as a run ConfigMap
(``instance.runrecord``); this process watches them, claims one at a time per worker (at most
``--concurrency`` at once), and for each:

1. asks the node plugin for the run's image, pinned by digest, through the store volume
   mounted at ``--store-dir`` (``rukpak.sources.storeclient``), with the pull Secret the
   run's volume names (read from the system namespace): content reaches this pod only
   through the CSI driver, checked against that credential as a pod's volume is;
2. runs the instance over ``<store>/<digest>`` exactly as the run pod would have, acting
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
from datetime import UTC, datetime
from pathlib import Path
from types import FrameType
from typing import Any

from provisioner.engine import listwatch
from provisioner.engine.kube import Kube
from provisioner.engine.objects import Obj, ObjectRef, meta_of
from provisioner.instance import process, unpack
from provisioner.instance import runrecord as runs
from provisioner.runtime import flags, leader, liveness
from rukpak.common import errors
from rukpak.sources.storeclient import StoreClient
from rukpak.sources.storeprotocol import SOCKET_NAME

log = logging.getLogger("rukpak.standing")

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
        try:
            args = run_args(pod)
            content = self.content(pod)
            rules = process.ignore_rules(str(getattr(args, "ignore", "") or ""))
        except errors.RukpakError as exc:
            return False, exc.message
        if args.command == "unpack":  # a Bundle's check: no API access, only the content
            result = unpack.validate(content, format=args.format)
            return result.ok, result.to_json()
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

    def content(self, pod: Obj) -> Path:
        """The run's one image volume, asked of the node store with its pull Secret."""
        volumes = (pod.get("spec") or {}).get("volumes") or []
        attributes = runs.image_attributes(volumes[0]) if len(volumes) == 1 else None
        if attributes is None:
            raise errors.InvalidArgument("the run's content is not one image volume")
        secret = ((volumes[0].get("csi") or {}).get("nodePublishSecretRef") or {}).get("name")
        config = self._dockerconfig(str(secret)) if secret else None
        try:
            return self.store.fetch(
                attributes["image"],
                dockerconfigjson=config,
                retain_for=attributes.get("retainFor", ""),
                retain=attributes.get("retain", "").split(),
            )
        except errors.RukpakError as exc:
            raise type(exc)(
                f"the node store could not serve {attributes['image']}: {exc.message}"
            ) from None

    def _dockerconfig(self, name: str) -> str:
        secret = self.kube.get(ObjectRef("", "v1", "Secret", self.namespace, name))
        if secret is None:
            raise errors.NotFound(
                f"pull Secret {self.namespace}/{name} not found: create it in {self.namespace}"
            )
        data: dict[str, Any] = secret.get("data") or {}
        raw = data.get(".dockerconfigjson")
        if not isinstance(raw, str):
            raise errors.InvalidArgument(
                f"pull Secret {self.namespace}/{name} holds no .dockerconfigjson"
            )
        return base64.b64decode(raw).decode()


# -- the command line -------------------------------------------------------------------


def register(subparsers: Any) -> None:
    """Add ``standing`` to the ``rukpak-provisioner`` parser."""
    p = subparsers.add_parser(
        "standing",
        help="the standing provisioner: take instance runs as work, no pod per change",
        description="Watch the run ConfigMaps the manager writes (--run-mode standing), "
        "claim them, fetch their content through the store volume at --store-dir, and run "
        "each install as its ServiceAccount.",
    )
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
    p.add_argument(
        "--health-port",
        type=int,
        default=0,
        help="serve /livez (liveness) and /healthz (readiness: runs listed, the store volume "
        "answering) over HTTP on this port; 0 disables (default: %(default)s)",
    )
    p.add_argument(
        "--health-bind",
        default="0.0.0.0",
        help="address of the health port: kubelet's probes dial the pod's address "
        "(default: %(default)s)",
    )
    flags.add_system_namespace(p, holds="the run ConfigMaps, pull Secrets and Leases")
    flags.add_cluster(p)
    p.set_defaults(func=run_standing)


def run_standing(args: argparse.Namespace) -> int:
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
