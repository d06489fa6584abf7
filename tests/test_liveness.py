"""``/livez``: a provisioner process is live while its own loops are (``runtime.liveness``).

Real work queues drained by real worker threads (``runtime.workers``), with reconciles that
return, hang or kill their thread, behind the manager's real HTTPS server
(``manager.webhook``, a certificate from ``certs.generate``) and the PV provisioner's plain
HTTP probe server (``liveness.serve``). The bound is a fraction of a second here; the
processes use ``liveness.STALL_AFTER``.
"""

from __future__ import annotations

import contextlib
import json
import logging
import socket
import ssl
import threading
import time
from collections.abc import Callable, Iterator

import pytest

from provisioner.manager.serving import certs, webhook
from provisioner.runtime import liveness
from provisioner.runtime.queue import WorkQueue
from provisioner.runtime.workers import Workers
from rukpak.common import httpanswer
from tests.httpreply import probe
from tests.polling import eventually

BOUND = 1.0
log = logging.getLogger("tests.liveness")


def get(url: str) -> tuple[int, dict[str, object]]:
    """GET ``url`` as kubelet's probe does (HTTPS unverified): status and JSON body."""
    status, body = probe(url)
    return status, json.loads(body)


@pytest.fixture
def alive() -> liveness.Liveness:
    return liveness.Liveness(stall_after=BOUND)


@pytest.fixture
def livez(alive: liveness.Liveness) -> Iterator[str]:
    """The manager's HTTPS server answering ``/livez`` from ``alive``; yields the URL."""
    server = webhook.Server(
        lambda old, new: {},
        certs.generate(["127.0.0.1"]),
        host="127.0.0.1",
        port=0,
        live=alive.check,
    )
    server.start()
    try:
        yield f"https://127.0.0.1:{server.port}{liveness.LIVEZ_PATH}"
    finally:
        server.stop()


@contextlib.contextmanager
def leading(
    alive: liveness.Liveness, reconcile: Callable[[str], None], *, workers: int
) -> Iterator[WorkQueue]:
    """A queue and ``workers`` threads on it, followed by ``alive`` as the manager's
    controller is: starting, then leading; stopping (and the workers stopped) on exit.
    Yields the queue."""
    queue = WorkQueue()
    pool = Workers(queue, reconcile, log=log)
    alive.starting()
    alive.follow(queue)
    pool.start(workers)
    alive.leading()
    try:
        yield queue
    finally:
        alive.stopping()
        pool.stop(timeout=2)


def failing(livez: str) -> dict[str, object]:
    """Wait until ``livez`` answers 503; its body."""
    _, body = eventually(lambda: a if (a := get(livez))[0] == 503 else None)
    return body


@pytest.fixture
def release() -> Iterator[threading.Event]:
    """Set at the end of the test: lets every hanging reconcile return."""
    event = threading.Event()
    yield event
    event.set()


def hanging_on(key: str, release: threading.Event) -> Callable[[str], None]:
    def reconcile(k: str) -> None:
        if k == key:
            release.wait(30)

    return reconcile


# -- a standby ---------------------------------------------------------------------------------


def test_a_standby_is_live_while_its_election_thread_runs() -> None:
    waiting = threading.Event()
    election = threading.Thread(target=waiting.wait, name="election", daemon=True)
    election.start()
    alive = liveness.Liveness(stall_after=BOUND, election=election)
    alive.waiting("waiting for the Lease rukpak-manager")
    server = webhook.Server(
        lambda old, new: {}, certs.generate(["127.0.0.1"]), host="127.0.0.1", live=alive.check
    )
    server.start()
    url = f"https://127.0.0.1:{server.port}/livez"
    try:
        time.sleep(BOUND * 2)  # waiting for a Lease has no bound
        assert get(url) == (200, {"ok": True, "message": "waiting for the Lease rukpak-manager"})
        waiting.set()
        election.join(5)
        code, body = get(url)
        assert code == 503
        assert body["message"] == (
            "waiting for the Lease rukpak-manager: the thread election has ended"
        )
    finally:
        server.stop()


