"""Git sources with dulwich: resolve a branch or tag to a commit, fetch one commit, and
write one directory of it as a tar archive.

Where it sits: the manager pins a Bundle's git source with :func:`resolve` (the
Bundle controller's one look at the remote); the node cache (``rukpak.sources.cache``)
fetches the pinned commit with :func:`fetch_commit` into a scratch bare repository
and turns the bundle directory into a tar file with :func:`write_tar`, which the
image extractor (``rukpak.image.extract``) unpacks under the same safety rules and
budgets as image layers (``..`` names refused, symlinks out of the tree removed,
byte and entry budgets). No ``git`` binary is run.

Hostile remotes: HTTP redirects are followed only on the same scheme, host and
port; every request has connect and read timeouts; the directory must stay inside
the repository (upstream's message); blobs count against the byte budget while
the tar is written; submodules are skipped (reported). SSH repositories go through
``rukpak.sources.ssh`` (the Secret's key and known hosts, paramiko).
"""

from __future__ import annotations

import io
import logging
import posixpath
import re
import tarfile
from collections.abc import Mapping
from pathlib import Path
from typing import Any
from urllib.parse import urljoin, urlsplit

import urllib3
from dulwich import client as gitclient
from dulwich.errors import GitProtocolError, HangupException, NotGitRepository
from dulwich.objects import Blob, Commit, Tag, Tree
from dulwich.repo import Repo

from rukpak.common import errors
from rukpak.sources.auth import SourceAuth

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 60.0
MAX_REDIRECTS = 5
COMMIT_RE = re.compile(r"^[0-9a-f]{40}$")
SCP_LIKE = re.compile(r"^(?:(?P<user>[^@/:]+)@)?(?P<host>[^@/:]+):(?P<path>[^/].*|/.*)$")
S_IFMT = 0o170000
S_IFLNK = 0o120000
S_IFDIR = 0o040000
S_IFGITLINK = 0o160000


def check_directory(directory: str, repository: str) -> tuple[str, ...]:
    """The components of the bundle directory inside the repository; () for its root.

    A directory that starts with ``/`` or climbs out with ``..`` is refused with
    upstream RukPak's words.
    """
    text = (directory or "").strip()
    if not text:
        return ()
    clean = posixpath.normpath(text)
    if clean.startswith("/") or clean == ".." or clean.startswith("../"):
        raise errors.InvalidArgument(
            f"get subdirectory {_quote(directory)} for repository {_quote(repository)}: "
            "directory can not start with '../' or '/'"
        )
    return tuple(p for p in clean.split("/") if p not in ("", "."))


