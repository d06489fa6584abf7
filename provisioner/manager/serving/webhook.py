"""The manager's webhooks over HTTPS: CRD upgrade safety (upstream's crdvalidator) and the
BundleDeployment conversion between v1alpha1 and v1alpha2.

Sits beside the controllers in the manager process. The API server sends an
``admission.k8s.io/v1`` AdmissionReview for every CRD update; ``decide``
(pure, given a way to read existing custom resources) answers:

- admit a create, a CRD no BundleDeployment owns (no ``core.rukpak.io/owner-name``
  label), and a CRD that opts out (``core.rukpak.io/crd-upgrade-safety: disabled``,
  or upstream's ``core.rukpak.io/safe-crd-upgrade-validation: "false"``);
- otherwise run ``engine.crdsafety`` (the same check as the apply-time preflight)
  and deny, in upstream's words, when a stored version would be removed or
  existing custom resources would become invalid.

``BD_PATH`` refuses a create or update of a BundleDeployment whose ``spec.dependsOn``
closes a cycle, naming it (``dependencies.admission_denial`` judges; the other
BundleDeployments are read through the API along the path only).

``CONVERT_PATH`` answers the API server's ConversionReviews for the BundleDeployment
CRD with ``conversion.review`` (pure, lossless both ways).

Each review is counted with controller-runtime's webhook metrics (``runtime.metrics``: by
path and HTTP code, latency, in flight) and by ``verdict``.

``METRICS_PATH`` serves the manager's metrics behind the same authorization, and
``content`` answers ``GET /bundles/<name>.tgz`` (a bundle's content, for callers the API
server authorizes: ``status.contentURL``). ``/healthz`` (readiness: the server answers)
and ``/livez`` (liveness: the manager's ``runtime.liveness`` check, naming what is stuck)
answer anyone.

``Server`` serves these paths with the manager's own certificate (``certs``) on a
socket bound with SO_REUSEPORT, so two replicas on one host network both start.
Every replica serves them (both are read-only), leader or not.
"""

from __future__ import annotations

import json
import logging
import socket
import ssl
import tempfile
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from http.server import BaseHTTPRequestHandler
from pathlib import Path
from typing import Any

from provisioner.engine.apply import crdsafety
from provisioner.engine.bundle import words
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import OWNER_LABEL, Obj, ObjectRef, meta_of, owner_of
from provisioner.manager import conversion, model
from provisioner.manager.planning import dependencies, plan
from provisioner.manager.serving import certs
from provisioner.manager.serving import content as bundle_content
from provisioner.runtime import liveness
from provisioner.runtime import metrics as runtime_metrics
from rukpak.common import errors, httpanswer

log = logging.getLogger("rukpak.webhook")

PATH = "/validate-crd"
CONVERT_PATH = "/convert"
METRICS_PATH = "/metrics"
"""Prometheus metrics (``runtime.metrics``), for callers allowed ``get`` on it (ClusterRole
``rukpak-metrics-reader``), as the content is."""
DEFAULT_PORT = 9443
CONFIGURATION_NAME = "rukpak-crd-validator"
UPSTREAM_OPT_OUT = words.CRD_VALIDATION_ANNOTATION
MAX_BODY = 8 * 1024 * 1024
DRAIN_SECONDS = 5.0  # how long a stopping server waits for the answers ``drain`` started

Existing = Callable[[Obj, Obj], Mapping[str, Sequence[Obj]]]
"""(live CRD, new CRD) -> for each new version, the custom resources to check against it."""


def owned(crd: Obj | None) -> bool:
    labels = ((crd or {}).get("metadata") or {}).get("labels") or {}
    return bool(labels.get(OWNER_LABEL))


def opted_out(crd: Obj) -> bool:
    annotations = meta_of(crd).get("annotations") or {}
    return (
        crdsafety.opted_out(crd)
        or annotations.get(UPSTREAM_OPT_OUT) == words.CRD_VALIDATION_DISABLED
    )


def decide(operation: str, old: Obj | None, new: Obj | None, existing: Existing) -> str:
    """The reason to deny, or "" to admit (see the module docstring)."""
    if operation != "UPDATE" or old is None or new is None:
        return ""
    if not (owned(old) or owned(new)) or opted_out(new):
        return ""
    name = str(meta_of(new).get("name") or "")
    try:
        reasons = crdsafety.findings(old, new, existing(old, new))
    except errors.RukpakError as err:
        reasons = [f"cannot read the existing custom resources: {err.message}"]
    if not reasons:
        return ""
    return words.crd_denied(operation, name, reasons)


CONFIGMAP_PATH = "/validate-configmap"

Users = Callable[[str], list[str]]
"""ConfigMap name -> what uses it (``bundle 'NAME'``, ``bundledeployment 'NAME'``)."""


