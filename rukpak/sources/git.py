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
port; every request (http, git:// and ssh alike) has connect and read timeouts, cut
to what remains of the caller's deadline (``rukpak.common.backoff.Deadline``, one per
NodePublishVolume) when there is one, and a remote that does not answer in time is
not asked a second time; the directory must stay inside
the repository (upstream's message); blobs count against the byte budget while
the tar is written; submodules are skipped (reported). SSH repositories go through
``rukpak.sources.ssh`` (the Secret's key and known hosts, paramiko).

TLS (https:// remotes): ``tls`` (the source's ``certificateData`` and
``auth.insecureSkipVerify``, see ``rukpak.oci.tls``), else the SourceTLS in force on this
thread (the node plugin publishes a volume under its own), else the system trust store;
for this client's connection pool only. A refused certificate is FailedPrecondition
naming the server and why; the tree is still the one its commit hash names.
"""

from __future__ import annotations

import contextlib
import io
import logging
import posixpath
import re
import socket
import tarfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, TypedDict
from urllib.parse import urljoin, urlsplit, urlunsplit

import urllib3
from dulwich import client as gitclient
from dulwich import protocol
from dulwich.errors import GitProtocolError, HangupException, NotGitRepository
from dulwich.objects import Blob, Commit, Tag, Tree
from dulwich.repo import Repo

from rukpak.common import errors
from rukpak.common.backoff import Deadline
from rukpak.oci import tls as source_tls
from rukpak.sources.auth import SourceAuth

if TYPE_CHECKING:
    from typing_extensions import Unpack

log = logging.getLogger(__name__)

CONNECT_TIMEOUT = 10.0
READ_TIMEOUT = 60.0
CONNECT_RETRIES = 2  # urllib3 retries a failed connect this many times (http remotes)
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


def display(repository: str) -> str:
    """``repository`` for a message: no user name or password, no query."""
    parts = urlsplit(repository)
    if not parts.scheme or not parts.hostname:
        return repository.rsplit("@", 1)[-1][:300]  # user@host:path
    netloc = parts.hostname if parts.port is None else f"{parts.hostname}:{parts.port}"
    if ":" in (parts.hostname or ""):
        netloc = f"[{parts.hostname}]" + ("" if parts.port is None else f":{parts.port}")
    return urlunsplit((parts.scheme, netloc, parts.path, "", ""))[:300]


class _SameOriginPool(urllib3.PoolManager):
    """Follows redirects only to the origin of the first request; refuses others. Each
    request's timeouts are cut to what remains of ``deadline``."""

    def __init__(self, *, deadline: Deadline | None, read_timeout: float, **kw: Any) -> None:
        super().__init__(**kw)
        self.deadline = deadline
        self.read_timeout = read_timeout

    def _timeout(self) -> urllib3.Timeout:
        if self.deadline is None:
            return urllib3.Timeout(connect=CONNECT_TIMEOUT, read=self.read_timeout)
        return urllib3.Timeout(
            connect=self.deadline.timeout(CONNECT_TIMEOUT, share=1 + CONNECT_RETRIES),
            read=self.deadline.timeout(self.read_timeout),
        )

    def urlopen(  # type: ignore[override]
        self, method: str, url: str, redirect: bool = True, **kw: Any
    ) -> urllib3.BaseHTTPResponse:
        origin = _origin(url)
        current = url
        for _ in range(MAX_REDIRECTS + 1):
            if self.deadline is not None and self.deadline.expired():
                raise TimeoutError("the deadline passed")  # _call names the deadline
            kw["timeout"] = self._timeout()
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


class _TimedTCPGitClient(gitclient.TCPGitClient):
    """dulwich's git:// client, whose sockets have no timeout at all, with ours: the
    connect and every read time out (cut to what remains of ``deadline``)."""

    def __init__(
        self,
        host: str,
        port: int | None,
        *,
        deadline: Deadline | None,
        read_timeout: float,
    ) -> None:
        super().__init__(host, port=port, quiet=True)
        self.deadline = deadline
        self.read_timeout = read_timeout

    def _connect(
        self, cmd: bytes, path: str | bytes, protocol_version: int | None = None
    ) -> tuple[protocol.Protocol, Callable[[], bool], IO[bytes] | None]:
        if not isinstance(path, bytes):
            path = path.encode(self._remote_path_encoding)
        d = self.deadline
        connect = CONNECT_TIMEOUT if d is None else d.timeout(CONNECT_TIMEOUT)
        if d is not None and d.expired():
            raise TimeoutError("the deadline passed")
        s = socket.create_connection((self._host, self._port), timeout=connect)
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        s.settimeout(self.read_timeout if d is None else d.timeout(self.read_timeout))
        rfile = s.makefile("rb", -1)
        wfile = s.makefile("wb", 0)

        def close() -> None:
            rfile.close()
            wfile.close()
            s.close()

        def shutdown_write() -> None:
            wfile.flush()
            with contextlib.suppress(OSError):
                s.shutdown(socket.SHUT_WR)

        proto = protocol.Protocol(
            rfile.read,
            wfile.write,
            close,
            report_activity=self._report_activity,
            shutdown_write=shutdown_write,
        )
        if path.startswith(b"/~"):
            path = path[1:]
        # From here on as dulwich's own client does it.
        version = b""
        if cmd == b"upload-pack":
            self.protocol_version = (
                protocol.DEFAULT_GIT_PROTOCOL_VERSION_FETCH
                if protocol_version is None
                else protocol_version
            )
            if self.protocol_version == 2:
                version = b"\0\0version=%d\0" % self.protocol_version
        else:
            self.protocol_version = protocol.DEFAULT_GIT_PROTOCOL_VERSION_SEND
        proto.send_cmd(b"git-" + cmd, path, b"host=" + self._host.encode("ascii") + version)
        return proto, lambda: gitclient._fileno_can_read(s.fileno()), None


class Remote(TypedDict, total=False):
    """How :func:`resolve` and :func:`fetch_commit` reach a repository (each one optional):
    ``auth`` the source's Secret, ``insecure`` to skip TLS verification (and ssh host keys),
    ``tls`` the source's own trust (else this thread's, ``rukpak.oci.tls.using``),
    ``read_timeout`` the seconds one read may wait (:data:`READ_TIMEOUT`), ``deadline``
    the whole call's."""

    auth: SourceAuth | None
    insecure: bool
    tls: source_tls.SourceTLS | None
    read_timeout: float
    deadline: Deadline | None


def _client(
    repository: str,
    *,
    auth: SourceAuth | None = None,
    insecure: bool = False,
    tls: source_tls.SourceTLS | None = None,
    read_timeout: float = READ_TIMEOUT,
    deadline: Deadline | None = None,
) -> tuple[gitclient.GitClient, str]:
    parts = urlsplit(repository)
    if parts.scheme in ("http", "https"):
        trust = tls if tls is not None else source_tls.current()
        verify = False if insecure else (trust.verify() if trust is not None else True)
        pool = _SameOriginPool(
            deadline=deadline,
            read_timeout=read_timeout,
            retries=urllib3.Retry(
                total=CONNECT_RETRIES, connect=CONNECT_RETRIES, read=0, redirect=0, status=0
            ),
            cert_reqs="CERT_REQUIRED" if verify else "CERT_NONE",
            **({"ca_certs": verify} if isinstance(verify, str) else {}),
        )
        username = auth.username if auth is not None and auth.username else None
        password = auth.password if auth is not None and auth.username else None
        client = gitclient.Urllib3HttpGitClient(
            repository, pool_manager=pool, username=username, password=password, quiet=True
        )
        return client, parts.path
    if parts.scheme == "git":
        if not parts.hostname:
            raise errors.InvalidArgument(f"git repository {display(repository)!r} names no host")
        tcp = _TimedTCPGitClient(
            parts.hostname, parts.port, deadline=deadline, read_timeout=read_timeout
        )
        return tcp, parts.path
    from rukpak.sources import ssh  # paramiko is loaded only for ssh repositories

    if deadline is not None:
        read_timeout = deadline.timeout(read_timeout)
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


class _NoAnswer(errors.Unavailable):
    """The remote did not answer in time: asking it again (another way) would not help."""


def _call(
    repository: str, what: str, fn: Any, *args: Any, deadline: Deadline | None = None, **kw: Any
) -> Any:
    """Run a dulwich call, turning its failures into our errors with the repository named;
    DeadlineExceeded once ``deadline`` has passed."""
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
    except (GitProtocolError, HangupException, OSError, urllib3.exceptions.HTTPError) as exc:
        refused = source_tls.refusal(
            exc,
            what=f"git server {urlsplit(repository).netloc}",
            skip_field=source_tls.SKIP_FIELD_FETCH,
        )
        if refused is not None:  # the same certificate again: retrying cannot help
            raise errors.FailedPrecondition(f"{what} {display(repository)}: {refused}") from None
        raise _unanswered(repository, what, exc, deadline) from None


def _unanswered(
    repository: str, what: str, exc: Exception, deadline: Deadline | None
) -> errors.RukpakError:
    """A remote that failed to answer: out of time, silent, or broken."""
    text = str(exc)[:300]
    timed_out = isinstance(exc, urllib3.exceptions.TimeoutError | TimeoutError) or (
        "timed out" in text.lower() or "timeout" in text.lower()
    )
    if deadline is not None and deadline.expired():
        detail = "no answer" if timed_out else (text or type(exc).__name__)
        return deadline.exceeded(f"{what} git repository {display(repository)}", detail=detail)
    if isinstance(exc, urllib3.exceptions.TimeoutError | TimeoutError):
        return _NoAnswer(f"{what} {repository}: no answer in time")
    if timed_out:
        return _NoAnswer(f"{what} {repository}: no answer in time: {text}")
    return errors.Unavailable(f"{what} {repository}: {text or type(exc).__name__}")


def resolve(repository: str, ref: Mapping[str, Any], **remote: Unpack[Remote]) -> str:
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
    client, path = _client(repository, **remote)
    result = _call(
        repository, "list refs of", client.get_refs, path, deadline=remote.get("deadline")
    )
    refs: dict[bytes, bytes] = dict(getattr(result, "refs", result) or {})
    peeled = refs.get(f"{name}^{{}}".encode()) or refs.get(name.encode())
    if not peeled:
        raise errors.NotFound(f"git repository {repository} has no {name}")
    return peeled.decode()


def fetch_commit(repository: str, commit: str, workdir: Path, **remote: Unpack[Remote]) -> Repo:
    """Fetch ``commit`` (and what it needs) into a new bare repository at ``workdir``.

    Asks for the commit itself first (servers that allow reachable commits in
    "want"); otherwise, unless the remote did not answer in time, fetches every
    branch and tag and looks for it there. Both share ``deadline``.
    """
    if not COMMIT_RE.match(commit):
        raise errors.InvalidArgument(f"{commit[:80]!r} is not a full commit hash")
    repo = Repo.init_bare(str(workdir), mkdir=True)
    client, path = _client(repository, **remote)
    deadline = remote.get("deadline")
    want = commit.encode()

    def only_commit(refs: Any, depth: int | None = None) -> list[bytes]:
        return [want]

    try:
        _call(
            repository,
            "fetch from",
            client.fetch,
            path,
            repo,
            determine_wants=only_commit,
            deadline=deadline,
        )
    except (errors.PermissionDenied, errors.DeadlineExceeded, _NoAnswer):
        raise
    except errors.RukpakError as exc:
        log.info("msg=%r repository=%s error=%r", "fetching all refs", repository, exc.message)
        _call(repository, "fetch from", client.fetch, path, repo, deadline=deadline)
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
                        "entries in the bundle directory (the node's budget); use a smaller "
                        "directory or raise --max-unpacked-files"
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
                        f"more than {max_bytes} bytes (the node's budget); use a smaller "
                        "directory or raise --max-unpacked-bytes"
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
