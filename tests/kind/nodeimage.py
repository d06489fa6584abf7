"""The kind node image, made here: ``rukpak-kind-node:<kubernetes version>``.

Where it sits: ``tests.kind.cluster`` asks for it before ``kind create cluster --image``.
Nothing is pulled (no registry outside is reachable); what kind's own ``kindest/node``
holds is made from what this machine can reach, in three cached steps:

1. **rootfs**: Debian bookworm (``debootstrap``) with systemd, containerd, runc, the CNI
   plugins, iptables and the other packages kind's base image installs, then kind's own
   base files taken from the kind module (``images/base/files``: the entrypoint, the
   systemd units, containerd's config), set up as kind's Dockerfile does; the Kubernetes
   binaries of ``tests/cluster/build.sh`` (kubeadm, kubelet, kubectl); ``/kind/version``;
   and one static CNI config (a bridge over ``10.244.0.0/24`` with masquerade), since
   kind's default CNI image cannot be pulled: clusters use ``disableDefaultCNI`` and one
   node. Imported with ``docker import`` as ``rukpak-kind-base:<stamp>``.
2. **images**: the control plane's images, named as ``kubeadm config images list`` says
   (``tests.kind.ociarchive``), imported into the node's containerd by a containerd run
   in a container of the base image, which is then committed as the node image.
3. The node image is labelled with the stamp (the packages, kind's version, the
   binaries' digests); a second build with the same stamp returns at once.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.cluster import bins, dns, images, node
from tests.kind import ociarchive
from tests.kind.engine import Engine

KIND_VERSION = "v0.33.0"
SUITE = "bookworm"
PACKAGES = (
    "systemd",
    "systemd-sysv",
    "conntrack",
    "iptables",
    "nftables",
    "iproute2",
    "ethtool",
    "util-linux",
    "mount",
    "kmod",
    "libseccomp2",
    "pigz",
    "bash",
    "ca-certificates",
    "curl",
    "jq",
    "procps",
    "containerd",
    "runc",
    "containernetworking-plugins",
)
NAME = "rukpak-kind-node"
LABEL = "io.rukpak.kind.stamp"
POD_SUBNET = "10.244.0.0/24"
CACHE = Path(os.environ.get("RUKPAK_CACHE", Path.home() / ".cache" / "rukpak")) / "kind"
CNI_CONFIG = {
    "cniVersion": "0.4.0",
    "name": "rukpak-kind",
    "plugins": [
        node.bridge_plugin("cni0", POD_SUBNET, ip_masq=True),
        {"type": "portmap", "capabilities": {"portMappings": True}},
    ],
}
XTABLES = Path("/usr/lib/x86_64-linux-gnu/xtables")
ENTRYPOINT = '["/usr/local/bin/entrypoint", "/sbin/init"]'


def log(message: str) -> None:
    print(f"kind-node: {message}", file=sys.stderr, flush=True)


def kind_files() -> Path:
    """kind's base image files, from the kind module (downloaded by the Go tool chain)."""
    done = subprocess.run(
        ["go", "mod", "download", "-json", f"sigs.k8s.io/kind@{KIND_VERSION}"],
        capture_output=True,
        text=True,
        check=True,
        cwd="/",
    )
    return Path(json.loads(done.stdout)["Dir"]) / "images" / "base" / "files"


