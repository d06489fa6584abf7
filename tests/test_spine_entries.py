"""One rule set for hostile entries and budgets: every source, both publish modes.

Parameterized over {bind, fuse} x {image, eStargz image, git, http} so a rule cannot
exist in one mode only (issue 18). Images come from the real registry, git
repositories from ``git http-backend`` and tarballs from the http server of
``tests.source_servers``. Which combinations are real: images in both modes (FUSE
indexes them, eStargz ones lazily); git and http volumes are bound from the source
cache in both modes (``tests.spine_helpers``); git cannot hold an absolute path.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

from rukpak.common import errors
from rukpak.image.members import Limits
from rukpak.sources import http
from tests.csi_helpers import Entry, PushedImage, push_image
from tests.registry import RegistryServer
from tests.source_servers import SourceServer, serving, tarball
from tests.spine_helpers import MODES, Node, fast_import_repo, push_estargz, push_estargz_dirs

pytestmark = [pytest.mark.registry]

KINDS = ("image", "estargz", "git", "http")
DEEP = "a/" * 1999 + "f"  # 2,000 components, 3,999 bytes: under PATH_MAX, far over the depth
_names = itertools.count()


@pytest.fixture(params=MODES)
def mode(request: pytest.FixtureRequest) -> str:
    """A test taking ``mode`` runs in both publish modes."""
    return str(request.param)


@pytest.fixture(params=KINDS)
def kind(request: pytest.FixtureRequest) -> str:
    """A test taking ``kind`` runs for every kind of source."""
    return str(request.param)


@dataclass(frozen=True)
class Sources:
    """Where each kind of volume comes from: the registry (images) and the git and http
    server."""

    registry: RegistryServer
    server: SourceServer

    def publish(self, node: Node, kind: str, files: dict[str, str]) -> dict[str, str]:
        """Publish ``files`` (``symlink:`` values are links; names verbatim) as a ``kind``
        volume on ``node``; what the pod sees."""
        n = next(_names)
        server = self.server
        if kind in ("image", "estargz"):
            entries: list[Entry] = [
                (name, "symlink", body[len("symlink:") :])
                if body.startswith("symlink:")
                else (name, "file", body.encode())
                for name, body in files.items()
            ]
            push = push_estargz if kind == "estargz" else _push_plain
            image = push(self.registry.host, f"spine/{kind}{n}", entries)
            return node.publish_image(image.ref)
        if kind == "git":
            commit = fast_import_repo(server.git_root / f"r{n}", files)
            return node.publish_source({"git": server.repo_url(f"r{n}"), "commit": commit})
        links = {k: v[len("symlink:") :] for k, v in files.items() if v.startswith("symlink:")}
        plain = {k: v for k, v in files.items() if k not in links}
        data = tarball(plain, symlinks=links)
        server.files[f"t{n}.tgz"] = data
        digest = f"sha256:{hashlib.sha256(data).hexdigest()}"
        return node.publish_source({"url": http.pin_url(f"{server.url}/files/t{n}.tgz", digest)})


@pytest.fixture
def sources(registry: RegistryServer, tmp_path: Path) -> Iterator[Sources]:
    with serving(tmp_path / "git") as server:
        yield Sources(registry, server)


def _push_plain(host: str, repo: str, entries: list[Entry]) -> PushedImage:
    return push_image(host, repo, "v1", [entries])


def test_hostile_entries_are_refused_alike(
    tmp_path: Path, sources: Sources, mode: str, kind: str, caplog: pytest.LogCaptureFixture
) -> None:
    files = {
        "ok.yaml": "ok",
        "../up": "climbs out",
        "escape": "symlink:../../etc/passwd",
        "dir/hop": "symlink:..",
        "chain": "symlink:dir/hop/..",
        "inside": "symlink:ok.yaml",
    }
    if kind != "git":  # a git tree cannot hold an absolute path
        files["/abs/x"] = "absolute"
    seen = sources.publish(Node(mode, tmp_path), kind, files)
    expected = {
        "ok.yaml": "file:ok",
        "dir": "dir",
        "dir/hop": "-> ..",
        "inside": "-> ok.yaml",
    }
    if kind != "git":
        expected |= {"abs": "dir", "abs/x": "file:absolute"}
        assert "leading '/' removed" in caplog.text  # stripped, and said so, in both modes
    if kind == "estargz" and mode == "bind":
        # The one difference left: bind mode extracts an eStargz layer as the plain
        # tar.gz it also is, TOC member included; FUSE hides it (as stargz readers do).
        assert seen.pop("stargz.index.json").startswith("file:{")
    assert seen == expected


def test_a_path_deeper_than_the_budget_is_invalid_argument_naming_it(
    tmp_path: Path, sources: Sources, mode: str, kind: str
) -> None:
    node = Node(mode, tmp_path)
    with pytest.raises(errors.InvalidArgument) as info:
        if kind == "estargz":
            image = push_estargz_dirs(sources.registry.host, f"spine/deep{next(_names)}", [DEEP])
            node.publish_image(image.ref)
        else:
            sources.publish(node, kind, {DEEP: "deep", "ok.yaml": "ok"})
    message = info.value.message
    assert "entry 'a/a/a/a" in message and "at most 128" in message
    # git's archive lists the parent directories first: the 129th is refused.
    assert f"{129 if kind == 'git' else 2000} components" in message


SMALL = Limits(max_bytes=64 * 1024, max_entries=16)


OVER_BUDGET: dict[str, tuple[dict[str, str], int]] = {
    "bytes": ({"big.txt": "x" * (SMALL.max_bytes + 1)}, SMALL.max_bytes),
    "files": ({f"f{n:03}.txt": str(n) for n in range(SMALL.max_entries + 8)}, SMALL.max_entries),
}
"""More of each budget than ``SMALL`` allows: the files, and the limit the error names."""


@pytest.mark.parametrize("budget", OVER_BUDGET)
def test_more_than_the_budget_is_resource_exhausted(
    tmp_path: Path, sources: Sources, mode: str, kind: str, budget: str
) -> None:
    files, limit = OVER_BUDGET[budget]
    node = Node(mode, tmp_path, limits=SMALL)
    with pytest.raises(errors.ResourceExhausted) as info:
        sources.publish(node, kind, files)
    assert str(limit) in info.value.message
    assert f"--max-unpacked-{budget}" in info.value.message  # what to do about it


def test_within_the_budgets_every_source_publishes(
    tmp_path: Path, sources: Sources, mode: str
) -> None:
    node = Node(mode, tmp_path, limits=SMALL)
    files = {"manifests/a.yaml": "a", "manifests/b.yaml": "b"}
    for kind in KINDS:
        seen = sources.publish(node, kind, files)
        if kind == "estargz" and mode == "bind":  # see test_hostile_entries_are_refused_alike
            seen.pop("stargz.index.json")
        assert seen == {
            "manifests": "dir",
            "manifests/a.yaml": "file:a",
            "manifests/b.yaml": "file:b",
        }
