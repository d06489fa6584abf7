"""The control plane of the local cluster: etcd, kube-apiserver, and optionally
kube-controller-manager and kube-scheduler, on loopback ports, in one work directory.

``localcluster`` calls ``start_apiserver`` (etcd + apiserver: enough for apply-engine
tests) and ``start_controllers``; each returns started ``process.Component``s that are
ready, or raises ``ComponentError`` with the failing component's log tail.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import requests
import urllib3

from tests.cluster import pki
from tests.cluster.network import LOOPBACK, SERVICE_CIDR, Place
from tests.cluster.process import Component, free_port

START_TIMEOUT = 90.0


@dataclass(frozen=True)
class Pki:
    """The files every component of one cluster shares."""

    ca: pki.Pair
    sa: pki.Pair
    admin: pki.Pair
    apiserver: pki.Pair
    apiserver_kubelet_client: pki.Pair

    @classmethod
    def make(cls, directory: Path, *, addresses: Sequence[str] = ()) -> Pki:
        """The cluster's CA and certificates; ``addresses`` are more IP SANs of the apiserver."""
        ca = pki.make_ca(directory)
        return cls(
            ca=ca,
            sa=pki.service_account_keys(directory),
            admin=pki.issue(ca, "admin", cn="admin", orgs=("system:masters",), client=True),
            apiserver=pki.issue(
                ca,
                "apiserver",
                cn="kube-apiserver",
                sans=(
                    "IP:127.0.0.1",
                    "IP:10.0.0.1",
                    *(f"IP:{a}" for a in addresses),
                    "DNS:localhost",
                    "DNS:kubernetes",
                    "DNS:kubernetes.default",
                    "DNS:kubernetes.default.svc",
                    "DNS:kubernetes.default.svc.cluster.local",
                ),
                server=True,
            ),
            apiserver_kubelet_client=pki.issue(
                ca,
                "apiserver-kubelet-client",
                cn="kube-apiserver-kubelet-client",
                orgs=("system:masters",),
                client=True,
            ),
        )


def _get_ok(url: str, **kwargs: object) -> bool:
    with contextlib.suppress(requests.RequestException):
        return requests.get(url, timeout=2, **kwargs).status_code == 200  # type: ignore[arg-type]
    return False


def start_etcd(bin_: Path, workdir: Path, *, place: Place = LOOPBACK) -> tuple[Component, str]:
    """etcd with its data in ``workdir``/etcd, no fsync (test data only); and its URL."""
    client, peer = free_port(), free_port()
    host = place.address
    data = workdir / "etcd"
    data.mkdir(parents=True, exist_ok=True)
    argv = [
        str(bin_),
        "--name=default",
        f"--data-dir={data}",
        f"--listen-client-urls=http://{host}:{client}",
        f"--advertise-client-urls=http://{host}:{client}",
        f"--listen-peer-urls=http://{host}:{peer}",
        f"--initial-advertise-peer-urls=http://{host}:{peer}",
        f"--initial-cluster=default=http://{host}:{peer}",
        "--unsafe-no-fsync",
        "--log-level=warn",
    ]
    etcd = Component.start("etcd", place.argv(argv), log=workdir / "logs" / "etcd.log")
    url = f"http://{host}:{client}"
    etcd.wait_ready(lambda: _get_ok(f"{url}/health"), timeout=START_TIMEOUT)
    return etcd, url


