"""Exponential backoff, the one schedule every retry loop in the project uses, and the
deadline that bounds a whole operation, retries included.

Registry requests (``rukpak.oci.transport``), API writes (``provisioner.engine``),
watches that break (the list+watch helper) and the manager's work queue all ask
a ``Backoff`` for the delay before attempt ``n`` instead of doubling their own.
Jitter is optional and deterministic when a ``random.Random`` is passed, so tests
can check exact schedules.

A :class:`Deadline` is one moment by which an operation must answer (the node plugin
makes one per NodePublishVolume, ``--publish-deadline``). Everything below derives its
per-attempt timeouts and its backoff from what remains of it (:meth:`Deadline.timeout`,
``retry(..., deadline=)``), so timeouts never add up past it. The source fetchers take it
as an argument; the registry client, which the image cache creates per pull, reads the
one in force for the calling thread (:func:`within`, :func:`current`).
"""

from __future__ import annotations

import contextlib
import contextvars
import random
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import TypeVar

from rukpak.common import errors

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


@dataclass(frozen=True)
class Deadline:
    """The moment (``clock()`` time) by which an operation must answer, retries included.

    ``seconds`` is the budget it was made with and ``what`` names it, for messages
    ("the publish deadline of 90s (--publish-deadline)").
    """

    at: float
    seconds: float
    what: str = "deadline"
    clock: Callable[[], float] = field(default=time.monotonic, compare=False, repr=False)

    @classmethod
    def after(
        cls, seconds: float, *, what: str = "deadline", clock: Callable[[], float] = time.monotonic
    ) -> Deadline:
        return cls(at=clock() + seconds, seconds=seconds, what=what, clock=clock)

    def remaining(self) -> float:
        """Seconds left, never negative."""
        return max(0.0, self.at - self.clock())

    def expired(self) -> bool:
        return self.clock() >= self.at

    def timeout(self, cap: float, *, share: int = 1) -> float:
        """A per-attempt timeout: ``cap``, or less so that ``share`` attempts fit in what
        remains (at least 1 ms: socket libraries take 0 as "do not block")."""
        return max(0.001, min(cap, self.remaining() / max(share, 1)))

    def check(self, doing: str) -> None:
        """DeadlineExceeded (:meth:`exceeded`) when no time remains."""
        if self.expired():
            raise self.exceeded(doing)

    def exceeded(self, doing: str, *, detail: str = "") -> errors.DeadlineExceeded:
        """The error for ``doing`` (which names the server) running out of time."""
        why = f" ({detail})" if detail else ""
        return errors.DeadlineExceeded(
            f"{doing}: did not finish within {self.what} of {self.seconds:g}s{why}; check "
            "that the server is up and reachable from this node, or retry later"
        )


_current: contextvars.ContextVar[Deadline | None] = contextvars.ContextVar(
    "rukpak_deadline", default=None
)


@contextlib.contextmanager
def within(deadline: Deadline | None) -> Iterator[Deadline | None]:
    """Make ``deadline`` the one :func:`current` returns in this thread for the block."""
    token = _current.set(deadline)
    try:
        yield deadline
    finally:
        _current.reset(token)


def current() -> Deadline | None:
    """The deadline in force for the calling thread (:func:`within`), or None."""
    return _current.get()


def retry(
    call: Callable[[], T],
    *,
    attempts: int,
    backoff: Backoff,
    retryable: Callable[[BaseException], bool],
    sleep: Callable[[float], object],
    on_retry: Callable[[int, BaseException, float], object] | None = None,
    deadline: Deadline | None = None,
) -> T:
    """``call()`` up to ``attempts`` times while it raises a ``retryable`` error.

    ``sleep`` is passed in (``time.sleep``, or an ``Event.wait`` that a stop
    request can cut short). ``on_retry(attempt, error, delay)`` is told about
    each retry, for logs. With a ``deadline``, no retry starts once it has passed
    and no delay outlasts it. The last error propagates unchanged.
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
            if deadline is not None and deadline.remaining() <= delay:
                raise  # the retry could not start in time: the caller names the deadline
            if on_retry is not None:
                on_retry(attempt + 1, err, delay)
            sleep(delay)
    raise AssertionError("unreachable")
