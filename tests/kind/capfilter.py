"""``runc``, minus the capabilities this machine cannot grant: a runtime for ``dockerd``.

Where it sits: ``tests.kind.engine`` starts Debian's ``dockerd`` (20.10) with this as its
default runtime when the machine's capability bounding set lacks some capability (in
sandboxes, ``CAP_SYS_RESOURCE`` for instance). ``docker run --privileged``, which kind
uses for its node containers, asks for every capability Docker knows; ``runc`` then fails
with "unable to apply caps: operation not permitted". For ``create`` and ``run`` this
rewrites the bundle's ``config.json`` so each capability set keeps only what the bounding
set holds, then runs ``runc`` with the same arguments; everything else goes to ``runc``
untouched; for ``exec`` the process spec (``--process``) is filtered the same way.
(containerd, which the kind node runs inside, already grants privileged
containers only the capabilities it has.)

Run as ``python3 capfilter.py RUNC ARGS...`` by the wrapper script the engine writes.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

NAMES = [
    "CHOWN", "DAC_OVERRIDE", "DAC_READ_SEARCH", "FOWNER", "FSETID", "KILL", "SETGID", "SETUID",
    "SETPCAP", "LINUX_IMMUTABLE", "NET_BIND_SERVICE", "NET_BROADCAST", "NET_ADMIN", "NET_RAW",
    "IPC_LOCK", "IPC_OWNER", "SYS_MODULE", "SYS_RAWIO", "SYS_CHROOT", "SYS_PTRACE", "SYS_PACCT",
    "SYS_ADMIN", "SYS_BOOT", "SYS_NICE", "SYS_RESOURCE", "SYS_TIME", "SYS_TTY_CONFIG", "MKNOD",
    "LEASE", "AUDIT_WRITE", "AUDIT_CONTROL", "SETFCAP", "MAC_OVERRIDE", "MAC_ADMIN", "SYSLOG",
    "WAKE_ALARM", "BLOCK_SUSPEND", "AUDIT_READ", "PERFMON", "BPF", "CHECKPOINT_RESTORE",
]  # fmt: skip
"""Capability numbers 0.., as <linux/capability.h> names them (without ``CAP_``)."""


def bounding() -> set[str]:
    """``CAP_*`` names in this process's bounding set."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("CapBnd:"):
            mask = int(line.split()[1], 16)
            return {f"CAP_{n}" for i, n in enumerate(NAMES) if mask >> i & 1}
    return {f"CAP_{n}" for n in NAMES}


def missing() -> list[str]:
    """Known capabilities this machine's bounding set lacks ([] on an ordinary host)."""
    last = int(Path("/proc/sys/kernel/cap_last_cap").read_text())
    have = bounding()
    return [f"CAP_{n}" for n in NAMES[: last + 1] if f"CAP_{n}" not in have]


def option(args: list[str], *names: str) -> str | None:
    for i, arg in enumerate(args):
        if arg in names and i + 1 < len(args):
            return args[i + 1]
        for name in names:
            if arg.startswith(f"{name}="):
                return arg.partition("=")[2]
    return None


def filter_config(path: Path, allowed: set[str], *, process: bool = False) -> None:
    """Keep only ``allowed`` capabilities in every set of the OCI config at ``path`` (or of
    the process spec ``runc exec --process`` reads, when ``process``)."""
    config = json.loads(path.read_text())
    holder = config if process else (config.get("process") or {})
    caps = holder.get("capabilities")
    if not isinstance(caps, dict):
        return
    for kind, names in caps.items():
        if isinstance(names, list):
            caps[kind] = [n for n in names if n in allowed]
    temp = path.with_name(path.name + ".caps")
    temp.write_text(json.dumps(config))
    os.replace(temp, path)


def main(argv: list[str]) -> None:
    runc, args = argv[0], argv[1:]
    if "create" in args or "run" in args:
        config = Path(option(args, "--bundle", "-b") or Path.cwd()) / "config.json"
        if config.exists():
            filter_config(config, bounding())
    elif "exec" in args:
        spec = option(args, "--process", "-p")
        if spec is not None and Path(spec).exists():
            filter_config(Path(spec), bounding(), process=True)
    os.execv(runc, [runc, *args])


if __name__ == "__main__":
    main(sys.argv[1:])
