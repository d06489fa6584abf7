"""A Docker engine for kind: the one that already answers, or Debian's ``dockerd`` started
here.

Where it sits: first step of ``tests.kind.cluster`` and ``tests.kind.nodeimage``. When
``docker info`` answers (``$DOCKER_HOST`` or the default socket), that engine is used and
never stopped by us. Otherwise, as root, ``docker.io`` is installed from Debian's
packages if missing and ``dockerd`` is started detached with its state under
``/var/lib/rukpak-kind`` (pid and log there too), without iptables rules: containers
talk to each other and to this machine over the bridge, and nothing is masqueraded out.
Where this machine's capability bounding set lacks a capability (sandboxes), its default
runtime is ``runc`` behind ``tests.kind.capfilter``, so privileged containers (kind's
nodes) get every capability there is here instead of failing.
``stop`` ends only a ``dockerd`` started here, by its pid.

A machine where the engine cannot run gets :class:`EngineUnavailable` whose message says
exactly what failed (the command, its exit and the log's last lines).
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import time
from dataclasses import dataclass
from pathlib import Path

from tests.kind import capfilter

STATE = Path(os.environ.get("RUKPAK_KIND_STATE", "/var/lib/rukpak-kind"))
PIDFILE = STATE / "dockerd.pid"
LOG = STATE / "dockerd.log"
SOCKET = Path("/var/run/docker.sock")
START_TIMEOUT = 60.0
CLIENT_CANDIDATES = ("/usr/bin/docker", "/usr/local/bin/docker")


class EngineUnavailable(RuntimeError):
    """No Docker engine answers here, and none could be started; the message says why."""


@dataclass(frozen=True)
class Engine:
    docker: str
    """The client binary."""
    started_here: bool

    def run(
        self, *args: str, check: bool = True, timeout: float = 600, stdin: bytes | None = None
    ) -> subprocess.CompletedProcess[bytes]:
        done = subprocess.run(
            [self.docker, *args], capture_output=True, timeout=timeout, input=stdin, check=False
        )
        if check and done.returncode != 0:
            raise RuntimeError(
                f"docker {' '.join(args)[:200]} failed ({done.returncode}): "
                f"{done.stderr.decode(errors='replace')[-2000:]}"
            )
        return done

    def text(self, *args: str) -> str:
        return self.run(*args).stdout.decode().strip()


def client() -> str | None:
    for path in CLIENT_CANDIDATES:
        if os.access(path, os.X_OK):
            return path
    return shutil.which("docker")


def answers(docker: str) -> bool:
    done = subprocess.run(
        [docker, "info", "--format", "{{.ServerVersion}}"],
        capture_output=True,
        timeout=20,
        check=False,
    )
    return done.returncode == 0 and bool(done.stdout.strip())


def _install() -> None:
    if os.geteuid() != 0:
        raise EngineUnavailable(
            "no Docker engine answers and docker.io is not installed; installing it needs "
            "root (apt-get install docker.io), or start an engine and set DOCKER_HOST"
        )
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    for args in (
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", "docker.io"],
        ["apt-get", "update", "-q"],
        ["apt-get", "install", "-y", "-q", "--no-install-recommends", "docker.io"],
    ):
        done = subprocess.run(args, capture_output=True, text=True, env=env, check=False)
        if done.returncode == 0 and args[1] == "install":
            return
    raise EngineUnavailable(
        f"apt-get install docker.io failed ({done.returncode}): {done.stderr[-1500:]}"
    )


def ensure() -> Engine:
    """An engine that answers; see the module docstring."""
    docker = client()
    if docker is not None and answers(docker):
        return Engine(docker, started_here=ours() is not None)
    if shutil.which("dockerd") is None:
        _install()
    docker = client()
    if docker is None:
        raise EngineUnavailable("docker.io is installed but no docker client is on PATH")
    STATE.mkdir(parents=True, exist_ok=True)
    command = [
        "dockerd",
        *_runtime(),
        f"--host=unix://{SOCKET}",
        f"--data-root={STATE / 'docker'}",
        f"--exec-root={STATE / 'exec'}",
        f"--pidfile={PIDFILE}",
        "--iptables=false",
        "--ip6tables=false",
        "--bridge=none",  # no docker0: kind makes its own network
    ]
    with LOG.open("ab") as log:
        process = subprocess.Popen(
            command,
            stdout=log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
            start_new_session=True,  # outlives `make kind-run`: the cluster lives in it
        )
    deadline = time.monotonic() + START_TIMEOUT
    while time.monotonic() < deadline:
        if answers(docker):
            return Engine(docker, started_here=True)
        if process.poll() is not None:
            break
        time.sleep(0.5)
    tail = LOG.read_text(errors="replace").splitlines()[-15:]
    if process.poll() is None:
        process.terminate()
    raise EngineUnavailable(
        f"dockerd did not start here ({' '.join(command)}; exit {process.poll()}); its log "
        f"({LOG}) ends with:\n" + "\n".join(tail)
    )


def _runtime() -> list[str]:
    """dockerd flags for :mod:`tests.kind.capfilter` as the default runtime, when this
    machine's bounding set lacks a capability (else none: plain runc)."""
    if not capfilter.missing():
        return []
    runc = shutil.which("runc") or "/usr/sbin/runc"
    wrapper = STATE / "bin" / "runc-caps"
    wrapper.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(capfilter.__file__, wrapper.with_suffix(".py"))
    wrapper.write_text(
        f'#!/bin/sh\nexec /usr/bin/python3 {wrapper.with_suffix(".py")} {runc} "$@"\n'
    )
    wrapper.chmod(0o755)
    return [f"--add-runtime=runc-caps={wrapper}", "--default-runtime=runc-caps"]


def ours() -> int | None:
    """The pid of a ``dockerd`` started by :func:`ensure` that still runs, else None."""
    try:
        pid = int(PIDFILE.read_text().strip())
    except (OSError, ValueError):
        return None
    try:
        cmdline = Path(f"/proc/{pid}/cmdline").read_bytes().split(b"\0")[0]
    except OSError:
        return None
    return pid if cmdline.endswith(b"dockerd") else None


def stop() -> bool:
    """Stop a ``dockerd`` started by :func:`ensure` (by pid); False when there is none."""
    pid = ours()
    if pid is None:
        return False
    os.kill(pid, signal.SIGTERM)
    for _ in range(300):
        if not Path(f"/proc/{pid}").exists():
            return True
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)
    return True
