"""Hardened manifests: every long-running container is probed, sized, and its probes reach
something that exists.

Renders ``deploy/`` with the real ``kubectl kustomize``, alone and with every shipped
component (``host-network`` moves the Deployments onto the node's network and drops the
manager's declared port; ``kubelet-root`` moves the paths; ``monitoring`` rebinds the node
plugin's metrics; ``registry-mirror`` adds a Deployment), and checks each container of each
Deployment and DaemonSet: a liveness and a readiness probe, CPU and memory requests and a
memory limit, all stated in the table of docs/operations.md ("Probes, requests and limits")
beside the measured figures they come from (``python -m tests.bench footprint``).

A probe must reach what the process serves: an HTTP probe's port is one the
container's own flags listen on, on an address the kubelet can dial (the pod's, or the
node's loopback for a host-network pod whose server binds there), at a path that process
serves; an exec probe runs an importable module with flags it accepts, with the same
values as the container's (its socket and mountpoint), expanding only variables the
kubelet expands there (the container's literal environment).
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from provisioner.manager.serving import webhook
from provisioner.runtime import liveness
from tests import install_helpers as inst

COMPONENTS = inst.DEPLOY / "components"
PYTHON = "/opt/rukpak/bin/python"

SERVES: dict[str, set[str]] = {
    "rukpak-provisioner manager": {"/healthz", liveness.LIVEZ_PATH, webhook.METRICS_PATH},
    "rukpak-provisioner volumes": {liveness.HEALTHZ_PATH, liveness.LIVEZ_PATH},
    "rukpak-provisioner standing": {liveness.HEALTHZ_PATH, liveness.LIVEZ_PATH},
    "rukpak-csi-plugin": {"/healthz", "/metrics"},
    "csi.mirror": {"/v2/"},
}
"""What each process's HTTP server answers (by command; see ``program``)."""

OPERATIONS = Path(__file__).resolve().parent.parent / "docs" / "operations.md"
ROW = re.compile(r"^\| `([\w-]+)` \((?:Deployment|DaemonSet) `([\w-]+)`[^)]*\) \|(.*)\|\s*$")

_UNITS = {"Ki": 1 / 1024, "Mi": 1.0, "Gi": 1024.0}


def mib(quantity: str) -> float:
    number, unit = re.fullmatch(r"(\d+)(Ki|Mi|Gi)", str(quantity)).groups()
    return int(number) * _UNITS[unit]


# -- rendering -------------------------------------------------------------------------------

RENDERS = ("deploy", "deploy with every component")


@pytest.fixture(scope="module")
def renders(tmp_path_factory: pytest.TempPathFactory) -> dict[str, list[dict[str, Any]]]:
    plain = inst.render_overlay(tmp_path_factory.mktemp("plain"))
    everything = inst.render_overlay(
        tmp_path_factory.mktemp("all"),
        # the mirror first, so that host-network moves its Deployment too
        *(
            COMPONENTS / c
            for c in ("registry-mirror", "host-network", "kubelet-root", "monitoring")
        ),
        configMapGenerator=[
            {
                "name": "rukpak-apiserver",
                "namespace": "rukpak-system",
                "literals": ["KUBERNETES_SERVICE_HOST=127.0.0.1", "KUBERNETES_SERVICE_PORT=6443"],
            },
            {
                "name": "rukpak-node-paths",
                "literals": ["kubeletRoot=/data/kubelet", "stateDir=/data/rukpak-csi"],
            },
            {
                "name": "rukpak-registry-mirror",
                "namespace": "rukpak-system",
                "literals": ["upstream=registry.example.com"],
                "options": {"disableNameSuffixHash": True},
            },
        ],
    )
    return {
        RENDERS[0]: [d for d in plain.values() if d["kind"] in ("Deployment", "DaemonSet")],
        RENDERS[1]: [d for d in everything.values() if d["kind"] in ("Deployment", "DaemonSet")],
    }


def containers(workloads: list[dict[str, Any]]) -> list[tuple[dict[str, Any], dict[str, Any]]]:
    """(workload, container) for every long-running container (not init containers)."""
    return [(w, c) for w in workloads for c in w["spec"]["template"]["spec"]["containers"]]


