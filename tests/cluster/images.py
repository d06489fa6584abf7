"""The local cluster's container images: built here from Debian's busybox-static, pushed
to a loopback registry, pulled by containerd.

``pause`` (the CRI sandbox image: busybox sleeping) and ``busybox`` (a shell and its
applets) are one-layer OCI images made in memory, byte-for-byte reproducible. The pusher
is the registry API's monolithic upload (POST, then PUT with the digest) and a manifest
PUT. ``start_registry`` runs ``tests.registry`` when it exists, else Debian's
docker-registry directly.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path
from typing import Protocol

import requests

from tests.cluster.network import LOOPBACK, Place
from tests.cluster.process import Component, free_port

BUSYBOX = Path("/bin/busybox")
PAUSE_REPO = "rukpak-test/pause"
PAUSE_TAG = "3.10"
BUSYBOX_REPO = "rukpak-test/busybox"
BUSYBOX_TAG = "1.35"
LAYER_TYPE = "application/vnd.oci.image.layer.v1.tar+gzip"
CONFIG_TYPE = "application/vnd.oci.image.config.v1+json"
MANIFEST_TYPE = "application/vnd.oci.image.manifest.v1+json"
TIMEOUT = 30


def _digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()


def _applets() -> list[str]:
    out = subprocess.run([str(BUSYBOX), "--list"], check=True, capture_output=True, text=True)
    return sorted(a for a in out.stdout.split() if a and a != "busybox")


def busybox_layer(*, applets: bool) -> bytes:
    """An uncompressed tar: /bin/busybox, /tmp, and (when ``applets``) a symlink per applet."""
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in ("bin", "tmp", "etc"):
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
        data = BUSYBOX.read_bytes()
        info = tarfile.TarInfo("bin/busybox")
        info.size = len(data)
        info.mode = 0o755
        tar.addfile(info, io.BytesIO(data))
        for applet in _applets() if applets else []:
            link = tarfile.TarInfo(f"bin/{applet}")
            link.type = tarfile.SYMTYPE
            link.linkname = "busybox"
            link.mode = 0o777
            tar.addfile(link)
    return buf.getvalue()


@dataclass(frozen=True)
class Image:
    """An OCI image in memory: its blobs by digest and its manifest."""

    manifest: bytes
    blobs: dict[str, bytes]


def make_image(layer_tar: bytes, *, entrypoint: list[str], cmd: list[str]) -> Image:
    """A one-layer linux/amd64 OCI image around ``layer_tar``."""
    layer = gzip.compress(layer_tar, compresslevel=6, mtime=0)
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "config": {
                "Env": ["PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"],
                "Entrypoint": entrypoint or None,
                "Cmd": cmd or None,
            },
            "rootfs": {"type": "layers", "diff_ids": [_digest(layer_tar)]},
        },
        sort_keys=True,
    ).encode()
    manifest = json.dumps(
        {
            "schemaVersion": 2,
            "mediaType": MANIFEST_TYPE,
            "config": {"mediaType": CONFIG_TYPE, "digest": _digest(config), "size": len(config)},
            "layers": [{"mediaType": LAYER_TYPE, "digest": _digest(layer), "size": len(layer)}],
        },
        sort_keys=True,
    ).encode()
    return Image(manifest=manifest, blobs={_digest(config): config, _digest(layer): layer})


def pause_image() -> Image:
    """The sandbox image: busybox sleeping for ever (containerd kills sandboxes with SIGKILL)."""
    return make_image(
        busybox_layer(applets=False), entrypoint=["/bin/busybox", "sleep", "2147483647"], cmd=[]
    )


def busybox_image() -> Image:
    """A shell image: ``sh``, ``echo``, ``cat``, ... all busybox applets under /bin."""
    return make_image(busybox_layer(applets=True), entrypoint=[], cmd=["sh"])


def push(registry_url: str, repo: str, tag: str, image: Image) -> str:
    """Push ``image`` as ``repo:tag`` to a registry without auth; return the reference."""
    session = requests.Session()
    for digest, blob in image.blobs.items():
        head = session.head(f"{registry_url}/v2/{repo}/blobs/{digest}", timeout=TIMEOUT)
        if head.status_code == 200:
            continue
        start = session.post(f"{registry_url}/v2/{repo}/blobs/uploads/", timeout=TIMEOUT)
        start.raise_for_status()
        location = start.headers["Location"]
        if location.startswith("/"):
            location = registry_url + location
        sep = "&" if "?" in location else "?"
        put = session.put(
            f"{location}{sep}digest={digest}",
            data=blob,
            headers={"Content-Type": "application/octet-stream"},
            timeout=TIMEOUT,
        )
        put.raise_for_status()
    put = session.put(
        f"{registry_url}/v2/{repo}/manifests/{tag}",
        data=image.manifest,
        headers={"Content-Type": MANIFEST_TYPE},
        timeout=TIMEOUT,
    )
    put.raise_for_status()
    host = registry_url.split("://", 1)[1]
    return f"{host}/{repo}:{tag}"


class Registry(Protocol):
    """What the cluster needs of a registry: ``host`` (host:port), ``url`` and ``stop``."""

    @property
    def host(self) -> str: ...

    @property
    def url(self) -> str: ...

    def stop(self) -> None: ...


@dataclass
class LocalRegistry:
    """Debian's docker-registry (distribution v2) on a loopback port, no auth, own storage."""

    component: Component
    port: int
    address: str = "127.0.0.1"

    @property
    def host(self) -> str:
        return f"{self.address}:{self.port}"

    @property
    def url(self) -> str:
        return f"http://{self.host}"

    def stop(self) -> None:
        self.component.stop(grace=5)


def start_registry(
    workdir: Path,
    *,
    log: Path | None = None,
    binary: str = "docker-registry",
    place: Place = LOOPBACK,
) -> LocalRegistry:
    """Start a registry storing blobs under ``workdir``; returns once ``/v2/`` answers."""
    workdir.mkdir(parents=True, exist_ok=True)
    port = free_port()
    config = workdir / "config.yml"
    config.write_text(
        json.dumps(
            {
                "version": 0.1,
                "log": {"level": "warn"},
                "storage": {
                    "filesystem": {"rootdirectory": str(workdir / "storage")},
                    "delete": {"enabled": True},
                },
                "http": {"addr": f"{place.address}:{port}", "secret": "rukpak-test-cluster"},
            }
        )
    )
    component = Component.start(
        "registry",
        place.argv([binary, "serve", str(config)]),
        log=log or workdir / "registry.log",
    )
    registry = LocalRegistry(component=component, port=port, address=place.address)

    def answers() -> bool:
        return requests.get(f"{registry.url}/v2/", timeout=2).status_code == 200

    try:
        component.wait_ready(answers, timeout=30)
    except Exception:
        component.stop(grace=1)
        raise
    return registry


def push_test_images(registry_url: str) -> tuple[str, str]:
    """Push the pause and busybox images; return their references (pause, busybox)."""
    pause = push(registry_url, PAUSE_REPO, PAUSE_TAG, pause_image())
    busybox = push(registry_url, BUSYBOX_REPO, BUSYBOX_TAG, busybox_image())
    return pause, busybox
