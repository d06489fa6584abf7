"""Images of this machine's binaries, as one OCI archive that ``ctr images import`` reads.

Where it sits: ``tests.kind.nodeimage`` preloads the node image's containerd with the
images ``kubeadm init`` runs (kube-apiserver, kube-controller-manager, kube-scheduler,
kube-proxy, etcd, CoreDNS, pause) and the registry image ``tests.kind.cluster`` runs.
Each is one layer (``tests.cluster.images.make_image``): the binary under
``/usr/local/bin`` and the shared libraries ``ldd`` says it loads, at the same paths, so
the Go binaries built with cgo by ``tests/cluster/build.sh`` run in an image with nothing
else. The archive is an OCI image layout in a tar (``oci-layout``, ``index.json``,
``blobs/``) whose index names each image with ``io.containerd.image.name``.
"""

from __future__ import annotations

import io
import json
import re
import subprocess
import tarfile
from collections.abc import Iterable, Mapping
from pathlib import Path

from tests.cluster import images

INDEX_TYPE = "application/vnd.oci.image.index.v1+json"
PATH_ENV = "/usr/local/bin"


def shared_libraries(binary: Path) -> list[Path]:
    """The libraries ``binary`` loads (its interpreter too), as ``ldd`` resolves them."""
    done = subprocess.run(["ldd", str(binary)], capture_output=True, text=True, check=False)
    if done.returncode != 0 or "not a dynamic executable" in done.stdout + done.stderr:
        return []
    found: list[Path] = []
    for line in done.stdout.splitlines():
        match = re.search(r"(/\S+) \(0x", line)
        if match:
            found.append(Path(match.group(1)))
    return found


def layer(
    files: Mapping[str, Path], *, links: Mapping[str, str] | None = None, extra: Iterable[str] = ()
) -> bytes:
    """An uncompressed tar: each ``files`` entry (path in the image → file here) with the
    libraries it needs, ``links`` (path → target) and empty directories ``extra``."""
    entries: dict[str, Path] = {}
    for path, source in files.items():
        entries[path.lstrip("/")] = source
        for lib in shared_libraries(source):
            entries.setdefault(str(lib).lstrip("/"), lib.resolve())
    dirs: set[str] = {d.lstrip("/") for d in extra} | {"tmp"}
    for path in [*entries, *(links or {})]:
        parent = Path(path.lstrip("/")).parent
        while str(parent) != ".":
            dirs.add(str(parent))
            parent = parent.parent
    buf = io.BytesIO()
    with tarfile.open(fileobj=buf, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for d in sorted(dirs):
            info = tarfile.TarInfo(d)
            info.type = tarfile.DIRTYPE
            info.mode = 0o1777 if d == "tmp" else 0o755
            tar.addfile(info)
        for path, source in sorted(entries.items()):
            data = source.read_bytes()
            info = tarfile.TarInfo(path)
            info.size = len(data)
            info.mode = 0o755
            tar.addfile(info, io.BytesIO(data))
        for path, target in sorted((links or {}).items()):
            info = tarfile.TarInfo(path.lstrip("/"))
            info.type = tarfile.SYMTYPE
            info.linkname = target
            info.mode = 0o777
            tar.addfile(info)
    return buf.getvalue()


def binary_image(
    binary: Path, *, name: str | None = None, entrypoint: bool = False
) -> images.Image:
    """``binary`` as ``/usr/local/bin/<name>`` with its libraries; the entrypoint when asked
    (kubeadm's static pods name their command, CoreDNS's Deployment does not)."""
    target = f"{PATH_ENV}/{name or binary.name}"
    return images.make_image(
        layer({target: binary}), entrypoint=[target] if entrypoint else [], cmd=[]
    )


def write(path: Path, named: Mapping[str, images.Image]) -> None:
    """An OCI archive at ``path`` holding every image under its name (``repo:tag``)."""
    blobs: dict[str, bytes] = {}
    manifests = []
    for name, image in sorted(named.items()):
        digest = images._digest(image.manifest)
        blobs[digest] = image.manifest
        blobs.update(image.blobs)
        manifests.append(
            {
                "mediaType": images.MANIFEST_TYPE,
                "digest": digest,
                "size": len(image.manifest),
                "annotations": {
                    "io.containerd.image.name": name,
                    "org.opencontainers.image.ref.name": name.rpartition(":")[2],
                },
            }
        )
    index = json.dumps({"schemaVersion": 2, "mediaType": INDEX_TYPE, "manifests": manifests})
    with tarfile.open(path, "w") as tar:
        for member, data in [
            ("oci-layout", b'{"imageLayoutVersion":"1.0.0"}'),
            ("index.json", index.encode()),
            *((f"blobs/sha256/{d.partition(':')[2]}", b) for d, b in sorted(blobs.items())),
        ]:
            info = tarfile.TarInfo(member)
            info.size = len(data)
            info.mode = 0o644
            tar.addfile(info, io.BytesIO(data))
