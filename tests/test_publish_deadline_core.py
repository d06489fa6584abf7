"""The deadline below the plugin: the schedule, the registry transport, the git and http
fetchers and the publish core's fetch slots, each against a silent server on loopback.

Elapsed times are asserted only as upper bounds derived from the deadline given.
"""

from __future__ import annotations

import subprocess
import tarfile
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from csi.node.publish import CLIENT_MARGIN, Publisher
from csi.volume.request import PublishRequest
from rukpak.common import backoff, errors
from rukpak.common.backoff import Backoff, Deadline
from rukpak.oci.client import RegistryClient
from rukpak.oci.reference import Reference
from rukpak.sources import git, http
from rukpak.sources.volume import FetchSource, VolumeSource
from tests.csi_helpers import free_port, terminate
from tests.deadline_helpers import COMMIT, MARGIN, PIN, SilentServer, silent_server
from tests.publish_fakes import offline_publisher
from tests.source_servers import make_repo


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now

    def sleep(self, seconds: float) -> None:
        self.now += seconds


@pytest.fixture
def silent() -> Iterator[SilentServer]:
    with silent_server() as server:
        yield server


# --- the schedule ------------------------------------------------------------------------


def test_a_deadline_cuts_timeouts_to_what_remains() -> None:
    clock = Clock()
    deadline = Deadline.after(10, clock=clock)
    assert deadline.timeout(30) == 10
    assert deadline.timeout(30, share=4) == 2.5
    clock.sleep(9.5)
    assert deadline.timeout(30) == 0.5 and not deadline.expired()
    clock.sleep(1)
    assert deadline.expired() and deadline.remaining() == 0
    assert deadline.timeout(30) == 0.001  # never 0: "do not block" to a socket


def test_retry_starts_no_attempt_the_deadline_leaves_no_time_for() -> None:
    clock = Clock()
    deadline = Deadline.after(5, clock=clock)
    calls = []

    def call() -> None:
        calls.append(clock.now)
        clock.sleep(2)  # each attempt times out after 2 s
        raise TimeoutError

    with pytest.raises(TimeoutError):
        backoff.retry(
            call,
            attempts=10,
            backoff=Backoff(base=1, cap=1),
            retryable=lambda err: True,
            sleep=clock.sleep,
            deadline=deadline,
        )
    assert calls == [100, 103]  # 3 s left after the second attempt: 1 s delay, no third
    assert clock.now <= deadline.at


def test_the_deadline_in_force_is_per_block() -> None:
    assert backoff.current() is None
    deadline = Deadline.after(5)
    with backoff.within(deadline):
        assert backoff.current() is deadline
        seen: list[Deadline | None] = []
        other = threading.Thread(target=lambda: seen.append(backoff.current()))
        other.start()
        other.join()
        assert seen == [None]  # another thread (a FUSE read later on) is not bound by it
    assert backoff.current() is None


# --- the fetchers against a silent server -------------------------------------------------


def test_a_registry_request_stops_at_the_deadline_not_after_every_retry(
    silent: SilentServer,
) -> None:
    client = RegistryClient(timeout=30, retries=3)
    ref = Reference.parse(f"{silent.host}/bundles/silent:v1")
    started = time.monotonic()
    with (
        backoff.within(Deadline.after(2, what="the test deadline")),
        pytest.raises(errors.DeadlineExceeded) as info,
    ):
        client.resolve(ref)
    assert time.monotonic() - started < 2 + MARGIN
    assert f"registry {silent.host} at http://{silent.host}" in info.value.message
    assert "the test deadline of 2s" in info.value.message
    assert silent.accepted == 1  # the one attempt waited for what remained


def test_a_git_remote_that_does_not_answer_is_asked_once(
    silent: SilentServer, tmp_path: Path
) -> None:
    """Without a deadline the read timeout holds for the whole fetch: no second fetch (of
    every ref) after the first timed out."""
    with pytest.raises(errors.Unavailable, match="no answer in time"):
        git.fetch_commit(
            f"http://{silent.host}/bundles/silent.git", COMMIT, tmp_path / "repo", read_timeout=1
        )
    assert silent.accepted == 1


@pytest.mark.parametrize("scheme", ["http", "git"])
def test_a_git_fetch_stops_at_the_deadline(
    silent: SilentServer, scheme: str, tmp_path: Path
) -> None:
    started = time.monotonic()
    with pytest.raises(errors.DeadlineExceeded) as info:
        git.fetch_commit(
            f"{scheme}://{silent.host}/bundles/silent.git",
            COMMIT,
            tmp_path / "repo",
            deadline=Deadline.after(1.5),
        )
    assert time.monotonic() - started < 1.5 + MARGIN
    assert f"{scheme}://{silent.host}/bundles/silent.git" in info.value.message


