"""The one adapter between the engine and the Kubernetes API.

Everything else in the engine is pure; this module turns its decisions into
HTTP requests through the ``kubernetes`` client's ``ApiClient`` (auth, TLS,
kubeconfig handling) and turns HTTP failures into ``rukpak.common.errors`` values
carrying the API server's own message. It speaks JSON to raw REST paths
rather than through the generated typed APIs, so one code path serves every
kind, including custom resources created moments ago.

Requests go straight to the client's urllib3 pool (its TLS settings, its
auth headers from ``update_params_for_auth``) with the body serialised once
here: the generic request path of the client walks and re-encodes every
body, which costs more CPU than the request itself on a busy install. The
pool keeps ``pool_size`` connections: at least as many as the threads that
share the adapter, or urllib3 discards the extra connections after each use.

Discovery (is a kind namespaced, what is its plural) is cached by
``engine.discovery``. Every request carries a timeout; watches also ask the
server to end them (``timeoutSeconds``); ``rukpak.kube.listwatch`` builds the
list+watch loop and the informer cache on ``list`` and ``watch`` (a ``listwatch.Source``:
this adapter writes ``events``, the core spells ``watch``).

``Kube.requests`` counts the requests sent, by HTTP method, and
``Kube.writes`` the write requests among them (POST, PUT, PATCH, DELETE):
the figure behind "a no-op re-apply sends no writes" (tests, ``make bench``).
"""

from __future__ import annotations

import copy
import json
import os
import threading
from collections import Counter
from collections.abc import Callable, Iterator
from typing import Any
from urllib.parse import quote, urlencode

import urllib3
from kubernetes import client as k8s_client
from kubernetes import config as k8s_config

from provisioner.engine.errors import UnknownKind
from provisioner.engine.kube import discovery
from provisioner.engine.kube.discovery import Resource
from provisioner.engine.objects import FIELD_MANAGER, Obj, ObjectRef
from rukpak.common import errors
from rukpak.kube import listwatch
from rukpak.kube.listwatch import Gone

DEFAULT_TIMEOUT = 30.0
WRITE_METHODS = frozenset({"POST", "PUT", "PATCH", "DELETE"})


_STATUS_ERRORS: dict[int, type[errors.RukpakError]] = {
    400: errors.InvalidArgument,
    401: errors.Unauthenticated,
    403: errors.PermissionDenied,
    404: errors.NotFound,
    409: errors.Aborted,
    410: Gone,
    415: errors.InvalidArgument,
    422: errors.InvalidArgument,
    429: errors.Unavailable,
}


def error_for(status: int, body: bytes, what: str) -> errors.RukpakError:
    """The error value for an HTTP failure, with the API server's message."""
    message = body.decode(errors="replace").strip()
    reason = ""
    try:
        doc = json.loads(body)
        if isinstance(doc, dict):
            message = str(doc.get("message") or message)
            reason = str(doc.get("reason") or "")
    except ValueError:
        pass
    if status == 409 and reason == "AlreadyExists":
        cls: type[errors.RukpakError] = errors.AlreadyExists
    elif status >= 500:
        cls = errors.Unavailable
    else:
        cls = _STATUS_ERRORS.get(status, errors.Internal)
    return cls(f"{what}: {message or f'HTTP {status}'}")


def _timeout(limit: float | tuple[float, float]) -> urllib3.Timeout:
    if isinstance(limit, tuple):
        return urllib3.Timeout(connect=limit[0], read=limit[1])
    return urllib3.Timeout(total=limit)


