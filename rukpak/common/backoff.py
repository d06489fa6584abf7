"""Exponential backoff, the one schedule every retry loop in the project uses.

Registry requests (``rukpak.oci.transport``), API writes (``provisioner.engine``),
watches that break (the list+watch helper) and the manager's work queue all ask
a ``Backoff`` for the delay before attempt ``n`` instead of doubling their own.
Jitter is optional and deterministic when a ``random.Random`` is passed, so tests
can check exact schedules.
"""

from __future__ import annotations

import random
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

T = TypeVar("T")


@dataclass(frozen=True)
class Backoff:
    """Delay before retry ``n`` (0-based): ``min(cap, base * factor**n)``, plus jitter.

    ``jitter`` is the fraction of the delay added at random (0.1 = up to +10%),
    which spreads the retries of many clients that failed together.
    """

    base: float = 0.5
    cap: float = 30.0
    factor: float = 2.0
    jitter: float = 0.0
    rng: random.Random = field(default_factory=random.Random, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.base < 0 or self.cap < 0 or self.factor < 1 or self.jitter < 0:
            raise ValueError(f"invalid backoff {self!r}")

    def delay(self, n: int) -> float:
        """Seconds to wait before retry number ``n`` (0 for the first retry)."""
        exponent = min(max(n, 0), 64)  # 2**64 * base is past any cap; avoid float overflow
        plain = min(self.cap, self.base * self.factor**exponent)
        if self.jitter:
            plain = min(self.cap, plain * (1 + self.jitter * self.rng.random()))
        return plain

    def delays(self, retries: int) -> Iterator[float]:
        """The delays of ``retries`` successive retries."""
        for n in range(retries):
            yield self.delay(n)


def retry(
    call: Callable[[], T],
    *,
    attempts: int,
    backoff: Backoff,
    retryable: Callable[[BaseException], bool],
    sleep: Callable[[float], object],
    on_retry: Callable[[int, BaseException, float], object] | None = None,
) -> T:
    """``call()`` up to ``attempts`` times while it raises a ``retryable`` error.

    ``sleep`` is passed in (``time.sleep``, or an ``Event.wait`` that a stop
    request can cut short). ``on_retry(attempt, error, delay)`` is told about
    each retry, for logs. The last error propagates unchanged.
    """
    if attempts < 1:
        raise ValueError("attempts must be at least 1")
    for attempt in range(attempts):
        try:
            return call()
        except BaseException as err:
            if attempt + 1 >= attempts or not retryable(err):
                raise
            delay = backoff.delay(attempt)
            if on_retry is not None:
                on_retry(attempt + 1, err, delay)
            sleep(delay)
    raise AssertionError("unreachable")