def test_an_http_fetch_stops_at_the_deadline(silent: SilentServer) -> None:
    started = time.monotonic()
    with pytest.raises(errors.DeadlineExceeded) as info:
        http.fetch(f"http://{silent.host}/b.tgz?token=secret", deadline=Deadline.after(1.5))
    assert time.monotonic() - started < 1.5 + MARGIN
    assert f"GET http://{silent.host}/b.tgz" in info.value.message
    assert "secret" not in info.value.message


# --- the publish core ----------------------------------------------------------------------


def _publisher(tmp_path: Path, *, deadline: float = 90, slots: int = 8) -> Publisher:
    return offline_publisher(tmp_path, deadline=deadline, slots=slots)


def _http_request(tmp_path: Path, name: str, url: str) -> PublishRequest:
    source = VolumeSource.from_attributes({"url": url, "digest": PIN})
    return PublishRequest(
        volume_id=name, target_path=str(tmp_path / "kubelet" / name / "mount"), source=source
    )


def test_a_publish_deadline_is_shortened_by_the_clients_own(tmp_path: Path) -> None:
    publisher = _publisher(tmp_path, deadline=200)
    assert 199 < publisher.deadline().remaining() <= 200
    kubelet = publisher.deadline(client_seconds=120).remaining()
    assert 114 < kubelet <= 120 - CLIENT_MARGIN
    assert 17.9 < publisher.deadline(client_seconds=20).remaining() <= 18
    assert 1.7 < publisher.deadline(client_seconds=2).remaining() <= 1.8


def test_waiting_for_a_fetch_slot_counts_against_the_deadline(
    silent: SilentServer, tmp_path: Path
) -> None:
    publisher = _publisher(tmp_path, slots=1)
    first = _http_request(tmp_path, "first", f"http://{silent.host}/first.tgz")
    outcome: list[BaseException] = []

    def hang() -> None:
        try:
            publisher.publish(first, deadline=Deadline.after(60))
        except errors.RukpakError as exc:
            outcome.append(exc)

    holder = threading.Thread(target=hang)
    holder.start()
    silent.wait_for(1, timeout=30)  # the first publish holds the only slot
    second = _http_request(tmp_path, "second", "http://127.0.0.1:9/second.tgz")
    with pytest.raises(errors.DeadlineExceeded, match="waiting for one of the 1 publishes"):
        publisher.publish(second, deadline=Deadline.after(1))
    silent.stop()  # the first publish fails at once
    holder.join(timeout=60)
    assert outcome and isinstance(outcome[0], errors.Unavailable)


def test_fetch_sources_get_the_publish_deadline(silent: SilentServer, tmp_path: Path) -> None:
    publisher = _publisher(tmp_path, deadline=1)
    source = FetchSource("git", f"http://{silent.host}/bundles/silent.git", COMMIT)
    request = PublishRequest(
        volume_id="git",
        target_path=str(tmp_path / "kubelet" / "git" / "mount"),
        source=VolumeSource(image=source.label(), fetch=source),
    )
    with pytest.raises(errors.DeadlineExceeded, match="publish deadline"):
        publisher.publish(request)


# --- git:// with timeouts still speaks git -------------------------------------------------


@pytest.fixture
def git_daemon(tmp_path: Path) -> Iterator[tuple[str, str]]:
    """``git daemon`` on a free loopback port serving one repository: (URL, commit)."""
    root = tmp_path / "served"
    head = make_repo(root / "bundle", {"manifests/cm.yaml": "kind: ConfigMap\n"})
    port = free_port()
    proc = subprocess.Popen(
        ["git", "daemon", "--verbose", "--export-all", "--reuseaddr", f"--base-path={root}",
         "--listen=127.0.0.1", f"--port={port}", str(root)],
        stderr=subprocess.PIPE,
    )  # fmt: skip
    try:
        assert proc.stderr is not None
        assert b"Ready to rumble" in proc.stderr.readline()
        yield f"git://127.0.0.1:{port}/bundle", head
    finally:
        terminate(proc)


def test_a_git_protocol_fetch_under_a_deadline_gets_the_commit(
    git_daemon: tuple[str, str], tmp_path: Path
) -> None:
    url, head = git_daemon
    deadline = Deadline.after(60)
    assert git.resolve(url, {"branch": "main"}, deadline=deadline) == head
    repo = git.fetch_commit(url, head, tmp_path / "repo", deadline=deadline)
    try:
        git.write_tar(
            repo, head, (), tmp_path / "b.tar", repository=url, max_bytes=1 << 20, max_entries=10
        )
    finally:
        repo.close()
    with tarfile.open(tmp_path / "b.tar") as tar:
        assert "manifests/cm.yaml" in tar.getnames()
