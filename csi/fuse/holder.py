"""The /dev/fuse holder: a small long-lived process that owns the FUSE mount's connection.

Where it sits: beside the plugin (``python -m csi.fuse.holder``, a separate
container of the plugin's pod in a cluster, or a child in its own session when
the plugin starts it). It opens ``/dev/fuse``, mounts the filesystem with that
descriptor (read-only, ``allow_other``) and keeps the descriptor open for as
long as it lives, so the kernel keeps the connection — and every volume bound
from the mount — alive while the plugin restarts. The plugin's FUSE daemon
(``csi.fuse.session``) asks for the descriptor over a unix socket and gets it
with SCM_RIGHTS, together with the FUSE_INIT request the kernel sent at mount
time (once the first daemon has read and answered it) so that a restarted
daemon can negotiate exactly as the first one did.

It also keeps, in memory only, the pull credentials of lazily fetched trees
(opaque to it), so that a restarted plugin can go on fetching the files of
volumes published before the restart without anyone writing secrets to disk.
They live exactly as long as the mount: a new holder means a new mount, and
every volume published from the old one is gone anyway.

Protocol (one request per connection, lines of text, on a socket only root
can open): ``GET`` → a JSON line ``{"mountpoint": ..., "init": base64 or ""}``
with the descriptor attached; ``INIT <base64>`` → ``OK`` (stores the INIT
request); ``CRED <tree> <base64>`` → ``OK`` (keeps a tree's credentials);
``UNCRED <tree>`` → ``OK``; ``CREDS`` → a JSON line ``{tree: base64}``; ``PING`` →
``PONG <id>``, a random id of this holder (a plugin that sees another id knows its
holder, and with it the mount it serves, was replaced).
Nothing it keeps is ever logged. It imports only the standard library, so it
stays small. SIGTERM or SIGINT unmounts and exits.

``--check`` is its probe (kubelet runs it in the holder's container, an exec probe): it
sends ``PING`` to ``--socket`` and, given ``--mountpoint``, also looks for the FUSE mount
there; exit 0 when both are fine, else 1 with the reason on stdout (the probe's event).
It mounts nothing and opens no ``/dev/fuse``; the socket is root's, as the container is.
"""

from __future__ import annotations

import argparse
import base64
import ctypes
import json
import logging
import os
import signal
import socket
import sys
from collections.abc import Sequence
from pathlib import Path

log = logging.getLogger("csi.fuse.holder")

MS_RDONLY = 1
MS_NOSUID = 2
MS_NODEV = 4
MNT_DETACH = 2
FSTYPE = "fuse.rukpak-csi"
SOURCE = "rukpak-csi"
MAX_REQUEST = 1 << 16

_libc = ctypes.CDLL(None, use_errno=True)


def mount_fuse(fd: int, mountpoint: Path) -> None:
    """Mount the FUSE connection of ``fd`` on ``mountpoint`` (read-only, allow_other)."""
    options = f"fd={fd},rootmode=40000,user_id=0,group_id=0,allow_other,default_permissions"
    flags = MS_RDONLY | MS_NOSUID | MS_NODEV
    if (
        _libc.mount(
            SOURCE.encode(), str(mountpoint).encode(), FSTYPE.encode(), flags, options.encode()
        )
        != 0
    ):
        code = ctypes.get_errno()
        raise OSError(code, f"mounting FUSE on {mountpoint}: {os.strerror(code)}")


def unmount(mountpoint: Path) -> None:
    """Detach ``mountpoint`` if something is mounted there (a stale mount of a dead holder)."""
    if _libc.umount2(str(mountpoint).encode(), MNT_DETACH) != 0:
        code = ctypes.get_errno()
        if code not in (22, 2):  # EINVAL: not a mount point; ENOENT: missing
            raise OSError(code, f"unmounting {mountpoint}: {os.strerror(code)}")


def _escaped(path: Path) -> str:
    """``path`` as /proc/self/mountinfo writes it."""
    return str(path).replace("\\", "\\134").replace(" ", "\\040").replace("\n", "\\012")


def _fstypes_on(path: Path) -> list[str]:
    """The filesystem types of the mounts on ``path``, bottom to top (/proc/self/mountinfo)."""
    escaped, found = _escaped(path), []
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        fields = line.split(" ")
        if len(fields) > 4 and fields[4] == escaped:
            found.append(line.split(" - ", 1)[1].split(" ")[0] if " - " in line else "")
    return found


def is_mount_point(path: Path) -> bool:
    return bool(_fstypes_on(path))


def holds_fuse_mount(path: Path) -> bool:
    """Whether the topmost mount on ``path`` is a holder's (type ``FSTYPE``)."""
    return _fstypes_on(path)[-1:] == [FSTYPE]


CHECK_TIMEOUT = 5.0


