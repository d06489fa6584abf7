"""``rukpak-provisioner manager``: the edge of the manager process.

Parses flags into ``model.Settings``; serves the CRD validating webhook
(``webhook``, with the certificate ``certs`` manages) on every replica;
optionally takes the ``rukpak-manager``
Lease (``provisioner.runtime.lease.LeaseLock``) before reconciling, runs the
``controller`` until SIGTERM/SIGINT or the Lease is lost, then stops the
workers and releases the Lease. Exit 0 when stopped by a signal, 1 on a
fatal error or a lost Lease. Its ``provisioner.runtime.liveness.Liveness`` follows
where it is (waiting for the Lease, starting, leading: the controller's work queue)
and answers ``/livez`` on the webhook's server.
"""

from __future__ import annotations

import argparse
import logging
import os
import threading
from collections.abc import Callable
from typing import Any

from provisioner.engine.kube.kube import Kube
from provisioner.manager import controller, model
from provisioner.manager.acting import actuate, prestage
from provisioner.manager.serving import certs, content, webhook
from provisioner.runtime import flags, liveness, service, signals
from provisioner.runtime.metrics import Metrics, object_conditions
from rukpak.common import command, errors
from rukpak.oci import client as oci_client

log = logging.getLogger("rukpak.manager")
WATCH_TIMEOUT = 300
"""Seconds each of the leader's watches lasts before it is made again (client-go's floor of
5 minutes): with about ten informers, 2 requests a minute at rest instead of 10."""
LEASE_NAME = "rukpak-manager"
BD_CRD = f"bundledeployments.{model.GROUP}"


def register(subparsers: Any) -> None:
    p = command.add(subparsers, "manager", run_manager)
    flags.add_cluster(p)
    p.add_argument(
        "--image",
        default="",
        help="image of the instance pods (must hold /opt/rukpak/bin/rukpak-provisioner)",
    )
    flags.add_system_namespace(p, holds="instance run pods, inventories and Leases")
    p.add_argument(
        "--instance-service-account",
        default=model.Settings.service_account,
        help="ServiceAccount of instance pods unless a BD names one (default: %(default)s)",
    )
    p.add_argument(
        "--unpack-service-account",
        default=model.Settings.unpack_service_account,
        help="ServiceAccount of unpack pods; they get no API token (default: %(default)s)",
    )
    p.add_argument(
        "--instance-host-network",
        action="store_true",
        help="run instance pods on the host network (clusters without a service proxy)",
    )
    p.add_argument(
        "--max-concurrent-runs",
        type=int,
        default=model.Settings.max_concurrent_runs,
        help="instance run pods active at once across all BundleDeployments; more wait their "
        "turn (default: %(default)s)",
    )
    p.add_argument(
        "--run-mode",
        choices=("pod", "standing"),
        default=model.Settings.run_mode,
        help="pod: each instance run is a pod; standing: runs of one image are taken by the "
        "standing provisioner (rukpak-provisioner standing), no pod per change "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--instance-env",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="extra environment for instance pods (repeatable)",
    )
    p.add_argument(
        "--webhook-port",
        type=int,
        default=webhook.DEFAULT_PORT,
        help="HTTPS port of the CRD validating webhook, 0 to not serve it (default: %(default)s)",
    )
    p.add_argument(
        "--webhook-bind",
        default="0.0.0.0",
        help="address the webhook listens on (default: %(default)s)",
    )
    p.add_argument(
        "--webhook-service",
        default="rukpak-webhook",
        help="Service in the system namespace in front of the webhook; its DNS names go "
        "into the certificate (default: %(default)s)",
    )
    p.add_argument(
        "--webhook-configuration",
        default=webhook.CONFIGURATION_NAME,
        help="ValidatingWebhookConfiguration whose caBundle the manager keeps current "
        "(default: %(default)s)",
    )
    p.add_argument(
        "--content-base-url",
        default=None,
        help="where callers reach this manager's HTTPS server for bundle content: "
        "status.contentURL is <base>/bundles/<name>.tgz (default: "
        "https://<webhook-service>.<system-namespace>.svc; '' writes none)",
    )
    p.add_argument(
        "--insecure-registry",
        action="append",
        default=[],
        metavar="HOST[:PORT]",
        help="registry spoken to over plain HTTP when resolving tags and packing content "
        "(loopback always is); give the node plugin the same list; repeatable",
    )
    p.add_argument(
        "--prestage-timeout",
        type=float,
        default=float(os.environ.get("PRESTAGE_TIMEOUT", f"{prestage.DEFAULT_TIMEOUT:g}")),
        help="seconds a v1alpha2 BundleDeployment's pivot to a new pin waits at most for the "
        "node plugins that follow pre-stage asks to fetch its images (docs/prestage.md; "
        "default: %(default)g; with no such node nothing is asked and it pivots at once); "
        "0 turns it off; a BundleDeployment's annotation prestage.rukpak.io/timeout "
        "overrides it (env PRESTAGE_TIMEOUT)",
    )
    flags.add_controller(p, lease=LEASE_NAME, workers="reconcile")
    p.add_argument(
        "--resync", type=float, default=30.0, help="seconds between full resyncs (default: 30)"
    )


