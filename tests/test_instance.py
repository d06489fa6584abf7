"""The instance pod's process (``rukpak-provisioner instance``) and its Lease lock.

The Lease decision is tested pure; the lock against a real kube-apiserver with
two contenders; the process as a subprocess (``python -m provisioner``) with
``KUBECONFIG`` pointing at that API server, as the instance pod runs it apart
from the CSI volume (a directory stands in for the mounted bundle).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest

from provisioner import __main__ as provisioner_main
from provisioner.engine.apply import appliedrecord, inventory
from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import OWNER_LABEL, Obj, ObjectRef
from provisioner.instance import process as instance
from provisioner.manager.planning import runs
from provisioner.runtime import lease
from tests.bundles import configmap, namespace, write_bundle
from tests.polling import eventually

REPO_ROOT = Path(__file__).resolve().parent.parent
SYSTEM_NAMESPACE = "rukpak-system"
T0 = datetime(2025, 1, 1, 12, 0, 0, tzinfo=UTC)


def record(
    holder: str, *, renewed: datetime | None = T0, duration: float = 15
) -> lease.LeaseRecord:
    return lease.LeaseRecord(
        holder=holder, duration=duration, renewed=renewed, transitions=0, resource_version="1"
    )


# -- the decision ----------------------------------------------------------------------


@pytest.mark.parametrize(
    ("current", "seen_for", "take"),
    [
        (None, 0.0, True),
        (record(""), 0.0, True),
        (record("me"), 0.0, True),
        (record("other"), 14.9, False),
        (record("other"), 15.0, True),
        (record("other", renewed=None), 0.0, False),
        (record("other", duration=1), 2.0, True),
        (record("other", renewed=T0 - timedelta(days=1)), 1.0, False),
    ],
    ids=[
        "no lease yet",
        "released",
        "already ours",
        "held and seen changing 14.9 s ago",
        "held and unchanged for its duration since seen",
        "held, never renewed, just seen",
        "held with a short duration, expired",
        "an old renewTime counts for nothing: only what this process saw",
    ],
)
def test_a_lease_may_be_taken_when_free_ours_or_unchanged_for_its_duration(
    current: lease.LeaseRecord | None, seen_for: float, take: bool
) -> None:
    assert lease.should_take(current, "me", observed_at=100.0, now=100.0 + seen_for) is take


def test_a_lease_record_reads_the_api_servers_microtime() -> None:
    live = {
        "metadata": {"resourceVersion": "42"},
        "spec": {
            "holderIdentity": "pod-a",
            "leaseDurationSeconds": 15,
            "acquireTime": "2025-01-01T11:00:00.000000Z",
            "renewTime": lease.format_time(T0),
            "leaseTransitions": 3,
        },
    }
    got = lease.LeaseRecord.of(live)
    assert got == lease.LeaseRecord("pod-a", 15.0, T0, 3, "42")
    assert got.expires() == T0 + timedelta(seconds=15)


def test_log_lines_are_key_value_with_awkward_values_quoted() -> None:
    line = instance.kv("lease acquired", lease="ns/x", holder="", why="a b")
    assert line == "msg='lease acquired' lease=ns/x holder='' why='a b'"


def test_without_a_subcommand_it_prints_usage_names_instance_and_exits_2(
    capsys: pytest.CaptureFixture[str],
) -> None:
    assert provisioner_main.main([]) == 2
    err = capsys.readouterr().err
    assert "usage: rukpak-provisioner" in err
    assert "a subcommand is required: instance, manager" in err


@pytest.mark.parametrize(
    ("argv", "expected"),
    [
        (["instance", "--bundle-dir", "/b"], "instance"),
        (["--log-level", "debug", "unpack", "--help"], "unpack"),
        (["--log-level=debug", "manager"], "manager"),
        (["--help"], None),
        (["nonsense", "instance"], None),
        ([], None),
    ],
)
def test_the_subcommand_is_found_before_anything_is_imported(
    argv: list[str], expected: str | None
) -> None:
    assert provisioner_main.subcommand_of(argv) == expected


def test_an_instance_process_imports_neither_the_manager_nor_the_pv_provisioner() -> None:
    """What a run pod pays at start: only the instance's own modules."""
    probe = (
        "import sys\n"
        "from provisioner import __main__ as m\n"
        "try:\n"
        "    m.main(['instance', '--help'])\n"
        "except SystemExit:\n"
        "    pass\n"
        "print(sorted(n for n in sys.modules if n.startswith('provisioner.')))\n"
    )
    done = subprocess.run(
        [sys.executable, "-c", probe], capture_output=True, text=True, timeout=60, check=True
    )
    loaded = done.stdout.strip().splitlines()[-1]
    assert "provisioner.instance.process" in loaded
    for heavy in ("provisioner.manager.cli", "provisioner.storage.cli", "provisioner.manager"):
        assert f"'{heavy}'" not in loaded, loaded
    assert "usage: rukpak-provisioner instance" in done.stdout


