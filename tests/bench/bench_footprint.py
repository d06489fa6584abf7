"""Memory of every long-running container's process, started as the tests start them.

Where it sits: ``python -m tests.bench footprint`` (about two minutes; no kubelet). It
starts etcd and kube-apiserver (``tests.cluster``) and the registry, then each process
with the flags its container has in the shipped manifests, gives it work, and reads its
peak resident memory, VmHWM of /proc/PID/status, and its CPU at rest (utime + stime of
/proc/PID/stat over ``REST`` seconds, in millicores): the figures the manifests' requests
and limits cite (docs/operations.md, "Probes, requests and limits"). Each memory target is
that container's memory limit, read from the manifest: a process above it would be
OOM-killed.

- ``fuse-holder``: the holder after answering ``PROBES`` probes, and one ``--check`` (the
  exec probe's own process runs in the holder's container and counts against its limit);
- node ``plugin`` with the DaemonSet's flags (FUSE with that holder, a kubelet
  registration directory, signature policies followed on the API server, metrics port)
  after ``VOLUMES`` bind publishes and their unpublishes (the large bundle's peak is
  ``csi``'s, 100 FUSE volumes ``fuse``'s);
- the StorageClass controller's ``plugin`` (``--controller``) and ``provisioner``
  (``rukpak-provisioner volumes``, leader-elected, health port) after provisioning
  ``CLAIMS`` claims;
- ``manager``, leader and standby (``rukpak-provisioner manager --leader-elect``, webhook
  on loopback) at rest with the CRDs installed and no BundleDeployment; the cost of each
  BundleDeployment is ``install``'s (50) and ``scale``'s (1,000);
- the ``standing`` provisioner (``rukpak-provisioner standing``, health port) at rest, its
  runs watched;
- the registry ``mirror`` (``python -m csi.mirror``, deploy/components/registry-mirror)
  after ``PULLS`` nodes pulled a ``LAYER_MIB`` MiB image through it at once.
"""

from __future__ import annotations

import contextlib
import os
import resource
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import grpc
import yaml

from csi.fuse import holder as fuse_holder
from csi.proto import csi_pb2_grpc
from provisioner.engine.kube.kube import Kube
from rukpak.oci.client import RegistryClient
from rukpak.oci.reference import Reference
from tests import crd_helpers, httpreply
from tests.bench import Result, progress
from tests.bench.bench_csi import proc_status_mib
from tests.cluster import bins
from tests.cluster.localcluster import LocalCluster
from tests.csi_helpers import (
    PluginProcess,
    free_port,
    publish_request,
    push_image,
    simple_image,
    target,
    terminate,
    unpublish,
)
from tests.fuse_helpers import start_holder
from tests.polling import eventually
from tests.registry import RegistryServer
from tests.storage_helpers import DRIVER, claim, storage_class

REPO = Path(__file__).resolve().parents[2]
PROBES = 50
VOLUMES = 20
CLAIMS = 20
REST = 20.0
PULLS = 4
LAYER_MIB = 16
NAMESPACE = "rukpak-footprint"


