"""rukpak.common.background.Chore: wake-ups during a run make one more run, never none."""

from __future__ import annotations

import logging
import threading

import pytest

from rukpak.common.background import Chore


def test_wakeups_during_a_run_make_exactly_one_more_run() -> None:
    started, release, finished = threading.Event(), threading.Event(), threading.Event()
    runs: list[int] = []

    def work() -> None:
        runs.append(len(runs))
        if len(runs) == 1:
            started.set()
            assert release.wait(10)
        else:
            finished.set()

    chore = Chore("test", work, failure="test chore failed")
    chore.wake()
    assert started.wait(10)
    for _ in range(5):  # all while the first run is going
        chore.wake()
    release.set()
    assert finished.wait(10)
    thread = chore._thread
    if thread is not None:
        thread.join(10)
    assert runs == [0, 1]
    assert chore._thread is None  # idle: no thread left behind


def test_a_failed_run_is_logged_and_the_next_wakeup_runs_again(
    caplog: pytest.LogCaptureFixture,
) -> None:
    done = threading.Event()
    calls: list[str] = []

    def work() -> None:
        calls.append("run")
        if len(calls) == 1:
            raise OSError("disk full")
        done.set()

    chore = Chore("test", work, failure="test chore failed")
    with caplog.at_level(logging.ERROR):
        chore.wake()
        thread = chore._thread
        if thread is not None:
            thread.join(10)  # the failing run ends; its thread ends with it
        assert "test chore failed" in caplog.text and "disk full" in caplog.text
    chore.wake()
    assert done.wait(10)
    assert calls == ["run", "run"]
