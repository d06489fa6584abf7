"""The manager's work queue: dedup per key, no key on two workers, backoff."""

from __future__ import annotations

import threading
import time

from provisioner.runtime.queue import WorkQueue


def test_a_key_added_twice_is_queued_once() -> None:
    q = WorkQueue()
    q.add("a")
    q.add("a")
    q.add("b")
    assert len(q) == 2
    assert q.get(timeout=0) == "a"
    assert q.get(timeout=0) == "b"
    assert q.get(timeout=0) is None


def test_a_key_added_while_processing_runs_once_more_after_done() -> None:
    q = WorkQueue()
    q.add("a")
    assert q.get(timeout=0) == "a"
    q.add("a")
    q.add("a")
    assert q.get(timeout=0) is None  # not handed to a second worker
    q.done("a")
    assert q.get(timeout=0) == "a"
    q.done("a")
    assert q.get(timeout=0) is None


def test_retries_back_off_exponentially_up_to_the_cap_and_forget_resets() -> None:
    q = WorkQueue(base=0.01, cap=0.04)
    delays = [q.retry("a") for _ in range(4)]
    assert delays == [0.01, 0.02, 0.04, 0.04]
    assert q.failures("a") == 4
    q.forget("a")
    assert q.failures("a") == 0
    assert q.retry("a") == 0.01


def test_a_delayed_key_becomes_ready_after_its_delay() -> None:
    q = WorkQueue()
    q.add_after("a", 0.2)
    started = time.monotonic()
    assert q.get(timeout=0.05) is None
    assert q.get(timeout=2) == "a"
    assert time.monotonic() - started >= 0.19


class SignallingCondition(threading.Condition):
    """A condition variable that tells when a thread starts waiting on it."""

    def __init__(self) -> None:
        super().__init__()
        self.waiting = threading.Event()

    def wait(self, timeout: float | None = None) -> bool:
        self.waiting.set()  # the lock is held: no notify can slip in before the wait
        return super().wait(timeout)


def test_shutdown_wakes_a_waiting_worker() -> None:
    q = WorkQueue()
    cond = SignallingCondition()
    q._cond = cond  # before any use: the queue's only lock and wake-up channel
    got: list[str | None] = []
    # no timeout: it waits until woken
    worker = threading.Thread(target=lambda: got.append(q.get()), daemon=True)
    worker.start()
    assert cond.waiting.wait(5), "the worker never waited for work"
    with cond:  # the worker has released the lock: it is inside wait() now
        assert got == []
    q.shutdown()
    worker.join(timeout=5)
    assert not worker.is_alive(), "shutdown did not wake the waiting worker"
    assert got == [None]