def _quote(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'


class _SameOriginPool(urllib3.PoolManager):
    """Follows redirects only to the origin of the first request; refuses others."""

    def urlopen(  # type: ignore[override]
        self, method: str, url: str, redirect: bool = True, **kw: Any
    ) -> urllib3.BaseHTTPResponse:
        origin = _origin(url)
        current = url
        for _ in range(MAX_REDIRECTS + 1):
            response = super().urlopen(method, current, redirect=False, **kw)
            location = response.get_redirect_location()
            if not location:
                return response
            target = urljoin(current, location)
            response.drain_conn()
            if _origin(target) != origin:
                raise errors.InvalidArgument(
                    f"git repository {url[:300]} redirected to another host ({target[:300]}); "
                    "a git source must not leave its scheme, host and port: use the final URL"
                )
            current = target
        raise errors.InvalidArgument(f"git repository {url[:300]}: too many redirects")


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    return parts.scheme, (parts.hostname or "").lower(), parts.port


def _client(
    repository: str, auth: SourceAuth | None, *, insecure: bool, read_timeout: float
) -> tuple[gitclient.GitClient, str]:
    parts = urlsplit(repository)
    if parts.scheme in ("http", "https"):
        pool = _SameOriginPool(
            timeout=urllib3.Timeout(connect=CONNECT_TIMEOUT, read=read_timeout),
            retries=urllib3.Retry(total=2, connect=2, read=0, redirect=0, status=0),
            cert_reqs="CERT_NONE" if insecure else "CERT_REQUIRED",
        )
        username = auth.username if auth is not None and auth.username else None
        password = auth.password if auth is not None and auth.username else None
        client = gitclient.Urllib3HttpGitClient(
            repository, pool_manager=pool, username=username, password=password, quiet=True
        )
        return client, parts.path
    if parts.scheme == "git":
        client_, path = gitclient.get_transport_and_path(repository, quiet=True)
        return client_, path
    from rukpak.sources import ssh  # paramiko is loaded only for ssh repositories

    vendor = ssh.SecretKeyVendor(auth, insecure=insecure, read_timeout=read_timeout)
    if parts.scheme == "ssh" and parts.hostname:
        ssh_client = gitclient.SSHGitClient(
            parts.hostname, port=parts.port, username=parts.username, vendor=vendor, quiet=True
        )
        return ssh_client, parts.path
    scp = SCP_LIKE.match(repository)
    if not parts.scheme and scp:
        ssh_client = gitclient.SSHGitClient(
            scp["host"], username=scp["user"], vendor=vendor, quiet=True
        )
        return ssh_client, scp["path"]
    raise errors.InvalidArgument(
        f"git repository {repository[:300]!r}: use an https://, http://, ssh://, git:// URL "
        "or user@host:path"
    )


def _call(repository: str, what: str, fn: Any, *args: Any, **kw: Any) -> Any:
    """Run a dulwich call, turning its failures into our errors with the repository named."""
    try:
        return fn(*args, **kw)
    except errors.RukpakError:
        raise
    except gitclient.HTTPUnauthorized:
        raise errors.PermissionDenied(
            f"{what} {repository}: authentication required or refused: check the auth "
            "secret's username and password"
        ) from None
    except NotGitRepository:
        raise errors.NotFound(f"{what} {repository}: repository not found") from None
    except (urllib3.exceptions.TimeoutError, TimeoutError):
        raise errors.Unavailable(f"{what} {repository}: no answer in time") from None
    except (GitProtocolError, HangupException, OSError, urllib3.exceptions.HTTPError) as exc:
        text = str(exc)[:300]
        if "timed out" in text.lower() or "timeout" in text.lower():
            raise errors.Unavailable(f"{what} {repository}: no answer in time: {text}") from None
        raise errors.Unavailable(f"{what} {repository}: {text or type(exc).__name__}") from None


def resolve(
    repository: str,
    ref: Mapping[str, Any],
    *,
    auth: SourceAuth | None = None,
    insecure: bool = False,
    read_timeout: float = READ_TIMEOUT,
) -> str:
    """The commit ``ref`` (``branch``, ``tag`` or ``commit``) names in ``repository``."""
    commit = str(ref.get("commit") or "").strip().lower()
    if commit:
        if not COMMIT_RE.match(commit):
            raise errors.InvalidArgument(
                f"git ref commit {commit[:80]!r} is not a full 40-character commit hash"
            )
        return commit
    if ref.get("branch"):
        name = f"refs/heads/{ref['branch']}"
    elif ref.get("tag"):
        name = f"refs/tags/{ref['tag']}"
    else:
        raise errors.InvalidArgument("git ref must set one of branch, tag or commit")
    client, path = _client(repository, auth, insecure=insecure, read_timeout=read_timeout)
    result = _call(repository, "list refs of", client.get_refs, path)
    refs: dict[bytes, bytes] = dict(getattr(result, "refs", result) or {})
    peeled = refs.get(f"{name}^{{}}".encode()) or refs.get(name.encode())
    if not peeled:
        raise errors.NotFound(f"git repository {repository} has no {name}")
    return peeled.decode()


def fetch_commit(
    repository: str,
    commit: str,
    workdir: Path,
    *,
    auth: SourceAuth | None = None,
    insecure: bool = False,
    read_timeout: float = READ_TIMEOUT,
) -> Repo:
    """Fetch ``commit`` (and what it needs) into a new bare repository at ``workdir``.

    Asks for the commit itself first (servers that allow reachable commits in
    "want"); otherwise fetches every branch and tag and looks for it there.
    """
    if not COMMIT_RE.match(commit):
        raise errors.InvalidArgument(f"{commit[:80]!r} is not a full commit hash")
    repo = Repo.init_bare(str(workdir), mkdir=True)
    client, path = _client(repository, auth, insecure=insecure, read_timeout=read_timeout)
    want = commit.encode()

    def only_commit(refs: Any, depth: int | None = None) -> list[bytes]:
        return [want]

    try:
        _call(repository, "fetch from", client.fetch, path, repo, determine_wants=only_commit)
    except errors.PermissionDenied:
        raise
    except errors.RukpakError as exc:
        log.info("msg=%r repository=%s error=%r", "fetching all refs", repository, exc.message)
        _call(repository, "fetch from", client.fetch, path, repo)
    try:
        obj = repo[want]
    except KeyError:
        raise errors.NotFound(
            f"git repository {repository} has no commit {commit} reachable from its branches "
            "and tags"
        ) from None
    if not isinstance(obj, Commit):
        raise errors.InvalidArgument(f"git object {commit} in {repository} is not a commit")
    return repo


def write_tar(
    repo: Repo,
    commit: str,
    directory: tuple[str, ...],
    dest: Path,
    *,
    repository: str,
    max_bytes: int,
    max_entries: int,
) -> list[str]:
    """Write ``directory`` of ``commit`` as an uncompressed tar at ``dest``; warnings."""
    obj = repo[commit.encode()]
    assert isinstance(obj, Commit)
    tree = repo[obj.tree]
    for name in directory:
        if not isinstance(tree, Tree):
            break
        try:
            mode, sha = tree[name.encode()]
        except KeyError:
            raise errors.NotFound(
                f"get subdirectory {_quote('/'.join(directory))} for repository "
                f"{_quote(repository)}: file does not exist at commit {commit}"
            ) from None
        tree = repo[sha] if (mode & S_IFMT) == S_IFDIR else None  # type: ignore[assignment]
    if not isinstance(tree, Tree):
        raise errors.InvalidArgument(
            f"get subdirectory {_quote('/'.join(directory))} for repository "
            f"{_quote(repository)}: not a directory at commit {commit}"
        )
    warnings: list[str] = []
    total = 0
    entries = 0
    with tarfile.open(dest, "w", format=tarfile.PAX_FORMAT) as tar:
        stack: list[tuple[str, Tree]] = [("", tree)]
        while stack:
            prefix, current = stack.pop()
            for item in current.iteritems():
                name = item.path.decode("utf-8", "surrogateescape")
                path = f"{prefix}{name}"
                entries += 1
                if entries > max_entries:
                    raise errors.ResourceExhausted(
                        f"git repository {repository} at {commit}: more than {max_entries} "
                        "entries in the bundle directory"
                    )
                kind = item.mode & S_IFMT
                info = tarfile.TarInfo(path)
                if kind == S_IFDIR:
                    sub = repo[item.sha]
                    if isinstance(sub, Tree):
                        info.type = tarfile.DIRTYPE
                        info.mode = 0o755
                        tar.addfile(info)
                        stack.append((f"{path}/", sub))
                    continue
                if kind == S_IFGITLINK:
                    warnings.append(f"{path[-256:]!r}: submodule skipped")
                    continue
                blob = repo[item.sha]
                if isinstance(blob, Tag) or not isinstance(blob, Blob):
                    continue
                data = blob.as_raw_string()
                total += len(data)
                if total > max_bytes:
                    raise errors.ResourceExhausted(
                        f"git repository {repository} at {commit}: the bundle directory holds "
                        f"more than {max_bytes} bytes"
                    )
                if kind == S_IFLNK:
                    info.type = tarfile.SYMTYPE
                    info.linkname = data.decode("utf-8", "surrogateescape")
                    info.mode = 0o777
                    tar.addfile(info)
                    continue
                info.mode = 0o755 if item.mode & 0o111 else 0o644
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))
    return warnings
