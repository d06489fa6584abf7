"""The publish core without gRPC: attributes, target checks, mountinfo, reconcile."""

from __future__ import annotations

from pathlib import Path

import pytest

from csi import mounter
from csi.node.publish import Publisher
from csi.volume.request import PublishRequest
from rukpak.common import errors
from rukpak.image.cache import ImageCache
from rukpak.image.cachestate import Holder
from rukpak.image.seams import PullPolicy
from rukpak.oci.manifest import Platform
from rukpak.sources.volume import VolumeSource, credentials_from_secrets
from tests.publish_fakes import FakeMounter, no_network


@pytest.fixture
def publisher(tmp_path: Path) -> Publisher:
    (tmp_path / "kubelet").mkdir()
    images = ImageCache(tmp_path / "state", puller_factory=no_network)
    return Publisher(images=images, mounter=FakeMounter(), kubelet_dir=tmp_path / "kubelet")


def test_volume_attributes_parse_with_defaults_and_ignore_kubernetes_keys() -> None:
    source = VolumeSource.from_attributes(
        {"image": "quay.io/a/b:v1", "csi.storage.k8s.io/pod.name": "p"}
    )
    assert source == VolumeSource("quay.io/a/b:v1", PullPolicy.IF_NOT_PRESENT, None)
    full = VolumeSource.from_attributes(
        {"image": "quay.io/a/b:v1", "pullPolicy": "Never", "platform": "linux/arm64"}
    )
    assert full.attributes() == {
        "image": "quay.io/a/b:v1",
        "pullPolicy": "Never",
        "platform": "linux/arm64/v8",
    }


@pytest.mark.parametrize(
    "attributes",
    [{}, {"image": " "}, {"image": "a/b", "pullPolicy": "always"}, {"image": "a/b", "x": "y"}],
)
def test_bad_volume_attributes_are_invalid_argument(attributes: dict[str, str]) -> None:
    with pytest.raises(errors.InvalidArgument):
        VolumeSource.from_attributes(attributes)


def test_secrets_need_a_dockerconfigjson_key_and_none_means_anonymous() -> None:
    assert credentials_from_secrets({}) is None
    creds = credentials_from_secrets({".dockerconfigjson": '{"auths": {"r.io": {"auth": ""}}}'})
    assert creds is not None and creds.hosts() == ["r.io"]
    with pytest.raises(errors.InvalidArgument, match="dockerconfigjson"):
        credentials_from_secrets({"username": "u"})


@pytest.mark.parametrize(
    "target",
    ["relative/path", "/etc", "{kubelet}", "{kubelet}/../escape", "{kubelet}/pods/.."],
)
def test_targets_outside_the_kubelet_dir_are_invalid_argument(
    publisher: Publisher, target: str
) -> None:
    with pytest.raises(errors.InvalidArgument):
        publisher.check_target(target.format(kubelet=publisher.kubelet_dir))


def test_a_target_inside_the_kubelet_dir_is_accepted(publisher: Publisher) -> None:
    path = f"{publisher.kubelet_dir}/pods/uid/volumes/kubernetes.io~csi/v/mount"
    assert publisher.check_target(path) == Path(path)


def test_mountinfo_lines_are_parsed_and_unescaped() -> None:
    line = (
        "36 35 98:0 /state/unpacked/abc /var/lib/kubelet/pods/x/with\\040space ro,relatime "
        "master:1 - ext4 /dev/root rw,errors=continue"
    )
    (info,) = mounter.parse_mountinfo(line)
    assert info.mount_point == "/var/lib/kubelet/pods/x/with space"
    assert info.root == "/state/unpacked/abc"
    assert info.read_only


def test_reconcile_drops_vanished_mounts_and_adopts_unrecorded_ones(
    publisher: Publisher,
) -> None:
    images = publisher.images
    digest = "sha256:" + "a" * 64
    images.tree_path(digest).mkdir()
    images.hold(digest, Holder("/gone/target", "vol-gone", "r.io/a:v1"))
    adopted = str(publisher.kubelet_dir / "pods/p/mount")
    fake = publisher.mounter
    assert isinstance(fake, FakeMounter)
    fake.table.append(mounter.MountInfo(adopted, f"/anything/unpacked/{'a' * 64}", ("ro",)))
    fake.table.append(mounter.MountInfo("/elsewhere", f"/x/unpacked/{'a' * 64}", ("ro",)))
    publisher.reconcile()
    assert list(images.holders()) == [adopted]
    assert images.holder_digest(adopted) == digest


def test_unpublish_never_deletes_a_target_with_content(publisher: Publisher) -> None:
    target = publisher.kubelet_dir / "pods/p/mount"
    target.mkdir(parents=True)
    (target / "data").write_text("someone else's")
    with pytest.raises(errors.FailedPrecondition):
        publisher.unpublish("vol", str(target))
    assert (target / "data").exists()


def test_publish_uses_the_platform_attribute_or_the_nodes(tmp_path: Path) -> None:
    seen: list[Platform] = []

    class Recorder(ImageCache):
        def ensure(self, image, *, platform, **kwargs):  # type: ignore[no-untyped-def, override]
            seen.append(platform)
            raise errors.NotFound("stop here")

    (tmp_path / "kubelet").mkdir()
    images = Recorder(tmp_path / "state", puller_factory=no_network)
    pub = Publisher(
        images=images,
        mounter=FakeMounter(),
        kubelet_dir=tmp_path / "kubelet",
        platform=Platform.parse("linux/s390x"),
    )

    for attrs in ({"image": "r.io/a:v1"}, {"image": "r.io/a:v1", "platform": "linux/arm/v7"}):
        with pytest.raises(errors.NotFound):
            pub.publish(
                PublishRequest(
                    "v", str(tmp_path / "kubelet/t"), VolumeSource.from_attributes(attrs)
                )
            )
    assert [str(p) for p in seen] == ["linux/s390x", "linux/arm/v7"]