def configmap_denial(operation: str, old: Obj | None, users: Users) -> str:
    """Why deleting a bundle ConfigMap is refused ("" to admit): one that a Bundle or a
    v1alpha2 BundleDeployment sources stays while it is in use (upstream's rule)."""
    if operation != "DELETE" or old is None:
        return ""
    name = str(meta_of(old).get("name") or "")
    using = users(name)
    if not using:
        return ""
    more = f" (and {len(using) - 1} more)" if len(using) > 1 else ""
    return f'configmap "{name}" is in use by {using[0]}{more}'


def _configmap_names(source: object) -> list[str]:
    if not isinstance(source, dict) or source.get("type") != "configMaps":
        return []
    return [
        str((e.get("configMap") or {}).get("name") or "")
        for e in source.get("configMaps") or []
        if isinstance(e, dict)
    ]


def users_from(kube: Kube) -> Users:
    """Read the Bundles and v1alpha2 BundleDeployments that source a ConfigMap."""

    def users(name: str) -> list[str]:
        found: list[str] = []
        for bundle in kube.list("core.rukpak.io/v1alpha1", "Bundle")[0]:
            if name in _configmap_names((bundle.get("spec") or {}).get("source")):
                found.append(f'bundle "{meta_of(bundle).get("name")}"')
        for bd in kube.list("core.rukpak.io/v1alpha2", "BundleDeployment")[0]:
            spec = bd.get("spec") or {}
            if conversion.origin(bd) != "v1alpha2":
                continue  # its generated Bundles are listed above
            sourced = [spec.get("source"), *(spec.get("sources") or [])]
            if any(name in _configmap_names(s) for s in sourced):
                found.append(f'bundledeployment "{meta_of(bd).get("name")}"')
        return found

    return users


def configmap_review(body: Obj, users: Users) -> Obj:
    """The AdmissionReview response for a ConfigMap deletion (admitted if users cannot be
    read: this check protects, it must not block the namespace)."""
    request = body.get("request") or {}
    try:
        denial = configmap_denial(
            str(request.get("operation") or ""), request.get("oldObject"), users
        )
    except errors.RukpakError as err:
        log.warning("msg='cannot read configmap users; admitting' error=%r", err.message)
        denial = ""
    return _admission_review(request, denial)


BD_PATH = "/validate-bundledeployment"


def deployments_from(kube: Kube) -> dependencies.Lookup:
    """Read one BundleDeployment by name through the API (in the storage version)."""

    def lookup(name: str) -> Obj | None:
        return kube.get(ObjectRef(conversion.GROUP, "v1alpha2", "BundleDeployment", "", name))

    return lookup


def bd_review(body: Obj, lookup: dependencies.Lookup) -> Obj:
    """The AdmissionReview response for a BundleDeployment create or update (admitted if
    the others cannot be read: the manager still reports a cycle as ``DependencyCycle``)."""
    request = body.get("request") or {}
    new, old = request.get("object"), request.get("oldObject")
    try:
        denial = dependencies.admission_denial(
            str(request.get("operation") or ""),
            conversion.to_v1alpha2(old) if isinstance(old, dict) else None,
            conversion.to_v1alpha2(new) if isinstance(new, dict) else None,
            lookup,
        )
    except errors.RukpakError as err:
        log.warning("msg='cannot read bundledeployments; admitting' error=%r", err.message)
        denial = ""
    if denial:
        log.info("msg='denied' bundledeployment=%s", request.get("name"))
    return _admission_review(request, denial)


def existing_from(kube: Kube, settings: model.Settings | None = None) -> Existing:
    """Read the custom resources ``crdsafety.check`` needs through the API: with
    ``settings``, as the instance identity of the BundleDeployment that owns the CRD (the
    manager itself may not list arbitrary kinds), else as ``kube``."""

    def read(old: Obj, new: Obj) -> Mapping[str, Sequence[Obj]]:
        spec = old.get("spec") or {}
        group, kind = spec.get("group", ""), (spec.get("names") or {}).get("kind", "")
        reader = kube
        if settings is not None:
            # the owner as it was: an Orphan uninstall's update takes the label off
            owner = owner_of(old) or owner_of(new) or ""
            ref = ObjectRef(conversion.GROUP, "v1alpha2", "BundleDeployment", "", owner)
            bd = kube.get(ref) if owner else None
            reader = kube.impersonating(plan.instance_user(bd or {}, settings))
        out: dict[str, list[Obj]] = {}
        for version, read_at in crdsafety.read_plan(old, new).items():
            out[version] = reader.list(f"{group}/{read_at}", kind)[0]
        return out

    return read