def each(
    renders: dict[str, list[dict[str, Any]]],
) -> list[tuple[str, dict[str, Any], dict[str, Any]]]:
    """(what, pod spec, container) across both renders; ``what`` names them."""
    out = []
    for render, workloads in renders.items():
        for workload, container in containers(workloads):
            what = (
                f"{render}: {workload['kind']} {workload['metadata']['name']}/{container['name']}"
            )
            out.append((what, workload["spec"]["template"]["spec"], container))
    return out


def args_of(container: dict[str, Any]) -> list[str]:
    return [*container.get("command", []), *container.get("args", [])]


def program(container: dict[str, Any]) -> str:
    """Which of ``SERVES`` the container runs."""
    argv = args_of(container)
    base = Path(argv[0]).name
    if base == "rukpak-provisioner":
        return f"{base} {argv[1]}"
    if argv[1:2] == ["-m"]:
        return argv[2]
    return base


def flag(argv: list[str], name: str) -> str | None:
    """The value of ``--name=VALUE`` (or ``--name VALUE``) in ``argv``; the last one wins."""
    value = None
    for i, arg in enumerate(argv):
        if arg.startswith(f"{name}="):
            value = arg.split("=", 1)[1]
        elif arg == name and i + 1 < len(argv):
            value = argv[i + 1]
    return value


def listening(container: dict[str, Any]) -> dict[int, str]:
    """Port -> bind address of every server the container's flags start."""
    argv = args_of(container)
    found: dict[int, str] = {}
    for prefix in ("--webhook", "--metrics", "--health"):
        port = flag(argv, f"{prefix}-port")
        if port and int(port):
            found[int(port)] = flag(argv, f"{prefix}-bind") or (
                "127.0.0.1" if prefix == "--metrics" else "0.0.0.0"  # the processes' defaults
            )
    listen = flag(argv, "--listen")
    if listen:
        host, _, port = listen.rpartition(":")
        found[int(port)] = host
    return found


def probes(container: dict[str, Any]) -> list[tuple[str, dict[str, Any]]]:
    return [(kind, container[kind]) for kind in ("livenessProbe", "readinessProbe")]


# -- every container has both probes, requests and a memory limit -----------------------------


