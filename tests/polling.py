"""Waiting in tests: poll a check until it holds, or fail saying what never happened."""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import TypeVar

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
