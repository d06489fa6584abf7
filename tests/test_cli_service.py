"""The lifecycle of the long-running provisioner processes (``provisioner.runtime.service``).

Pure: leader election off, so no API server is asked; the work is a recorder. The
manager and the PV provisioner run it for real with a Lease in
``test_manager_controller`` (the process tests) and the storage e2e tests.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import cast

import pytest

from provisioner.engine.kube.kube import Kube
from provisioner.runtime import service
from rukpak.common import errors

NO_KUBE = cast(Kube, object())  # never used: leader election is off
OFF = service.Election(False, "rukpak-system", "test-lease")
log = logging.getLogger("test.service")


def test_the_work_starts_runs_until_stopped_and_is_stopped_then_exit_0(
    caplog: pytest.LogCaptureFixture,
) -> None:
    stop = threading.Event()
    seen: list[str] = []

    def start() -> Callable[[], None]:
        seen.append("started")
        stop.set()  # SIGTERM arrives while the work runs
        return lambda: seen.append(f"halted after stop={stop.is_set()}")

    with caplog.at_level(logging.INFO, logger="test.service"):
        code = service.serve(NO_KUBE, OFF, start, stop=stop, log=log, lost="stopped")
    assert code == service.EXIT_OK
    assert seen == ["started", "halted after stop=True"]
    assert "msg='stopped'" in caplog.text


def test_an_error_while_starting_is_logged_and_exits_1(caplog: pytest.LogCaptureFixture) -> None:
    def start() -> Callable[[], None]:
        raise errors.Unavailable("the API server is not reachable; check --kubeconfig")

    code = service.serve(NO_KUBE, OFF, start, stop=threading.Event(), log=log, lost="stopped")
    assert code == service.EXIT_ERROR
    assert "msg='failed' error='the API server is not reachable" in caplog.text
