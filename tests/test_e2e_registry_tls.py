"""End to end: a v1alpha2 BundleDeployment whose image is on a registry with a private CA
installs through the local kubelet when its source gives the CA as ``certificateData``.

RukPak is installed from ``deploy/`` (``standing_system``: the standing provisioner
takes every run, no pod is started for any change (checked after each test)); the registry is a
docker-registry serving HTTPS on the host's loopback with a certificate signed by a CA
this test makes, reachable from the manager and the node plugin (both run with
hostNetwork here). certificateData that is not PEM is a condition naming the field; with
another CA's certificate the condition names the registry and
"unknown authority"; with the right one the manager pins the tag, the run's
volume (asked of the store volume by the standing provisioner) carries the CA to the node
plugin, and the bundle installs.
"""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest
import yaml

from provisioner.engine.objects import ObjectRef
from rukpak.oci import tls as source_tls
from tests import bundles, csi_helpers, tls_helpers
from tests import install_helpers as inst
from tests.polling import eventually
from tests.registry import RegistryServer

pytestmark = [pytest.mark.cluster, pytest.mark.slow]

SUFFIX = uuid.uuid4().hex[:6]


def test_a_bundledeployment_with_certificate_data_installs_from_a_private_ca_registry(
    standing_system: inst.RukpakSystem, tmp_path: Path
) -> None:
    system = standing_system
    name = ns = f"tls-{SUFFIX}"
    ca, other_ca = tls_helpers.make_ca(), tls_helpers.make_ca("another-ca")
    serving = tls_helpers.issue(ca, tmp_path / "pki", "registry")
    registry = RegistryServer.start(tmp_path / "registry", tls=serving)
    try:
        docs = [bundles.namespace(ns), bundles.configmap("greeting", ns, greeting="private-ca")]
        entries: list[csi_helpers.Entry] = [
            ("manifests/", "dir"),
            ("manifests/cm.yaml", "file", yaml.safe_dump_all(docs).encode()),
        ]
        with source_tls.using(source_tls.SourceTLS(ca_pem=ca.pem)):
            pushed = csi_helpers.push_image(registry.host, f"tls-{SUFFIX}", "v1", [entries])
        source = {"type": "image", "image": {"ref": pushed.ref, "certificateData": "not PEM"}}
        system.kube.create(inst.bd_v2(name, pushed.ref, installNamespace=ns, source=source))
        bad = eventually(
            lambda: c if "PEM" in (c := inst.cond_v2(system, name, "Unpacked"))[2] else None,
            timeout=120,
            what="certificateData that is not PEM refused",
        )
        assert bad[0] == "False" and "source.image.certificateData" in bad[2], bad
        source["image"]["certificateData"] = other_ca.pem  # type: ignore[index]
        inst.set_source_v2(system, name, source)
        refused = eventually(
            lambda: (
                c
                if "unknown authority" in (c := inst.cond_v2(system, name, "Unpacked"))[2]
                else None
            ),
            timeout=120,
            what="the registry's certificate refused with another CA",
        )
        assert refused[0] == "False" and f"registry {registry.host}" in refused[2], refused
        source["image"]["certificateData"] = ca.pem  # type: ignore[index]
        inst.set_source_v2(system, name, source)
        inst.installed_v2(system, name, what="installed with the registry's CA")
        cm = system.kube.get(ObjectRef("", "v1", "ConfigMap", ns, "greeting")) or {}
        assert cm.get("data") == {"greeting": "private-ca"}
        resolved = inst.live_v2(system, name)["status"]["resolvedSource"]["image"]
        assert resolved["ref"] == f"{pushed.ref.rsplit(':', 1)[0]}@{pushed.manifest_digest}"
        assert resolved["certificateData"] == ca.pem
        assert registry.count_requests("GET", rf"/blobs/{pushed.blob_digests[1]}") >= 1
    finally:
        inst.delete_v2(system, name)
        registry.stop()
