"""A bounded pool that runs one function over many objects and keeps every error.

Used by every engine step that talks to the API server for many objects at
once (ownership preflight, each apply phase, pruning, status): results come
back in input order and an error becomes that item's result, so a failing
phase can name every object that failed, not just the first.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from typing import TypeVar

from rukpak.common import errors

T = TypeVar("T")
R = TypeVar("R")


def run_all(
    items: Sequence[T], fn: Callable[[T], R], *, concurrency: int
) -> list[tuple[T, R | errors.RukpakError]]:
    """``fn`` over ``items`` with at most ``concurrency`` in flight; results in item order.

    A ``RukpakError`` becomes that item's result; anything else is wrapped as Internal.
    """

    def guarded(item: T) -> R | errors.RukpakError:
        try:
            return fn(item)
        except errors.RukpakError as err:
            return err
        except Exception as err:  # an unexpected bug must still name its object
            return errors.Internal(f"{type(err).__name__}: {err}")

    if len(items) <= 1 or concurrency <= 1:
        return [(item, guarded(item)) for item in items]
    with ThreadPoolExecutor(max_workers=min(concurrency, len(items))) as pool:
        return list(zip(items, pool.map(guarded, items), strict=True))
