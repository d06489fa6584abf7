"""Real servers for git and http bundle sources, on loopback, started by the tests.

One small threaded HTTP server (``SourceServer``) serves:

- ``/git/<repo>``: real git smart HTTP through ``git http-backend`` (run per request
  as CGI, as a web server would, and waited for by pid), with optional basic auth;
- ``/files/<name>``: bytes the test put there (tarballs), with the same basic auth;
- ``/redirect-away/<rest>``: a 302 to the same path on ``localhost`` (another host);
- ``/redirect-here/<rest>``: a 302 to ``/<rest>`` on the same host;
- ``/hang/<rest>``: accepts the request and never answers (until the server stops).

``make_repo`` builds a repository on disk with ``git`` (test set-up only; the
product code never runs git). ``tarball`` builds a tar.gz from a mapping.
"""

from __future__ import annotations

import base64
import contextlib
import io
import os
import ssl
import subprocess
import tarfile
import threading
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

from tests.httpreply import reply
from tests.registry import ServingCert

GIT_HTTP_BACKEND = "/usr/lib/git-core/git-http-backend"
USERNAME = "bundles"
PASSWORD = "s3cret-pass"


def git(repo: Path, *args: str) -> str:
    env = {
        **os.environ,
        "GIT_AUTHOR_NAME": "t",
        "GIT_AUTHOR_EMAIL": "t@example.com",
        "GIT_COMMITTER_NAME": "t",
        "GIT_COMMITTER_EMAIL": "t@example.com",
        "GIT_CONFIG_NOSYSTEM": "1",
        "HOME": str(repo),
    }
    out = subprocess.run(
        ["git", "-C", str(repo), *args], check=True, capture_output=True, text=True, env=env
    )
    return out.stdout.strip()


def make_repo(path: Path, files: Mapping[str, str | bytes], *, branch: str = "main") -> str:
    """A non-bare repository at ``path`` with ``files`` committed; the commit hash.

    A value starting with ``symlink:`` makes a symlink to the rest.
    """
    path.mkdir(parents=True, exist_ok=True)
    if not (path / ".git").exists():
        git(path, "init", "-q", "-b", branch)
        git(path, "config", "uploadpack.allowAnySHA1InWant", "true")
    return commit(path, files)


def commit(path: Path, files: Mapping[str, str | bytes], message: str = "change") -> str:
    for name, content in files.items():
        target = path / name
        target.parent.mkdir(parents=True, exist_ok=True)
        if target.is_symlink() or target.exists():
            target.unlink()
        if isinstance(content, str) and content.startswith("symlink:"):
            os.symlink(content[len("symlink:") :], target)
        else:
            target.write_bytes(content.encode() if isinstance(content, str) else content)
    git(path, "add", "-A")
    git(path, "commit", "-q", "--allow-empty", "-m", message)
    return git(path, "rev-parse", "HEAD")


def tarball(files: Mapping[str, str | bytes], *, symlinks: Mapping[str, str] = {}) -> bytes:
    """A tar.gz holding ``files`` (names used verbatim, so ``../x`` is possible)."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w:gz") as tar:
        for name, content in files.items():
            data = content.encode() if isinstance(content, str) else content
            info = tarfile.TarInfo(name)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
        for name, target in symlinks.items():
            info = tarfile.TarInfo(name)
            info.type = tarfile.SYMTYPE
            info.linkname = target
            tar.addfile(info)
    return buf.getvalue()


@dataclass
class SourceServer:
    """The running server; ``url`` is ``http://127.0.0.1:PORT``."""

    git_root: Path
    auth: bool = False
    files: dict[str, bytes] = field(default_factory=dict)
    requests: list[str] = field(default_factory=list)
    _httpd: ThreadingHTTPServer | None = None
    _thread: threading.Thread | None = None
    stopping: threading.Event = field(default_factory=threading.Event)
    tls: ServingCert | None = None
    """Serve HTTPS with this certificate (``url`` is then ``https://``)."""

    @property
    def port(self) -> int:
        assert self._httpd is not None
        return int(self._httpd.server_address[1])

    @property
    def url(self) -> str:
        return f"{'https' if self.tls else 'http'}://127.0.0.1:{self.port}"

    def repo_url(self, name: str) -> str:
        return f"{self.url}/git/{name}"

    def start(self) -> SourceServer:
        server = self
        expected = "Basic " + base64.b64encode(f"{USERNAME}:{PASSWORD}".encode()).decode()

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.0"

            def log_message(self, format: str, *args: object) -> None:
                server.requests.append(self.path)

            def _authorized(self) -> bool:
                if not server.auth or self.headers.get("Authorization") == expected:
                    return True
                reply(self, 401, headers=[("WWW-Authenticate", 'Basic realm="bundles"')])
                return False

            def do_GET(self) -> None:
                self._serve()

            def do_POST(self) -> None:
                self._serve()

            def _serve(self) -> None:
                path = self.path
                if path.startswith("/hang/"):
                    server.requests.append(path)
                    server.stopping.wait()
                    return
                if path.startswith("/redirect-away/"):
                    rest = path[len("/redirect-away/") :]
                    self._redirect(f"http://localhost:{server.port}/{rest}")
                    return
                if path.startswith("/redirect-here/"):
                    self._redirect("/" + path[len("/redirect-here/") :])
                    return
                if not self._authorized():
                    return
                if path.startswith("/files/"):
                    data = server.files.get(path[len("/files/") :].split("?")[0])
                    if data is None:
                        self.send_error(404)
                        return
                    reply(self, 200, data, headers=[("Content-Type", "application/gzip")])
                    return
                if path.startswith("/git/"):
                    self._git(path[len("/git") :])
                    return
                self.send_error(404)

            def _redirect(self, location: str) -> None:
                reply(self, 302, headers=[("Location", location)])

            def _git(self, rest: str) -> None:
                path_info, _, query = rest.partition("?")
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                env = {
                    "GIT_PROJECT_ROOT": str(server.git_root),
                    "GIT_HTTP_EXPORT_ALL": "1",
                    "PATH_INFO": path_info,
                    "QUERY_STRING": query,
                    "REQUEST_METHOD": self.command,
                    "CONTENT_TYPE": self.headers.get("Content-Type", ""),
                    "CONTENT_LENGTH": str(len(body)),
                    "GIT_PROTOCOL": self.headers.get("Git-Protocol", ""),
                    "REMOTE_USER": USERNAME if server.auth else "",
                    "REMOTE_ADDR": "127.0.0.1",
                    "PATH": os.environ.get("PATH", "/usr/bin:/bin"),
                    "HOME": str(server.git_root),
                    "GIT_CONFIG_NOSYSTEM": "1",
                }
                proc = subprocess.Popen(
                    [GIT_HTTP_BACKEND],
                    env=env,
                    stdin=subprocess.PIPE,
                    stdout=subprocess.PIPE,
                    stderr=subprocess.DEVNULL,
                )
                out, _ = proc.communicate(body)  # waits for this pid
                head, _, payload = out.partition(b"\r\n\r\n")
                status = 200
                headers: list[tuple[str, str]] = []
                for line in head.decode("latin-1").split("\r\n"):
                    key, _, value = line.partition(":")
                    if key.lower() == "status":
                        status = int(value.strip().split()[0])
                    elif key:
                        headers.append((key, value.strip()))
                reply(self, status, payload, headers=headers)

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        if self.tls is not None:
            context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
            context.load_cert_chain(self.tls.cert, self.tls.key)
            self._httpd.socket = context.wrap_socket(self._httpd.socket, server_side=True)
        self._httpd.daemon_threads = True
        self._thread = threading.Thread(target=self._httpd.serve_forever, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        self.stopping.set()
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()


@contextlib.contextmanager
def local_http(handler: type[BaseHTTPRequestHandler]) -> Iterator[str]:
    """``handler`` served by a threading HTTP server on a free loopback port: its
    ``host:port``. Shut down when the block ends."""
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True).start()
    try:
        yield f"127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextlib.contextmanager