def review(body: Obj, existing: Existing) -> Obj:
    """The AdmissionReview response to an AdmissionReview request."""
    request = body.get("request") or {}
    denial = decide(
        str(request.get("operation") or ""),
        request.get("oldObject"),
        request.get("object"),
        existing,
    )
    if denial:
        log.info("msg='denied' crd=%s", request.get("name"))
    return _admission_review(request, denial)


def _admission_review(request: Obj, denial: str) -> Obj:
    """The AdmissionReview answering ``request``: allowed, or refused (403) for ``denial``."""
    response: Obj = {"uid": str(request.get("uid") or ""), "allowed": not denial}
    if denial:
        response["status"] = {"code": 403, "reason": "Forbidden", "message": denial}
    return {"apiVersion": "admission.k8s.io/v1", "kind": "AdmissionReview", "response": response}


def verdict(path: str, code: int, doc: Obj) -> str:
    """The ``verdict`` label of ``rukpak_webhook_verdicts_total`` for an answer: ``refused``
    (not a review: HTTP 400), ``converted`` or ``failed`` (a ConversionReview's
    ``result.status``), ``allowed`` or ``denied`` (an AdmissionReview's ``allowed``)."""
    if code != 200:
        return "refused"
    response = doc.get("response") or {}
    if path == CONVERT_PATH:
        status = (response.get("result") or {}).get("status")
        return "converted" if status == "Success" else "failed"
    return "allowed" if response.get("allowed") else "denied"


class _TLSServer(httpanswer.Server):
    """Accepts plain connections on a SO_REUSEPORT socket and does each TLS handshake in
    that connection's own thread, within ``httpanswer.CONNECTION_TIMEOUT``: a client that
    connects and says nothing holds only its thread, never the accepting loop (which every
    webhook call, and the kubelet's probes, go through)."""

    tls: ssl.SSLContext | None = None

    def server_bind(self) -> None:
        self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        if hasattr(socket, "SO_REUSEPORT"):
            self.socket.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEPORT, 1)
        super().server_bind()

    def finish_request(self, request: Any, client_address: Any) -> None:
        assert self.tls is not None
        try:
            conn = self.tls.wrap_socket(request, server_side=True)
        except (OSError, ValueError) as exc:  # ssl.SSLError and timeouts are OSErrors
            log.debug("msg='tls handshake failed' client=%s error=%r", client_address, exc)
            return  # the plain socket is closed by shutdown_request
        try:
            super().finish_request(conn, client_address)
        finally:
            self.shutdown_request(conn)  # as for a plain connection: end writes, then close

    def drain(self, *, within: float) -> None:
        """Serve what already waits in the accept queue (a closing SO_REUSEPORT listener
        resets it), waiting ``within`` seconds at most for those answers."""
        self.socket.setblocking(False)
        serving: list[threading.Thread] = []
        while True:
            try:
                request, address = self.get_request()  # with the connection timeout
            except OSError:  # BlockingIOError: nothing left
                break
            thread = threading.Thread(
                target=self.process_request_thread, args=(request, address), daemon=True
            )
            thread.start()
            serving.append(thread)
        end = time.monotonic() + within
        for thread in serving:
            thread.join(timeout=max(0.0, end - time.monotonic()))