def cpu_seconds(pid: int) -> float:
    """User and system CPU time of ``pid`` so far (/proc/PID/stat)."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


def at_rest(pids: dict[str, int]) -> dict[str, float]:
    """Millicores each process uses over ``REST`` seconds of doing nothing asked of it."""
    before = {name: cpu_seconds(pid) for name, pid in pids.items()}
    time.sleep(REST)
    return {name: (cpu_seconds(pid) - before[name]) / REST * 1000 for name, pid in pids.items()}


def limit_mib(manifest: str, container: str) -> float:
    """The memory limit of ``container`` in the shipped ``manifest`` (a path under the repo),
    in MiB."""
    for doc in yaml.safe_load_all((REPO / manifest).read_text()):
        for c in doc["spec"]["template"]["spec"]["containers"]:
            if c["name"] == container:
                value = str(c["resources"]["limits"]["memory"])
                assert value.endswith("Mi"), value
                return float(value[:-2])
    raise KeyError(f"{container} in {manifest}")


def probe(url: str) -> tuple[int, str]:
    """GET ``url`` (HTTPS without verification, as kubelet's probes): status and body;
    (0, the error) when nothing answers."""
    try:
        status, body = httpreply.probe(url, timeout=5)
    except OSError as err:
        return 0, str(err)
    return status, body.decode()


@contextlib.contextmanager
def provisioner(
    cluster: LocalCluster, pod: str, log: Path, *args: str
) -> Iterator[subprocess.Popen[bytes]]:
    """``python -m provisioner ARGS`` as pod ``pod`` of ``cluster`` (its output to ``log``)
    for a ``with`` block; stopped after it."""
    env = {**os.environ, "KUBECONFIG": str(cluster.kubeconfig), "POD_NAME": pod}
    with log.open("wb") as out:
        command = [sys.executable, "-m", "provisioner", *args]
        proc = subprocess.Popen(command, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT)
        try:
            yield proc
        finally:
            terminate(proc)


def holder_figures(workdir: Path) -> tuple[subprocess.Popen[bytes], Path, list[Result]]:
    sock = workdir / "holder.sock"
    proc = start_holder(workdir / "fusemnt", sock)
    for _ in range(PROBES):
        ok, reason = fuse_holder.check(sock, workdir / "fusemnt")
        assert ok, reason
    used = resource.getrusage(resource.RUSAGE_CHILDREN)
    check = subprocess.run(
        [sys.executable, "-c", _CHECK, str(sock), str(workdir / "fusemnt")],
        capture_output=True,
        text=True,
        check=True,
    )
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    check_cpu = after.ru_utime + after.ru_stime - used.ru_utime - used.ru_stime
    check_hwm = float(check.stdout.split()[-1]) / 1024
    limit = limit_mib("daemonset/daemonset.yaml", "fuse-holder")
    hwm = proc_status_mib(proc.pid, "VmHWM")
    idle = at_rest({"holder": proc.pid})["holder"]
    return (
        proc,
        sock,
        [
            Result(
                "footprint: fuse-holder peak RSS (VmHWM)",
                hwm,
                "MiB",
                target=limit,
                note=f"after {PROBES} probes; RSS now {proc_status_mib(proc.pid):.1f} MiB",
            ),
            Result(
                "footprint: fuse-holder --check (the exec probe) peak RSS",
                check_hwm,
                "MiB",
                target=limit,
                note="a process of its own in the holder's container, for about 0.1 s",
            ),
            Result("footprint: fuse-holder CPU at rest", idle, "m"),
            Result(
                "footprint: fuse-holder --check CPU per probe",
                check_cpu * 1000,
                "ms",
                note="charged to the holder's container: two probes every 30 s cost "
                f"{check_cpu * 2 / 30 * 1000:.1f} millicores",
            ),
        ],
    )


_CHECK = """
import sys
from pathlib import Path
from csi.fuse import holder
ok, reason = holder.check(Path(sys.argv[1]), Path(sys.argv[2]))
assert ok, reason
status = Path("/proc/self/status").read_text()
print(next(line for line in status.splitlines() if line.startswith("VmHWM")).split()[1])
"""


def node_plugin_figures(workdir: Path, holder_sock: Path, image: str) -> list[Result]:
    registration = workdir / "plugins_registry"
    registration.mkdir(parents=True)
    plugin = PluginProcess(
        workdir / "node",
        extra_args=(
            "--fuse",
            "--fuse-holder-socket",
            str(holder_sock),
            "--registration-dir",
            str(registration),
            "--signature-policies=cluster",
            "--cache-budget=10Gi",
        ),
    ).start()
    try:
        assert plugin.process is not None
        idle = proc_status_mib(plugin.process.pid)
        with grpc.insecure_channel(f"unix://{plugin.socket}") as channel:
            node = csi_pb2_grpc.NodeStub(channel)
            targets = []
            for i in range(VOLUMES):
                path = target(plugin)
                node.NodePublishVolume(publish_request(path, image, volume_id=f"v{i}"))
                targets.append((path, f"v{i}"))
            for path, volume in targets:
                unpublish(node, path, volume_id=volume)
        hwm = proc_status_mib(plugin.process.pid, "VmHWM")
        idle_cpu = at_rest({"plugin": plugin.process.pid})["plugin"]
    finally:
        plugin.stop()
        plugin.unmount_all()
    return [
        Result(
            "footprint: node plugin (DaemonSet flags) peak RSS (VmHWM)",
            hwm,
            "MiB",
            target=limit_mib("daemonset/daemonset.yaml", "plugin"),
            note=f"idle {idle:.1f} MiB after start; {VOLUMES} bind publishes and unpublishes; "
            "FUSE, registration dir, --signature-policies=cluster",
        ),
        Result("footprint: node plugin CPU at rest", idle_cpu, "m"),
    ]


def storageclass_figures(
    workdir: Path, cluster: LocalCluster, kube: Kube, image: str
) -> list[Result]:
    plugin = PluginProcess(workdir / "controller", extra_args=("--controller",)).start()
    health = free_port()
    args = ["volumes", "--csi-address", str(plugin.socket), "--driver-name", DRIVER]
    args += ["--leader-elect", "--leader-election-namespace", NAMESPACE]
    args += ["--health-port", str(health), "--health-bind", "127.0.0.1"]
    try:
        with provisioner(cluster, "provisioner-0", workdir / "volumes.log", *args) as proc:
            eventually(
                lambda: probe(f"http://127.0.0.1:{health}/healthz")[0] == 200,
                timeout=60,
                what="the provisioner ready",
            )
            kube.create(storage_class(parameters={"image": image, "pullPolicy": "IfNotPresent"}))
            for i in range(CLAIMS):
                body = claim()
                meta = body["metadata"]
                meta.update(name=f"claim-{i}", namespace=NAMESPACE)
                for key in ("uid", "resourceVersion"):
                    meta.pop(key)
                kube.create(body)

            def provisioned() -> bool:
                volumes = kube.list("v1", "PersistentVolume")[0]
                return sum(1 for v in volumes if v["spec"]["csi"]["driver"] == DRIVER) >= CLAIMS

            eventually(provisioned, timeout=120, what=f"{CLAIMS} PersistentVolumes")
            live = probe(f"http://127.0.0.1:{health}/livez")
            assert live[0] == 200 and "leading" in live[1], live
            assert plugin.process is not None
            provisioner_hwm = proc_status_mib(proc.pid, "VmHWM")
            plugin_hwm = proc_status_mib(plugin.process.pid, "VmHWM")
            cpu = at_rest({"provisioner": proc.pid, "plugin": plugin.process.pid})
    finally:
        plugin.stop()
    note = f"after provisioning {CLAIMS} claims (CreateVolume: the tag resolved at the registry)"
    return [
        Result(
            "footprint: StorageClass provisioner peak RSS (VmHWM)",
            provisioner_hwm,
            "MiB",
            target=limit_mib("storageclass/controller.yaml", "provisioner"),
            note=note + "; leader-elected, health port",
        ),
        Result(
            "footprint: StorageClass controller plugin peak RSS (VmHWM)",
            plugin_hwm,
            "MiB",
            target=limit_mib("storageclass/controller.yaml", "plugin"),
            note=note,
        ),
        Result("footprint: StorageClass provisioner CPU at rest", cpu["provisioner"], "m"),
        Result("footprint: StorageClass controller plugin CPU at rest", cpu["plugin"], "m"),
    ]


def manager_figures(workdir: Path, cluster: LocalCluster, kube: Kube) -> list[Result]:
    with contextlib.ExitStack() as stack:
        procs: list[tuple[subprocess.Popen[bytes], int]] = []
        for i in range(2):
            port = free_port()
            args = ["manager", "--image", "rukpak:footprint", "--system-namespace", NAMESPACE]
            args += ["--leader-elect", "--webhook-bind", "127.0.0.1", "--webhook-port", str(port)]
            log = workdir / f"manager-{i}.log"
            procs.append((stack.enter_context(provisioner(cluster, f"m-{i}", log, *args)), port))

        def roles() -> dict[str, int] | None:
            answers = [probe(f"https://127.0.0.1:{port}/livez") for _, port in procs]
            if any(code != 200 for code, _ in answers):
                return None
            texts = [body for _, body in answers]
            lead = [i for i, t in enumerate(texts) if '"leading: ' in t]
            wait = [i for i, t in enumerate(texts) if "waiting for the Lease" in t]
            return {"leader": lead[0], "standby": wait[0]} if lead and wait else None

        found = eventually(roles, timeout=120, what="a leading manager and a standby")
        # at rest: watches open, Lease renewals (leader) and reads (standby) every 5 s
        cpu = at_rest({role: procs[i][0].pid for role, i in found.items()})
        hwm = {role: proc_status_mib(procs[i][0].pid, "VmHWM") for role, i in found.items()}
    limit = limit_mib("deploy/manager/deployment.yaml", "manager")
    return [
        Result(
            f"footprint: manager {role} at rest, no BundleDeployment, peak RSS (VmHWM)",
            value,
            "MiB",
            target=limit,
            note="CRDs installed; webhook served; per-BundleDeployment cost: install, scale",
        )
        for role, value in hwm.items()
    ] + [
        Result(f"footprint: manager {role} CPU at rest", value, "m") for role, value in cpu.items()
    ]


def standing_figures(workdir: Path, cluster: LocalCluster) -> list[Result]:
    """The standing provisioner at rest: its runs listed and watched, no store volume here
    (so it answers live, and not ready, saying why); its cost per BundleDeployment is
    ``standing``'s."""
    port = free_port()
    store = workdir / "store"
    store.mkdir(parents=True)
    args = ["standing", "--store-dir", str(store), "--system-namespace", NAMESPACE]
    args += ["--health-bind", "127.0.0.1", "--health-port", str(port)]
    with provisioner(cluster, "standing-0", workdir / "standing.log", *args) as proc:
        eventually(
            lambda: probe(f"http://127.0.0.1:{port}/livez")[0] == 200,
            timeout=60,
            what="the standing provisioner live",
        )
        code, body = probe(f"http://127.0.0.1:{port}/healthz")
        assert code == 503 and "store volume" in body, (code, body)
        cpu = at_rest({"standing": proc.pid})["standing"]
        hwm = proc_status_mib(proc.pid, "VmHWM")
    limit = limit_mib("deploy/standing/deployment.yaml", "provisioner")
    return [
        Result(
            "footprint: standing provisioner at rest, no BundleDeployment, peak RSS (VmHWM)",
            hwm,
            "MiB",
            target=limit,
            note="runs watched, health port; per-BundleDeployment cost: standing",
        ),
        Result("footprint: standing provisioner CPU at rest", cpu, "m"),
    ]


def mirror_figures(workdir: Path, registry: RegistryServer) -> list[Result]:
    data = os.urandom(LAYER_MIB << 20)  # random: no compression shrinks it
    image = push_image(registry.host, "footprint/big", "v1", [[("blob.bin", "file", data)]])
    proc = subprocess.Popen(
        [sys.executable, "-m", "csi.mirror", "--listen", "127.0.0.1:0", "--root",
         str(workdir / "store"), "--upstream", registry.host],
        stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    try:
        assert proc.stdout is not None
        address = proc.stdout.readline().decode().strip()
        pinned = Reference.parse(image.ref.rsplit(":", 1)[0] + "@" + image.manifest_digest)

        def pull(index: int) -> None:
            dest = workdir / f"node-{index}"
            dest.mkdir(parents=True)
            with RegistryClient(mirrors={registry.host: address}) as client:
                _, manifest = client.resolve_image(pinned)
                for blob in [manifest.config, *manifest.layers]:
                    client.fetch_blob(pinned, blob, dest / blob.digest.replace(":", "-"))

        nodes = [threading.Thread(target=pull, args=(i,)) for i in range(PULLS)]
        for node in nodes:
            node.start()
        for node in nodes:
            node.join(60)
        served = sum(1 for i in range(PULLS) if len(list((workdir / f"node-{i}").iterdir())) == 2)
        assert served == PULLS, f"{served} of {PULLS} pulls complete"
        hwm = proc_status_mib(proc.pid, "VmHWM")
        idle = at_rest({"mirror": proc.pid})["mirror"]
    finally:
        terminate(proc)
    return [
        Result(
            "footprint: registry mirror peak RSS (VmHWM)",
            hwm,
            "MiB",
            target=limit_mib("deploy/components/registry-mirror/deployment.yaml", "mirror"),
            note=f"after {PULLS} pulls at once of a {LAYER_MIB} MiB layer through it",
        ),
        Result("footprint: registry mirror CPU at rest", idle, "m"),
    ]


def run(workdir: Path) -> list[Result]:
    results: list[Result] = []
    progress("footprint: starting etcd, kube-apiserver and the registry")
    cluster = LocalCluster.start(
        workdir / "cp", node=False, binaries=bins.ensure(bins.CONTROL_PLANE)
    )
    registry = RegistryServer.start(workdir / "registry")
    holder: subprocess.Popen[bytes] | None = None
    kube = Kube.from_kubeconfig(str(cluster.kubeconfig))
    saved = os.environ.get("KUBECONFIG")
    os.environ["KUBECONFIG"] = str(cluster.kubeconfig)  # the node plugin's policy watch
    try:
        crd_helpers.install_crds(kube)
        kube.apply({"apiVersion": "v1", "kind": "Namespace", "metadata": {"name": NAMESPACE}})
        image = simple_image(registry.host, "footprint/hello").ref
        progress("footprint: the FUSE holder")
        holder, holder_sock, got = holder_figures(workdir / "holder")
        results += got
        progress("footprint: the node plugin")
        results += node_plugin_figures(workdir, holder_sock, image)
        progress("footprint: the StorageClass controller")
        results += storageclass_figures(workdir, cluster, kube, image)
        progress("footprint: the managers")
        results += manager_figures(workdir, cluster, kube)
        progress("footprint: the standing provisioner")
        results += standing_figures(workdir / "standing", cluster)
        progress("footprint: the registry mirror")
        results += mirror_figures(workdir / "mirror", registry)
    finally:
        if saved is None:
            os.environ.pop("KUBECONFIG", None)
        else:
            os.environ["KUBECONFIG"] = saved
        if holder is not None:
            terminate(holder)
        kube.close()
        registry.stop()
        cluster.stop(remove=True)
    return results