def serving(
    git_root: Path, *, auth: bool = False, tls: ServingCert | None = None
) -> Iterator[SourceServer]:
    server = SourceServer(git_root=git_root, auth=auth, tls=tls).start()
    try:
        yield server
    finally:
        server.stop()


SSHD = "/usr/sbin/sshd"


@dataclass
class SshServer:
    """Debian's sshd, non-daemon on a free loopback port, its own host key and config.

    Logs in the current user with ``client_key`` (git runs ``git-upload-pack`` there);
    ``known_hosts`` is the line a client needs to trust it. Stopped by pid.
    """

    workdir: Path
    port: int = 0
    client_key: str = ""
    known_hosts: str = ""
    user: str = ""
    proc: subprocess.Popen[bytes] | None = None

    def start(self) -> SshServer:
        import getpass
        import socket
        import time

        import paramiko

        self.workdir.mkdir(parents=True, exist_ok=True)
        host_key = paramiko.RSAKey.generate(2048)
        host_path = self.workdir / "host_rsa"
        host_key.write_private_key_file(str(host_path))
        host_path.chmod(0o600)
        client = paramiko.RSAKey.generate(2048)
        buf = io.StringIO()
        client.write_private_key(buf)
        self.client_key = buf.getvalue()
        (self.workdir / "authorized_keys").write_text(
            f"{client.get_name()} {client.get_base64()}\n"
        )
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        self.known_hosts = f"[127.0.0.1]:{self.port} {host_key.get_name()} {host_key.get_base64()}"
        self.user = getpass.getuser()
        config = self.workdir / "sshd_config"
        config.write_text(
            "\n".join(
                [
                    f"Port {self.port}",
                    "ListenAddress 127.0.0.1",
                    f"HostKey {host_path}",
                    f"PidFile {self.workdir / 'sshd.pid'}",
                    f"AuthorizedKeysFile {self.workdir / 'authorized_keys'}",
                    "StrictModes no",
                    "UsePAM no",
                    "PasswordAuthentication no",
                    "KbdInteractiveAuthentication no",
                    "PubkeyAuthentication yes",
                    "PermitRootLogin prohibit-password",
                    "",
                ]
            )
        )
        if os.geteuid() == 0:
            Path("/run/sshd").mkdir(mode=0o755, exist_ok=True)  # sshd's privsep dir
        self.proc = subprocess.Popen(
            [SSHD, "-D", "-e", "-f", str(config)],
            stdout=subprocess.DEVNULL,
            stderr=open(self.workdir / "sshd.log", "wb"),  # noqa: SIM115
        )
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError((self.workdir / "sshd.log").read_text())
            with (
                contextlib.suppress(OSError),
                socket.create_connection(("127.0.0.1", self.port), timeout=1),
            ):
                return self
            time.sleep(0.1)
        self.stop()
        raise RuntimeError("sshd did not start listening")

    def url(self, repo: Path) -> str:
        return f"ssh://{self.user}@127.0.0.1:{self.port}{repo}"

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            self.proc.wait(timeout=10)
