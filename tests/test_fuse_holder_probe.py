"""The fuse-holder container's probe: ``python -m csi.fuse.holder --check``, run as the
kubelet runs an exec probe (a process of its own; exit 0 or 1, its output the event).

A real holder process owns a real FUSE mount (``/dev/fuse``); the probe must pass while it
answers, fail once it is gone, and (given ``--mountpoint``, the readiness probe) fail while
its mount is missing. The plugin's own use of the holder's socket goes on between probes.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from csi.fuse import holder
from csi.fuse.session import HolderClient
from tests.csi_helpers import terminate
from tests.fuse_helpers import start_holder


@pytest.fixture(autouse=True)
def _dev_fuse() -> None:
    if not os.path.exists("/dev/fuse"):
        pytest.fail("no /dev/fuse: FUSE mode needs the fuse kernel module (modprobe fuse)")


@pytest.fixture
def running(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[bytes], Path, Path]]:
    """A holder process: (process, socket, mountpoint)."""
    sock, mountpoint = tmp_path / "holder.sock", tmp_path / "fusemnt"
    proc = start_holder(mountpoint, sock)
    try:
        yield proc, sock, mountpoint
    finally:
        terminate(proc)


def probe(*args: str) -> tuple[int, str]:
    """``python -m csi.fuse.holder --check ARGS`` as the kubelet runs it: (exit code, output)."""
    done = subprocess.run(
        [sys.executable, "-m", "csi.fuse.holder", "--check", *args],
        capture_output=True,
        text=True,
        timeout=30,
    )
    return done.returncode, done.stdout.strip()


def test_the_probe_passes_while_the_holder_answers_and_names_it(
    running: tuple[subprocess.Popen[bytes], Path, Path],
) -> None:
    _, sock, mountpoint = running
    ident = HolderClient(sock).ident()
    assert probe(f"--socket={sock}") == (0, f"the FUSE holder at {sock} answers (id {ident})")
    code, said = probe(f"--socket={sock}", f"--mountpoint={mountpoint}")
    assert code == 0 and ident in said


def test_the_probe_fails_once_the_holder_is_gone(
    running: tuple[subprocess.Popen[bytes], Path, Path],
) -> None:
    proc, sock, _ = running
    assert probe(f"--socket={sock}")[0] == 0
    terminate(proc)
    code, said = probe(f"--socket={sock}")
    assert code == 1
    assert said.startswith(f"the FUSE holder at {sock} does not answer: ")


def test_a_socket_file_no_holder_listens_on_fails_the_probe(tmp_path: Path) -> None:
    stale = tmp_path / "stale.sock"
    with socket.socket(socket.AF_UNIX) as s:
        s.bind(str(stale))  # bound, never listening, then closed: what a killed holder leaves
    code, said = probe(f"--socket={stale}")
    assert code == 1 and "does not answer" in said and "Connection refused" in said


def test_readiness_also_wants_the_mount_liveness_only_the_answer(
    running: tuple[subprocess.Popen[bytes], Path, Path],
) -> None:
    """Someone unmounted the holder's FUSE mount: not ready (new FUSE publishes would fail),
    but live (restarting the holder would end the volumes still served)."""
    _, sock, mountpoint = running
    holder.unmount(mountpoint)
    code, said = probe(f"--socket={sock}", f"--mountpoint={mountpoint}")
    assert code == 1
    assert f"no {holder.FSTYPE} mount is on {mountpoint}" in said
    assert probe(f"--socket={sock}")[0] == 0


def test_a_mountpoint_with_another_filesystem_is_not_the_holders(
    running: tuple[subprocess.Popen[bytes], Path, Path], tmp_path: Path
) -> None:
    _, sock, _ = running
    other = tmp_path / "tmpfs"
    other.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "tmpfs", str(other)], check=True)
    try:
        assert probe(f"--socket={sock}", f"--mountpoint={other}")[0] == 1
    finally:
        subprocess.run(["umount", str(other)], check=True)


def test_the_plugins_requests_are_answered_between_probes(
    running: tuple[subprocess.Popen[bytes], Path, Path],
) -> None:
    _, sock, mountpoint = running
    client = HolderClient(sock)
    ident = client.ident()
    for _ in range(5):
        assert probe(f"--socket={sock}", f"--mountpoint={mountpoint}")[0] == 0
        assert client.ident() == ident
    fd, served, _init = client.get()
    try:
        assert served == mountpoint
    finally:
        os.close(fd)


def test_holding_still_needs_a_mountpoint(tmp_path: Path) -> None:
    done = subprocess.run(
        [sys.executable, "-m", "csi.fuse.holder", "--socket", str(tmp_path / "s.sock")],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert done.returncode == 2
    assert "--mountpoint is required (unless --check)" in done.stderr
