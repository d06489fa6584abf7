"""The node plugin process (``rukpak-csi-plugin``): flags, logging, servers, lifecycle.

Where it sits: the top of the CSI driver. It builds the image cache, the
publisher, the servicers (Identity, Node and, unless ``--no-controller``,
Controller) and serves them on the ``--endpoint`` unix socket; with
``--registration-dir`` it also serves kubelet's plugin registration, and with
``--metrics-port`` Prometheus metrics and ``/healthz`` (``csi.plugin.health``)
on loopback. At start it removes a
leftover socket and reconciles its records with the mount table; on SIGTERM or
SIGINT it stops the gRPC servers with a grace period.

Flags fall back to environment variables (``CSI_ENDPOINT``, ``NODE_ID`` or
``KUBE_NODE_NAME``, ...) so a DaemonSet can set either.

Each gRPC server runs an RPC on a thread of its own (``RPC_THREADS`` at most, started
as needed): a publish waiting on a silent server must never keep Identity.Probe, and
with it kubelet's liveness probe, queued behind it. How many publishes fetch at once is
the publish core's business (``csi.node.publish.PUBLISH_SLOTS``), within each
publish's deadline (``--publish-deadline``).
"""

from __future__ import annotations

import argparse
import gc
import logging
import os
import re
import signal
import socket
import stat
import sys
import threading
from collections.abc import Callable, Sequence
from concurrent import futures
from pathlib import Path
from typing import Protocol

import grpc

from csi.controller.resolve import RegistryResolver
from csi.controller.server import ControllerServicer
from csi.controller.volumes import VolumeRegistry
from csi.mounter import Mounter
from csi.node.identity import IdentityServicer
from csi.node.publish import PUBLISH_DEADLINE, EventSink, Publisher
from csi.node.refresh import RefreshVolumes
from csi.node.registration import RegistrationServicer
from csi.node.server import NodeServicer
from csi.node.storevolume import AllowList, StoreVolumes
from csi.plugin import health, metrics
from csi.proto import csi_pb2_grpc, pluginregistration_pb2_grpc
from rukpak.common import errors, fsio
from rukpak.common.flags import add_driver_name, add_log_level
from rukpak.common.logsetup import configure_logging
from rukpak.image import extract
from rukpak.image.cache import ImageCache
from rukpak.image.eviction import RETAIN_TTL
from rukpak.image.seams import Puller
from rukpak.image.settings import CacheSettings
from rukpak.oci.auth import Credentials
from rukpak.oci.client import RegistryClient
from rukpak.oci.manifest import Platform
from rukpak.signing.gate import ClientFactory, Gate
from rukpak.store.holders import Holders

log = logging.getLogger("csi.plugin")

GRACE_SECONDS = 10.0
RPC_THREADS = 256  # far above the calls kubelet has in flight: one per volume operation
_SIZE = re.compile(r"^(\d+)([KMGT]i?)?$")
_UNITS = {
    None: 1, "K": 10**3, "M": 10**6, "G": 10**9, "T": 10**12,
    "Ki": 2**10, "Mi": 2**20, "Gi": 2**30, "Ti": 2**40,
}  # fmt: skip


def parse_seconds(text: str) -> float:
    """A positive number of seconds."""
    try:
        value = float(text)
    except ValueError:
        value = 0.0
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r} is not a positive number of seconds")
    return value


def parse_size(text: str) -> int:
    """``10Gi``, ``500M`` or plain bytes."""
    match = _SIZE.match(text.strip())
    if not match:
        raise argparse.ArgumentTypeError(f"{text!r} is not a size like 10Gi, 500M or 1048576")
    return int(match.group(1)) * _UNITS[match.group(2)]


Kind = Callable[[str], object] | tuple[str, ...]
"""What a flag of :func:`add_flags` takes: a value its callable parses, one of the listed
choices, or (``bool``) none: a ``--flag``/``--no-flag`` switch."""


def add_flags(p: argparse.ArgumentParser, rows: Sequence[tuple[str, Kind, object, str]]) -> None:
    """Add one flag per ``(flag, kind, default, help)`` row, in order (the order of ``--help``)."""
    for flag, kind, default, text in rows:
        if kind is bool:
            p.add_argument(flag, action=argparse.BooleanOptionalAction, default=default, help=text)
        elif isinstance(kind, tuple):
            p.add_argument(flag, choices=kind, default=default, help=text)
        else:
            p.add_argument(flag, type=kind, default=default, help=text)