def test_healthz_stays_the_readiness_answer_beside_livez(livez: str) -> None:
    assert get(livez.replace("/livez", "/healthz")) == (200, {"ok": True})


def test_a_server_without_a_liveness_check_has_no_livez() -> None:
    server = webhook.Server(lambda old, new: {}, certs.generate(["127.0.0.1"]), host="127.0.0.1")
    server.start()
    try:
        assert get(f"https://127.0.0.1:{server.port}/livez")[0] == 404
    finally:
        server.stop()


def test_a_stopping_server_answers_the_connections_already_waiting_to_be_accepted() -> None:
    """Two replicas share 9443 on a host network (SO_REUSEPORT): a listener that closed with
    connections in its accept queue would reset them (a webhook call failing while a replica
    stops), so ``stop`` serves them first."""
    server = webhook.Server(lambda old, new: {}, certs.generate(["127.0.0.1"]), host="127.0.0.1")
    waiting = socket.create_connection(("127.0.0.1", server.port))  # queued: nothing accepts
    context = ssl.create_default_context()
    context.check_hostname = False
    context.verify_mode = ssl.CERT_NONE
    answers: list[bytes] = []

    def ask() -> None:
        with context.wrap_socket(waiting) as conn:
            conn.settimeout(20)
            conn.sendall(b"GET /healthz HTTP/1.0\r\n\r\n")
            answers.append(b"".join(iter(lambda: conn.recv(4096), b"")))

    asking = threading.Thread(target=ask)
    asking.start()
    server.stop()  # never started: what waits is only served by the drain
    asking.join(timeout=30)
    assert answers and answers[0].startswith(b"HTTP/1.0 200"), answers


# -- a leader ----------------------------------------------------------------------------------


def test_a_leader_whose_workers_are_idle_stays_live(alive: liveness.Liveness, livez: str) -> None:
    with leading(alive, lambda key: None, workers=2) as queue:
        queue.add("bd:a")
        eventually(lambda: get(livez)[1]["message"] == "leading: 0 keys in progress, 0 waiting")
        time.sleep(BOUND * 3)  # idle for longer than the bound
        assert get(livez) == (
            200,
            {"ok": True, "message": "leading: 0 keys in progress, 0 waiting"},
        )


def test_a_reconcile_stuck_past_the_bound_fails_livez_naming_the_worker(
    alive: liveness.Liveness, livez: str, release: threading.Event
) -> None:
    with leading(alive, hanging_on("bd:stuck", release), workers=2) as queue:
        queue.add("bd:stuck")
        assert get(livez)[0] == 200  # within the bound: a slow reconcile is fine
        body = failing(livez)
        message = str(body["message"])
        assert body["ok"] is False
        assert message.startswith("leading: worker-") and "has been on one key for" in message
        assert f"(more than {BOUND:.1f} s)" in message
        release.set()  # it returns: live again
        eventually(lambda: get(livez)[0] == 200, what="live once the reconcile returned")


def test_keys_waiting_behind_stuck_workers_are_named_too(
    alive: liveness.Liveness, livez: str, release: threading.Event
) -> None:
    with leading(alive, hanging_on("bd:stuck", release), workers=1) as queue:
        queue.add("bd:stuck")
        eventually(lambda: "1 keys in progress" in str(get(livez)[1]["message"]))
        queue.add("bd:next")
        queue.add("bundle:other")

        def both() -> str | None:
            message = str(get(livez)[1]["message"])
            return message if "keys have waited" in message else None

        message = eventually(both, what="the waiting keys named")
        assert "worker-0 has been on one key" in message
        assert "2 keys have waited" in message and "none was taken or finished" in message


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_worker_thread_that_ended_fails_livez(alive: liveness.Liveness, livez: str) -> None:
    def reconcile(key: str) -> None:
        raise SystemExit("a worker that leaves its loop")  # not an Exception: the thread ends

    with leading(alive, reconcile, workers=2) as queue:
        queue.add("bd:fatal")
        body = failing(livez)
        assert "the worker thread worker-" in str(body["message"])
        assert "has ended" in str(body["message"])


