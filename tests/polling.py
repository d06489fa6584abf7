"""Waiting in tests: poll a check until it holds, or fail saying what never happened.

And, for "nothing happened" checks, wait for the event that must come first (a watch
event the watcher handled) instead of sleeping.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

from provisioner.engine.objects import Obj
from rukpak.kube import listwatch

T = TypeVar("T")


def eventually(
    check: Callable[[], T | None],
    *,
    timeout: float = 10.0,
    what: str = "the condition",
    interval: float = 0.2,
) -> T:
    """Call ``check`` until it returns something truthy and return that.

    Exceptions count as "not yet"; on timeout the last one is in the message.
    """
    deadline = time.monotonic() + timeout
    last: Exception | None = None
    while True:
        try:
            result = check()
        except Exception as e:  # keep polling; show the last error on timeout
            last = e
        else:
            if result:
                return result
        if time.monotonic() >= deadline:
            raise AssertionError(
                f"timed out after {timeout}s waiting for {what}; last error: {last!r}"
            )
        time.sleep(interval)


def until(
    check: Callable[[], T | None],
    *,
    timeout: float,
    what: str,
    interval: float = 0.05,
    tolerate: bool = False,
) -> T:
    """The benchmarks' wait: call ``check`` until it returns something truthy and return
    that, or raise :class:`TimeoutError` naming ``what``. An exception of ``check`` ends
    the wait at once unless ``tolerate`` (transient API errors count as "not yet")."""
    deadline = time.monotonic() + timeout
    while True:
        try:
            got = check()
        except Exception:
            if not tolerate:
                raise
            got = None
        if got:
            return got
        if time.monotonic() > deadline:
            raise TimeoutError(f"timed out after {timeout:.0f}s waiting for {what}")
        time.sleep(interval)


def logged(read: Callable[[], str], line: str, *, more_than: int = 0, timeout: float = 10.0) -> str:
    """Wait until the text ``read()`` returns holds ``line`` more than ``more_than`` times.

    Processes log what they did just after doing it, so a test that saw the effect must
    still wait for the line. Returns the whole text, so "a secret is not in the log"
    checks run on a log that already records the request.
    """

    def check() -> str | None:
        text = read()
        return text if text.count(line) > more_than else None

    return eventually(check, timeout=timeout, what=f"{line!r} in the log")


def seen_by(informer: listwatch.Informer, obj: Obj, *, timeout: float = 10.0) -> None:
    """Wait until ``informer``'s handlers have run for ``obj``'s write (or a later one).

    The proof that a watcher had its chance to react to a write: assert afterwards
    that it did not (no correction queued, no request sent).
    """
    written = int(obj["metadata"]["resourceVersion"])
    informer.wait(lambda: int(informer.handled or 0) >= written, timeout=timeout)