def _handler(
    existing: Existing,
    default_namespace: str,
    content: bundle_content.Content | None,
    users: Users | None,
    metrics: runtime_metrics.Metrics | None,
    live: liveness.Check | None,
    deployments: dependencies.Lookup | None = None,
) -> type[BaseHTTPRequestHandler]:
    class Handler(BaseHTTPRequestHandler):
        def do_POST(self) -> None:
            path = self.path.split("?", 1)[0]
            if path not in (PATH, CONVERT_PATH, CONFIGMAP_PATH, BD_PATH):
                paths = f"{PATH}, {CONFIGMAP_PATH}, {BD_PATH} or {CONVERT_PATH}"
                self._send(404, {"message": f"no webhook at {self.path}; use {paths}"})
                return  # not counted: a path of the caller's choosing is no label value
            start = time.monotonic()
            if metrics is not None:
                metrics.webhook_in_flight.labels(path).inc()
            try:
                code, doc = self._review(path)
                self._send(code, doc)
            finally:
                if metrics is not None:
                    metrics.webhook_in_flight.labels(path).dec()
            if metrics is not None:
                metrics.webhook_answered(
                    path,
                    code=code,
                    verdict=verdict(path, code, doc),
                    seconds=time.monotonic() - start,
                )

        def _review(self, path: str) -> tuple[int, Obj]:
            what = "a ConversionReview" if path == CONVERT_PATH else "an AdmissionReview"
            try:
                length = int(self.headers.get("Content-Length") or 0)
            except ValueError:
                length = 0
            if length <= 0 or length > MAX_BODY:
                return 400, {"message": f"{what} body of at most {MAX_BODY} bytes is required"}
            try:
                body: Any = json.loads(self.rfile.read(length))
                if not isinstance(body, dict):
                    raise ValueError("not an object")
            except ValueError as err:
                return 400, {"message": f"the body is not {what}: {err}"}
            if path == PATH:
                return 200, review(body, existing)
            if path == CONFIGMAP_PATH:
                return 200, configmap_review(body, users or (lambda name: []))
            if path == BD_PATH:
                return 200, bd_review(body, deployments or (lambda name: None))
            return 200, conversion.review(body, default_namespace=default_namespace)

        def _token(self) -> str:
            auth = str(self.headers.get("Authorization") or "")
            return auth[len("Bearer ") :].strip() if auth.startswith("Bearer ") else ""

        def _metrics(self) -> None:
            assert content is not None and metrics is not None
            try:
                bundle_content.authorize(content.kube, self._token(), METRICS_PATH)
            except bundle_content.Denied as denied:
                self._send(denied.status, {"message": denied.message})
                return
            except errors.RukpakError as err:
                self._send(503, {"message": f"cannot authorize: {err.message}"})
                return
            httpanswer.answer(self, 200, metrics.exposition(), runtime_metrics.CONTENT_TYPE)

        def do_GET(self) -> None:
            path = self.path.split("?", 1)[0]
            if path == METRICS_PATH and metrics is not None and content is not None:
                self._metrics()
                return
            if path == liveness.LIVEZ_PATH and live is not None:
                ok, reason = live()
                self._send(200 if ok else 503, {"ok": ok, "message": reason})
                return
            name = bundle_content.name_of_path(path)
            if name is None or content is None:
                self._send(200 if path == "/healthz" else 404, {"ok": path == "/healthz"})
                return
            token = self._token()
            try:
                user = bundle_content.authorize(content.kube, token, path)
                data = content.tarball(name)
            except bundle_content.Denied as denied:
                self._send(denied.status, {"message": denied.message})
                return
            except errors.NotFound as err:
                self._send(404, {"message": err.message})
                return
            except errors.RukpakError as err:
                log.warning("msg='content failed' name=%s error=%r", name, err.message)
                self._send(502, {"message": f"cannot fetch the content of {name}: {err.message}"})
                return
            log.info("msg='content served' name=%s user=%s bytes=%d", name, user, len(data))
            httpanswer.answer(self, 200, data, "application/gzip")

        def _send(self, code: int, doc: Obj) -> None:
            httpanswer.answer_json(self, code, doc)

        def log_message(self, format: str, *args: Any) -> None:
            log.debug("msg='request' %s", format % args)

    return Handler


class Server:
    """The HTTPS server of ``PATH``, ``CONVERT_PATH`` (and ``/healthz``, and ``/livez`` when
    given ``live``) on one daemon thread."""

    def __init__(
        self,
        existing: Existing,
        bundle: certs.Bundle,
        *,
        host: str = "0.0.0.0",
        port: int = 0,
        default_namespace: str = conversion.DEFAULT_INSTALL_NAMESPACE,
        content: bundle_content.Content | None = None,
        users: Users | None = None,
        metrics: runtime_metrics.Metrics | None = None,
        live: liveness.Check | None = None,
        deployments: dependencies.Lookup | None = None,
    ) -> None:
        handler = _handler(existing, default_namespace, content, users, metrics, live, deployments)
        self._httpd = _TLSServer((host, port), handler)
        context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        with tempfile.TemporaryDirectory(prefix="rukpak-webhook-") as tmp:
            cert, key = Path(tmp) / "tls.crt", Path(tmp) / "tls.key"
            cert.write_bytes(bundle.cert)
            key.touch(mode=0o600)
            key.write_bytes(bundle.key)
            context.load_cert_chain(cert, key)
        self._httpd.tls = context
        self._thread: threading.Thread | None = None

    @property
    def port(self) -> int:
        return int(self._httpd.server_address[1])

    def start(self) -> None:
        self._thread = threading.Thread(
            target=self._httpd.serve_forever, name="webhook", daemon=True
        )
        self._thread.start()
        log.info("msg='webhook serving' port=%d paths=%s,%s", self.port, PATH, CONVERT_PATH)

    def stop(self) -> None:
        """Stop accepting, answer the connections already accepted by the kernel (within
        ``DRAIN_SECONDS``), close."""
        if self._thread is not None:
            self._httpd.shutdown()
        self._httpd.drain(within=DRAIN_SECONDS)
        self._httpd.server_close()
        if self._thread is not None:
            self._thread.join(timeout=5)
