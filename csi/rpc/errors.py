"""The one place where errors become gRPC statuses.

Where it sits: wraps every RPC method of the servicers in ``csi.node`` and
``csi.controller``. A ``rukpak.common.errors`` value becomes ``context.abort(code,
message)`` with its own code and message; anything else is INTERNAL with the
traceback logged (the client sees only a short message). Each call is logged as
one key=value line with the request redacted by ``csi.rpc.redact`` (secrets
never reach a log) and reported to the servicer's ``metrics`` if it has one.
"""

from __future__ import annotations

import functools
import logging
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

import grpc
from google.protobuf import message

from csi.rpc import redact
from rukpak.common import errors

log = logging.getLogger("csi.rpc")

Req = TypeVar("Req", bound=message.Message)
Resp = TypeVar("Resp", bound=message.Message)
Self = TypeVar("Self")


class RpcObserver(Protocol):
    def rpc_done(self, *, method: str, code: str, seconds: float) -> None: ...


def status_code(error: errors.RukpakError) -> grpc.StatusCode:
    code = getattr(grpc.StatusCode, error.code, None)
    return code if isinstance(code, grpc.StatusCode) else grpc.StatusCode.INTERNAL


def rpc(
    method: Callable[[Self, Req, grpc.ServicerContext], Resp],
) -> Callable[[Self, Req, grpc.ServicerContext], Resp]:
    """Decorate a servicer method: log, map errors to statuses, observe."""
    name = method.__name__

    @functools.wraps(method)
    def wrapper(self: Self, request: Req, context: grpc.ServicerContext) -> Resp:
        started = time.monotonic()
        observer: RpcObserver | None = getattr(self, "metrics", None)

        def done(code: str) -> None:
            seconds = time.monotonic() - started
            if observer is not None:
                observer.rpc_done(method=name, code=code, seconds=seconds)
            log.log(
                logging.INFO if code in ("OK", "ALREADY_EXISTS") else logging.WARNING,
                "method=%s code=%s seconds=%.3f",
                name,
                code,
                seconds,
            )

        log.debug("method=%s request=%s", name, _redacted(request))
        try:
            response = method(self, request, context)
        except errors.RukpakError as exc:
            done(exc.code)
            log.warning("method=%s code=%s error=%r", name, exc.code, exc.message)
            context.abort(status_code(exc), exc.message)
            raise  # unreachable: abort raises
        except Exception as exc:
            done("INTERNAL")
            log.exception("method=%s code=INTERNAL error=%r", name, type(exc).__name__)
            context.abort(
                grpc.StatusCode.INTERNAL,
                f"internal error in {name} ({type(exc).__name__}); see the plugin's log",
            )
            raise
        done("OK")
        return response

    return wrapper


def _redacted(request: Any) -> object:
    try:
        return redact.redact(request)
    except Exception:  # a log line must never fail the call
        return "<unloggable>"
