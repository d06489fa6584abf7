"""Events on the pods whose volumes' signatures the node plugin checked: Normal
``SignatureVerified`` naming the digest, the policy and the authority that signed; Warning
``SignatureRefused`` with the policy's reason.

Real components: the test registry, and a kube-apiserver (session fixture; run under
``flock /tmp/rukpak-cluster.lock``) to which :class:`csi.node.policies.PolicyWatch` posts
the events. The publish spine (``csi.node.publish``, the fake mounter of the other spine
tests) checks signatures made here with ``rukpak.signing.sign``; each test waits for its
event with a watch.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from kubernetes import client, watch

from csi.node.policies import PolicyWatch
from csi.node.publish import Publisher
from csi.volume.request import PodRef, PublishRequest
from rukpak.image.cache import ImageCache
from rukpak.oci.manifest import Platform
from rukpak.signing import keys
from rukpak.signing import sign as signer
from rukpak.signing.gate import SignatureDenied
from rukpak.sources.volume import VolumeSource
from tests.e2e_helpers import api
from tests.publish_fakes import FakeMounter
from tests.registry import RegistryServer
from tests.signing_helpers import private_pem, public_pem
from tests.test_signing import client as registry_client
from tests.test_signing import gate_of, image, key_authority, policy_for

pytestmark = [pytest.mark.registry, pytest.mark.cluster]
EVENT_WAIT = 60


@pytest.fixture(scope="module")
def core(kube_apiserver: Any) -> Iterator[client.CoreV1Api]:
    made = api(kube_apiserver)
    try:
        yield client.CoreV1Api(made)
    finally:
        made.close()  # type: ignore[no-untyped-call]


@pytest.fixture
def pod(core: client.CoreV1Api) -> Iterator[PodRef]:
    """A pod object (never scheduled: the spine is driven directly) in a namespace of its own."""
    namespace = f"events-{uuid.uuid4().hex[:8]}"
    core.create_namespace(client.V1Namespace(metadata=client.V1ObjectMeta(name=namespace)))
    core.create_namespaced_service_account(  # no controller-manager here makes it
        namespace, client.V1ServiceAccount(metadata=client.V1ObjectMeta(name="default"))
    )
    made = core.create_namespaced_pod(
        namespace,
        client.V1Pod(
            metadata=client.V1ObjectMeta(name="reader"),
            spec=client.V1PodSpec(
                containers=[client.V1Container(name="c", image="pause")],
                automount_service_account_token=False,
            ),
        ),
    )
    try:
        yield PodRef(namespace, "reader", str(made.metadata.uid))
    finally:
        core.delete_namespace(namespace)


def wait_for_event(core: client.CoreV1Api, pod: PodRef, reason: str) -> Any:
    """The first event ``reason`` on ``pod``, watched for (AssertionError after EVENT_WAIT)."""
    selector = f"involvedObject.uid={pod.uid},reason={reason}"
    found = core.list_namespaced_event(pod.namespace, field_selector=selector)
    if found.items:
        return found.items[0]
    stream = watch.Watch()  # type: ignore[no-untyped-call]
    for change in stream.stream(  # type: ignore[no-untyped-call]
        core.list_namespaced_event,
        pod.namespace,
        field_selector=selector,
        resource_version=found.metadata.resource_version,
        timeout_seconds=EVENT_WAIT,
    ):
        stream.stop()  # type: ignore[no-untyped-call]
        return change["object"]
    raise AssertionError(f"no {reason} event on pod {pod} within {EVENT_WAIT}s")


def spine(tmp_path: Path, core: client.CoreV1Api, *policies: Any) -> Publisher:
    events = PolicyWatch(core.api_client, namespace="rukpak-system", node="node-events")
    (tmp_path / "kubelet").mkdir()
    return Publisher(
        images=ImageCache(tmp_path / "images", puller_factory=registry_client),
        mounter=FakeMounter(),
        kubelet_dir=tmp_path / "kubelet",
        platform=Platform.parse("linux/amd64"),
        gate=gate_of(*policies),
        events=events.post_event,
    )


def publish(pub: Publisher, tmp_path: Path, ref: str, pod: PodRef) -> Path:
    target = tmp_path / "kubelet" / "pods" / pod.uid / "volumes" / "vol"
    target.parent.mkdir(parents=True)
    request = PublishRequest("vol-events", str(target), VolumeSource(image=ref), pod=pod)
    return pub.publish(request)


def test_a_pod_whose_volume_passed_the_signature_gate_gets_a_normal_event_naming_the_signer(
    registry: RegistryServer, core: client.CoreV1Api, pod: PodRef, tmp_path: Path
) -> None:
    pushed = image(registry, "events/signed")
    key = ec.generate_private_key(ec.SECP256R1())
    with registry_client() as c:
        signer.sign(c, pushed.ref, keys.load_private_key(private_pem(key), None))
    policy = policy_for(f"{registry.host}/events/*", key_authority(public_pem(key)), name="rel")
    publish(spine(tmp_path, core, policy), tmp_path, pushed.ref, pod)
    event = wait_for_event(core, pod, "SignatureVerified")
    assert event.type == "Normal"
    assert event.involved_object.name == "reader" and event.involved_object.kind == "Pod"
    assert pushed.manifest_digest in event.message
    assert "ClusterBundlePolicy 'rel': signed for authority 'release'" in event.message
    assert event.source.component == "csi.rukpak.io" and event.source.host == "node-events"


def test_a_pod_whose_volume_was_refused_gets_a_warning_event_with_the_reason(
    registry: RegistryServer, core: client.CoreV1Api, pod: PodRef, tmp_path: Path
) -> None:
    pushed = image(registry, "events/unsigned")
    key = ec.generate_private_key(ec.SECP256R1())
    policy = policy_for(f"{registry.host}/events/*", key_authority(public_pem(key)), name="rel")
    with pytest.raises(SignatureDenied):
        publish(spine(tmp_path, core, policy), tmp_path, pushed.ref, pod)
    event = wait_for_event(core, pod, "SignatureRefused")
    assert event.type == "Warning"
    assert "refused by ClusterBundlePolicy 'rel'" in event.message
    assert "no signature found" in event.message
    verified = core.list_namespaced_event(
        pod.namespace, field_selector=f"involvedObject.uid={pod.uid},reason=SignatureVerified"
    )
    assert verified.items == []
