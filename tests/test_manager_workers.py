"""Workers draining a work queue: what a success, a requested delay and a failure do to a
key. Pure logic: a real ``WorkQueue`` and a reconcile function written for each case;
the worker loop runs on the test's thread until the reconcile sets the stop event."""

from __future__ import annotations

import logging
import threading
from typing import Any

import pytest

from provisioner.runtime.queue import WorkQueue
from provisioner.runtime.workers import Workers
from rukpak.common import errors

log = logging.getLogger("test.workers")


def drain(queue: WorkQueue, steps: list[object], **kw: Any) -> list[tuple[str, int]]:
    """Run one worker over ``queue`` (key "a" added); each reconcile takes the next of
    ``steps``: an exception to raise, or a delay (float) or None to return. The worker
    stops after the last step. What each call saw: (key, failures counted so far)."""
    seen: list[tuple[str, int]] = []
    todo = list(steps)

    def reconcile(key: str) -> float | None:
        seen.append((key, queue.failures(key)))
        step = todo.pop(0)
        if not todo:
            workers.stopping.set()
        if isinstance(step, BaseException):
            raise step
        assert step is None or isinstance(step, float)
        return step

    workers = Workers(queue, reconcile, log=log, **kw)
    queue.add("a")
    workers.work()
    return seen


def test_failures_are_retried_with_backoff_and_a_success_forgets_them() -> None:
    queue = WorkQueue(base=0.01, cap=0.04)
    seen = drain(queue, [errors.Unavailable("not yet"), errors.Unavailable("still not"), None])
    assert seen == [("a", 0), ("a", 1), ("a", 2)]
    assert queue.failures("a") == 0


def test_a_crashing_reconcile_is_logged_and_retried_like_a_failure(
    caplog: pytest.LogCaptureFixture,
) -> None:
    queue = WorkQueue(base=0.01, cap=0.04)
    with caplog.at_level(logging.WARNING, logger="test.workers"):
        seen = drain(queue, [KeyError("bug"), errors.NotFound("gone"), None])
    assert seen == [("a", 0), ("a", 1), ("a", 2)]
    messages = [r.getMessage() for r in caplog.records]
    assert any("msg='reconcile crashed' key=a" in m for m in messages), messages
    assert any("msg='reconcile failed' key=a" in m and "gone" in m for m in messages), messages


def test_a_requested_delay_looks_again_and_forgets_the_failures() -> None:
    queue = WorkQueue(base=0.01, cap=0.04)
    seen = drain(queue, [errors.Unavailable("x"), 0.01, None])
    assert seen == [("a", 0), ("a", 1), ("a", 0)]


def test_keep_failures_on_requeue_lets_the_reconcile_back_off_by_itself() -> None:
    queue = WorkQueue(base=0.01, cap=0.04)
    seen = drain(queue, [errors.Unavailable("x"), 0.01, None], keep_failures_on_requeue=True)
    assert seen == [("a", 0), ("a", 1), ("a", 1)]
    assert queue.failures("a") == 0  # None settles the key


def test_the_pass_is_named_in_the_logs(caplog: pytest.LogCaptureFixture) -> None:
    queue = WorkQueue(base=0.01, cap=0.04)
    with caplog.at_level(logging.WARNING, logger="test.workers"):
        drain(queue, [errors.Unavailable("no socket"), None], what="sync")
    assert any("msg='sync failed' key=a" in r.getMessage() for r in caplog.records)


def test_stop_ends_the_workers_and_the_spawned_loops() -> None:
    queue = WorkQueue()
    handled = threading.Event()
    workers = Workers(queue, lambda key: handled.set(), log=log)
    ended: list[str] = []

    def loop() -> None:
        workers.stopping.wait()
        ended.append("resync")

    before = set(threading.enumerate())
    workers.start(2)
    workers.spawn("resync", loop)
    names = {"worker-0", "worker-1", "resync"}
    started = [t for t in set(threading.enumerate()) - before if t.name in names]
    assert {t.name for t in started} == names
    queue.add("a")
    assert handled.wait(10)
    workers.stop(timeout=10)
    assert ended == ["resync"]
    assert not [t.name for t in started if t.is_alive()]
