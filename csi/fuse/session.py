"""The FUSE daemon: pyfuse3 on trio in a thread, on a /dev/fuse descriptor from the holder.

Where it sits: started by the plugin process (``csi.plugin.main``) beside the
gRPC server; serves the operations of ``csi.fuse.fs``. The mount and its
``/dev/fuse`` descriptor belong to the holder process (``csi.fuse.holder``),
so the daemon can die (even ``kill -9``) and a new one take over the same
mount: pods reading volumes bound from it wait, then continue.

How a daemon takes over a connection libfuse never saw being set up:
libfuse refuses every request until it has processed a FUSE_INIT. So the
daemon hands libfuse (``pyfuse3.init(ops, "/dev/fd/N")``) one end of a
socketpair, writes into the other end the FUSE_INIT request the kernel sent
at mount time (read from the real descriptor by the first daemon and kept by
the holder), and while libfuse processes it — inside ``Operations.init``,
before the reply is written — swaps descriptor N for the real ``/dev/fuse``
with ``dup2``. The first daemon's reply thus reaches the kernel and completes
the mount; a restarted daemon's reply carries a request id the kernel never
issued, which the kernel drops with ENOENT (libfuse ignores that). trio's
epoll registration follows the swap: the socket's last reference went with
``dup2``, so epoll forgets it and trio re-adds descriptor N. A restarted
daemon then sends FUSE_NOTIFY_RESEND (Linux 6.9+), which puts the requests
the dead daemon had read but not answered back in the queue, so no reader
sees an error. Inode numbers and file handles are stable across daemons
(``csi.fuse.fs``), so the kernel's cached inodes stay valid.
"""

from __future__ import annotations

import base64
import contextlib
import errno
import json
import logging
import os
import socket
import struct
import subprocess
import sys
import threading
import time
from pathlib import Path

import pyfuse3
import trio

from rukpak.common import errors

log = logging.getLogger(__name__)

FUSE_INIT = 26
FUSE_NOTIFY_RESEND = 7
IN_HEADER = struct.Struct("<IIQQIIIHH")  # len, opcode, unique, nodeid, uid, gid, pid, extlen, pad
OUT_HEADER = struct.Struct("<IiQ")  # len, error, unique
FAKE_UNIQUE = 1 << 62  # never issued by the kernel (ids count up from 0; bit 63 marks resends)
READ_BUFFER = (1 << 20) + 4096


class HolderClient:
    """Talks to the holder's unix socket (see ``csi.fuse.holder`` for the protocol)."""

    def __init__(self, socket_path: Path) -> None:
        self.socket_path = socket_path

    def get(self) -> tuple[int, Path, bytes]:
        """The /dev/fuse descriptor (ours to close), the mount point and the stored INIT."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(10)
            conn.connect(str(self.socket_path))
            conn.sendall(b"GET\n")
            data, fds, _flags, _addr = socket.recv_fds(conn, 1 << 20, 1)
            while not data.endswith(b"\n"):
                more = conn.recv(1 << 20)
                if not more:
                    break
                data += more
        if not fds:
            raise errors.Unavailable(f"the FUSE holder at {self.socket_path} sent no descriptor")
        reply = json.loads(data)
        return fds[0], Path(reply["mountpoint"]), base64.b64decode(reply["init"])

    def store_init(self, request: bytes) -> None:
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(10)
            conn.connect(str(self.socket_path))
            conn.sendall(b"INIT " + base64.b64encode(request) + b"\n")
            if conn.recv(64).strip() != b"OK":
                raise errors.Unavailable("the FUSE holder did not store the INIT request")

    def _request(self, line: bytes) -> bytes:
        """Send one request line; the reply line (without its newline)."""
        with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
            conn.settimeout(10)
            conn.connect(str(self.socket_path))
            conn.sendall(line + b"\n")
            data = b""
            while not data.endswith(b"\n"):
                more = conn.recv(1 << 20)
                if not more:
                    break
                data += more
        return data.strip()

    def keep_credentials(self, tree: str, blob: bytes) -> None:
        """Hand a lazy tree's credentials to the holder (memory only; see csi.fuse.holder)."""
        if self._request(b"CRED " + tree.encode() + b" " + base64.b64encode(blob)) != b"OK":
            raise errors.Unavailable("the FUSE holder did not keep the credentials")

    def drop_credentials(self, tree: str) -> None:
        self._request(b"UNCRED " + tree.encode())

    def credentials(self) -> dict[str, bytes]:
        """Every tree's credentials the holder keeps (from before a restart)."""
        reply = json.loads(self._request(b"CREDS") or b"{}")
        return {str(tree): base64.b64decode(blob) for tree, blob in reply.items()}

    def ident(self) -> str:
        """The holder's random id ("" when it does not answer)."""
        try:
            reply = self._request(b"PING")
        except OSError:
            return ""
        return reply[len(b"PONG ") :].decode() if reply.startswith(b"PONG ") else ""

    def alive(self) -> bool:
        try:
            with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as conn:
                conn.settimeout(2)
                conn.connect(str(self.socket_path))
                conn.sendall(b"PING\n")
                conn.recv(64)
            return True
        except OSError:
            return False


