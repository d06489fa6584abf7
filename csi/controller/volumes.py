"""The controller's record of provisioned volumes: name → id, source and capacity.

Where it sits: the core of the Controller service (``csi.controller.server``).
A bundle volume has no storage to allocate: its content is the image named in
its volume context, pulled by each node. What CreateVolume must still provide
is idempotency (the same name gives the same volume; the same name with other
parameters or capacity is AlreadyExists) and DeleteVolume/Validate must know
which ids exist. That record is a JSON file written atomically (temp, fsync,
rename, fsync dir). Volume ids derive from the name, so a retried CreateVolume
always gets the same id.
"""

from __future__ import annotations

import hashlib
import logging
import os
import threading
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from rukpak.common import errors
from rukpak.common.fsio import read_json_or_set_aside, write_json_atomic

log = logging.getLogger(__name__)

ID_PREFIX = "bundle-"


@dataclass(frozen=True)
class VolumeSpec:
    """What CreateVolume asked for, in the terms that decide compatibility, and what it
    answered: ``attributes`` are the requested (normalised) parameters, ``context`` the
    volume context returned (the image pinned to a digest). Records written before
    ``context`` existed have none: their attributes are their context."""

    name: str
    attributes: dict[str, str]
    required_bytes: int = 0
    limit_bytes: int = 0
    modes: tuple[int, ...] = ()
    context: dict[str, str] = field(default_factory=dict)

    @property
    def volume_context(self) -> dict[str, str]:
        return self.context or self.attributes


@dataclass(frozen=True)
class Volume:
    volume_id: str
    spec: VolumeSpec


def volume_id_for(name: str) -> str:
    return ID_PREFIX + hashlib.sha256(name.encode()).hexdigest()[:40]


def _check_compatible(existing: VolumeSpec, spec: VolumeSpec) -> None:
    if existing.attributes != spec.attributes:
        raise errors.AlreadyExists(
            f"volume {spec.name!r} exists with other parameters "
            f"({existing.attributes}); use another name or delete it first"
        )
    if (existing.required_bytes, existing.limit_bytes) != (spec.required_bytes, spec.limit_bytes):
        raise errors.AlreadyExists(
            f"volume {spec.name!r} exists with another capacity range; "
            "use another name or delete it first"
        )


class VolumeRegistry:
    """Provisioned volumes, persisted in ``path``. Thread-safe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._volumes: dict[str, VolumeSpec] = {}
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        raw = read_json_or_set_aside(path)  # a broken file is kept aside, never overwritten
        try:
            for volume_id, spec in (raw or {}).get("volumes", {}).items():
                spec["modes"] = tuple(spec.get("modes", ()))
                spec.setdefault("context", {})
                self._volumes[volume_id] = VolumeSpec(**spec)
        except (AttributeError, TypeError) as exc:
            # Valid JSON of the wrong shape: keep it aside too, before the next write.
            aside = path.with_name(f"{path.name}.bad-{time.time_ns()}")
            os.replace(path, aside)
            self._volumes.clear()
            log.error(
                "msg=%r path=%s kept_as=%s error=%r",
                "volume records malformed; kept aside, starting empty",
                path,
                aside,
                str(exc)[:200],
            )

    def _save(self) -> None:
        write_json_atomic(self.path, {"volumes": {k: asdict(v) for k, v in self._volumes.items()}})

    def existing(self, spec: VolumeSpec) -> Volume | None:
        """The volume already recorded under ``spec.name`` if it is compatible with
        ``spec``; None when there is none; AlreadyExists when it differs."""
        volume_id = volume_id_for(spec.name)
        with self._lock:
            found = self._volumes.get(volume_id)
        if found is None:
            return None
        _check_compatible(found, spec)
        return Volume(volume_id, found)

    def create(self, spec: VolumeSpec) -> Volume:
        """Record ``spec``; idempotent for a compatible spec (the first record wins, with
        its context), AlreadyExists otherwise."""
        volume_id = volume_id_for(spec.name)
        with self._lock:
            existing = self._volumes.get(volume_id)
            if existing is not None:
                _check_compatible(existing, spec)
                return Volume(volume_id, existing)
            self._volumes[volume_id] = spec
            self._save()
        return Volume(volume_id, spec)

    def get(self, volume_id: str) -> Volume | None:
        with self._lock:
            spec = self._volumes.get(volume_id)
        return None if spec is None else Volume(volume_id, spec)

    def delete(self, volume_id: str) -> bool:
        """Forget a volume; False if it was unknown (which is success for callers)."""
        with self._lock:
            if self._volumes.pop(volume_id, None) is None:
                return False
            self._save()
        return True
