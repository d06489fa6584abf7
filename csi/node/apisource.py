"""A ``listwatch.Source`` over the official ``kubernetes`` client, for custom resources.

Where it sits: in the node plugin, under ``csi.node.policies``, the plugin's one reader of
the API server; the core's ``rukpak.kube.listwatch`` follows a kind through it (the shared
core itself speaks no Kubernetes API, an import contract). The provisioner has its own
HTTP adapter (``provisioner.engine.kube.Kube``), which is a ``Source`` too. Both write
``list`` and ``events``; ``watch``, the call ``ListWatch`` makes, is the core's.

Only kinds served under ``/apis`` (custom resources: group, version and plural given at
construction) are followed; the client's failures become ``rukpak.common.errors``: 410 is
``listwatch.Gone`` (re-list), 404 ``NotFound`` (the CRD is not installed), 401/403
``PermissionDenied``, anything else, including a connection that fails, ``Unavailable``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from typing import Any

from kubernetes import client, config, watch
from kubernetes.client.exceptions import ApiException

from rukpak.common import errors
from rukpak.kube import listwatch
from rukpak.kube.listwatch import Gone, Obj

REQUEST_TIMEOUT = 10.0
"""Seconds a list waits for the API server (a watch waits its own timeout plus this)."""


def api_from_environment(needed_by: str) -> client.ApiClient:
    """An API client with the pod's in-cluster credentials, or $KUBECONFIG's when set;
    FailedPrecondition naming ``needed_by`` (the flag that asked for it) without either."""
    cfg = client.Configuration()
    loader: Callable[..., None] = (
        config.load_kube_config if os.environ.get("KUBECONFIG") else config.load_incluster_config
    )
    try:
        loader(client_configuration=cfg)
    except config.ConfigException as exc:
        raise errors.FailedPrecondition(
            f"{needed_by} needs in-cluster credentials or $KUBECONFIG: {exc}"
        ) from None
    return client.ApiClient(cfg)


def _error(exc: ApiException, what: str) -> errors.RukpakError:
    status = int(exc.status or 0)
    message = f"{what}: {status} {exc.reason}"
    if status == 410:
        return Gone(message)
    if status == 404:
        return errors.NotFound(message)
    if status in (401, 403):
        return errors.PermissionDenied(message)
    return errors.Unavailable(message)


class ClientSource(listwatch.Source):
    """List and watch one custom resource (``plural`` of ``api_version``) with ``api``."""

    def __init__(
        self, api: client.ApiClient, *, plurals: dict[str, str], absent_is_empty: bool = False
    ) -> None:
        self._custom = client.CustomObjectsApi(api)
        self.plurals = plurals
        """Kind → plural of every kind this source may follow."""
        self.absent_is_empty = absent_is_empty
        """A kind not served (its CRD not installed) lists as none, resourceVersion "", and
        its watch is NotFound: an informer is synced and empty, and lists again after its
        backoff."""

    def _where(self, api_version: str, kind: str) -> tuple[str, str, str]:
        group, _, version = api_version.rpartition("/")
        plural = self.plurals.get(kind)
        if not group or plural is None:
            raise errors.InvalidArgument(f"{kind} of {api_version} is not followed by this source")
        return group, version, plural

    def _call(self, namespace: str) -> Callable[..., Any]:
        if namespace:
            return self._custom.list_namespaced_custom_object  # type: ignore[no-any-return]
        return self._custom.list_cluster_custom_object  # type: ignore[no-any-return]

    def _args(self, api_version: str, kind: str, namespace: str) -> tuple[str, ...]:
        group, version, plural = self._where(api_version, kind)
        return (group, version, namespace, plural) if namespace else (group, version, plural)

    def list(
        self, api_version: str, kind: str, *, namespace: str = "", label_selector: str = ""
    ) -> tuple[list[Obj], str]:
        args = self._args(api_version, kind, namespace)
        extra = {"label_selector": label_selector} if label_selector else {}
        try:
            listing: Any = self._call(namespace)(*args, _request_timeout=REQUEST_TIMEOUT, **extra)
        except ApiException as exc:
            if exc.status == 404 and self.absent_is_empty:
                return [], ""
            raise _error(exc, f"cannot list {kind}") from None
        except Exception as exc:  # the server away: refused, reset, timed out
            raise errors.Unavailable(f"cannot list {kind}: {str(exc)[:300]}") from None
        items = [i for i in listing.get("items") or [] if isinstance(i, dict)]
        for item in items:
            item.setdefault("apiVersion", api_version)
            item.setdefault("kind", kind)
        return items, str((listing.get("metadata") or {}).get("resourceVersion") or "")

    def events(self, request: listwatch.Watch) -> Iterator[tuple[str, Obj]]:
        kind = request.kind
        args = self._args(request.api_version, kind, request.namespace)
        if not request.resource_version and self.absent_is_empty:  # listed as absent
            raise errors.NotFound(f"{kind} is not served (its CRD is not installed)")
        extra = {"label_selector": request.label_selector} if request.label_selector else {}
        make: Callable[[], Any] = watch.Watch  # untyped in the client
        stream = make()
        try:
            for event in stream.stream(
                self._call(request.namespace),
                *args,
                resource_version=request.resource_version,
                timeout_seconds=request.timeout_seconds,
                allow_watch_bookmarks=True,
                _request_timeout=request.timeout_seconds + REQUEST_TIMEOUT,
                **extra,
            ):
                type_, obj = event.get("type"), event.get("object")
                if type_ == "ERROR":
                    code = int(obj.get("code") or 0) if isinstance(obj, dict) else 0
                    message = str(obj.get("message") or "") if isinstance(obj, dict) else ""
                    if code == 410:
                        raise Gone(f"watch of {kind} expired: {message}")
                    raise errors.Unavailable(f"watch of {kind} failed: {code} {message}")
                if isinstance(type_, str) and isinstance(obj, dict):
                    yield type_, obj
        except ApiException as exc:
            raise _error(exc, f"cannot watch {kind}") from None
        except errors.RukpakError:
            raise
        except Exception as exc:  # a broken stream
            raise errors.Unavailable(f"watch of {kind} broke: {str(exc)[:300]}") from None
        finally:
            stream.stop()
