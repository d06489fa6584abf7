"""``rukpak-provisioner instance``: the process of the instance pod (DESIGN.md "Instance pod").

The pod mounts its Bundle's content read-only at ``/bundle`` (a CSI volume)
and runs this to completion: load the bundle, take the deployment's Lease
(``provisioner.runtime.lease``, so two runs never apply at once), install it with
the apply engine, record the install on the inventory ConfigMap (the Bundle, an
``engine.appliedrecord`` of the fields it owns, the optional objects it set
aside: ``runs.InstallRecord``), release the Lease and exit. The manager watches
the applied objects: it restores drift itself from what it saw last, and starts
a new run when it cannot. One function per step, wired together by ``run``; the
edge (arguments, signals, logging) is ``run_instance``.

Exit status:

* 0: installed and recorded; or stopped by SIGTERM/SIGINT (Lease released), also
  when the signal came while still waiting for the Lease;
* 1: the bundle is invalid, applying it failed, the Lease was lost, or the
  Lease could not be taken within ``--lease-timeout``. The message goes to
  stderr and to the termination log (``--termination-log``, by default
  ``/dev/termination-log`` when it exists), which Kubernetes shows as the
  container's termination message.

A bundle error is reported before waiting for the Lease: the volume is
read-only and loading it changes nothing, so a broken revision says so at
once, even while the previous revision's pod still holds the Lease.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import signal
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from types import FrameType
from typing import Any

from provisioner.engine.apply import appliedrecord, apply, ignore, inventory, optional
from provisioner.engine.bundle import formats
from provisioner.engine.kube.kube import Kube
from provisioner.instance import preview
from provisioner.runtime import flags, leader, lease, termination
from rukpak.common import command, errors

log = logging.getLogger("rukpak.instance")

EXIT_OK = 0
EXIT_ERROR = 1


@dataclass(frozen=True)
class Config:
    bundle_dir: Path
    name: str
    namespace: str = "default"
    system_namespace: str = inventory.DEFAULT_SYSTEM_NAMESPACE
    identity: str = ""
    lease_duration: float = 15.0
    lease_timeout: float | None = None
    bundle_format: str = formats.DEFAULT_FORMAT
    termination_log: Path | None = None
    bundle_name: str = ""
    """The Bundle being installed, recorded with the install (``--bundle``)."""
    source_dirs: tuple[Path, ...] = ()
    """With several sources (``--source-dir``): each a bundle root under ``bundle_dir``;
    the union of their objects is installed."""
    preview: bool = False
    """Apply nothing: write what the install would do (``instance.preview``) and exit."""
    ignore: tuple[ignore.Rule, ...] = ()
    """The BundleDeployment's ``spec.ignore`` (``--ignore``): fields left to other writers."""

    @property
    def options(self) -> apply.Options:
        """The deployment as the apply engine (and the preview) takes it."""
        return apply.Options(
            name=self.name,
            namespace=self.namespace,
            system_namespace=self.system_namespace,
            ignore=self.ignore,
        )


def ignore_rules(text: str) -> tuple[ignore.Rule, ...]:
    """The rules of ``--ignore`` (a JSON list, as ``spec.ignore``); ``InvalidRule`` when it
    is not one."""
    if not text:
        return ()
    try:
        doc = json.loads(text)
    except ValueError as err:
        raise ignore.InvalidRule(f"--ignore is not JSON: {err}") from None
    return ignore.parse_rules(doc)


def kv(msg: str, **fields: object) -> str:
    """``msg='...' key=value ...``: the log line format of every rukpak process."""
    parts = [f"msg={msg!r}"]
    for key, value in fields.items():
        text = str(value)
        if not text or any(c.isspace() or c in "'\"=" for c in text):
            text = repr(text)
        parts.append(f"{key}={text}")
    return " ".join(parts)