def test_slow_work_that_keeps_moving_stays_live(alive: liveness.Liveness, livez: str) -> None:
    """A backlog that waits longer than the bound is fine while keys are taken and finished:
    a leader working through thousands of BundleDeployments after a takeover."""
    with leading(alive, lambda key: time.sleep(BOUND / 4), workers=1) as queue:
        for i in range(16):  # 16 x BOUND/4 = 4 bounds of work
            queue.add(f"bd:{i}")
        answers = []
        while len(queue) or alive.check()[1] != "leading: 0 keys in progress, 0 waiting":
            answers.append(get(livez))
            time.sleep(BOUND / 8)
        assert len(answers) > 10
        assert all(code == 200 for code, _ in answers), answers


def test_starting_to_lead_has_the_same_bound(alive: liveness.Liveness, livez: str) -> None:
    alive.starting()
    assert get(livez) == (200, {"ok": True, "message": "starting to lead"})
    time.sleep(BOUND * 1.5)
    code, body = get(livez)
    assert code == 503
    assert "the informers' first lists or the workers' start are stuck" in str(body["message"])
    alive.stopping()
    assert get(livez) == (200, {"ok": True, "message": "stopping"})


def test_the_observer_it_replaced_still_gets_every_call(alive: liveness.Liveness) -> None:
    calls: list[str] = []

    class Recorder:
        def added(self) -> None:
            calls.append("added")

        def retried(self) -> None:
            calls.append("retried")

        def waited(self, seconds: float) -> None:
            calls.append("waited")

        def worked(self, seconds: float) -> None:
            calls.append("worked")

    queue = WorkQueue()
    queue.observer = Recorder()
    alive.follow(queue)
    queue.add("a")
    assert queue.get(timeout=1) == "a"
    queue.retry("a")
    queue.done("a")
    assert calls == ["added", "waited", "retried", "worked"]


# -- the PV provisioner's probe server ---------------------------------------------------------


def test_the_probe_server_answers_livez_and_healthz_from_its_checks() -> None:
    ready = {"ok": False}
    server = liveness.serve(
        host="127.0.0.1",
        port=0,
        live=lambda: (True, "waiting for the CSI plugin"),
        ready=lambda: (ready["ok"], "connected" if ready["ok"] else "not connected yet"),
    )
    base = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert get(base + "/livez") == (200, {"ok": True, "message": "waiting for the CSI plugin"})
        assert get(base + "/healthz") == (503, {"ok": False, "message": "not connected yet"})
        ready["ok"] = True
        assert get(base + "/healthz") == (200, {"ok": True, "message": "connected"})
        code, body = get(base + "/metrics")
        assert code == 404 and "use /livez or /healthz" in str(body["message"])
    finally:
        server.shutdown()
        server.server_close()


def test_a_probe_server_closes_a_silent_connection_and_answers_others_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(httpanswer, "CONNECTION_TIMEOUT", 0.5)
    server = liveness.serve(
        host="127.0.0.1", port=0, live=lambda: (True, "live"), ready=lambda: (True, "ready")
    )
    port = server.server_address[1]
    try:
        with (
            socket.create_connection(("127.0.0.1", port)) as silent,
            socket.create_connection(("127.0.0.1", port)) as halfway,
        ):
            halfway.sendall(b"GET /livez HTTP/1.1\r\nHost: x\r\n")  # no blank line: unfinished
            answer = get(f"http://127.0.0.1:{port}/healthz")
            assert answer == (200, {"ok": True, "message": "ready"})
            for conn in (silent, halfway):
                conn.settimeout(20)  # a failure here, not a hang
                assert conn.recv(4096) == b""  # the server closed it
    finally:
        server.shutdown()
        server.server_close()
