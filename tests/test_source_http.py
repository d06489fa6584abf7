"""http sources against a real HTTP server on loopback: pinning by the digest of the
content, fetching into the node cache only what matches the pin, and the hostile
cases (path escapes, symlinks out, a decompression bomb, a redirect to another host,
a server that never answers, refused credentials)."""

from __future__ import annotations

import gzip
import hashlib
import io
import tarfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from rukpak.common import errors
from rukpak.image.cache import ImageCache
from rukpak.image.members import Limits
from rukpak.sources import http
from rukpak.sources.auth import SourceAuth
from rukpak.sources.cache import SourceCache
from rukpak.sources.volume import FetchSource, VolumeSource
from tests.publish_fakes import no_network
from tests.source_servers import PASSWORD, USERNAME, SourceServer, serving, tarball

AUTH = SourceAuth(username=USERNAME, password=PASSWORD)
CM = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n"
GOOD = tarball({"manifests/a.yaml": CM})


@pytest.fixture
def server(tmp_path: Path) -> Iterator[SourceServer]:
    with serving(tmp_path, auth=True) as s:
        s.files["good.tgz"] = GOOD
        yield s


@pytest.fixture
def cache(tmp_path: Path) -> SourceCache:
    return SourceCache(ImageCache(tmp_path / "state", puller_factory=no_network), read_timeout=2)


def digest_of(data: bytes) -> str:
    return f"sha256:{hashlib.sha256(data).hexdigest()}"


def leftovers(cache: SourceCache) -> list[str]:
    return sorted(p.name for p in cache.images.unpacked_dir.iterdir() if ".tmp-" in p.name)


def test_the_pin_travels_in_the_url_fragment() -> None:
    digest = "sha256:" + "ab" * 32
    pinned = http.pin_url("https://h.example/b.tgz?x=1#old", digest)
    assert pinned == f"https://h.example/b.tgz?x=1#sha256={'ab' * 32}"
    assert http.split_pinned(pinned) == ("https://h.example/b.tgz?x=1", digest)
    assert http.split_pinned("https://h.example/b.tgz") == ("https://h.example/b.tgz", None)
    source = VolumeSource.from_attributes({"url": pinned})
    assert source.fetch == FetchSource("http", "https://h.example/b.tgz?x=1", digest)
    with pytest.raises(errors.InvalidArgument, match="digest"):
        VolumeSource.from_attributes({"url": "https://h.example/b.tgz"})
    with pytest.raises(errors.InvalidArgument, match="exclusive"):
        VolumeSource.from_attributes({"url": pinned, "image": "a/b:v1"})
    with pytest.raises(errors.InvalidArgument, match="http:// or https://"):
        http.check_url("file:///etc/passwd")


def test_the_digest_of_what_was_fetched_pins_it(server: SourceServer) -> None:
    url = f"{server.url}/files/good.tgz"
    assert http.fetch(url, auth=AUTH) == digest_of(GOOD)
    with pytest.raises(errors.PermissionDenied, match='"401 Unauthorized"'):
        http.fetch(url)
    with pytest.raises(errors.NotFound, match='unexpected status "404'):
        http.fetch(f"{server.url}/files/missing.tgz", auth=AUTH)


def test_the_pinned_content_is_served_and_a_changed_url_is_refused(
    server: SourceServer, cache: SourceCache
) -> None:
    url = f"{server.url}/files/good.tgz"
    pinned = FetchSource("http", url, digest_of(GOOD), auth=AUTH)
    got = cache.ensure(pinned)
    assert (got.path / "manifests" / "a.yaml").read_text() == CM
    server.files["good.tgz"] = tarball({"manifests/b.yaml": CM})
    assert cache.ensure(pinned).path == got.path  # cached: the pin decides, not the URL
    fresh = SourceCache(ImageCache(cache.images.root.parent / "other", puller_factory=no_network))
    with pytest.raises(errors.FailedPrecondition, match="changed since the Bundle pinned it"):
        fresh.ensure(pinned)
    assert leftovers(fresh) == []
    assert list(fresh.images.unpacked_dir.iterdir()) == []


def test_content_fetched_with_credentials_is_not_served_without_them(
    server: SourceServer, cache: SourceCache
) -> None:
    url = f"{server.url}/files/good.tgz"
    cache.ensure(FetchSource("http", url, digest_of(GOOD), auth=AUTH))
    with pytest.raises(errors.PermissionDenied):
        cache.ensure(FetchSource("http", url, digest_of(GOOD)))


def test_path_escapes_and_symlinks_out_of_the_tree_are_dropped(
    server: SourceServer, cache: SourceCache, tmp_path: Path
) -> None:
    evil = tarball(
        {"manifests/a.yaml": CM, "../../escaped": "owned", "/abs/owned": "owned"},
        symlinks={"manifests/passwd": "../../../../etc/passwd", "up": "/../.."},
    )
    server.files["evil.tgz"] = evil
    got = cache.ensure(
        FetchSource("http", f"{server.url}/files/evil.tgz", digest_of(evil), auth=AUTH)
    )
    assert sorted(p.name for p in (got.path / "manifests").iterdir()) == ["a.yaml"]
    assert not (tmp_path / "escaped").exists()
    assert not any(p.is_symlink() for p in got.path.rglob("*"))


def test_a_decompression_bomb_is_stopped_and_leaves_nothing(
    server: SourceServer, tmp_path: Path
) -> None:
    raw = io.BytesIO()
    with tarfile.open(fileobj=raw, mode="w") as tar:
        info = tarfile.TarInfo("manifests/huge.yaml")
        info.size = 50_000_000
        tar.addfile(info, io.BytesIO(bytes(info.size)))
    bomb = gzip.compress(raw.getvalue(), compresslevel=9)
    assert len(bomb) < 100_000
    server.files["bomb.tgz"] = bomb
    small = SourceCache(
        ImageCache(tmp_path / "small", puller_factory=no_network),
        limits=Limits(max_bytes=1_000_000),
    )
    with pytest.raises(errors.ResourceExhausted):
        small.ensure(
            FetchSource("http", f"{server.url}/files/bomb.tgz", digest_of(bomb), auth=AUTH)
        )
    assert list(small.images.unpacked_dir.iterdir()) == []
    with pytest.raises(errors.ResourceExhausted, match="1000-byte limit"):
        http.fetch(f"{server.url}/files/bomb.tgz", auth=AUTH, max_bytes=1000)


def test_a_redirect_stays_on_its_host(server: SourceServer) -> None:
    with pytest.raises(errors.InvalidArgument, match="redirected to another host"):
        http.fetch(f"{server.url}/redirect-away/files/good.tgz", auth=AUTH)
    assert http.fetch(f"{server.url}/redirect-here/files/good.tgz", auth=AUTH) == digest_of(GOOD)


def test_a_server_that_never_answers_times_out_and_leaves_nothing(
    server: SourceServer, cache: SourceCache
) -> None:
    with pytest.raises(errors.Unavailable, match="no answer within 1s"):
        http.fetch(f"{server.url}/hang/x.tgz", read_timeout=1)
    with pytest.raises(errors.Unavailable):
        cache.ensure(FetchSource("http", f"{server.url}/hang/x.tgz", digest_of(GOOD)))
    assert leftovers(cache) == []