# -- the lock against a real API server ----------------------------------------------


def lock(kube: Kube, name: str, identity: str, **kw: Any) -> lease.LeaseLock:
    return lease.LeaseLock(
        kube,
        namespace=SYSTEM_NAMESPACE,
        name=lease.lease_name(name),
        identity=identity,
        **kw,
    )


def live_lease(kube: Kube, name: str) -> dict[str, Any]:
    ref = ObjectRef("coordination.k8s.io", "v1", "Lease", SYSTEM_NAMESPACE, lease.lease_name(name))
    got = kube.get(ref)
    assert got is not None
    return got


@pytest.mark.cluster
class TestTheLeaseLock:
    def test_the_second_holder_waits_until_the_first_releases(self, kube: Kube, name: str) -> None:
        a, b = lock(kube, name, "a"), lock(kube, name, "b", retry_interval=0.2)
        assert a.acquire(timeout=10)
        assert not b.try_acquire()
        assert live_lease(kube, name)["spec"]["holderIdentity"] == "a"

        got: list[bool] = []
        waiter = threading.Thread(target=lambda: got.append(b.acquire(timeout=20)))
        waiter.start()
        waiter.join(1.0)
        assert waiter.is_alive(), "b took a lease a still holds"
        assert a.release()
        waiter.join(10)
        assert got == [True]
        spec = live_lease(kube, name)["spec"]
        assert spec["holderIdentity"] == "b" and spec["leaseTransitions"] == 1
        assert b.release()
        assert not b.release()  # idempotent

    def test_an_expired_lease_is_taken_over(self, kube: Kube, name: str) -> None:
        a = lock(kube, name, "a", duration=2)
        b = lock(kube, name, "b", duration=2, retry_interval=0.2)
        assert a.acquire(timeout=10)  # and never renewed: a crashed holder
        assert not b.try_acquire()
        assert b.acquire(timeout=10)
        assert live_lease(kube, name)["spec"]["holderIdentity"] == "b"
        assert not a.release()  # no longer ours: left alone
        assert live_lease(kube, name)["spec"]["holderIdentity"] == "b"

    def test_a_renewed_lease_is_not_taken_over(self, kube: Kube, name: str) -> None:
        a = lock(kube, name, "a", duration=2, renew_interval=0.3)
        b = lock(kube, name, "b", duration=2, retry_interval=0.2)
        assert a.acquire(timeout=10)
        a.start_renewing()
        try:
            assert not b.acquire(timeout=4)
            assert a.held
        finally:
            assert a.release()

    def test_a_holder_whose_lease_is_taken_learns_it_lost_the_lease(
        self, kube: Kube, name: str
    ) -> None:
        lost: list[str] = []
        a = lock(kube, name, "a", duration=5, renew_interval=0.2, on_lost=lost.append)
        assert a.acquire(timeout=10)
        a.start_renewing()
        kube.merge_patch(a.ref, {"spec": {"holderIdentity": "intruder"}})
        assert a.lost.wait(5) and not a.held
        eventually(lambda: lost, timeout=5, what="on_lost to be called")
        assert lost == ["taken by 'intruder'"]
        assert not a.release()
        assert live_lease(kube, name)["spec"]["holderIdentity"] == "intruder"

    def test_of_two_contenders_racing_for_a_free_lease_exactly_one_wins(
        self, kube: Kube, name: str
    ) -> None:
        for round_ in range(5):
            key = f"{name}-{round_}"
            contenders = [lock(kube, key, "a"), lock(kube, key, "b")]
            start = threading.Barrier(2)
            won: list[str] = []

            threads = [threading.Thread(target=_race, args=(c, start, won)) for c in contenders]
            for t in threads:
                t.start()
            for t in threads:
                t.join(10)
            assert len(won) == 1, won
            assert live_lease(kube, key)["spec"]["holderIdentity"] == won[0]


def _race(contender: lease.LeaseLock, start: threading.Barrier, won: list[str]) -> None:
    start.wait()
    if contender.try_acquire():
        won.append(contender.identity)


# -- the process ---------------------------------------------------------------------