class Kube(listwatch.Source):
    """JSON over REST to one API server; safe to share between threads."""

    def __init__(self, api: k8s_client.ApiClient, *, timeout: float = DEFAULT_TIMEOUT) -> None:
        self._api = api
        self.timeout = timeout
        self._lock = threading.Lock()
        self._discovery = discovery.Discovery(self._get_discovery)
        self._requests: Counter[str] = Counter()
        self._answers: Counter[tuple[str, str]] = Counter()
        self._as: dict[str, str] = {}

    @property
    def requests(self) -> dict[str, int]:
        """Requests sent so far by HTTP method (dry runs included: they are PATCHes too)."""
        with self._lock:
            return dict(self._requests)

    @property
    def writes(self) -> int:
        """Write requests (POST, PUT, PATCH, DELETE) sent so far."""
        with self._lock:
            return sum(n for method, n in self._requests.items() if method in WRITE_METHODS)

    def _count(self, method: str) -> None:
        with self._lock:
            self._requests[method] += 1

    @property
    def host(self) -> str:
        """The API server's address (``https://host:port``), as configured."""
        return str(self._api.configuration.host)

    @property
    def answers(self) -> dict[tuple[str, str], int]:
        """Answers so far by (HTTP method, status code; ``<error>`` when none came), watches
        left out: client-go's ``rest_client_requests_total``."""
        with self._lock:
            return dict(self._answers)

    def _answered(self, method: str, code: str) -> None:
        with self._lock:
            self._answers[(method, code)] += 1

    @classmethod
    def from_kubeconfig(
        cls, path: str | None = None, *, context: str | None = None, pool_size: int = 16
    ) -> Kube:
        """Client for ``path`` (else $KUBECONFIG, else ~/.kube/config, else in-cluster)."""
        cfg = k8s_client.Configuration()
        path = path or os.environ.get("KUBECONFIG") or None
        default = os.path.expanduser("~/.kube/config")
        try:
            if path or os.path.exists(default) or not os.environ.get("KUBERNETES_SERVICE_HOST"):
                load: Callable[..., None] = k8s_config.load_kube_config
                load(config_file=path, context=context, client_configuration=cfg)
            else:
                load_in_cluster: Callable[..., None] = k8s_config.load_incluster_config
                load_in_cluster(client_configuration=cfg)
        except (k8s_config.ConfigException, OSError) as err:
            raise errors.FailedPrecondition(
                f"cannot load kubeconfig {path or default}: {err}"
            ) from None
        cfg.connection_pool_maxsize = max(pool_size, cfg.connection_pool_maxsize or 0)
        return cls(k8s_client.ApiClient(cfg))

    def impersonating(self, user: str) -> Kube:
        """The same client acting as ``user`` (``Impersonate-User``): its requests are
        allowed what ``user`` is allowed, given the caller may impersonate it. Shares the
        connection pool, discovery and request counts; ``close`` the original only."""
        other = copy.copy(self)
        other._as = {**self._as, "Impersonate-User": user}
        return other

    def close(self) -> None:
        self._api.close()  # type: ignore[no-untyped-call]

    # -- HTTP ---------------------------------------------------------------

    def _get_discovery(self, path: str, what: str) -> Any:
        return self._send("GET", path, what=what)

    def _send(
        self,
        method: str,
        path: str,
        *,
        what: str,
        query: dict[str, str] | None = None,
        body: Any = None,
        content_type: str | None = None,
        timeout: float | tuple[float, float] | None = None,
    ) -> Any:
        api = self._api
        headers = {**api.default_headers, **self._as, "Accept": "application/json"}
        if content_type:
            headers["Content-Type"] = content_type
        params = list((query or {}).items())
        api.update_params_for_auth(headers, params, ["BearerToken"], path, method, None)
        url = api.configuration.host + path
        if params:
            url += "?" + urlencode(params, quote_via=quote)
        data = None if body is None else json.dumps(body, separators=(",", ":")).encode()
        limit = timeout or self.timeout
        self._count(method)
        try:
            resp = api.rest_client.pool_manager.urlopen(
                method,
                url,
                body=data,
                headers=headers,
                timeout=_timeout(limit),
                preload_content=True,
            )
        except (urllib3.exceptions.HTTPError, OSError) as err:
            self._answered(method, "<error>")
            raise errors.Unavailable(f"{what}: API server unreachable: {err}") from None
        self._answered(method, str(resp.status))
        if not 200 <= resp.status < 300:
            raise error_for(resp.status, resp.data, what)
        return json.loads(resp.data) if resp.data else None

    # -- discovery ----------------------------------------------------------

    def resource(self, api_version: str, kind: str) -> Resource:
        """Discovery for one kind; refreshes the group/version once when the kind is missing."""
        return self._discovery.resource(api_version, kind)

    def serves(self, api_version: str, kind: str) -> bool:
        """Whether the API server answers a one-item list of ``kind`` in ``api_version``.

        A version added to an existing CRD can be Established and listed by discovery a
        moment before the server's handler for it is ready (requests then get a bare
        404), so "served" is proven by asking, not by discovery alone.
        """
        try:
            res = self.resource(api_version, kind)
            self._send("GET", res.path(), what=f"list {kind}", query={"limit": "1"})
        except (UnknownKind, errors.NotFound):
            return False
        return True

    # -- objects ------------------------------------------------------------

    def _locate(self, ref: ObjectRef) -> Resource:
        return self.resource(ref.api_version, ref.kind)

    def get(self, ref: ObjectRef) -> Obj | None:
        """The live object, or None when it (or its kind) does not exist."""
        try:
            res = self._locate(ref)
            result: Obj = self._send("GET", res.path(ref.namespace, ref.name), what=f"get {ref}")
        except (errors.NotFound, UnknownKind):
            return None
        return result

    def apply(
        self, obj: Obj, *, force: bool = True, dry_run: bool = False, manager: str = FIELD_MANAGER
    ) -> Obj:
        """Server-side apply of ``obj`` under field manager ``manager`` (``rukpak``); the
        live result."""
        ref = ObjectRef.of(obj)
        res = self._locate(ref)
        query = {"fieldManager": manager, "force": "true" if force else "false"}
        if dry_run:
            query["dryRun"] = "All"
        result: Obj = self._send(
            "PATCH",
            res.path(ref.namespace, ref.name),
            what=f"apply {ref}",
            query=query,
            body=obj,
            content_type="application/apply-patch+yaml",
        )
        return result

    def create(self, obj: Obj) -> Obj:
        """POST ``obj``; ``AlreadyExists`` when an object of that name is there already."""
        ref = ObjectRef.of(obj)
        res = self._locate(ref)
        created: Obj = self._send("POST", res.path(ref.namespace), what=f"create {ref}", body=obj)
        return created

    def merge_patch(self, ref: ObjectRef, patch: Obj) -> Obj:
        res = self._locate(ref)
        result: Obj = self._send(
            "PATCH",
            res.path(ref.namespace, ref.name),
            what=f"patch {ref}",
            body=patch,
            content_type="application/merge-patch+json",
        )
        return result

    def merge_patch_status(self, ref: ObjectRef, patch: Obj) -> Obj:
        """Merge-patch ``ref``'s status subresource."""
        res = self._locate(ref)
        result: Obj = self._send(
            "PATCH",
            res.path(ref.namespace, ref.name) + "/status",
            what=f"patch status of {ref}",
            body=patch,
            content_type="application/merge-patch+json",
        )
        return result

    def delete(self, ref: ObjectRef, *, propagation: str = "Background") -> bool:
        """Delete ``ref``; False when it was already gone (idempotent)."""
        try:
            res = self._locate(ref)
            self._send(
                "DELETE",
                res.path(ref.namespace, ref.name),
                what=f"delete {ref}",
                body={
                    "kind": "DeleteOptions",
                    "apiVersion": "v1",
                    "propagationPolicy": propagation,
                },
            )
        except (errors.NotFound, UnknownKind):
            return False
        return True

    def list(
        self,
        api_version: str,
        kind: str,
        *,
        namespace: str = "",
        label_selector: str = "",
    ) -> tuple[list[Obj], str]:
        """Objects of a kind (every namespace unless ``namespace``), and the resourceVersion."""
        res = self.resource(api_version, kind)
        query: dict[str, str] = {"limit": "500"}
        if label_selector:
            query["labelSelector"] = label_selector
        items: list[Obj] = []
        while True:
            doc = self._send("GET", res.path(namespace), what=f"list {kind}", query=query)
            for item in doc.get("items") or []:
                item.setdefault("apiVersion", api_version)
                item.setdefault("kind", kind)
                items.append(item)
            meta = doc.get("metadata") or {}
            if not meta.get("continue"):
                return items, str(meta.get("resourceVersion", ""))
            query["continue"] = meta["continue"]

    def events(self, request: listwatch.Watch) -> Iterator[tuple[str, Obj]]:
        """Events ``(type, object)`` after the watch's resourceVersion; raises ``Gone`` on 410.

        Ends when the server closes the watch (after ``timeout_seconds``); the
        client read timeout is a little longer so a dead connection cannot hang.
        """
        kind, timeout_seconds = request.kind, request.timeout_seconds
        res = self.resource(request.api_version, kind)
        query = {
            "watch": "true",
            "resourceVersion": request.resource_version,
            "allowWatchBookmarks": "true",
            "timeoutSeconds": str(timeout_seconds),
        }
        if request.label_selector:
            query["labelSelector"] = request.label_selector
        m, url, h, b, post = self._api.param_serialize(
            "GET",
            res.path(request.namespace),
            query_params=list(query.items()),
            header_params={**self._as, "Accept": "application/json"},
            auth_settings=["BearerToken"],
        )
        self._count("GET")
        try:
            resp = self._api.call_api(
                m, url, h, b, post, _request_timeout=(self.timeout, timeout_seconds + 15)
            )
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise errors.Unavailable(f"watch {kind}: API server unreachable: {err}") from None
        raw = resp.response
        try:
            if resp.status != 200:
                raise error_for(resp.status, raw.data, f"watch {kind}")
            for line in raw:
                if not line.strip():
                    continue
                event = json.loads(line)
                obj = event.get("object") or {}
                if event.get("type") == "ERROR":
                    code = int(obj.get("code") or 500)
                    raise error_for(code, json.dumps(obj).encode(), f"watch {kind}")
                yield str(event.get("type")), obj
        except (urllib3.exceptions.HTTPError, OSError) as err:
            raise errors.Unavailable(f"watch {kind}: stream broke: {err}") from None
        finally:
            raw.release_conn()