def build_parser() -> argparse.ArgumentParser:
    env = os.environ.get
    p = argparse.ArgumentParser(prog="rukpak-csi-plugin", description=__doc__.split("\n")[0])
    p.add_argument(
        "--endpoint",
        default=env("CSI_ENDPOINT", "unix:///csi/csi.sock"),
        help="unix:///path of the CSI gRPC socket to serve (env CSI_ENDPOINT)",
    )
    add_driver_name(p, role="must match the CSIDriver object")
    p.add_argument(
        "--node-id",
        default=env("NODE_ID") or env("KUBE_NODE_NAME") or socket.gethostname(),
        help="node ID reported by NodeGetInfo (env NODE_ID or KUBE_NODE_NAME; default hostname)",
    )
    add_flags(p, [
        ("--state-dir", Path, Path(env("STATE_DIR", "/var/lib/rukpak-csi")),
         "where the blob store, unpacked trees and records live (env STATE_DIR)"),
        ("--kubelet-dir", Path, Path(env("KUBELET_DIR", "/var/lib/kubelet")),
         "kubelet root dir; the plugin mounts only under it (env KUBELET_DIR)"),
        ("--cache-budget", parse_size, parse_size("10Gi"),
         "evict unused images when the cache exceeds this size (e.g. 10Gi, 500M)"),
        ("--retain-ttl", parse_seconds, RETAIN_TTL,
         "seconds eviction spares the trees an owner retains, in both modes (volume attributes "
         "retainFor and retain: a BundleDeployment's kept revisions) after the publish that "
         "last named them (default 14 days)"),
        ("--max-unpacked-bytes", parse_size, parse_size("2Gi"),
         "refuse an image that unpacks to more than this (decompression-bomb guard)"),
        ("--max-unpacked-files", int, 200_000,
         "refuse an image whose layers hold more entries than this"),
        ("--metrics-port", int, int(env("METRICS_PORT", "0")),
         "serve Prometheus metrics and /healthz on --metrics-bind:PORT; 0 disables "
         "(env METRICS_PORT)"),
        ("--metrics-bind", str, env("METRICS_BIND", "127.0.0.1"),
         "address of the metrics port: the node's loopback by default; 0.0.0.0 lets Prometheus "
         "scrape it (deploy/components/monitoring) (env METRICS_BIND)"),
        ("--registration-dir", Path, None,
         "kubelet plugin registration dir (e.g. /var/lib/kubelet/plugins_registry); "
         "serve kubelet's registration socket there"),
        ("--kubelet-registration-path", str, None,
         "the CSI socket path as kubelet sees it (default: the --endpoint path)"),
        ("--controller", bool, True,
         "also serve the Controller service (CreateVolume etc. for StorageClass volumes)"),
    ])  # fmt: skip
    p.add_argument(
        "--insecure-registry",
        action="append",
        default=[],
        metavar="HOST[:PORT]",
        help="registry spoken to over plain HTTP (loopback always is); repeatable",
    )
    p.add_argument(
        "--registry-mirror",
        action="append",
        default=[],
        metavar="REGISTRY=MIRROR",
        type=_mirror,
        help="ask MIRROR (a `python -m csi.mirror`, HOST[:PORT]) first for the pinned "
        "content of REGISTRY's public images: a rollout to many nodes then costs the registry "
        "one pull; private images (a pull secret for REGISTRY) never go through it; repeatable",
    )
    add_flags(p, [
        ("--registry-timeout", float, 30.0,
         "seconds a registry read may stall before failing (connects: at most 5)"),
        ("--publish-deadline", parse_seconds,
         parse_seconds(env("PUBLISH_DEADLINE", str(PUBLISH_DEADLINE))),
         "seconds a NodePublishVolume may take, retries included, before it answers "
         "DEADLINE_EXCEEDED naming the server; keep it under kubelet's 2 minutes "
         "(env PUBLISH_DEADLINE)"),
        ("--durable-commit", bool, True,
         "flush an unpacked tree to disk (syncfs) before committing it; turn off only "
         "to measure what durability costs"),
        ("--private-image-auth-ttl", float, 60.0,
         "seconds a pod credential's successful check against a private image is "
         "remembered before the registry is asked again"),
        ("--publish-mode", ("bind", "fuse"), env("PUBLISH_MODE", "bind"),
         "how volumes without a publishMode attribute are published (env PUBLISH_MODE); "
         "fuse turns --fuse on"),
        ("--fuse", bool, env("FUSE", "") == "true",
         "serve publishMode fuse volumes from a FUSE mount (pyfuse3) under "
         "<state-dir>/fuse (env FUSE=true)"),
        ("--fuse-holder-socket", Path, None,
         "socket of a /dev/fuse holder someone else runs (python -m csi.fuse.holder, "
         "e.g. a container of this pod): the plugin waits for it; unset, the plugin starts "
         "one on <state-dir>/fuse/holder.sock when none answers"),
        ("--signature-policies", ("off", "cluster"), env("SIGNATURE_POLICIES", "off"),
         "cluster: follow the ClusterBundlePolicy objects (in-cluster credentials, or "
         "$KUBECONFIG) and refuse images they select whose signatures do not satisfy them, "
         "before anything is fetched; off: check no signature (env SIGNATURE_POLICIES)"),
        ("--system-namespace", str, env("POD_NAMESPACE", "rukpak-system"),
         "namespace of the key Secrets policies name (env POD_NAMESPACE)"),
        ("--prestage", ("off", "follow"), env("PRESTAGE", "off"),
         "follow: fetch the images BundleDeployments ask to pre-stage when this node needs "
         "them, answer on this Node and advertise cached digests as its labels "
         "(docs/prestage.md; in-cluster credentials or $KUBECONFIG) (env PRESTAGE)"),
        ("--advertise-max", int, int(env("ADVERTISE_MAX", "16")),
         "cached digests advertised as cached.csi.rukpak.io/<hex> labels of this Node at "
         "most (newest kept) (env ADVERTISE_MAX)"),
    ])  # fmt: skip
    p.add_argument(
        "--store-volume-allow",
        action="append",
        default=[env("STORE_VOLUME_ALLOW")] if env("STORE_VOLUME_ALLOW") else [],
        metavar="NAMESPACE/SERVICEACCOUNT",
        help="pods that may mount a kind: store volume (content by digest on request, for "
        "standing provisioners): those running as SERVICEACCOUNT in NAMESPACE (NAMESPACE/*: "
        "any there); repeatable or comma-separated; every other pod is refused "
        "PERMISSION_DENIED (env STORE_VOLUME_ALLOW)",
    )
    add_log_level(p)
    return p


