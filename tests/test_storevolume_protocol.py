"""The store volume without mounts: its request protocol, its allow-list, its attributes,
and its socket (``csi.node.storeserver``) with a plain handler behind it, asked through
the client the provisioner side uses (``rukpak.sources.storeclient``)."""

from __future__ import annotations

import contextlib
import json
import socket
import subprocess
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from csi.node import storeserver
from csi.node.storeserver import StoreSocket
from csi.node.storevolume import AllowList, PodInfo
from rukpak.common import errors
from rukpak.sources import storeprotocol as protocol
from rukpak.sources import volume
from rukpak.sources.storeclient import StoreClient
from tests.polling import eventually

DIGEST = "sha256:" + "ab" * 32
REF = f"registry.example.com/bundles/hello@{DIGEST}"


def pod(namespace: str = "rukpak-system", account: str = "provisioner") -> PodInfo:
    return PodInfo(namespace=namespace, name="p", uid="u", service_account=account)


# --- requests ---------------------------------------------------------------------------


def test_a_request_with_a_dockerconfigjson_parses_and_never_shows_the_secret() -> None:
    config = json.dumps({"auths": {"registry.example.com": {"auth": "dTpzZWNyZXRwdw=="}}})
    req = protocol.parse_request(
        protocol.encode_request(
            REF, dockerconfigjson=config, retain_for="bd/x/1", retain=[REF]
        ).rstrip(b"\n")
    )
    assert (req.ref, req.digest, req.retain_for, req.retain) == (REF, DIGEST, "bd/x/1", (REF,))
    assert req.credentials is not None
    entry = req.credentials.for_host("registry.example.com")
    assert entry is not None and entry.password == "secretpw"
    assert "secretpw" not in repr(req)


def test_a_username_and_password_are_for_the_refs_registry() -> None:
    req = protocol.parse_request(protocol.encode_request(REF, username="u", password="pw"))
    assert req.credentials is not None and req.credentials.hosts() == ["registry.example.com"]


def test_no_credential_is_an_anonymous_request() -> None:
    assert protocol.parse_request(protocol.encode_request(REF)).credentials is None


@pytest.mark.parametrize(
    ("line", "says"),
    [
        (b"garbage", "not a JSON object"),
        (b"\xff\xfe", "not a JSON object"),
        (b"[1, 2]", "must be a JSON object"),
        (b"{}", "'ref' is required"),
        (b'{"ref": 5}', "must be a string"),
        (b'{"ref": "a/b:v1"}', "not pinned by digest"),
        (b'{"ref": "a/b@sha256:../../etc/passwd"}', "digest"),
        (b'{"ref": "a/b@sha512:' + b"a" * 128 + b'"}', "not pinned by digest"),
        (json.dumps({"ref": REF, "path": "/etc"}).encode(), "unknown request field"),
        (json.dumps({"ref": REF, "username": "u"}).encode(), "go together"),
        (json.dumps({"ref": REF, "retain": "x"}).encode(), "list of strings"),
        (
            json.dumps({"ref": REF, "dockerconfigjson": "{}", "username": "u"}).encode(),
            "exclusive",
        ),
        (json.dumps({"ref": REF, "dockerconfigjson": "not json"}).encode(), "not valid JSON"),
        (b"x" * (protocol.MAX_LINE + 1), "longer than"),
    ],
)
def test_bad_requests_are_invalid_argument_saying_what_is_wrong(line: bytes, says: str) -> None:
    with pytest.raises(errors.InvalidArgument, match=says):
        protocol.parse_request(line)


def test_a_wrong_password_is_never_quoted_in_an_error() -> None:
    line = json.dumps({"ref": "a/b:v1", "password": "hunter2", "username": "u"}).encode()
    with pytest.raises(errors.InvalidArgument) as info:
        protocol.parse_request(line)
    assert "hunter2" not in info.value.message


def test_answers_round_trip_and_errors_keep_their_code() -> None:
    ok = protocol.StoreAnswer(ok=True, digest=DIGEST, path=DIGEST)
    assert protocol.parse_answer(protocol.encode_answer(ok).rstrip(b"\n")) == ok
    denied = protocol.failure(errors.PermissionDenied("no"))
    back = protocol.parse_answer(protocol.encode_answer(denied))
    assert isinstance(back.error(), errors.PermissionDenied) and back.error().message == "no"
    with pytest.raises(errors.Unavailable):
        protocol.parse_answer(b'{"ok": tr')