class Instance:
    """One run of the instance process; ``stop`` may be called from a signal handler."""

    def __init__(self, kube: Kube, config: Config) -> None:
        self.kube = kube
        self.config = config
        self.identity = config.identity or leader.default_identity()
        self.stopping = threading.Event()
        self.unfinished = False
        """Stopped before it installed anything (exit 0, nothing recorded): a standing
        provisioner gives such a run back instead of finishing it."""
        self.lock = lease.LeaseLock(
            kube,
            namespace=config.system_namespace,
            name=lease.lease_name(config.name),
            identity=self.identity,
            duration=config.lease_duration,
            on_lost=self._lease_lost,
        )

    def stop(self, why: str) -> None:
        if not self.stopping.is_set():
            log.info(kv("stopping", reason=why))
        self.stopping.set()

    def _lease_lost(self, why: str) -> None:
        self.stopping.set()

    def load(self) -> formats.Bundle:
        cfg = self.config
        log.info(kv("loading bundle", dir=cfg.bundle_dir, format=cfg.bundle_format))
        if cfg.source_dirs:
            roots = [
                (
                    str(d.relative_to(cfg.bundle_dir))
                    if d.is_relative_to(cfg.bundle_dir)
                    else str(d),
                    d,
                )
                for d in cfg.source_dirs
            ]
            bundle = formats.load_union(roots, format=cfg.bundle_format)
        else:
            bundle = formats.load(cfg.bundle_dir, format=cfg.bundle_format)
        log.info(kv("bundle loaded", objects=len(bundle.manifests)))
        return bundle

    def take_lease(self) -> bool:
        """Wait for the Lease; False when stopped first. Raises on ``--lease-timeout``."""
        log.info(kv("taking lease", lease=self.lock, identity=self.identity))
        started = time.monotonic()
        got = self.lock.acquire(
            timeout=self.config.lease_timeout,
            stop=self.stopping,
            waiting=lambda holder: log.info(
                kv("waiting for lease", lease=self.lock, holder=holder or "none")
            ),
        )
        if got:
            self.lock.start_renewing()
            log.info(
                kv(
                    "lease acquired",
                    lease=self.lock,
                    identity=self.identity,
                    waited=f"{time.monotonic() - started:.1f}s",
                )
            )
            return True
        if self.stopping.is_set():
            return False
        raise errors.DeadlineExceeded(
            f"lease {self.lock} still held by {self.lock.holder()!r}"
            f" after {self.config.lease_timeout}s"
        )

    def install(self, bundle: formats.Bundle) -> apply.Result:
        cfg = self.config
        started = time.monotonic()
        result = apply.install(
            self.kube, bundle, cfg.options, progress=lambda m: log.info(kv("progress", step=m))
        )
        log.info(
            kv(
                "installed",
                deployment=cfg.name,
                applied=len(result.applied),
                pruned=len(result.pruned),
                seconds=f"{time.monotonic() - started:.1f}",
            )
        )
        for ref, why in result.skipped:
            log.info(kv("left alone", object=ref, reason=why))
        if result.optional:
            log.info(kv("optional objects set aside", detail=optional.summary(result.optional)))
        return result

    def record(self, result: apply.Result) -> None:
        """The one install record, on the inventory ConfigMap (its own field manager, so
        the inventory's apply and the record's never remove each other's keys): what was
        applied, for the manager's drift detection and restore; ``Installed`` waits for it."""
        if not self.lock.held:
            raise errors.Aborted(f"lease {self.lock} lost before the install was recorded")
        cfg = self.config
        doc = {
            "by": self.identity,
            "bundle": cfg.bundle_name,
            "applied": appliedrecord.encode(appliedrecord.of(result.applied)),
            "awaiting": [list(api) for api in sorted(optional.awaited(result.optional))],
        }
        if os.environ.get("NODE_NAME"):
            doc["node"] = os.environ["NODE_NAME"]  # whose cache now holds the content
        body = inventory.record_configmap(cfg.name, doc, system_namespace=cfg.system_namespace)
        self.kube.apply(body, manager=inventory.RECORD_MANAGER)

    def run(self) -> int:
        """Every step in order; the exit status (see the module doc)."""
        try:
            bundle = self.load()
            if self.config.preview:
                return self.preview(bundle)
            if not self.take_lease():
                log.info(kv("stopped", lease="never taken"))
                self.unfinished = True
                return EXIT_OK
            self.unfinished = self.stopping.is_set()
            if not self.stopping.is_set():
                result = self.install(bundle)
                self.record(result)
                log.info(kv("install recorded; exiting", lease=self.lock))
            if self.lock.lost.is_set():
                return self._fail(f"lease {self.lock} lost; stopped applying")
        except errors.RukpakError as err:
            return self._fail(err.message)
        finally:
            if self.lock.held:
                released = self.lock.release()
                log.info(
                    kv("lease released" if released else "lease not released", lease=self.lock)
                )
        log.info(kv("stopped"))
        return EXIT_OK

    def preview(self, bundle: formats.Bundle) -> int:
        """What installing ``bundle`` would do, nothing applied (no Lease needed): the
        ConfigMap for ``rukpak preview``, the summary as the termination message."""
        cfg = self.config
        summary = preview.run(self.kube, bundle, cfg.options, revision=cfg.bundle_name)
        termination.write(cfg.termination_log, summary)
        return EXIT_OK

    def _fail(self, message: str) -> int:
        return _failed(self.config.termination_log, message)