def signature_gate(
    args: argparse.Namespace,
    client: ClientFactory,
    m: metrics.Metrics,
    events: list[EventSink] | None = None,
) -> Gate | None:
    """The publish spine's signature gate, following the cluster's policies; None when
    ``--signature-policies=off``. Appends to ``events`` where pods' events are posted."""
    events = [] if events is None else events
    if args.signature_policies == "off":
        return None
    from csi.node.policies import PolicyWatch  # the kubernetes client only when it is on

    watch = PolicyWatch.from_environment(namespace=args.system_namespace, node=args.node_id)
    watch.start()
    events.append(watch.post_event)  # the pods' SignatureVerified/SignatureRefused events
    return Gate(
        policies=watch.policies,
        read_secret=watch.read_secret,
        client=client,
        observe=m.signature_check,
    )


def prestage_follower(
    args: argparse.Namespace,
    images: ImageCache,
    puller: Callable[[Credentials | None], Puller],
    platform: Platform,
    store_root: Path,
    m: metrics.Metrics,
) -> PrestageLike | None:
    """The pre-stage follower of ``--prestage=follow``, started; None when off."""
    if args.prestage == "off":
        return None
    from csi.node import prestage, prestagewatch  # the kubernetes client only when it is on
    from csi.node.apisource import api_from_environment

    stager = prestage.Prestager(
        images=images,
        puller_factory=puller,
        platform=platform,
        store_present=lambda: next(fsio.json_records(store_root), None) is not None,
    )
    return prestagewatch.PrestageWatch(
        api_from_environment("--prestage=follow"),
        node=args.node_id,
        prestager=stager,
        advertise_max=max(0, args.advertise_max),
        metrics=prestagewatch.PrestageMetrics(m),
    ).start()


class PrestageLike(Protocol):
    def stop(self) -> None: ...


