"""Errors as values with a code.

Every layer below the gRPC edge (the OCI library, the content store, the
extractor, the node and controller cores) raises one of these. Each carries the
name of the gRPC status code it maps to, so the servicers in ``csi.node`` and
``csi.controller`` turn them into ``context.abort(code, message)`` with one
decorator, and the CLI turns them into exit codes. Messages say what was wrong
and what to do about it; they never contain secrets.
"""

from __future__ import annotations


class RukpakError(Exception):
    """Base class: ``code`` is a ``grpc.StatusCode`` member name."""

    code: str = "INTERNAL"

    def __init__(self, message: str) -> None:
        super().__init__(message)
        self.message = message

    def __str__(self) -> str:
        return self.message


class InvalidArgument(RukpakError):
    code = "INVALID_ARGUMENT"


class NotFound(RukpakError):
    code = "NOT_FOUND"


class AlreadyExists(RukpakError):
    code = "ALREADY_EXISTS"


class FailedPrecondition(RukpakError):
    code = "FAILED_PRECONDITION"


class ResourceExhausted(RukpakError):
    code = "RESOURCE_EXHAUSTED"


class Unavailable(RukpakError):
    code = "UNAVAILABLE"


class PermissionDenied(RukpakError):
    code = "PERMISSION_DENIED"


class Unauthenticated(RukpakError):
    code = "UNAUTHENTICATED"


class DeadlineExceeded(RukpakError):
    code = "DEADLINE_EXCEEDED"


class Aborted(RukpakError):
    code = "ABORTED"


class DataLoss(RukpakError):
    """Content that does not match its digest or declared size."""

    code = "DATA_LOSS"


class Internal(RukpakError):
    code = "INTERNAL"