def settings_from(args: argparse.Namespace) -> model.Settings:
    env: list[tuple[str, str]] = []
    for item in args.instance_env:
        key, sep, value = item.partition("=")
        if not sep or not key:
            raise errors.InvalidArgument(f"--instance-env wants KEY=VALUE, not {item!r}")
        env.append((key, value))
    if not args.image:
        raise errors.InvalidArgument("--image is required: the instance pods' image")
    if args.max_concurrent_runs < 1:
        raise errors.InvalidArgument(
            f"--max-concurrent-runs must be at least 1, not {args.max_concurrent_runs}"
        )
    base = args.content_base_url
    if base is None:
        base = f"https://{args.webhook_service}.{args.system_namespace}.svc"
    if not args.webhook_port:
        base = ""  # nothing serves it
    return command.config_from(
        model.Settings,
        args,
        service_account=args.instance_service_account,
        host_network=args.instance_host_network,
        content_base_url=base,
        env=tuple(env),
    )


def webhook_hosts(service: str, namespace: str) -> list[str]:
    """The names the webhook certificate serves: the Service's DNS names and loopback."""
    return [
        f"{service}.{namespace}.svc",
        f"{service}.{namespace}.svc.cluster.local",
        f"{service}.{namespace}",
        "localhost",
        "127.0.0.1",
    ]


def start_webhook(
    kube: Kube,
    args: argparse.Namespace,
    namespace: str,
    stop: threading.Event,
    *,
    default_namespace: str = model.Settings.default_install_namespace,
    metrics: Metrics | None = None,
    live: liveness.Check | None = None,
    settings: model.Settings | None = None,
) -> webhook.Server:
    """Serve the webhooks with the managed certificate; publish its CA (into the
    ValidatingWebhookConfiguration and the BundleDeployment CRD's conversion) in the
    background."""
    bundle = certs.ensure(kube, namespace, webhook_hosts(args.webhook_service, namespace))
    if metrics is not None:
        for which, not_after in certs.expiry(bundle).items():
            metrics.certificate_expiry.labels(which).set(not_after)
    server = webhook.Server(
        webhook.existing_from(kube, settings),
        bundle,
        host=args.webhook_bind,
        port=args.webhook_port,
        default_namespace=default_namespace,
        content=content.Content(
            kube,
            system_namespace=namespace,
            registry=lambda creds: oci_client.RegistryClient(
                credentials=creds, insecure=args.insecure_registry
            ),
        ),
        users=webhook.users_from(kube),
        deployments=webhook.deployments_from(kube),
        metrics=metrics,
        live=live,
    )
    server.start()

    def publish() -> None:
        delay = 1.0
        done = {"validating": False, "conversion": False}
        while not stop.is_set():
            try:
                if not done["conversion"]:
                    done["conversion"] = certs.publish_conversion_ca(kube, BD_CRD, bundle.ca)
                if not done["validating"]:
                    done["validating"] = certs.publish_ca(
                        kube, args.webhook_configuration, bundle.ca
                    )
                if all(done.values()):
                    return
                log.info(
                    "msg='webhook configuration not found yet' names=%s",
                    [name for name, ok in done.items() if not ok],
                )
            except errors.RukpakError as err:
                log.warning("msg='cannot publish the webhook CA' error=%r", err.message)
            stop.wait(delay)
            delay = min(delay * 2, 60.0)

    threading.Thread(target=publish, name="webhook-ca", daemon=True).start()
    return server


