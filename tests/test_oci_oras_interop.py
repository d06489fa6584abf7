"""Our client and the ``oras`` package read each other's pushes on the real registry.

oras is an independent implementation of the same protocol; agreeing with it
on the wire shows our pushes are ordinary OCI artifacts and our pulls read
what other tools write.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import oras.defaults
import oras.provider
import pytest

from rukpak.oci import mediatypes
from rukpak.oci.client import RegistryClient
from rukpak.oci.manifest import Manifest
from rukpak.oci.reference import Reference
from tests.registry import RegistryServer

pytestmark = pytest.mark.registry


def test_an_artifact_pushed_by_oras_pulls_verified_with_our_client(
    registry: RegistryServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))  # no stray docker config
    source = tmp_path / "bundle.tar"
    source.write_bytes(b"manifests go here" * 1000)
    target = f"{registry.host}/interop/{uuid.uuid4().hex[:8]}:v1"
    pusher = oras.provider.Registry(insecure=True)
    pusher.push(
        target=target,
        files=[f"{source}:{mediatypes.OCI_LAYER_TAR}"],
        disable_path_validation=True,
        quiet=True,
    )
    with RegistryClient() as client:
        ref = Reference.parse(target)
        desc, manifest = client.resolve_image(ref)
        layer = manifest.layers[0]
        client.fetch_blob(ref, layer, tmp_path / "pulled")
    assert desc.media_type == mediatypes.OCI_MANIFEST
    assert layer.annotations[oras.defaults.annotation_title] == "bundle.tar"
    assert (tmp_path / "pulled").read_bytes() == source.read_bytes()


def test_an_image_pushed_by_our_client_pulls_with_oras(
    registry: RegistryServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("HOME", str(tmp_path))
    ref = Reference.parse(f"{registry.host}/interop/{uuid.uuid4().hex[:8]}:v1")
    with RegistryClient() as client:
        config = client.push_blob(ref, b"{}", media_type=mediatypes.OCI_CONFIG)
        layer = client.push_blob(ref, b"plain file", media_type="text/plain")
        layer.annotations[oras.defaults.annotation_title] = "note.txt"
        manifest = Manifest(mediatypes.OCI_MANIFEST, config, [layer])
        client.push_manifest(ref, manifest.to_json(), mediatypes.OCI_MANIFEST)
    out = tmp_path / "out"
    files = oras.provider.Registry(insecure=True).pull(target=str(ref), outdir=str(out))
    assert [Path(f).name for f in files] == ["note.txt"]
    assert (out / "note.txt").read_bytes() == b"plain file"
