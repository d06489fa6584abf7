"""One component process of the local cluster: started in its own session, logged to a
file, waited on until ready, stopped by process group.

Every other module of ``tests.cluster`` starts its processes through ``Component`` so a
failure always carries the tail of the component's log and a stop never misses a child.
"""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

LOG_TAIL_LINES = 40


class ComponentError(RuntimeError):
    """A component failed to start or become ready; the message ends with its log tail."""


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nobody listens on right now."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def log_tail(path: Path, lines: int = LOG_TAIL_LINES) -> str:
    """The last ``lines`` lines of a log file ('' when it does not exist)."""
    try:
        with path.open("rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - 64 * 1024))
            data = f.read().decode(errors="replace")
    except FileNotFoundError:
        return ""
    return "\n".join(data.splitlines()[-lines:])


def pid_alive(pid: int) -> bool:
    """True while ``pid`` exists and is not a zombie."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (FileNotFoundError, ProcessLookupError, IndexError):
        return False
    return state != "Z"


def stop_pid(pid: int, *, grace: float = 10.0, group: bool = True) -> None:
    """SIGTERM the process (group), then SIGKILL what is left after ``grace`` seconds."""
    kill = os.killpg if group else os.kill
    for sig, wait in ((signal.SIGTERM, grace), (signal.SIGKILL, 5.0)):
        try:
            kill(pid, sig)
        except ProcessLookupError:
            return
        deadline = time.monotonic() + wait
        while time.monotonic() < deadline:
            with contextlib.suppress(ChildProcessError):
                os.waitpid(pid, os.WNOHANG)
            if not pid_alive(pid):
                return
            time.sleep(0.05)


@dataclass
class Component:
    """A started process: its name, argv, log file and pid (also its process group id)."""

    name: str
    argv: list[str]
    log: Path
    popen: subprocess.Popen[bytes] | None = field(default=None, repr=False)
    pid: int = 0

    @classmethod
    def start(
        cls,
        name: str,
        argv: Sequence[str],
        *,
        log: Path,
        env: dict[str, str] | None = None,
        cwd: Path | None = None,
    ) -> Component:
        """Start ``argv`` in a new session, stdout and stderr appended to ``log``."""
        log.parent.mkdir(parents=True, exist_ok=True)
        with log.open("ab") as out:
            try:
                popen = subprocess.Popen(
                    list(argv),
                    stdin=subprocess.DEVNULL,
                    stdout=out,
                    stderr=subprocess.STDOUT,
                    start_new_session=True,
                    env=env,
                    cwd=cwd,
                )
            except OSError as e:
                raise ComponentError(f"{name}: cannot run {argv[0]}: {e}") from e
        return cls(name=name, argv=list(argv), log=log, popen=popen, pid=popen.pid)

    def running(self) -> bool:
        if self.popen is not None:
            return self.popen.poll() is None
        return pid_alive(self.pid)

    def tail(self, lines: int = LOG_TAIL_LINES) -> str:
        return log_tail(self.log, lines)

    def error(self, what: str) -> ComponentError:
        """A ComponentError saying ``what`` happened, with the log tail appended."""
        code = self.popen.poll() if self.popen is not None else None
        status = f" (exit code {code})" if code is not None else ""
        return ComponentError(
            f"{self.name} {what}{status}; last lines of {self.log}:\n{self.tail()}"
        )

    def wait_ready(
        self, check: Callable[[], bool], *, timeout: float, interval: float = 0.1
    ) -> None:
        """Poll ``check`` until it returns True; raise ComponentError on exit or timeout."""
        deadline = time.monotonic() + timeout
        while True:
            if not self.running():
                raise self.error("exited before it was ready")
            try:
                if check():
                    return
            except Exception:  # not ready yet, whatever the reason
                pass
            if time.monotonic() > deadline:
                raise self.error(f"was not ready after {timeout:.0f}s")
            time.sleep(interval)

    def stop(self, *, grace: float = 10.0) -> None:
        """Stop the whole process group; idempotent."""
        if self.pid:
            stop_pid(self.pid, grace=grace)
        if self.popen is not None:
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.popen.wait(timeout=1)
