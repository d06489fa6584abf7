"""Per-key locks stay bounded: a lock lives only while someone holds or waits for it."""

from __future__ import annotations

import threading

from rukpak.image.locks import KeyedLocks


def test_a_lock_per_key_is_dropped_when_its_last_user_leaves() -> None:
    locks = KeyedLocks()
    for n in range(1000):
        with locks.hold(f"/var/lib/kubelet/pods/{n}/mount"):
            assert len(locks) == 1
    assert len(locks) == 0


def test_one_key_is_exclusive_and_a_waiter_keeps_its_lock_alive() -> None:
    locks = KeyedLocks()
    inside = threading.Event()
    waiting = threading.Event()
    release = threading.Event()
    order: list[str] = []

    def first() -> None:
        with locks.hold("k"):
            inside.set()
            release.wait(10)
            order.append("first")

    def second() -> None:
        inside.wait(10)
        waiting.set()
        with locks.hold("k"):
            order.append("second")

    threads = [threading.Thread(target=first), threading.Thread(target=second)]
    for t in threads:
        t.start()
    waiting.wait(10)
    release.set()
    for t in threads:
        t.join(10)
    assert order == ["first", "second"]
    assert len(locks) == 0