def socket_path(endpoint: str) -> Path:
    if not endpoint.startswith("unix://"):
        raise SystemExit(f"--endpoint {endpoint!r} must be unix:///path/to/socket")
    return Path(endpoint[len("unix://") :])


def remove_stale_socket(path: Path) -> None:
    try:
        mode = path.lstat().st_mode
    except FileNotFoundError:
        return
    if not stat.S_ISSOCK(mode):
        raise SystemExit(f"{path} exists and is not a socket; refusing to remove it")
    path.unlink()


def serve_unix(path: Path, servicers: Sequence[tuple[object, object]]) -> grpc.Server:
    path.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_socket(path)
    # A thread per RPC in flight (an idle one is reused): see the module docstring.
    threads = futures.ThreadPoolExecutor(max_workers=RPC_THREADS, thread_name_prefix="rpc")
    server = grpc.server(threads)
    for add, servicer in servicers:
        add(servicer, server)  # type: ignore[operator]
    server.add_insecure_port(f"unix://{path}")
    server.start()
    return server


GC_GEN0 = 5000
"""Allocations between young collections once serving (Python's default: 700)."""


def settle_heap() -> None:
    """Before serving: move what start-up built (modules, gRPC, the loaded records) out of
    the collector's reach (``gc.freeze``) and collect the young generation less often. A
    full collection over that heap took 13-16 ms in the plugin, twice in a run of 1,400
    publishes: the tail of a hot publish (docs/benchmarks.md, "Hot publish with many
    volumes held"); frozen, a full collection walks only what was made since."""
    gc.collect()
    gc.freeze()
    _, gen1, gen2 = gc.get_threshold()
    gc.set_threshold(GC_GEN0, gen1, gen2)