def cache_gauges(metrics: Metrics, leader: Callable[[], controller.Controller | None]) -> None:
    """The gauges read from the leader's cache at scrape time (empty on a standby)."""

    def read(
        sample: Callable[[controller.Controller], dict[tuple[str, ...], float]],
    ) -> Callable[[], dict[tuple[str, ...], float]]:
        return lambda: sample(ctl) if (ctl := leader()) is not None else {}

    metrics.gauge_of(
        "rukpak_bundledeployments",
        "BundleDeployments by condition type and status (the leader's cache).",
        ["condition", "status"],
        read(controller.Controller.by_condition),
    )
    metrics.gauge_of(
        "rukpak_revisions",
        "Kept revisions of every BundleDeployment by outcome (the leader's cache).",
        ["outcome"],
        read(controller.Controller.by_revision_outcome),
    )
    metrics.gauge_of(
        "rukpak_bundledeployments_rolled_back",
        "BundleDeployments whose installed revision is older than their newest kept one.",
        [],
        read(controller.Controller.rolled_back),
    )
    metrics.object_gauge(
        "rukpak_bundledeployment_status_condition",
        "One series per BundleDeployment and condition type, value 1: its status and reason "
        "(the leader's cache; BundleDeployments are cluster-scoped, so no namespace).",
        ["bundledeployment", "condition", "status", "reason"],
        lambda: object_conditions(ctl.bds.items()) if (ctl := leader()) is not None else (),
    )
    metrics.gauge_of(
        "rukpak_bundledeployment_rolled_back",
        "1 for a BundleDeployment whose installed revision is older than its newest kept one "
        "(a rollback in force), 0 for the others (the leader's cache).",
        ["bundledeployment"],
        read(controller.Controller.rolled_back_by_name),
    )


def run_manager(args: argparse.Namespace) -> int:
    """the Bundle and BundleDeployment controllers and the CRD validating webhook

    Reconcile Bundles (resolve image tags to digests, validate the content in an unpack pod)
    and BundleDeployments (generate their Bundles, install them with run-to-completion
    instance pods, restore drift, report conditions); serve the CRD upgrade-safety
    validating webhook.
    """
    stop = signals.stop_on_signals(log)
    try:
        settings = settings_from(args)
        kube = flags.kube(args)
    except errors.RukpakError as err:
        return service.failed(log, err)

    metrics = Metrics()
    metrics.requests_of(lambda: kube.answers, host=kube.host)
    leading: list[controller.Controller] = []
    cache_gauges(metrics, lambda: leading[0] if leading else None)
    metrics.leader.labels(LEASE_NAME).set(0)
    alive = liveness.Liveness()  # on this thread, which runs the election
    alive.waiting(
        f"waiting for the Lease {LEASE_NAME}" if args.leader_elect else "starting to lead"
    )

    def start() -> Callable[[], None]:
        alive.starting()
        ctl = controller.Controller(
            kube,
            settings,
            resolve=actuate.RegistryResolver(
                oci_client.RegistryClient(insecure=args.insecure_registry),
                with_credentials=lambda creds: oci_client.RegistryClient(
                    credentials=creds, insecure=args.insecure_registry
                ),
            ),
            resync=args.resync,
            metrics=metrics,
            watch_timeout=WATCH_TIMEOUT,
            signature_client=lambda creds: oci_client.RegistryClient(
                credentials=creds, insecure=args.insecure_registry
            ),
            prestage_gate=prestage.Gate(timeout=args.prestage_timeout),
        )
        alive.follow(ctl.queue)
        ctl.start(workers=args.workers)
        alive.leading()
        leading.append(ctl)
        metrics.leader.labels(LEASE_NAME).set(1)
        log.info("msg='manager started' system_namespace=%s", settings.system_namespace)

        def halt() -> None:
            alive.stopping()
            metrics.leader.labels(LEASE_NAME).set(0)
            leading.clear()
            ctl.stop()

        return halt

    server: webhook.Server | None = None
    try:
        if args.webhook_port:
            server = start_webhook(
                kube,
                args,
                settings.system_namespace,
                stop,
                default_namespace=settings.default_install_namespace,
                metrics=metrics,
                live=alive.check,
                settings=settings,
            )
        election = service.Election(args.leader_elect, settings.system_namespace, LEASE_NAME)
        return service.serve(kube, election, start, stop=stop, log=log, lost="stopped reconciling")
    except errors.RukpakError as err:
        return service.failed(log, err)
    finally:
        if server is not None:
            server.stop()
        kube.close()
