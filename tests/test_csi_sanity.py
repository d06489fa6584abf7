"""csi-sanity (kubernetes-csi/csi-test) against the real plugin process and registry.

The binary comes from the cluster build cache (``make k8s-bins``); the test is
skipped when it is not built. Volumes are created with ``image`` pointing at a
bundle pushed to the test registry, and sanity's mount dir lies under the
plugin's kubelet dir, which is the only place the plugin mounts.
"""

from __future__ import annotations

import os
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster import bins
from tests.csi_helpers import PluginProcess, simple_image
from tests.registry import RegistryServer

pytestmark = [
    pytest.mark.registry,
    pytest.mark.slow,
    pytest.mark.skipif(os.geteuid() != 0, reason="bind mounts need root"),
]


@pytest.fixture
def sanity_binary() -> Path:
    path = bins.find("csi-sanity")
    if path is None:
        pytest.skip("csi-sanity is not built (make k8s-bins)")
    return path


@pytest.fixture
def plugin(tmp_path: Path) -> Iterator[PluginProcess]:
    proc = PluginProcess(tmp_path / "plugin").start()
    try:
        yield proc
    finally:
        proc.stop()
        proc.unmount_all()


def test_csi_sanity_passes(
    sanity_binary: Path, plugin: PluginProcess, registry: RegistryServer, tmp_path: Path
) -> None:
    image = simple_image(registry.host, "sanity/bundle", text="kind: ConfigMap")
    params = tmp_path / "params.yaml"
    params.write_text(f"image: {image.ref}\npullPolicy: IfNotPresent\n")
    sanity_dir = plugin.kubelet_dir / "sanity"
    sanity_dir.mkdir()
    result = subprocess.run(
        [
            str(sanity_binary),
            f"--csi.endpoint=unix://{plugin.socket}",
            f"--csi.mountdir={sanity_dir / 'mount'}",
            f"--csi.stagingdir={sanity_dir / 'staging'}",
            f"--csi.testvolumeparameters={params}",
            "--csi.testvolumesize=1048576",
            "--ginkgo.no-color",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    summary = "\n".join(result.stdout.splitlines()[-60:])
    assert result.returncode == 0, f"csi-sanity failed:\n{summary}\n{result.stderr[-3000:]}"
    assert " 0 Failed" in result.stdout
    print(next(line for line in result.stdout.splitlines() if " Passed " in line))
