"""A pod process's last words: the termination log Kubernetes shows as its message.

Where it sits: at the edge of the ``rukpak-provisioner`` processes that run in pods and
end with a verdict: ``instance`` (``provisioner.instance.process``: a fatal error) and
``unpack`` (``provisioner.instance.unpack``: the JSON result the manager reads back).
``add_flag`` defines ``--termination-log`` for both; ``where`` resolves its default;
``write`` writes it, best effort, within the size Kubernetes keeps.
"""

from __future__ import annotations

import argparse
import logging
from pathlib import Path

DEFAULT = Path("/dev/termination-log")
MESSAGE_LIMIT = 4096
"""Kubernetes keeps at most this many bytes of a termination message."""

log = logging.getLogger("rukpak.termination")


def add_flag(parser: argparse.ArgumentParser, *, what: str) -> None:
    """``--termination-log``; ``what`` says what goes there, for the help text."""
    parser.add_argument(
        "--termination-log",
        type=Path,
        default=None,
        help=f"write {what} here (default: {DEFAULT} when it exists)",
    )


def where(flag: Path | None) -> Path | None:
    """The file ``--termination-log`` names, else the pod's own when there is one."""
    if flag is not None:
        return flag
    return DEFAULT if DEFAULT.exists() else None


def write(path: Path | None, message: str) -> None:
    """Best effort: Kubernetes reads it after the container exits; never fails the exit."""
    if path is None:
        return
    data = message.encode(errors="replace")[:MESSAGE_LIMIT]
    try:
        path.write_bytes(data)
    except OSError as err:
        log.warning("msg='cannot write the termination log' path=%s error=%r", path, str(err))