# --- the allow-list and the volume kind -------------------------------------------------


def test_the_allow_list_names_service_accounts_or_whole_namespaces() -> None:
    allow = AllowList.parse(["rukpak-system/provisioner,tenants/*", " "])
    assert allow.allows(pod())
    assert allow.allows(pod("tenants", "anyone"))
    assert not allow.allows(pod("rukpak-system", "default"))
    assert not allow.allows(pod("other", "provisioner"))
    with pytest.raises(errors.PermissionDenied, match=r"other/p \(ServiceAccount x\) may not"):
        allow.check(pod("other", "x"))


def test_an_empty_allow_list_refuses_everyone() -> None:
    with pytest.raises(errors.PermissionDenied, match="allows only nobody"):
        AllowList.parse([]).check(pod())


@pytest.mark.parametrize("entry", ["justnamespace", "/sa", "ns/", "ns/a/b", "*/sa"])
def test_malformed_allow_list_entries_are_invalid(entry: str) -> None:
    with pytest.raises(errors.InvalidArgument, match="NAMESPACE/SERVICEACCOUNT"):
        AllowList.parse([entry])


def test_pod_info_must_be_on_the_request() -> None:
    with pytest.raises(errors.PermissionDenied, match="podInfoOnMount"):
        PodInfo.from_attributes({"kind": "store"})
    info = PodInfo.from_attributes(
        {
            "csi.storage.k8s.io/pod.namespace": "ns",
            "csi.storage.k8s.io/pod.name": "n",
            "csi.storage.k8s.io/pod.uid": "u",
            "csi.storage.k8s.io/serviceAccount.name": "sa",
        }
    )
    assert info == PodInfo("ns", "n", "u", "sa")


def test_the_volume_kind_is_bundle_by_default_and_store_takes_no_other_attribute() -> None:
    assert volume.volume_kind({"image": "a/b:v1"}) == "bundle"
    assert volume.volume_kind({"kind": "store", "csi.storage.k8s.io/pod.name": "p"}) == "store"
    with pytest.raises(errors.InvalidArgument, match="no other volume attributes"):
        volume.volume_kind({"kind": "store", "image": "a/b:v1"})
    with pytest.raises(errors.InvalidArgument, match=r"bundle \(the default\) or store"):
        volume.volume_kind({"kind": "Store"})
    with pytest.raises(errors.InvalidArgument, match="holds no bundle"):
        volume.VolumeSource.from_attributes({"kind": "store"})
    assert volume.VolumeSource.from_attributes({"kind": "bundle", "image": "a/b:v1"}).image


# --- the socket, with a plain handler -----------------------------------------------------


class Recorder:
    def __init__(self) -> None:
        self.seen: list[protocol.StoreRequest] = []
        self.release = threading.Event()
        self.release.set()

    def __call__(self, req: protocol.StoreRequest) -> protocol.StoreAnswer:
        self.release.wait(10)
        self.seen.append(req)
        if req.digest.endswith("00" * 4):
            raise errors.NotFound(f"{req.ref} is not in the registry")
        if req.digest.endswith("ff" * 4):
            raise RuntimeError("a bug")
        return protocol.StoreAnswer(ok=True, digest=req.digest, path=req.digest)


@pytest.fixture
def served(tmp_path: Path) -> Iterator[tuple[StoreSocket, Recorder]]:
    handler = Recorder()
    server = StoreSocket(tmp_path / protocol.SOCKET_NAME, handler, name="test")
    try:
        yield server, handler
    finally:
        server.stop()


def raw(path: Path) -> socket.socket:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(10)
    sock.connect(str(path))
    return sock


def read_answer(sock: socket.socket) -> protocol.StoreAnswer:
    data = b""
    while not data.endswith(b"\n"):  # a byte at a time: never past this answer's line
        chunk = sock.recv(1)
        if not chunk:
            break
        data += chunk
    return protocol.parse_answer(data)


def test_the_client_gets_the_path_of_the_digest_in_the_mount(
    served: tuple[StoreSocket, Recorder], tmp_path: Path
) -> None:
    with StoreClient(tmp_path) as client:
        assert client.fetch(REF, username="u", password="p") == tmp_path / DIGEST
        assert client.fetch(REF) == tmp_path / DIGEST  # the same connection again
    assert len(served[1].seen) == 2