def test_every_long_running_container_has_liveness_and_readiness_probes(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    missing = [
        f"{what}: no {kind}"
        for what, _, c in each(renders)
        for kind in ("livenessProbe", "readinessProbe")
        if not c.get(kind)
    ]
    assert not missing, missing
    names = {(w["metadata"]["name"], c["name"]) for w, c in containers(renders[RENDERS[1]])}
    assert len(names) == 7, names  # the manager, the standing provisioner, the node plugin and
    # holder, the controller's two, the mirror: a new container must be measured and
    # documented (see below)


def test_every_long_running_container_requests_cpu_and_memory_and_has_a_memory_limit(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    for what, _, container in each(renders):
        resources = container.get("resources") or {}
        requests, limits = resources.get("requests") or {}, resources.get("limits") or {}
        assert {"cpu", "memory"} <= requests.keys(), what
        assert "memory" in limits, what
        assert mib(requests["memory"]) <= mib(limits["memory"]), what


def documented() -> dict[tuple[str, str], list[str]]:
    """The table of docs/operations.md, "Probes, requests and limits": (workload, container)
    -> its cells after the first."""
    text = OPERATIONS.read_text().split("## Probes, requests and limits", 1)[1].split("\n## ")[0]
    rows = {}
    for line in text.splitlines():
        match = ROW.match(line)
        if match:
            rows[(match[2], match[1])] = [cell.strip() for cell in match[3].split(" | ")]
    return rows


def test_the_operations_table_states_every_containers_requests_limit_and_measurement(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    """Each manifest's `resources:` cites that table (and the benchmark behind it): a
    request or limit changed there, or a container added, without a row saying so fails."""
    rows = documented()
    for workload, container in containers(renders[RENDERS[1]]):
        key = (workload["metadata"]["name"], container["name"])
        assert key in rows, (
            f"{key}: no row in {OPERATIONS.name} (measure it: tests.bench footprint)"
        )
        _ready, _live, request, limit, measured, source = rows[key]
        requests = container["resources"]["requests"]
        assert request == f"{requests['cpu']}, {requests['memory']}", key
        assert limit == container["resources"]["limits"]["memory"], key
        assert "VmHWM" in measured and "MiB" in measured and "`footprint`" in source, key
    assert len(rows) == 7, sorted(rows)


# -- the probes reach what exists ------------------------------------------------------------


def test_every_http_probe_dials_a_port_and_path_the_process_serves(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    for what, pod, container in each(renders):
        ports = {p["name"]: p["containerPort"] for p in container.get("ports") or [] if "name" in p}
        serving = listening(container)
        for kind, probe in probes(container):
            action = probe.get("httpGet")
            if action is None:
                continue
            port = ports[action["port"]] if isinstance(action["port"], str) else action["port"]
            assert port in serving, f"{what} {kind}: nothing listens on {port} ({serving})"
            path = action["path"]
            assert path in SERVES[program(container)], f"{what} {kind}: {path}"
            bind, host = serving[port], action.get("host")
            if host == "127.0.0.1":  # the node's loopback: only a host-network pod is there
                assert pod.get("hostNetwork"), f"{what} {kind}: loopback of another netns"
                assert bind in ("127.0.0.1", "0.0.0.0"), f"{what} {kind}: bound to {bind}"
            else:  # the pod's address
                assert host is None and bind == "0.0.0.0", f"{what} {kind}: {host} vs {bind}"
            scheme = action.get("scheme", "HTTP")
            https = program(container) == "rukpak-provisioner manager"
            assert scheme == ("HTTPS" if https else "HTTP"), f"{what} {kind}: {scheme}"


def test_every_exec_probe_runs_a_module_with_flags_it_takes_and_the_containers_values(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    seen = 0
    for what, _, container in each(renders):
        literal = {e["name"]: e["value"] for e in container.get("env") or [] if "value" in e}
        for kind, probe in probes(container):
            command = (probe.get("exec") or {}).get("command")
            if command is None:
                continue
            seen += 1
            assert command[:2] == [PYTHON, "-m"], f"{what} {kind}: {command}"
            assert importlib.util.find_spec(command[2]) is not None, command[2]
            # the kubelet expands $(VAR) in an exec probe from the literal env only
            for var in re.findall(r"\$\((\w+)\)", " ".join(command)):
                assert var in literal, f"{what} {kind}: $({var}) is not a literal env var"
            helped = subprocess.run(
                [sys.executable, "-m", command[2], "--help"],
                capture_output=True,
                text=True,
                check=True,
            ).stdout
            argv = args_of(container)
            for arg in command[3:]:
                name = arg.split("=", 1)[0]
                assert name in helped, f"{what} {kind}: {command[2]} takes no {name}"
                if "=" in arg and flag(argv, name) is not None:
                    assert arg.split("=", 1)[1] == flag(argv, name), f"{what} {kind}: {arg}"
    assert seen == 4, seen  # the holder's two, in both renders


def test_liveness_never_gives_up_before_readiness_would(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    def patience(probe: dict[str, Any]) -> int:
        return int(probe.get("initialDelaySeconds", 0)) + int(
            probe.get("failureThreshold", 3)
        ) * int(probe.get("periodSeconds", 10))

    for what, _, container in each(renders):
        live, ready = container["livenessProbe"], container["readinessProbe"]
        assert patience(live) >= patience(ready), what
        for probe in (live, ready):
            assert int(probe.get("timeoutSeconds", 1)) < int(probe.get("periodSeconds", 10)), what


def test_the_host_network_render_has_no_two_workloads_on_one_node_port(
    renders: dict[str, list[dict[str, Any]]],
) -> None:
    """On the node's network every server is the node's: the manager's replicas share 9443
    (SO_REUSEPORT), nothing else may share a port."""
    owners: dict[int, set[str]] = {}
    for workload in renders[RENDERS[1]]:
        spec = workload["spec"]["template"]["spec"]
        assert spec.get("hostNetwork"), workload["metadata"]["name"]
        for container in spec["containers"]:
            for port in listening(container):
                owners.setdefault(port, set()).add(workload["metadata"]["name"])
    shared = {port: names for port, names in owners.items() if len(names) > 1}
    assert not shared, shared
    assert {9443, 9809, 9810, 9811, 9812} <= owners.keys(), owners
