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
import json
import logging
import threading
from dataclasses import asdict, dataclass
from pathlib import Path

from csi.common import errors
from csi.common.fsio import write_json_atomic

log = logging.getLogger(__name__)

ID_PREFIX = "bundle-"


@dataclass(frozen=True)
class VolumeSpec:
    """What CreateVolume asked for, in the terms that decide compatibility."""

    name: str
    attributes: dict[str, str]
    required_bytes: int = 0
    limit_bytes: int = 0
    modes: tuple[int, ...] = ()


@dataclass(frozen=True)
class Volume:
    volume_id: str
    spec: VolumeSpec


def volume_id_for(name: str) -> str:
    return ID_PREFIX + hashlib.sha256(name.encode()).hexdigest()[:40]


class VolumeRegistry:
    """Provisioned volumes, persisted in ``path``. Thread-safe."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self._lock = threading.Lock()
        self._volumes: dict[str, VolumeSpec] = {}
        path.parent.mkdir(mode=0o700, parents=True, exist_ok=True)
        try:
            raw = json.loads(path.read_text(encoding="utf-8"))
            for volume_id, spec in raw.get("volumes", {}).items():
                spec["modes"] = tuple(spec.get("modes", ()))
                self._volumes[volume_id] = VolumeSpec(**spec)
        except FileNotFoundError:
            pass
        except (OSError, ValueError, TypeError) as exc:
            log.warning("msg=%r path=%s error=%r", "volume record unreadable", path, str(exc))

    def _save(self) -> None:
        write_json_atomic(self.path, {"volumes": {k: asdict(v) for k, v in self._volumes.items()}})

    def create(self, spec: VolumeSpec) -> Volume:
        """Record ``spec``; idempotent for an identical spec, AlreadyExists otherwise."""
        volume_id = volume_id_for(spec.name)
        with self._lock:
            existing = self._volumes.get(volume_id)
            if existing is not None:
                if existing.attributes != spec.attributes:
                    raise errors.AlreadyExists(
                        f"volume {spec.name!r} exists with other parameters "
                        f"({existing.attributes}); use another name or delete it first"
                    )
                if (existing.required_bytes, existing.limit_bytes) != (
                    spec.required_bytes,
                    spec.limit_bytes,
                ):
                    raise errors.AlreadyExists(
                        f"volume {spec.name!r} exists with another capacity range; "
                        "use another name or delete it first"
                    )
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
