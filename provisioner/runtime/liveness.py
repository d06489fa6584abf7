"""Liveness of a long-running provisioner process: what its ``/livez`` answers.

Where it sits: beside ``service`` (the lifecycle of a leader-elected process), under its
two users: the manager (``provisioner.manager.cli``; ``/livez`` on its HTTPS server,
``manager.webhook``) and the PV provisioner (``provisioner.storage.cli``; ``/livez`` and
``/healthz`` on the plain HTTP port ``serve`` opens). Each makes one ``Liveness`` on the
thread that runs its election, tells it where it is (``waiting``, ``starting`` once it
leads, ``follow`` for the work queue of what it started, ``leading``, ``stopping``) and
hands ``check`` to its probe server.

``check`` answers from what it saw and the clock, and fails only where a restart helps:

- not leading (waiting for the Lease, or for what the process needs before it): live
  while the thread that runs the election is alive. Each of its requests carries a client
  timeout and it waits between attempts, so it cannot wedge short of a deadlock;
- starting to lead (the informers' first lists, bounded by their sync timeout): live for
  ``stall_after``;
- leading: not live when a worker has been on one key for longer than ``stall_after``
  (a reconcile stuck on something without a deadline), when a key has waited that long
  for a worker while no worker took or finished one (every worker stuck or gone), or when
  a worker thread has ended.

It follows the queue as its ``Observer`` (passing every call on to the one it had, the
metrics'): the queue reports each key made ready, taken and finished, the last two on the
worker's own thread, so ``check`` never takes the queue's lock. Nothing here depends on the
API server or a registry: an outage makes reconciles fail and retry with backoff, which is
progress, so a probe never restarts a process for it.
"""

from __future__ import annotations

import threading
import time
from collections import deque
from collections.abc import Callable
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from provisioner.runtime.queue import Observer, WorkQueue
from rukpak.common import httpanswer

STALL_AFTER = 600.0
"""Seconds one reconcile may take before the process is judged stuck: far above any
reconcile's own deadlines (a registry read stalls at most 30 s, an API request at most its
timeout), so only a wedge reaches it."""
LIVEZ_PATH = "/livez"
HEALTHZ_PATH = "/healthz"

Check = Callable[[], tuple[bool, str]]
"""Whether the process is live (or ready), and a one-line reason."""


def _s(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds >= 10 else f"{seconds:.1f} s"


class Liveness:
    """What ``check`` needs to know of a process; see the module docstring. Thread-safe."""

    def __init__(
        self,
        *,
        stall_after: float = STALL_AFTER,
        election: threading.Thread | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.stall_after = stall_after
        self.election = election or threading.current_thread()
        """The thread that runs the election (and, once leading, waits for the stop)."""
        self._clock = clock
        self._lock = threading.Lock()
        self._phase = "waiting"
        self._doing = "starting"
        self._since = clock()
        self._inner: Observer | None = None
        self._ready: deque[float] = deque()
        """When each key now ready was queued, oldest first (the queue is first in, first out)."""
        self._working: dict[threading.Thread, float] = {}
        self._workers: set[threading.Thread] = set()
        self._progress = self._since

    # -- where the process is --------------------------------------------------------------

    def _enter(self, phase: str, doing: str) -> None:
        with self._lock:
            self._phase, self._doing, self._since = phase, doing, self._clock()

    def waiting(self, doing: str) -> None:
        """Not leading: ``doing`` says for what it waits ("waiting for the Lease ...")."""
        self._enter("waiting", doing)

    def starting(self) -> None:
        """Leading, starting the work (informers' first lists, workers)."""
        self._enter("starting", "starting to lead")

    def leading(self) -> None:
        """Leading, the work started: judged by the queue it follows."""
        with self._lock:
            self._progress = max(self._progress, self._clock())
        self._enter("leading", "leading")

    def stopping(self) -> None:
        """On the way out: live until the process ends (the workers are being joined)."""
        self._enter("stopping", "stopping")

    def follow(self, queue: WorkQueue) -> None:
        """Become ``queue``'s observer, before its workers start (passing every call on to
        the observer it had)."""
        self._inner = queue.observer
        queue.observer = self

    # -- the queue's Observer --------------------------------------------------------------

    def added(self) -> None:
        with self._lock:
            self._ready.append(self._clock())
        if self._inner is not None:
            self._inner.added()

    def retried(self) -> None:
        if self._inner is not None:
            self._inner.retried()

    def waited(self, seconds: float) -> None:
        """A key was taken, on the worker's thread."""
        worker = threading.current_thread()
        with self._lock:
            now = self._clock()
            if self._ready:
                self._ready.popleft()
            self._working[worker] = now
            self._workers.add(worker)
            self._progress = now
        if self._inner is not None:
            self._inner.waited(seconds)

    def worked(self, seconds: float) -> None:
        """A key was finished, on the worker's thread."""
        with self._lock:
            self._working.pop(threading.current_thread(), None)
            self._progress = self._clock()
        if self._inner is not None:
            self._inner.worked(seconds)

    # -- the verdict -----------------------------------------------------------------------

    def check(self) -> tuple[bool, str]:
        """(live, reason): the answer of ``/livez``."""
        with self._lock:
            now = self._clock()
            phase, doing, since = self._phase, self._doing, self._since
            bound = self.stall_after
            if phase == "stopping":
                return True, "stopping"
            if phase == "waiting":
                if not self.election.is_alive():
                    return False, f"{doing}: the thread {self.election.name} has ended"
                return True, doing
            if phase == "starting":
                if now - since > bound:
                    return False, (
                        f"starting to lead for {_s(now - since)} (more than {_s(bound)}): "
                        "the informers' first lists or the workers' start are stuck"
                    )
                return True, doing
            stuck = [
                f"{t.name} has been on one key for {_s(now - t0)} (more than {_s(bound)})"
                for t, t0 in sorted(self._working.items(), key=lambda item: item[1])
                if now - t0 > bound
            ]
            ended = sorted(t.name for t in self._workers if not t.is_alive())
            stuck += [f"the worker thread {name} has ended" for name in ended]
            if self._ready and now - self._ready[0] > bound and now - self._progress > bound:
                stuck.append(
                    f"{len(self._ready)} keys have waited {_s(now - self._ready[0])} for a "
                    f"worker and none was taken or finished for {_s(now - self._progress)}"
                )
            if stuck:
                return False, "leading: " + "; ".join(stuck)
            return True, (
                f"leading: {len(self._working)} keys in progress, {len(self._ready)} waiting"
            )


# -- a probe server for processes without one ------------------------------------------------


def serve(*, host: str, port: int, live: Check, ready: Check) -> ThreadingHTTPServer:
    """Serve ``LIVEZ_PATH`` (``live``) and ``HEALTHZ_PATH`` (``ready``) over plain HTTP on a
    daemon thread: 200 or 503 with ``{"ok": ..., "message": reason}``. Returns the server
    (``server_address`` has the port; ``shutdown`` stops it)."""
    checks = {LIVEZ_PATH: live, HEALTHZ_PATH: ready}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            check = checks.get(self.path.split("?", 1)[0])
            if check is None:
                ok, reason, code = False, f"no probe at {self.path}; use /livez or /healthz", 404
            else:
                ok, reason = check()
                code = 200 if ok else 503
            httpanswer.answer_json(self, code, {"ok": ok, "message": reason})

        def log_message(self, format: str, *args: object) -> None:
            pass  # probes are not worth a log line

    return httpanswer.serve(host, port, Handler, name="probes")