def spawn_holder(mountpoint: Path, socket_path: Path) -> subprocess.Popen[bytes]:
    """Start a holder in its own session (it outlives us) and wait until it serves."""
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "csi.fuse.holder",
            "--mountpoint",
            str(mountpoint),
            "--socket",
            str(socket_path),
        ],
        stdout=subprocess.PIPE,
        start_new_session=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    proc.stdout.close()
    if line.strip() != b"ready":
        proc.wait(10)
        raise errors.Unavailable(
            f"the FUSE holder did not start (exit code {proc.returncode}); see its log"
        )
    return proc


class Session:
    """One FUSE daemon: ``start`` takes over the holder's mount, ``stop`` lets it go."""

    def __init__(self, ops: pyfuse3.Operations, holder: HolderClient) -> None:
        self.ops = ops
        self.holder = holder
        self.mountpoint = Path()
        self._thread: threading.Thread | None = None
        self._real_fd = -1
        self._lib_fd = -1
        self._feeder: socket.socket | None = None
        self._init_request = b""
        self._resumed = False
        self.initialized = threading.Event()
        self.failed: BaseException | None = None

    def start(self) -> None:
        fd, self.mountpoint, stored = self.holder.get()
        self._real_fd = fd
        if stored:
            self._resumed = True
            head = IN_HEADER.unpack_from(stored)
            request = (
                IN_HEADER.pack(head[0], head[1], FAKE_UNIQUE, *head[3:]) + stored[IN_HEADER.size :]
            )
        else:
            request = os.read(fd, READ_BUFFER)  # the kernel queued it when the holder mounted
            if IN_HEADER.unpack_from(request)[1] != FUSE_INIT:
                os.close(fd)
                raise errors.Internal(
                    "the FUSE connection's first request is not FUSE_INIT; restart the holder"
                )
            self._init_request = request
        lib_end, feeder = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        feeder.send(request)
        self._feeder = feeder
        self._lib_fd = lib_end.detach()  # its only reference: dup2 must release the socket
        self.ops.init = self._on_init  # type: ignore[method-assign]
        pyfuse3.init(self.ops, f"/dev/fd/{self._lib_fd}", set())
        self._thread = threading.Thread(target=self._run, name="fuse", daemon=True)
        self._thread.start()
        if not self.initialized.wait(30):
            raise errors.Internal("the FUSE daemon did not initialise within 30 s")
        if self._init_request:
            self.holder.store_init(self._init_request)
        log.info(
            "msg=%r mountpoint=%s resumed=%s", "FUSE daemon serving", self.mountpoint, self._resumed
        )

    def _on_init(self) -> None:
        """Called by libfuse while it processes FUSE_INIT, before it replies."""
        os.dup2(self._real_fd, self._lib_fd, inheritable=False)
        os.close(self._real_fd)
        self._real_fd = -1
        if self._feeder is not None:
            self._feeder.close()
            self._feeder = None
        if self._resumed:
            try:
                os.write(self._lib_fd, OUT_HEADER.pack(OUT_HEADER.size, FUSE_NOTIFY_RESEND, 0))
            except OSError as exc:  # older kernels: requests in flight at the crash are lost
                log.warning(
                    "msg=%r error=%r",
                    "the kernel cannot resend requests a dead daemon had read (needs Linux "
                    "6.9+); readers of those requests wait until interrupted",
                    os.strerror(exc.errno or errno.EINVAL),
                )
        self.initialized.set()

    def _run(self) -> None:
        try:
            trio.run(pyfuse3.main)
        except BaseException as exc:  # reported by stop() and the health check
            self.failed = exc
            log.exception("msg=%r", "FUSE daemon failed")

    def stop(self) -> None:
        """Stop serving; the mount stays (the holder keeps it) for the next daemon."""
        if self._thread is None:
            return
        token = pyfuse3.trio_token
        if token is not None and self._thread.is_alive():
            with contextlib.suppress(trio.RunFinishedError):
                trio.from_thread.run_sync(pyfuse3.terminate, trio_token=token)
        self._thread.join(10)
        pyfuse3.close(unmount=False)
        self._thread = None


def wait_for_socket(path: Path, timeout: float = 10.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if HolderClient(path).alive():
            return True
        time.sleep(0.05)
    return False