def test_errors_come_back_as_their_error_and_internal_ones_say_little(
    served: tuple[StoreSocket, Recorder], tmp_path: Path
) -> None:
    with StoreClient(tmp_path) as client:
        with pytest.raises(errors.NotFound, match="not in the registry"):
            client.fetch(REF.replace(DIGEST, "sha256:" + "00" * 32))
        with pytest.raises(errors.Internal, match="inside the node plugin"):
            client.fetch(REF.replace(DIGEST, "sha256:" + "ff" * 32))
        assert client.fetch(REF) == tmp_path / DIGEST  # and the connection still serves


def test_garbage_is_answered_and_the_connection_keeps_serving(
    served: tuple[StoreSocket, Recorder], tmp_path: Path
) -> None:
    with raw(tmp_path / protocol.SOCKET_NAME) as sock:
        sock.sendall(b"garbage\n\n" + protocol.encode_request(REF))
        assert read_answer(sock).code == "INVALID_ARGUMENT"
        assert read_answer(sock).ok


def test_a_huge_line_is_answered_once_then_the_connection_closes(
    served: tuple[StoreSocket, Recorder], tmp_path: Path
) -> None:
    with raw(tmp_path / protocol.SOCKET_NAME) as sock:
        with contextlib.suppress(OSError):  # the plugin may close before all of it is sent
            sock.sendall(b"x" * (protocol.MAX_LINE * 4))
        answer = read_answer(sock)
        assert answer.code == "INVALID_ARGUMENT" and "longer than" in answer.message
        # closed: an end of stream, or a reset (the rest of the line was never read)
        with contextlib.suppress(ConnectionResetError):
            assert sock.recv(10) == b""
    with StoreClient(tmp_path) as client:
        assert client.fetch(REF) == tmp_path / DIGEST


def test_connections_past_the_limit_are_refused_resource_exhausted(
    served: tuple[StoreSocket, Recorder], tmp_path: Path
) -> None:
    server, _ = served
    socks = [raw(server.path) for _ in range(storeserver.MAX_CONNECTIONS)]
    try:
        for s in socks:  # each is served (and counted) once it answered
            s.sendall(protocol.encode_request(REF))
            assert read_answer(s).ok
        with raw(server.path) as extra:
            answer = read_answer(extra)
        assert answer.code == "RESOURCE_EXHAUSTED"
    finally:
        for s in socks:
            s.close()


def test_ten_thousand_requests_in_a_loop_are_answered_in_order(
    served: tuple[StoreSocket, Recorder], tmp_path: Path
) -> None:
    with raw(tmp_path / protocol.SOCKET_NAME) as sock:
        sender = threading.Thread(
            target=sock.sendall, args=(protocol.encode_request(REF) * 10_000,)
        )
        sender.start()  # write and read at once: answers flow back while requests go out
        data = b""
        while data.count(b"\n") < 10_000:
            chunk = sock.recv(1 << 20)
            assert chunk, "the connection closed early"
            data += chunk
        sender.join()
    assert all(protocol.parse_answer(line).ok for line in data.splitlines())
    assert len(served[1].seen) == 10_000


def test_stop_closes_open_connections_and_removes_the_socket(
    served: tuple[StoreSocket, Recorder], tmp_path: Path
) -> None:
    server, _ = served
    sock = raw(server.path)
    sock.sendall(protocol.encode_request(REF))
    assert read_answer(sock).ok
    server.stop()
    assert sock.recv(10) == b""
    assert not server.path.exists()
    with pytest.raises(errors.Unavailable, match="cannot reach"):
        StoreClient(tmp_path).fetch(REF)


def test_stop_returns_with_every_connection_closed_so_the_directory_unmounts(
    tmp_path: Path,
) -> None:
    """An accepted unix socket holds its path: a connection still open when ``stop``
    returns keeps the store volume's mount busy (EBUSY on the unmount that follows)."""
    mount = tmp_path / "volume"
    mount.mkdir()
    subprocess.run(["mount", "-t", "tmpfs", "-o", "size=1m", "tmpfs", str(mount)], check=True)
    try:
        server = StoreSocket(mount / protocol.SOCKET_NAME, Recorder(), name="busy")
        clients = [raw(mount / protocol.SOCKET_NAME) for _ in range(4)]
        clients[0].sendall(b"not json\n")
        assert not read_answer(clients[0]).ok
        eventually(lambda: server.connections() == 4, timeout=10, what="4 connections accepted")
        server.stop()
        assert server.connections() == 0
        done = subprocess.run(["umount", str(mount)], capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        for client in clients:
            client.close()
    finally:
        subprocess.run(["umount", "-l", str(mount)], capture_output=True)
