"""Per-key locks stay bounded: a lock lives only while someone holds or waits for it."""

from __future__ import annotations

import threading
import types
from collections.abc import Iterator

import pytest

from rukpak.image import locks as locks_module
from rukpak.image.locks import KeyedLocks


def test_a_lock_per_key_is_dropped_when_its_last_user_leaves() -> None:
    locks = KeyedLocks()
    for n in range(1000):
        with locks.hold(f"/var/lib/kubelet/pods/{n}/mount"):
            assert len(locks) == 1
    assert len(locks) == 0


class ObservedLock:
    """A ``threading.Lock`` that tells when a caller finds it taken and is about to block,
    so a test can wait for that moment instead of hoping the scheduler reached it."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self.blocked = threading.Semaphore(0)

    def acquire(self, blocking: bool = True, timeout: float = -1) -> bool:
        if self._lock.acquire(blocking=False):
            return True
        self.blocked.release()
        return self._lock.acquire(blocking, timeout)

    def release(self) -> None:
        self._lock.release()

    def __enter__(self) -> bool:
        return self.acquire()

    def __exit__(self, *_: object) -> None:
        self.release()


@pytest.fixture
def observed(monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[KeyedLocks, list[ObservedLock]]]:
    """A ``KeyedLocks`` and the per-key locks it creates, in order of creation."""
    locks = KeyedLocks()  # (its own guard stays a plain lock)
    created: list[ObservedLock] = []

    def make() -> ObservedLock:
        created.append(ObservedLock())
        return created[-1]

    monkeypatch.setattr(locks_module, "threading", types.SimpleNamespace(Lock=make))
    yield locks, created


def test_one_key_is_exclusive_and_a_waiter_keeps_its_lock_alive(
    observed: tuple[KeyedLocks, list[ObservedLock]],
) -> None:
    locks, created = observed
    entered = {name: threading.Event() for name in ("first", "second", "third")}
    leave = {name: threading.Event() for name in ("first", "second", "third")}
    order: list[str] = []

    def user(name: str) -> None:
        with locks.hold("k"):
            order.append(name)
            entered[name].set()
            leave[name].wait(10)

    threads = {name: threading.Thread(target=user, args=(name,), daemon=True) for name in entered}
    threads["first"].start()
    assert entered["first"].wait(5)
    (lock,) = created

    # the second caller finds the key's lock taken and blocks on it
    threads["second"].start()
    assert lock.blocked.acquire(timeout=5), "the second caller never blocked on the held lock"
    assert order == ["first"]
    assert len(locks) == 1

    # the holder leaves while the second still waits: the waiter keeps the lock alive
    leave["first"].set()
    assert entered["second"].wait(5)
    assert order == ["first", "second"]
    assert len(locks) == 1

    # so a third caller meets the same lock (held by the second) and blocks on it too
    threads["third"].start()
    assert lock.blocked.acquire(timeout=5), "the third caller got a lock of its own"
    assert order == ["first", "second"]

    leave["second"].set()
    assert entered["third"].wait(5)
    leave["third"].set()
    for t in threads.values():
        t.join(5)
        assert not t.is_alive()
    assert order == ["first", "second", "third"]
    assert len(locks) == 0