@dataclass
class Proc:
    """``python -m provisioner instance ...`` with its stderr in a file."""

    process: subprocess.Popen[bytes]
    log_path: Path

    def log(self) -> str:
        return self.log_path.read_text(errors="replace")

    def wait_for(self, text: str, *, timeout: float = 30) -> None:
        def seen() -> bool:
            if text in self.log():
                return True
            if self.process.poll() is not None:
                raise AssertionError(f"exited {self.process.returncode}:\n{self.log()}")
            return False

        try:
            eventually(seen, timeout=timeout, what=repr(text), interval=0.1)
        except AssertionError as e:
            raise AssertionError(f"{e}\nlog:\n{self.log()}") from None

    def term(self, *, timeout: float = 30) -> int:
        self.process.send_signal(signal.SIGTERM)
        return self.process.wait(timeout)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.kill()
            self.process.wait(10)


@pytest.fixture
def run_instance(kube_apiserver: Any, tmp_path: Path) -> Iterator[Any]:
    started: list[Proc] = []

    def start(*args: str, log_name: str = "instance.log") -> Proc:
        env = {**os.environ, "KUBECONFIG": str(kube_apiserver.kubeconfig)}
        env.pop("POD_NAME", None)
        log_path = tmp_path / log_name
        with log_path.open("wb") as out:
            process = subprocess.Popen(
                [sys.executable, "-m", "provisioner", "instance", *args],
                cwd=REPO_ROOT,
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL,
            )
        proc = Proc(process, log_path)
        started.append(proc)
        return proc

    yield start
    for proc in started:
        proc.kill()


def bundle_dir(root: Path, name: str, **data: str) -> Path:
    write_bundle(root, {"01_all.yaml": [namespace(name), configmap("a", name, **data)]})
    return root


def inventory_cm(kube: Kube, name: str) -> Obj | None:
    ref = ObjectRef("", "v1", "ConfigMap", SYSTEM_NAMESPACE, inventory.configmap_name(name))
    return kube.get(ref)


def holder(kube: Kube, name: str) -> str:
    return str(live_lease(kube, name)["spec"].get("holderIdentity") or "")