def _failed(termination_log: Path | None, message: str) -> int:
    """A fatal error: logged, written to the termination log; the exit status."""
    log.error(kv("failed", error=message))
    termination.write(termination_log, message + "\n")
    return EXIT_ERROR


# -- the command line -------------------------------------------------------------------


def register(subparsers: Any) -> None:
    """Add ``instance`` to the ``rukpak-provisioner`` parser."""
    p = command.add(subparsers, "instance", run_instance)
    flags.add_bundle_dir(p)
    flags.add_deployment(p, name_is="owner label, inventory, Lease")
    flags.add_system_namespace(p, holds="the inventory and the Lease")
    p.add_argument(
        "--identity",
        default="",
        help="Lease holder identity (default: $POD_NAME, else hostname_random)",
    )
    p.add_argument(
        "--lease-duration",
        type=float,
        default=15.0,
        help="seconds a Lease outlives its holder's last renewal (default: %(default)s)",
    )
    p.add_argument(
        "--lease-timeout",
        type=float,
        default=None,
        help="give up (exit 1) after waiting this long for the Lease (default: wait forever)",
    )
    flags.add_format(p)
    p.add_argument(
        "--once",
        action="store_true",
        help="accepted for compatibility: every run is to completion",
    )
    p.add_argument(
        "--bundle",
        default="",
        help="name of the Bundle being installed, recorded with the install",
    )
    p.add_argument(
        "--source-dir",
        type=Path,
        action="append",
        default=[],
        help="a source's bundle root inside --bundle-dir (repeatable): the union of their "
        "objects is installed",
    )
    p.add_argument(
        "--preview",
        action="store_true",
        help="apply nothing: write what the install would do (objects, RBAC, CRDs) to the "
        "ConfigMap rukpak-preview-NAME and its summary to the termination log",
    )
    p.add_argument(
        "--ignore",
        default="",
        help="the BundleDeployment's spec.ignore as JSON: fields (JSON pointers, per target) "
        "sent when an object is created and left to their other writer afterwards",
    )
    termination.add_flag(p, what="a fatal error (with --preview: the summary)")
    flags.add_cluster(p)


def run_instance(args: argparse.Namespace) -> int:
    """the instance pod's process: apply a mounted bundle once and record it

    Take the deployment's Lease, apply the bundle at --bundle-dir, record the install on the
    inventory ConfigMap, release the Lease and exit.

    exit status: 0 installed (or stopped by a signal); 1 bundle or apply error, or the Lease
    lost (the message also goes to the termination log)
    """
    try:
        rules = ignore_rules(args.ignore)
    except errors.RukpakError as err:
        return _failed(termination.where(args.termination_log), err.message)
    config = command.config_from(
        Config,
        args,
        bundle_format=args.format,
        termination_log=termination.where(args.termination_log),
        bundle_name=args.bundle,
        source_dirs=tuple(args.source_dir),
        ignore=rules,
    )
    try:
        kube = flags.kube(args)
        instance = Instance(kube, config)
    except errors.RukpakError as err:
        return _failed(config.termination_log, err.message)

    def on_signal(signum: int, _frame: FrameType | None) -> None:
        instance.stop(signal.Signals(signum).name)

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info(
        kv(
            "starting",
            deployment=config.name,
            namespace=config.namespace,
            identity=instance.identity,
            pid=os.getpid(),
        )
    )
    try:
        return instance.run()
    finally:
        kube.close()
