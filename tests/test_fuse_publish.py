"""publishMode: the volume attribute, the plugin's default, and FUSE mode switched off."""

from __future__ import annotations

from pathlib import Path

import pytest

from csi.node.publish import Publisher
from csi.volume.request import PublishRequest
from rukpak.common import errors
from rukpak.sources.volume import VolumeSource
from tests.publish_fakes import offline_publisher


def _publisher(tmp_path: Path, default_mode: str) -> Publisher:
    return offline_publisher(tmp_path, default_mode=default_mode)


@pytest.mark.parametrize(
    ("attributes", "mode"),
    [({}, None), ({"publishMode": "bind"}, "bind"), ({"publishMode": "fuse"}, "fuse")],
)
def test_publish_mode_is_a_volume_attribute(attributes: dict[str, str], mode: str | None) -> None:
    source = VolumeSource.from_attributes({"image": "quay.io/a/b:v1", **attributes})
    assert source.publish_mode == mode
    assert source.attributes().get("publishMode") == mode


def test_an_unknown_publish_mode_is_invalid_argument() -> None:
    with pytest.raises(errors.InvalidArgument, match="publishMode 'nfs' is invalid"):
        VolumeSource.from_attributes({"image": "quay.io/a/b:v1", "publishMode": "nfs"})


@pytest.mark.parametrize(("default", "attribute"), [("fuse", None), ("bind", "fuse")])
def test_fuse_without_fuse_mode_on_is_failed_precondition(
    tmp_path: Path, default: str, attribute: str | None
) -> None:
    publisher = _publisher(tmp_path, default)
    target = tmp_path / "kubelet" / "pods" / "p" / "volumes" / "v"
    target.parent.mkdir(parents=True)
    source = VolumeSource("quay.io/a/b:v1", publish_mode=attribute)
    with pytest.raises(errors.FailedPrecondition, match="--fuse"):
        publisher.publish(PublishRequest("vol", str(target), source))
