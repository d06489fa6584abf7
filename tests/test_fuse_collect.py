"""Garbage collection of the FUSE file store (``csi.fuse.collect``), on a real store on disk.

Trees are saved indexes naming files put in a real ``FileStore``; the budget is set so
that the policy's decisions are visible: least recently used unheld trees go while
over budget, held and recently used trees stay, files no remaining index names are
deleted, files shared with a kept tree stay, and a pull in progress keeps its files.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from csi.fuse import collect, index
from csi.fuse.collect import Collector
from csi.fuse.filestore import FileStore

KiB = 1024


def _tree(store: FileStore, trees: Path, name: str, contents: list[bytes], *, age: float) -> None:
    """Save index ``name`` naming ``contents`` (stored), last used ``age`` seconds ago."""
    builder = index.Builder(image=name)
    for n, data in enumerate(contents):
        digest = store.put_bytes(data)
        builder.add_file(("f", f"{n}"), mode=0o644, size=len(data), digest=digest, mtime=0)
    path = trees / f"{name}.json"
    index.save(path, f"sha256:{name}", builder.finish(), files=store)
    stamp = time.time() - age
    os.utime(path, (stamp, stamp))


@pytest.fixture
def store(tmp_path: Path) -> FileStore:
    return FileStore(tmp_path / "store")


@pytest.fixture
def trees(tmp_path: Path) -> Path:
    path = tmp_path / "trees"
    path.mkdir()
    return path


def _blob(tag: str, size: int = 64 * KiB) -> bytes:
    return (tag.encode() * size)[:size]


def test_over_budget_the_least_recently_used_unheld_trees_go_with_their_files(
    store: FileStore, trees: Path
) -> None:
    shared = _blob("shared")
    _tree(store, trees, "old", [_blob("old"), shared], age=3000)
    _tree(store, trees, "held", [_blob("held")], age=4000)
    _tree(store, trees, "middle", [_blob("middle")], age=2000)
    _tree(store, trees, "new", [_blob("new"), shared], age=1000)
    forgotten: list[str] = []
    budget = 210 * KiB  # five 64 KiB files and 4 KiB listings are stored: two trees must go
    collector = Collector(store, trees, budget_bytes=budget, forget=forgotten.append)

    evicted, deleted = collector.collect(held={"held"})

    assert evicted == ["old", "middle"]
    assert forgotten == ["old", "middle"]
    assert sorted(p.stem for p in trees.glob("*.json")) == ["held", "new"]
    assert deleted == 4  # the two files and the two listings only those trees named
    assert store.disk_usage() <= budget
    assert set(store.digests()) == collect.referenced(trees, store)
    assert store.has(store.put_bytes(shared))  # shared with a kept tree: still there


def test_under_budget_nothing_is_evicted_but_orphan_files_go(store: FileStore, trees: Path) -> None:
    _tree(store, trees, "a", [_blob("a")], age=5000)
    orphan = store.put_bytes(_blob("orphan"))  # e.g. left by a pull that failed
    collector = Collector(store, trees, budget_bytes=10 * 1024 * KiB, forget=lambda _t: None)

    assert collector.collect(held=set()) == ([], 1)
    assert not store.has(orphan)
    assert [p.stem for p in trees.glob("*.json")] == ["a"]


def test_a_recently_used_tree_is_kept_even_when_over_budget(store: FileStore, trees: Path) -> None:
    _tree(store, trees, "just-published", [_blob("x")], age=1)
    collector = Collector(store, trees, budget_bytes=1, forget=lambda _t: None)

    assert collector.collect(held=set()) == ([], 0)
    assert store.disk_usage() > 0


def test_files_of_a_pull_in_progress_are_kept_until_it_ends(store: FileStore, trees: Path) -> None:
    collector = Collector(store, trees, budget_bytes=1, forget=lambda _t: None)
    with collector.pulling():
        unindexed = store.put_bytes(_blob("pulling"))  # its index is not saved yet
        assert collector.collect(held=set()) == ([], 0)
        assert store.has(unindexed)
    assert collector.collect(held=set()) == ([], 1)  # the pull failed: its files go now
