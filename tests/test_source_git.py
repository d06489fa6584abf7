"""Git sources against a real ``git http-backend`` (basic auth) on loopback: pinning a
branch or tag to a commit, fetching a pinned commit into the node cache, and every
hostile case the issue names (escapes, symlinks out, huge files, a directory outside
the repository, a redirect to another host, a server that never answers)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from dulwich.objects import Blob, Commit, Tree
from dulwich.repo import Repo

from csi.node.publish import Publisher
from csi.volume.request import PublishRequest
from provisioner.manager.planning import sources
from rukpak.common import errors
from rukpak.image.cache import ImageCache
from rukpak.image.cachestate import Holder
from rukpak.image.members import Limits
from rukpak.image.settings import CacheSettings
from rukpak.sources import git
from rukpak.sources.auth import SourceAuth
from rukpak.sources.cache import SourceCache, key_digest
from rukpak.sources.volume import FetchSource, VolumeSource
from tests.publish_fakes import FakeMounter, no_network
from tests.source_servers import (
    PASSWORD,
    USERNAME,
    SourceServer,
    SshServer,
    commit,
    make_repo,
    serving,
)
from tests.source_servers import git as run_git

AUTH = SourceAuth(username=USERNAME, password=PASSWORD)
CM = "apiVersion: v1\nkind: ConfigMap\nmetadata:\n  name: a\n"


@pytest.fixture
def repos(tmp_path: Path) -> Path:
    root = tmp_path / "repos"
    root.mkdir()
    return root


@pytest.fixture
def server(repos: Path) -> Iterator[SourceServer]:
    with serving(repos, auth=True) as s:
        yield s


@pytest.fixture
def cache(tmp_path: Path) -> SourceCache:
    return SourceCache(ImageCache(tmp_path / "state", puller_factory=no_network), read_timeout=2)


def unpacked_leftovers(cache: SourceCache) -> list[str]:
    return sorted(p.name for p in cache.images.unpacked_dir.iterdir() if ".tmp-" in p.name)


def source(server: SourceServer, name: str, pin: str, **kw: object) -> FetchSource:
    return FetchSource("git", server.repo_url(name), pin, auth=AUTH, **kw)  # type: ignore[arg-type]


def test_a_branch_and_a_tag_resolve_to_their_commits(repos: Path, server: SourceServer) -> None:
    first = make_repo(repos / "b.git", {"manifests/a.yaml": CM})
    run_git(repos / "b.git", "tag", "-a", "v1", "-m", "v1")
    second = commit(repos / "b.git", {"manifests/b.yaml": CM})
    url = server.repo_url("b.git")
    assert git.resolve(url, {"branch": "main"}, auth=AUTH) == second
    assert git.resolve(url, {"tag": "v1"}, auth=AUTH) == first  # annotated: peeled
    assert git.resolve(url, {"commit": first.upper()}) == first  # no network needed


def test_refused_credentials_and_missing_refs_say_what_is_wrong(
    repos: Path, server: SourceServer
) -> None:
    make_repo(repos / "b.git", {"manifests/a.yaml": CM})
    url = server.repo_url("b.git")
    with pytest.raises(errors.PermissionDenied, match="check the auth secret"):
        git.resolve(url, {"branch": "main"})
    with pytest.raises(errors.NotFound, match="has no refs/heads/nope"):
        git.resolve(url, {"branch": "nope"}, auth=AUTH)
    with pytest.raises(errors.InvalidArgument, match="full 40-character"):
        git.resolve(url, {"commit": "abc123"})


@pytest.mark.parametrize("directory", ["../x", "/etc", "a/../../b"])
def test_a_directory_outside_the_repository_is_refused_in_upstreams_words(directory: str) -> None:
    with pytest.raises(errors.InvalidArgument) as exc:
        git.check_directory(directory, "https://example.com/r.git")
    assert exc.value.message == (
        f'get subdirectory "{directory}" for repository "https://example.com/r.git": '
        "directory can not start with '../' or '/'"
    )
    assert git.check_directory("./dir1/", "r") == ("dir1",)
    assert git.check_directory("", "r") == ()


def test_the_pinned_commit_is_served_after_the_branch_moves(
    repos: Path, server: SourceServer, cache: SourceCache
) -> None:
    pinned = make_repo(repos / "b.git", {"bundle/manifests/a.yaml": CM, "README": "x"})
    commit(repos / "b.git", {"bundle/manifests/b.yaml": CM})
    got = cache.ensure(source(server, "b.git", pinned, directory="bundle"))
    assert sorted(p.name for p in (got.path / "manifests").iterdir()) == ["a.yaml"]
    assert not (got.path / "README").exists()
    assert (got.path / "manifests" / "a.yaml").read_text() == CM
    assert (got.path / "manifests" / "a.yaml").stat().st_mode & 0o222 == 0  # read-only
    again = cache.ensure(source(server, "b.git", pinned, directory="bundle"))
    assert (again.path, again.cache_hit, got.cache_hit) == (got.path, True, False)


def test_content_fetched_with_credentials_is_never_served_without_them(
    repos: Path, server: SourceServer, cache: SourceCache
) -> None:
    pinned = make_repo(repos / "b.git", {"manifests/a.yaml": CM})
    cache.ensure(source(server, "b.git", pinned))
    anonymous = FetchSource("git", server.repo_url("b.git"), pinned)
    assert key_digest(anonymous) != key_digest(source(server, "b.git", pinned))
    with pytest.raises(errors.PermissionDenied):
        cache.ensure(anonymous)
    wrong = FetchSource(
        "git", server.repo_url("b.git"), pinned, auth=SourceAuth(username=USERNAME, password="no")
    )
    with pytest.raises(errors.PermissionDenied):
        cache.ensure(wrong)
    assert unpacked_leftovers(cache) == []


def _hostile_commit(path: Path) -> str:
    """A commit git itself would refuse to make: a ``..`` entry and an escaping symlink."""
    repo = Repo.init_bare(str(path), mkdir=True)
    good = Blob.from_string(CM.encode())
    evil = Blob.from_string(b"owned")
    link = Blob.from_string(b"../../../../etc/passwd")
    manifests = Tree()
    manifests.add(b"a.yaml", 0o100644, good.id)
    manifests.add(b"passwd", 0o120000, link.id)
    manifests.add(b"..", 0o100644, evil.id)
    root = Tree()
    root.add(b"manifests", 0o040000, manifests.id)
    root.add(b"..", 0o100644, evil.id)
    c = Commit()
    c.tree = root.id
    c.author = c.committer = b"t <t@example.com>"
    c.author_time = c.commit_time = int(time.time())
    c.author_timezone = c.commit_timezone = 0
    c.message = b"hostile"
    for obj in (good, evil, link, manifests, root, c):
        repo.object_store.add_object(obj)
    repo.refs.set_if_equals(b"refs/heads/main", None, c.id)  # type: ignore[arg-type]
    repo.close()
    return c.id.decode()


def test_path_escapes_and_symlinks_out_of_the_tree_are_dropped(
    repos: Path, server: SourceServer, cache: SourceCache, tmp_path: Path
) -> None:
    pinned = _hostile_commit(repos / "evil.git")
    assert git.resolve(server.repo_url("evil.git"), {"branch": "main"}, auth=AUTH) == pinned
    got = cache.ensure(source(server, "evil.git", pinned))
    assert sorted(p.name for p in (got.path / "manifests").iterdir()) == ["a.yaml"]
    assert sorted(p.name for p in got.path.iterdir()) == ["manifests"]
    written = [p for p in tmp_path.rglob("*") if p.is_file() and not p.is_symlink()]
    assert [p for p in written if p.read_bytes() == b"owned"] == []  # nowhere on disk


def test_a_file_over_the_budget_fails_and_leaves_nothing(
    repos: Path, server: SourceServer, tmp_path: Path
) -> None:
    pinned = make_repo(repos / "big.git", {"manifests/big.yaml": b"x" * 200_000})
    # the node's unpack budgets (--max-unpacked-bytes) apply to git trees too
    small = SourceCache(
        ImageCache(
            tmp_path / "small",
            puller_factory=no_network,
            settings=CacheSettings(limits=Limits(max_bytes=100_000)),
        )
    )
    with pytest.raises(errors.ResourceExhausted, match="more than 100000 bytes"):
        small.ensure(source(server, "big.git", pinned))
    assert list(small.images.unpacked_dir.iterdir()) == []


def test_a_redirect_to_another_host_is_refused(repos: Path, server: SourceServer) -> None:
    make_repo(repos / "b.git", {"manifests/a.yaml": CM})
    with pytest.raises(errors.InvalidArgument, match="redirected to another host"):
        git.resolve(f"{server.url}/redirect-away/git/b.git", {"branch": "main"}, auth=AUTH)
    here = git.resolve(f"{server.url}/redirect-here/git/b.git", {"branch": "main"}, auth=AUTH)
    assert len(here) == 40


def test_a_server_that_never_answers_times_out_and_leaves_nothing(
    repos: Path, server: SourceServer, cache: SourceCache
) -> None:
    with pytest.raises(errors.Unavailable, match="no answer in time"):
        git.resolve(f"{server.url}/hang/b.git", {"branch": "main"}, read_timeout=1)
    hang = FetchSource("git", f"{server.url}/hang/b.git", "a" * 40)
    with pytest.raises(errors.Unavailable):
        cache.ensure(hang)
    assert unpacked_leftovers(cache) == []


def test_a_git_volume_publishes_its_pinned_commit_and_unpublishes(
    repos: Path, server: SourceServer, tmp_path: Path
) -> None:
    pinned = make_repo(repos / "b.git", {"manifests/a.yaml": CM})
    (tmp_path / "kubelet").mkdir()
    images = ImageCache(tmp_path / "node", puller_factory=no_network)
    publisher = Publisher(images=images, mounter=FakeMounter(), kubelet_dir=tmp_path / "kubelet")
    attributes = {"git": server.repo_url("b.git"), "commit": pinned}
    volume = VolumeSource.from_attributes(attributes).with_secrets(
        {"username": USERNAME, "password": PASSWORD}
    )
    target = str(tmp_path / "kubelet" / "pods" / "p1" / "vol")
    tree = publisher.publish(PublishRequest("v1", target, volume))
    assert (tree / "manifests" / "a.yaml").read_text() == CM
    assert publisher.publish(PublishRequest("v1", target, volume)) == tree  # idempotent
    assert images.holders()[target] == Holder(target, "v1", volume.image)
    assert "password" not in repr(volume) and PASSWORD not in repr(volume)
    publisher.unpublish("v1", target)
    assert images.holders() == {}
    anonymous = VolumeSource.from_attributes(attributes)
    with pytest.raises(errors.PermissionDenied):
        publisher.publish(PublishRequest("v2", target, anonymous))


@pytest.fixture
def sshd(tmp_path: Path) -> Iterator[SshServer]:
    server = SshServer(tmp_path / "sshd").start()
    try:
        yield server
    finally:
        server.stop()


def test_git_over_ssh_uses_the_secrets_key_and_known_hosts(
    repos: Path, sshd: SshServer, cache: SourceCache
) -> None:
    head = make_repo(repos / "b.git", {"manifests/a.yaml": CM})
    url = sshd.url(repos / "b.git")
    auth = SourceAuth(ssh_key=sshd.client_key, known_hosts=sshd.known_hosts)
    assert git.resolve(url, {"branch": "main"}, auth=auth) == head
    got = cache.ensure(FetchSource("git", url, head, auth=auth))
    assert (got.path / "manifests" / "a.yaml").read_text() == CM
    no_hosts = SourceAuth(ssh_key=sshd.client_key)
    with pytest.raises(errors.InvalidArgument, match="no ssh-knownhosts"):
        git.resolve(url, {"branch": "main"}, auth=no_hosts)
    assert git.resolve(url, {"branch": "main"}, auth=no_hosts, insecure=True) == head
    other = SshServer(repos.parent / "other-sshd")
    other.start()
    other.stop()
    wrong_host = SourceAuth(
        ssh_key=sshd.client_key,
        known_hosts=other.known_hosts.replace(str(other.port), str(sshd.port)),
    )
    with pytest.raises(errors.PermissionDenied, match="host key does not match"):
        git.resolve(url, {"branch": "main"}, auth=wrong_host)
    stranger = SourceAuth(ssh_key=other.client_key, known_hosts=sshd.known_hosts)
    with pytest.raises(errors.PermissionDenied, match="refused the auth secret's key"):
        git.resolve(url, {"branch": "main"}, auth=stranger)


def test_only_a_commit_pins_a_git_bundle_and_its_volume_names_the_secret() -> None:
    spec = {
        "repository": "https://git.example/r.git",
        "ref": {"branch": "main"},
        "auth": {"secret": {"name": "s"}, "insecureSkipVerify": True},
    }
    unpinned = {"status": {"resolvedSource": {"type": "git", "git": spec}}}
    assert sources.pinned(unpinned) is None
    resolved = sources.pinned_git(spec, "c" * 40)
    assert sources.pinned({"status": {"resolvedSource": resolved}}) == resolved
    assert resolved["git"]["ref"] == {"commit": "c" * 40}
    assert sources.volume(resolved) == {
        "name": "bundle",
        "csi": {
            "driver": "csi.rukpak.io",
            "readOnly": True,
            "volumeAttributes": {
                "git": "https://git.example/r.git",
                "commit": "c" * 40,
                "insecureSkipVerify": "true",
            },
            "nodePublishSecretRef": {"name": "s"},
        },
    }
    attributes = sources.volume(resolved)["csi"]["volumeAttributes"]
    parsed = VolumeSource.from_attributes(attributes)
    assert parsed.fetch == FetchSource("git", "https://git.example/r.git", "c" * 40, insecure=True)
    assert sources.describe(resolved) == f"https://git.example/r.git@{'c' * 40}"
