"""Helpers for tests that run the plugin in FUSE mode: the /dev/fuse holder process."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path


def start_holder(mountpoint: Path, sock: Path) -> subprocess.Popen[bytes]:
    """A /dev/fuse holder process, once it says it is ready (stop it with
    ``tests.csi_helpers.terminate``)."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "csi.fuse.holder", "--mountpoint", str(mountpoint),
         "--socket", str(sock)],
        stdout=subprocess.PIPE,
    )  # fmt: skip
    assert proc.stdout is not None
    assert proc.stdout.readline().strip() == b"ready"
    return proc