def start_kube_apiserver(
    bin_: Path,
    workdir: Path,
    *,
    etcd_url: str,
    files: Pki,
    port: int | None = None,
    extra_args: Sequence[str] = (),
    place: Place = LOOPBACK,
) -> tuple[Component, str]:
    """kube-apiserver with RBAC and Node authorization; returns it and its URL."""
    port = port or free_port()
    server = f"https://{place.address}:{port}"
    argv = [
        str(bin_),
        f"--etcd-servers={etcd_url}",
        f"--bind-address={place.address}",
        f"--advertise-address={place.address}",
        f"--secure-port={port}",
        f"--cert-dir={workdir / 'apiserver'}",
        f"--tls-cert-file={files.apiserver.cert}",
        f"--tls-private-key-file={files.apiserver.key}",
        f"--client-ca-file={files.ca.cert}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        f"--service-account-issuer={server}",
        f"--service-account-key-file={files.sa.cert}",
        f"--service-account-signing-key-file={files.sa.key}",
        "--authorization-mode=Node,RBAC",
        "--allow-privileged=true",
        f"--kubelet-client-certificate={files.apiserver_kubelet_client.cert}",
        f"--kubelet-client-key={files.apiserver_kubelet_client.key}",
        # on loopback the kubelet listens there only: dial the Node's Hostname ("localhost");
        # a node in its own namespace is reached at its address
        "--kubelet-preferred-address-types="
        + ("Hostname,InternalIP,ExternalIP" if place == LOOPBACK else "InternalIP,Hostname"),
        "--profiling=false",
        "--v=1",
        *extra_args,
    ]
    apiserver = Component.start(
        "kube-apiserver", place.argv(argv), log=workdir / "logs" / "kube-apiserver.log"
    )
    cert = (str(files.admin.cert), str(files.admin.key))
    apiserver.wait_ready(
        lambda: _get_ok(f"{server}/readyz", cert=cert, verify=str(files.ca.cert)),
        timeout=START_TIMEOUT,
        interval=0.25,
    )
    return apiserver, server


def _healthz_insecure(address: str, port: int) -> bool:
    with contextlib.suppress(requests.RequestException), urllib3_quiet():
        return requests.get(f"https://{address}:{port}/healthz", timeout=2, verify=False).ok
    return False


@contextlib.contextmanager
def urllib3_quiet():  # type: ignore[no-untyped-def]
    """Silence urllib3's warning about the unverified loopback health checks."""
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore", urllib3.exceptions.InsecureRequestWarning)
        yield


def _secure_serving(
    bin_: Path, kubeconfig: Path, port: int, cert_dir: Path, place: Place
) -> list[str]:
    """The binary and the flags the controller manager and the scheduler share: the
    kubeconfig for everything, HTTPS on ADDRESS:PORT, self-signed certs in CERT_DIR."""
    return [
        *place.prefix,
        str(bin_),
        f"--kubeconfig={kubeconfig}",
        f"--authentication-kubeconfig={kubeconfig}",
        f"--authorization-kubeconfig={kubeconfig}",
        f"--bind-address={place.address}",
        f"--secure-port={port}",
        f"--cert-dir={cert_dir}",
    ]


def start_kube_controller_manager(
    bin_: Path,
    workdir: Path,
    *,
    kubeconfig: Path,
    files: Pki,
    place: Place = LOOPBACK,
    extra_args: Sequence[str] = (),
) -> Component:
    """kube-controller-manager with every default controller, signing with the cluster CA."""
    port = free_port()
    argv = [
        *_secure_serving(bin_, kubeconfig, port, workdir / "kube-controller-manager", place),
        f"--service-account-private-key-file={files.sa.key}",
        f"--root-ca-file={files.ca.cert}",
        f"--cluster-signing-cert-file={files.ca.cert}",
        f"--cluster-signing-key-file={files.ca.key}",
        f"--service-cluster-ip-range={SERVICE_CIDR}",
        "--use-service-account-credentials=false",
        "--leader-elect=false",
        "--controllers=*",
        "--profiling=false",
        "--v=1",
        *extra_args,
    ]
    kcm = Component.start(
        "kube-controller-manager", argv, log=workdir / "logs" / "kube-controller-manager.log"
    )
    kcm.wait_ready(
        lambda: _healthz_insecure(place.address, port), timeout=START_TIMEOUT, interval=0.25
    )
    return kcm


def start_kube_scheduler(
    bin_: Path, workdir: Path, *, kubeconfig: Path, place: Place = LOOPBACK
) -> Component:
    """kube-scheduler with the default profile."""
    port = free_port()
    argv = [
        *_secure_serving(bin_, kubeconfig, port, workdir / "kube-scheduler", place),
        "--leader-elect=false",
        "--profiling=false",
        "--v=1",
    ]
    scheduler = Component.start("kube-scheduler", argv, log=workdir / "logs" / "kube-scheduler.log")
    scheduler.wait_ready(
        lambda: _healthz_insecure(place.address, port), timeout=START_TIMEOUT, interval=0.25
    )
    return scheduler