def _mirror(text: str) -> tuple[str, str]:
    """``REGISTRY=MIRROR`` of ``--registry-mirror``."""
    registry, sep, mirror = text.partition("=")
    if not sep or not registry.strip() or not mirror.strip() or "/" in registry + mirror:
        raise argparse.ArgumentTypeError(
            f"{text!r}: write REGISTRY=MIRROR, each HOST[:PORT] (registry.example.com="
            "rukpak-mirror.rukpak-system.svc:5000)"
        )
    return registry.strip(), mirror.strip()


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    configure_logging(args.log_level)
    csi_socket = socket_path(args.endpoint)
    ready = threading.Event()
    insecure = tuple(args.insecure_registry)
    timeout = args.registry_timeout

    mirrors = dict(args.registry_mirror)

    def puller(credentials: Credentials | None) -> Puller:
        return RegistryClient(
            credentials=credentials, insecure=insecure, timeout=timeout, mirrors=mirrors
        )

    publisher: Publisher | None = None
    m = metrics.Metrics(
        published=lambda: publisher.published() if publisher else 0, driver_name=args.driver_name
    )
    try:
        settings = CacheSettings(
            limits=extract.Limits(args.max_unpacked_bytes, args.max_unpacked_files),
            budget_bytes=args.cache_budget,
            auth_ttl=args.private_image_auth_ttl,
            retain_ttl=args.retain_ttl,
        )
        # One holder registry for the node: bind, FUSE, git and http volumes alike.
        holders = Holders(args.state_dir / "holders", durable=args.durable_commit)
        images = ImageCache(
            args.state_dir / "images",
            puller_factory=puller,
            settings=settings,
            observer=m,
            durable=args.durable_commit,
            holders=holders,
        )
        fuse = None
        if args.fuse or args.publish_mode == "fuse":
            from csi.fuse.service import FuseService  # pyfuse3 only when FUSE mode is on

            fuse = FuseService(
                args.state_dir / "fuse",
                puller_factory=puller,
                settings=settings,  # the same budgets and retention as bind mode
                holder_socket=args.fuse_holder_socket,
                shared_grants=images.grants,  # one credential re-check for both modes
                holders=holders,
                observer=m,  # the same metric families as bind mode
            )
            fuse.start()
        fuse_files = fuse.images.files if fuse else None
        m.track_cache(
            lambda: images.usage() + (fuse_files.disk_usage() if fuse_files else 0),
            images.budget_bytes,
        )
        event_sinks: list[EventSink] = []
        gate = signature_gate(
            args,
            lambda creds: RegistryClient(credentials=creds, insecure=insecure, timeout=timeout),
            m,
            event_sinks,
        )
        publisher = Publisher(
            gate=gate,
            events=event_sinks[0] if event_sinks else None,
            images=images,
            mounter=Mounter(),
            kubelet_dir=args.kubelet_dir,
            fuse=fuse.publisher if fuse else None,
            default_mode=args.publish_mode,
            deadline=args.publish_deadline,
        )
        publisher.reconcile()
        store = StoreVolumes(
            publisher=publisher,
            mounter=Mounter(),
            root=args.kubelet_dir / "plugins" / args.driver_name / "store",
            allow=AllowList.parse(args.store_volume_allow),
        )
        store.resume()
        refresh = RefreshVolumes(
            publisher=publisher,
            mounter=Mounter(),
            root=args.state_dir / "views",  # beside the cache's trees: views link into them
            events=event_sinks[0] if event_sinks else None,
            observe=m.presented,
        )
        refresh.resume()
        refresh.start()
        prestaging = prestage_follower(args, images, puller, publisher.platform, store.root, m)
    except errors.RukpakError as exc:
        log.error("msg=%r error=%r", "cannot start", exc.message)
        return 1
    servicers: list[tuple[object, object]] = [
        (
            csi_pb2_grpc.add_IdentityServicer_to_server,
            IdentityServicer(
                driver_name=args.driver_name,
                controller=args.controller,
                ready=ready.is_set,
                metrics=m,
            ),
        ),
        (
            csi_pb2_grpc.add_NodeServicer_to_server,
            NodeServicer(
                publisher=publisher, node_id=args.node_id, metrics=m, store=store, refresh=refresh
            ),
        ),
    ]
    if args.controller:
        registry = VolumeRegistry(args.state_dir / "controller" / "volumes.json")
        servicers.append(
            (
                csi_pb2_grpc.add_ControllerServicer_to_server,
                ControllerServicer(
                    volumes=registry,
                    resolver=RegistryResolver(insecure=insecure, timeout=timeout),
                    metrics=m,
                ),
            )
        )
    sockets = [csi_socket]
    servers = [serve_unix(csi_socket, servicers)]
    registered: Callable[[], bool | None] | None = None
    if args.registration_dir is not None:
        reg = RegistrationServicer(
            driver_name=args.driver_name,
            endpoint=args.kubelet_registration_path or str(csi_socket),
            on_status=lambda accepted: m.registration(accepted=accepted),
        )
        registered = lambda: reg.registered  # noqa: E731
        reg_socket = args.registration_dir / f"{args.driver_name}-reg.sock"
        sockets.append(reg_socket)
        servers.append(
            serve_unix(
                reg_socket, [(pluginregistration_pb2_grpc.add_RegistrationServicer_to_server, reg)]
            )
        )
    http = None
    if args.metrics_port:
        check = health.checker(
            csi_socket, registered=registered, fuse=fuse.healthy if fuse else None
        )
        http = metrics.serve(m, port=args.metrics_port, host=args.metrics_bind, health=check)
    settle_heap()
    ready.set()
    log.info(
        "msg=%r driver=%s node_id=%s endpoint=%s state_dir=%s kubelet_dir=%s metrics_port=%s",
        "serving",
        args.driver_name,
        args.node_id,
        csi_socket,
        args.state_dir,
        args.kubelet_dir,
        args.metrics_port,
    )

    stop = threading.Event()

    def on_signal(signum: int, _frame: object) -> None:
        log.info("msg=%r signal=%s", "stopping", signal.Signals(signum).name)
        stop.set()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    # Wake up now and then: a SIGTERM delivered to another thread only interrupts the
    # main thread's wait when it next runs Python code, so never block it forever.
    while not stop.wait(0.5):
        pass
    ready.clear()
    events = [s.stop(GRACE_SECONDS) for s in servers]
    for event in events:
        event.wait(GRACE_SECONDS + 1)
    if http is not None:
        http.shutdown()
    store.stop()  # the store volumes stay mounted; the next plugin process serves them again
    refresh.stop()  # the views stay mounted; the next plugin process refreshes them again
    if prestaging is not None:
        prestaging.stop()
    if fuse is not None:
        fuse.stop()  # the mount stays with the holder for the next plugin process
    for path in sockets:
        remove_stale_socket(path)
    log.info("msg=%r", "stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
