"""Engine errors: the ``rukpak.common.errors`` codes, plus the context an operator needs.

Every error the engine raises names what failed: the bundle file and document
for format errors, the object for apply errors, both deployments for ownership
conflicts. The CLI prints ``error: <message>`` and exits 1 for every error
(exit 3 is not an error: ``diff`` found changes, objects are not ready);
``code`` says which kind of failure it was (the gRPC-style name).
"""

from __future__ import annotations

from rukpak.common import errors


class BundleInvalid(errors.InvalidArgument):
    """The bundle's content does not follow its format."""


class UnknownKind(errors.InvalidArgument):
    """The API server serves no resource for an object's apiVersion and kind."""


class OwnershipConflict(errors.FailedPrecondition):
    """An object exists and belongs to another deployment, or to none without ``adopt``."""


class CRDUpgradeUnsafe(errors.FailedPrecondition):
    """A CRD upgrade would lose stored versions or make existing resources invalid."""


class ApplyFailed(errors.RukpakError):
    """One phase failed; ``failures`` pairs each failed object's description with its error.

    The code is the first failure's code, so an RBAC denial reads as
    PERMISSION_DENIED and a rejected object as INVALID_ARGUMENT.
    """

    def __init__(self, phase: str, failures: list[tuple[str, errors.RukpakError]]) -> None:
        lines = [f"phase {phase!r}: {len(failures)} object(s) failed"]
        lines += [f"  {what}: {err}" for what, err in failures]
        super().__init__("\n".join(lines))
        self.phase = phase
        self.failures = failures
        self.code = failures[0][1].code if failures else "INTERNAL"