def check(socket_path: Path, mountpoint: Path | None = None) -> tuple[bool, str]:
    """``--check``: whether the holder on ``socket_path`` answers ``PING`` (and, given
    ``mountpoint``, its FUSE mount is there); (ok, reason)."""
    try:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(CHECK_TIMEOUT)
            conn.connect(str(socket_path))
            conn.sendall(b"PING\n")
            answer = b""
            while not answer.endswith(b"\n") and len(answer) < 256:
                chunk = conn.recv(256)
                if not chunk:
                    break
                answer += chunk
    except OSError as exc:
        return False, f"the FUSE holder at {socket_path} does not answer: {exc}"
    if not answer.startswith(b"PONG "):
        return False, f"the FUSE holder at {socket_path} answered {answer[:64]!r} to PING"
    ident = answer[5:].decode("ascii", "replace").strip()
    if mountpoint is not None and not holds_fuse_mount(mountpoint):
        return False, (
            f"the FUSE holder at {socket_path} answers (id {ident}), but no {FSTYPE} mount is "
            f"on {mountpoint}: something unmounted it; new FUSE publishes fail until the "
            "holder is restarted"
        )
    return True, f"the FUSE holder at {socket_path} answers (id {ident})"


class Holder:
    """The mount and its descriptor; serves them on a unix socket."""

    def __init__(self, mountpoint: Path, socket_path: Path) -> None:
        self.mountpoint = mountpoint
        self.socket_path = socket_path
        self.init_request = b""
        self.credentials: dict[str, str] = {}  # tree → base64, opaque; memory only
        self.id = os.urandom(8).hex()
        mountpoint.mkdir(parents=True, exist_ok=True)
        while is_mount_point(mountpoint):
            log.warning("msg=%r mountpoint=%s", "removing a stale FUSE mount", mountpoint)
            unmount(mountpoint)
        self.fd = os.open("/dev/fuse", os.O_RDWR | os.O_CLOEXEC)
        mount_fuse(self.fd, mountpoint)
        socket_path.parent.mkdir(parents=True, exist_ok=True)
        socket_path.unlink(missing_ok=True)
        self.server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        umask = os.umask(0o177)  # root only from the first moment: it hands out credentials
        try:
            self.server.bind(str(socket_path))
        finally:
            os.umask(umask)
        os.chmod(socket_path, 0o600)
        self.server.listen(8)

    def serve_one(self) -> None:
        conn, _ = self.server.accept()
        with conn:
            conn.settimeout(10)
            data = b""
            while not data.endswith(b"\n") and len(data) < MAX_REQUEST * 2:
                chunk = conn.recv(MAX_REQUEST)
                if not chunk:
                    return
                data += chunk
            line = data.decode("ascii", "replace").strip()
            if line == "GET":
                reply = {
                    "mountpoint": str(self.mountpoint),
                    "init": base64.b64encode(self.init_request).decode(),
                }
                socket.send_fds(conn, [json.dumps(reply).encode() + b"\n"], [self.fd])
            elif line.startswith("INIT "):
                self.init_request = base64.b64decode(line[5:])
                conn.sendall(b"OK\n")
            elif line.startswith("CRED "):
                _cmd, tree, blob = line.split(" ", 2)
                self.credentials[tree] = blob
                conn.sendall(b"OK\n")
            elif line.startswith("UNCRED "):
                self.credentials.pop(line[7:], None)
                conn.sendall(b"OK\n")
            elif line == "CREDS":
                conn.sendall(json.dumps(self.credentials).encode() + b"\n")
            elif line == "PING":
                conn.sendall(f"PONG {self.id}\n".encode())
            else:
                conn.sendall(b"ERROR unknown request\n")

    def close(self) -> None:
        self.server.close()
        self.socket_path.unlink(missing_ok=True)
        unmount(self.mountpoint)
        os.close(self.fd)


def main(argv: Sequence[str] | None = None) -> int:
    p = argparse.ArgumentParser(
        prog="python -m csi.fuse.holder", description=__doc__.split("\n")[0]
    )
    p.add_argument(
        "--mountpoint", type=Path, help="where to mount the filesystem (required unless --check)"
    )
    p.add_argument("--socket", type=Path, required=True, help="unix socket to serve the fd on")
    p.add_argument(
        "--check",
        action="store_true",
        help="do not hold: exit 0 when the holder on --socket answers (and its mount is on "
        "--mountpoint, if given), else 1 saying why (a probe)",
    )
    args = p.parse_args(argv)
    if args.check:
        ok, reason = check(args.socket, args.mountpoint)
        print(reason, flush=True)
        return 0 if ok else 1
    if args.mountpoint is None:
        p.error("--mountpoint is required (unless --check)")
    logging.basicConfig(level=logging.INFO, format="level=%(levelname)s %(message)s")
    holder = Holder(args.mountpoint, args.socket)
    stopping = False

    def on_signal(signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True
        holder.server.close()

    signal.signal(signal.SIGTERM, on_signal)
    signal.signal(signal.SIGINT, on_signal)
    log.info("msg=%r mountpoint=%s socket=%s", "holding", args.mountpoint, args.socket)
    print("ready", flush=True)
    while not stopping:
        try:
            holder.serve_one()
        except OSError as exc:
            if stopping:
                break
            log.warning("msg=%r error=%r", "request failed", str(exc))
    holder.close()
    log.info("msg=%r", "stopped")
    return 0


if __name__ == "__main__":
    sys.exit(main())