def k8s_version(binaries: dict[str, Path]) -> str:
    out = subprocess.run(
        [str(binaries["kubeadm"]), "version", "-o", "short"],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.strip()
    return out


def _digest_of(path: Path) -> str:
    h = hashlib.sha256()
    with path.open("rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def stamp(binaries: dict[str, Path]) -> str:
    h = hashlib.sha256()
    h.update(json.dumps([KIND_VERSION, SUITE, PACKAGES, CNI_CONFIG]).encode())
    h.update(Path(__file__).read_bytes())
    h.update(Path(ociarchive.__file__).read_bytes())
    for name in sorted(binaries):
        h.update(f"{name}={_digest_of(binaries[name])}".encode())
    return h.hexdigest()[:16]


def _mirror() -> str:
    return os.environ.get("MIRROR", "http://deb.debian.org/debian")


def rootfs_tar() -> Path:
    """Debian with the node's packages, cached as a tar (``debootstrap`` once)."""
    key = hashlib.sha256(json.dumps([SUITE, PACKAGES, _mirror()]).encode()).hexdigest()[:12]
    tar = CACHE / f"rootfs-{key}.tar"
    if tar.exists():
        return tar
    if shutil.which("debootstrap") is None:
        subprocess.run(["apt-get", "install", "-y", "-q", "debootstrap"], check=True)
    CACHE.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(dir=CACHE) as work:
        root = Path(work) / "rootfs"
        log(f"debootstrap {SUITE} with {len(PACKAGES)} packages (cold: a few minutes)")
        started = time.monotonic()
        subprocess.run(
            [
                "debootstrap",
                "--variant=minbase",
                f"--include={','.join(PACKAGES)}",
                SUITE,
                str(root),
                _mirror(),
            ],
            check=True,
            stdout=subprocess.DEVNULL,
        )
        for junk in ("var/cache/apt/archives", "var/lib/apt/lists"):
            shutil.rmtree(root / junk, ignore_errors=True)
        partial = tar.with_suffix(".tmp")
        subprocess.run(["tar", "-C", str(root), "-cf", str(partial), "."], check=True)
        partial.rename(tar)
        log(f"rootfs in {time.monotonic() - started:.0f}s: {tar}")
    return tar


def _copy_tree(source: Path, dest: Path, mode: int) -> None:
    for path in sorted(source.rglob("*")):
        target = dest / path.relative_to(source)
        if path.is_dir():
            target.mkdir(parents=True, exist_ok=True)
            continue
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(path, target)
        os.chmod(target, mode)


def prepare(root: Path, binaries: dict[str, Path], version: str) -> None:
    """kind's base-image set-up on ``root`` (see its images/base/Dockerfile), our way."""
    files = kind_files()
    _copy_tree(files / "usr" / "local" / "bin", root / "usr" / "local" / "bin", 0o755)
    _copy_tree(files / "kind", root / "kind", 0o644)
    _copy_tree(files / "kind" / "bin", root / "kind" / "bin", 0o755)
    _copy_tree(files / "etc", root / "etc", 0o644)
    systemd = root / "lib" / "systemd" / "system"
    (systemd / "sysinit.target.wants" / "systemd-tmpfiles-setup.service").unlink(missing_ok=True)
    for wants in (
        systemd / "multi-user.target.wants",
        root / "etc" / "systemd" / "system",
        systemd / "local-fs.target.wants",
        systemd / "basic.target.wants",
    ):
        pattern = "*.wants/*" if wants.name == "system" else "*"
        for entry in wants.glob(pattern):
            if entry.is_symlink() or entry.is_file():
                entry.unlink()
    for entry in (systemd / "sockets.target.wants").glob("*"):
        if "udev" in entry.name or "initctl" in entry.name:
            entry.unlink()
    with (root / "etc" / "systemd" / "journald.conf").open("a") as f:
        f.write("ReadKMsg=no\n")
    init = root / "sbin" / "init"
    if not init.exists() and not init.is_symlink():
        init.symlink_to("/usr/lib/systemd/systemd")
    wants = root / "etc" / "systemd" / "system" / "multi-user.target.wants"
    wants.mkdir(parents=True, exist_ok=True)
    for unit in ("kubelet.service", "containerd.service", "undo-mount-hacks.service"):
        (wants / unit).unlink(missing_ok=True)
        (wants / unit).symlink_to(f"/etc/systemd/system/{unit}")
    masked = root / "etc" / "systemd" / "system" / "systemd-binfmt.service"
    masked.unlink(missing_ok=True)
    masked.symlink_to("/dev/null")
    (root / "etc" / "kubernetes" / "manifests").mkdir(parents=True, exist_ok=True)
    # Debian's containerd and CNI plugins where kind's units and containerd look for them
    local_bin = root / "usr" / "local" / "bin"
    for name in ("containerd", "ctr", "containerd-shim-runc-v2"):
        (local_bin / name).unlink(missing_ok=True)
        (local_bin / name).symlink_to(f"/usr/bin/{name}")
    opt_cni = root / "opt" / "cni"
    opt_cni.mkdir(parents=True, exist_ok=True)
    if not (opt_cni / "bin").exists():
        (opt_cni / "bin").symlink_to("/usr/lib/cni")
    spec = json.loads(
        subprocess.run(
            ["chroot", str(root), "/usr/bin/ctr", "oci", "spec"],
            capture_output=True,
            text=True,
            check=True,
        ).stdout
    )
    spec["process"].pop("rlimits", None)
    hooks = spec.setdefault("hooks", {}).setdefault("createContainer", [])
    hooks.append({"path": "/kind/bin/mount-product-files.sh"})
    (root / "etc" / "containerd" / "cri-base.json").write_text(json.dumps(spec, indent=1))
    for name in ("kubeadm", "kubelet", "kubectl"):
        shutil.copyfile(binaries[name], root / "usr" / "bin" / name)
        os.chmod(root / "usr" / "bin" / name, 0o755)
    (root / "kind" / "version").write_text(version + "\n")
    net = root / "etc" / "cni" / "net.d"
    net.mkdir(parents=True, exist_ok=True)
    (net / "10-rukpak-bridge.conflist").write_text(json.dumps(CNI_CONFIG, indent=1) + "\n")


def control_plane_images(binaries: dict[str, Path]) -> dict[str, images.Image]:
    """Every image ``kubeadm init`` runs, by the name kubeadm gives it, and kind's pause."""
    names = subprocess.run(
        [
            str(binaries["kubeadm"]),
            "config",
            "images",
            "list",
            "--kubernetes-version",
            k8s_version(binaries),
        ],
        capture_output=True,
        text=True,
        check=True,
    ).stdout.split()
    out: dict[str, images.Image] = {}
    iptables = Path("/usr/sbin/xtables-nft-multi")
    for name in names:
        repo = name.rpartition(":")[0].rpartition("/")[2]
        if repo in ("kube-apiserver", "kube-controller-manager", "kube-scheduler", "etcd"):
            out[name] = ociarchive.binary_image(binaries[repo])
        elif repo == "kube-proxy":
            tools = ["iptables", "iptables-save", "iptables-restore"]
            tools += [t.replace("iptables", "ip6tables") for t in tools]
            # iptables' matches and targets are plugins it loads itself (not in ldd's list)
            plugins = {str(p): p for p in sorted(XTABLES.glob("*.so"))}
            layer = ociarchive.layer(
                {
                    "/usr/local/bin/kube-proxy": binaries["kube-proxy"],
                    str(iptables): iptables,
                    **plugins,
                },
                links={f"/usr/sbin/{t}": iptables.name for t in tools},
            )
            out[name] = images.make_image(layer, entrypoint=[], cmd=[])
        elif repo == "coredns":
            out[name] = dns.image(binaries["coredns"])
        elif repo == "pause":
            out[name] = images.pause_image()
            out["registry.k8s.io/pause:3.10"] = images.pause_image()  # kind's containerd config
        else:
            raise RuntimeError(f"kubeadm lists an image this build cannot make: {name}")
    return out


def existing(engine: Engine, tag: str) -> str | None:
    done = engine.run(
        "image", "inspect", "--format", f'{{{{index .Config.Labels "{LABEL}"}}}}', tag, check=False
    )
    return done.stdout.decode().strip() if done.returncode == 0 else None


def ensure(engine: Engine) -> str:
    """The node image's tag, built unless an image with the same stamp exists."""
    binaries = bins.ensure(bins.KIND)
    version = k8s_version(binaries)
    tag = f"{NAME}:{version}"
    want = stamp(binaries)
    if existing(engine, tag) == want:
        log(f"{tag} is up to date")
        return tag
    started = time.monotonic()
    base = f"rukpak-kind-base:{want}"
    with tempfile.TemporaryDirectory(dir=CACHE if CACHE.exists() else None) as work:
        root = Path(work) / "rootfs"
        root.mkdir()
        subprocess.run(["tar", "-C", str(root), "-xf", str(rootfs_tar())], check=True)
        prepare(root, binaries, version)
        log("docker import of the base")
        tar = subprocess.Popen(["tar", "-C", str(root), "-c", "."], stdout=subprocess.PIPE)
        assert tar.stdout is not None
        subprocess.run(
            [engine.docker, "import", "-", base], stdin=tar.stdout, check=True,
            stdout=subprocess.DEVNULL,
        )  # fmt: skip
        if tar.wait() != 0:
            raise RuntimeError("tar of the node rootfs failed")
        archive = Path(work) / "images.tar"
        ociarchive.write(archive, control_plane_images(binaries))
        _preload(engine, base, archive, tag, want)
    engine.run("image", "rm", base, check=False)
    engine.run("image", "prune", "-f", check=False)  # earlier bases this build replaced
    log(f"{tag} built in {time.monotonic() - started:.0f}s")
    return tag


def _preload(engine: Engine, base: str, archive: Path, tag: str, want: str) -> None:
    """Import ``archive`` into the base's containerd, then commit the node image."""
    name = f"rukpak-kind-build-{want}"
    engine.run("rm", "-f", name, check=False)
    engine.run(
        "run", "-d", "--name", name, "--privileged", "--entrypoint", "/usr/bin/containerd", base
    )
    try:
        for _ in range(120):
            if engine.run("exec", name, "ctr", "version", check=False).returncode == 0:
                break
            time.sleep(0.5)
        engine.run("cp", str(archive), f"{name}:/kind/images.tar")
        engine.run(
            "exec", name, "ctr", "-n", "k8s.io", "images", "import", "--all-platforms",
            "--no-unpack", "/kind/images.tar",
        )  # fmt: skip
        listed = engine.text("exec", name, "ctr", "-n", "k8s.io", "images", "ls", "-q")
        log("preloaded: " + ", ".join(sorted(listed.split())))
        engine.run("exec", name, "rm", "/kind/images.tar")
        engine.run("stop", "-t", "10", name)
        engine.run(
            "commit",
            "--change", f"ENTRYPOINT {ENTRYPOINT}",
            "--change", "CMD []",
            "--change", "ENV container=docker",
            "--change", f"LABEL {LABEL}={want}",
            name,
            tag,
        )  # fmt: skip
    finally:
        engine.run("rm", "-f", name, check=False)