@pytest.mark.cluster
class TestTheInstanceProcess:
    def test_it_applies_the_bundle_under_the_lease_records_it_releases_and_exits_0(
        self, kube: Kube, name: str, tmp_path: Path, run_instance: Any
    ) -> None:
        root = bundle_dir(tmp_path / "bundle", name, k="1")
        proc = run_instance(
            "--bundle-dir", str(root), "--name", name, "--identity", "pod-1", "--bundle", "b-1"
        )
        assert proc.process.wait(60) == 0, proc.log()
        cm = kube.get(ObjectRef("", "v1", "ConfigMap", name, "a"))
        assert cm is not None and cm["data"] == {"k": "1"}
        assert cm["metadata"]["labels"][OWNER_LABEL] == name
        record = runs.InstallRecord.of_inventory(inventory_cm(kube, name))
        assert record is not None and (record.by, record.bundle) == ("pod-1", "b-1")
        assert holder(kube, name) == ""
        log = proc.log()
        for step in ("loading bundle", "lease acquired", "installed", "install recorded; exiting"):
            assert f"msg='{step}'" in log, log
        assert "msg='lease released'" in log

    def test_a_second_run_waits_for_the_lease_held_by_another(
        self, kube: Kube, name: str, tmp_path: Path, run_instance: Any
    ) -> None:
        root = bundle_dir(tmp_path / "bundle", name, k="1")
        squatter = lock(kube, name, "run-0", duration=60)
        assert squatter.acquire(timeout=10)
        proc = run_instance("--bundle-dir", str(root), "--name", name, "--identity", "run-1")
        proc.wait_for("msg='waiting for lease'")
        assert "holder=run-0" in proc.log()
        assert "msg='installed'" not in proc.log()
        assert kube.get(ObjectRef("", "v1", "ConfigMap", name, "a")) is None
        assert squatter.release()
        assert proc.process.wait(60) == 0, proc.log()
        assert kube.get(ObjectRef("", "v1", "ConfigMap", name, "a")) is not None
        assert holder(kube, name) == ""

    def test_sigterm_while_waiting_for_the_lease_exits_0_without_applying(
        self, kube: Kube, name: str, tmp_path: Path, run_instance: Any
    ) -> None:
        root = bundle_dir(tmp_path / "bundle", name)
        squatter = lock(kube, name, "squatter", duration=60)
        assert squatter.acquire(timeout=10)
        proc = run_instance("--bundle-dir", str(root), "--name", name)
        proc.wait_for("msg='waiting for lease'")
        assert proc.term() == 0, proc.log()
        assert "msg='installed'" not in proc.log()
        assert kube.get(ObjectRef("", "v1", "ConfigMap", name, "a")) is None
        assert holder(kube, name) == "squatter"
        assert squatter.release()

    def test_a_broken_bundle_exits_1_naming_the_file_in_stderr_and_the_termination_log(
        self, kube: Kube, name: str, tmp_path: Path, run_instance: Any
    ) -> None:
        root = tmp_path / "bundle"
        (root / "manifests").mkdir(parents=True)
        (root / "manifests" / "bad.yaml").write_text("kind: [\n")
        termination = tmp_path / "termination-log"
        termination.write_text("")
        proc = run_instance(
            "--bundle-dir", str(root), "--name", name, "--termination-log", str(termination)
        )
        assert proc.process.wait(30) == 1, proc.log()
        assert "manifests/bad.yaml document 1" in proc.log()
        assert "level=error" in proc.log()
        assert termination.read_text().startswith(
            "get objects from bundle manifests: manifests/bad.yaml document 1"
        )

    def test_an_apply_error_exits_1_with_the_object_named(
        self, kube: Kube, name: str, tmp_path: Path, run_instance: Any
    ) -> None:
        root = tmp_path / "bundle"
        bad = {"apiVersion": "v1", "kind": "ConfigMap", "metadata": {"name": "a"}, "data": {"k": 1}}
        write_bundle(
            root,
            {
                "01_all.yaml": [
                    namespace(name),
                    {**bad, "metadata": {"name": "a", "namespace": name}},
                ]
            },
        )
        termination = tmp_path / "termination-log"
        proc = run_instance(
            "--bundle-dir", str(root), "--name", name, "--termination-log", str(termination)
        )
        assert proc.process.wait(60) == 1, proc.log()
        assert f"ConfigMap {name}/a" in termination.read_text()
        assert holder(kube, name) == ""  # released on the way out

    def test_the_record_on_the_inventory_says_what_was_applied_and_survives_the_next_run(
        self, kube: Kube, name: str, tmp_path: Path, run_instance: Any
    ) -> None:
        monitor = {
            "apiVersion": "monitoring.example.com/v1",
            "kind": "Monitor",
            "metadata": {
                "name": "m",
                "namespace": name,
                "annotations": {"core.rukpak.io/optional": "true"},
            },
        }
        root = tmp_path / "bundle"
        write_bundle(root, {"01_all.yaml": [namespace(name), configmap("a", name, k="1"), monitor]})
        proc = run_instance(
            "--bundle-dir", str(root), "--name", name, "--identity", "run-1",
            "--once", "--bundle", "b-1",
        )  # fmt: skip
        assert proc.process.wait(60) == 0, proc.log()
        assert "optional objects set aside" in proc.log()
        live = live_lease(kube, name)
        assert live["spec"].get("holderIdentity") in ("", None)
        assert not (live["metadata"].get("annotations") or {}), "the Lease is a lock only"
        record = runs.InstallRecord.of_inventory(inventory_cm(kube, name))
        assert record is not None and record.applied is not None
        assert (record.by, record.bundle) == ("run-1", "b-1")
        assert record.awaiting == {("monitoring.example.com", "v1", "Monitor")}
        applied = record.applied
        cm = kube.get(ObjectRef("", "v1", "ConfigMap", name, "a"))
        assert cm is not None
        assert applied[appliedrecord.key_of(ObjectRef.of(cm))] == appliedrecord.fields_hash(cm)
        assert set(applied) == {
            appliedrecord.key_of(ObjectRef("", "v1", "Namespace", "", name)),
            appliedrecord.key_of(ObjectRef.of(cm)),
        }
        # another writer taking a field we apply is what the manager will call drift
        changed = kube.merge_patch(ObjectRef.of(cm), {"data": {"k": "2"}})
        reason = appliedrecord.drift_of(
            applied[appliedrecord.key_of(ObjectRef.of(cm))], changed, name
        )
        assert reason == "fields we apply were changed by another writer"

        # the next run rewrites the inventory (manager rukpak) and the record (rukpak-record):
        # neither apply removes the other's key
        write_bundle(root, {"01_all.yaml": [namespace(name), configmap("b", name, k="1")]})
        proc = run_instance(
            "--bundle-dir", str(root), "--name", name, "--identity", "run-2", "--bundle", "b-2"
        )
        assert proc.process.wait(60) == 0, proc.log()
        cm_now = inventory_cm(kube, name)
        assert cm_now is not None
        assert {r.name for r in inventory.from_configmap(cm_now).refs} == {name, "b"}
        again = runs.InstallRecord.of_inventory(cm_now)
        assert again is not None and (again.by, again.bundle) == ("run-2", "b-2")
        assert not again.awaiting
