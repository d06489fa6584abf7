"""End to end: signed bundles on the local kubelet, RukPak installed from ``deploy/``.

A ClusterBundlePolicy whose key lives in a Secret of the system namespace selects one
repository of the test registry. Checked here, with the DaemonSet, the manager and the
standing provisioner as users install them (``standing_system``: the standing provisioner
asks the store volume for each run's content, which the node plugin checks against the
policies as it checks a pod's volume; no pod is started for any change, checked after each
test):

- the manager says the policy is Valid, and says what is wrong with one whose Secret is
  missing (``kubectl get clusterbundlepolicies`` shows both);
- a pod mounting an unsigned bundle (bind and FUSE mode), or one signed with another key,
  never starts: its FailedMount event names the policy and the reason, and the node's
  cache holds nothing of that image;
- a bundle signed by ``cosign`` (built from its Go module) mounts and is read;
- a v1alpha2 BundleDeployment of an unsigned image reports ``Unpacked=False`` with reason
  SignatureVerificationFailed and installs nothing, and once the image is signed (``rukpak
  bundle sign``) it installs; ``Verified`` says first which policy refused it, then which
  policy and key verified it; a v1alpha1 one reports ``HasValidBundle=False`` with that
  reason.
"""

from __future__ import annotations

import base64
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec
from kubernetes import client

from provisioner.engine.objects import ObjectRef
from provisioner.manager import model
from rukpak.oci.client import RegistryClient
from rukpak.oci.reference import Reference
from rukpak.signing import keys
from rukpak.signing import policy as signing
from rukpak.signing import sign as signer
from tests import bundles
from tests import e2e_helpers as e2e
from tests import install_helpers as inst
from tests.polling import eventually
from tests.signing_helpers import Cosign, cosign, private_pem, public_pem

pytestmark = [pytest.mark.cluster, pytest.mark.slow]
__all__ = ["cosign"]  # the session fixture, used by name

SUFFIX = uuid.uuid4().hex[:6]
POLICY = f"e2e-signed-{SUFFIX}"
SECRET = f"e2e-signing-{SUFFIX}"
PLUGIN = "app.kubernetes.io/name=rukpak-csi,app.kubernetes.io/component=node-plugin"


def policy_ref(name: str) -> ObjectRef:
    return ObjectRef(signing.GROUP, signing.VERSION, signing.KIND, "", name)


def valid(system: inst.RukpakSystem, name: str) -> tuple[str, str, str] | None:
    found = inst.conditions(system.kube.get(policy_ref(name))).get("Valid")
    if not found:
        return None
    return str(found["status"]), str(found["reason"]), str(found["message"])


def plugin_log(core: client.CoreV1Api) -> str:
    pods = core.list_namespaced_pod(inst.NAMESPACE, label_selector=PLUGIN).items
    return "".join(
        str(core.read_namespaced_pod_log(str(p.metadata.name), inst.NAMESPACE, container="plugin"))
        for p in pods
    )


@dataclass
class Signed:
    system: inst.RukpakSystem
    key: ec.EllipticCurvePrivateKey
    repo: str  # registry/repository prefix the policy selects

    def push(self, root: Path, name: str, *, text: str = "hello") -> str:
        ns = f"sig-{name}-{SUFFIX}"
        inst.hello_bundle(root / name, namespace=ns, image=self.system.busybox_image, greeting=text)
        ref = f"{self.repo}/{name}:v1"
        e2e.push_bundle(root / name, ref)
        return ref

    def sign(self, ref: str) -> str:
        with RegistryClient(timeout=10) as c:
            return signer.sign(c, ref, self.key).digest

    def deploy_unsigned(
        self, root: Path, version: str, doc: Callable[[str, str], dict[str, Any]]
    ) -> tuple[str, str]:
        """Push the hello bundle unsigned and create the BundleDeployment ``doc(name, ref)``
        of it, named ``sig-<version>-<suffix>``: (its name, the bundle's ref)."""
        ref = self.push(root, f"{version}-deploy")
        name = f"sig-{version}-{SUFFIX}"
        self.system.kube.create(doc(name, ref))
        return name, ref


def signature_refusal(read: Callable[[], dict[str, Any] | None], condition: str) -> dict[str, Any]:
    """Condition ``condition`` of the object ``read`` returns, once its reason says the
    signature check refused the bundle."""

    def found() -> dict[str, Any] | None:
        c = inst.conditions(read()).get(condition)
        return c if c and c.get("reason") == "SignatureVerificationFailed" else None

    return eventually(found, timeout=90, what=f"{condition} SignatureVerificationFailed")


@pytest.fixture(scope="module")
def signed(standing_system: inst.RukpakSystem, core: client.CoreV1Api) -> Iterator[Signed]:
    """The policy (enforce, key in a Secret) in force: Valid, and loaded by the plugin."""
    system = standing_system
    key = ec.generate_private_key(ec.SECP256R1())
    repo = f"{system.registry_host}/e2e-signed-{SUFFIX}"
    core.create_namespaced_secret(
        inst.NAMESPACE,
        client.V1Secret(
            metadata=client.V1ObjectMeta(name=SECRET),
            data={"cosign.pub": base64.b64encode(public_pem(key)).decode()},
        ),
    )
    system.kube.create(
        {
            "apiVersion": f"{signing.GROUP}/{signing.VERSION}",
            "kind": signing.KIND,
            "metadata": {"name": POLICY},
            "spec": {
                "images": [{"glob": f"{repo}/**"}],
                "authorities": [{"name": "release", "key": {"secretRef": {"name": SECRET}}}],
            },
        }
    )
    try:
        eventually(lambda: valid(system, POLICY), timeout=60, what="the policy's Valid condition")
        eventually(
            lambda: f"{POLICY}@1" in plugin_log(core),
            timeout=60,
            what="the node plugin to load the policy",
        )
        yield Signed(system, key, repo)
    finally:
        system.kubectl("delete", "clusterbundlepolicy", POLICY, "--ignore-not-found")
        core.delete_namespaced_secret(SECRET, inst.NAMESPACE)


@pytest.fixture(scope="module")
def namespace(core: client.CoreV1Api) -> Iterator[str]:
    with e2e.temporary_namespace(core, "e2e-sig") as name:
        yield name


def test_the_manager_says_which_policies_are_valid(
    signed: Signed, standing_system: inst.RukpakSystem
) -> None:
    system = standing_system
    assert valid(system, POLICY) == (
        "True",
        "Valid",
        f"refuses images matching {signed.repo}/** unless signed for 1 authority: release",
    )
    broken = f"{POLICY}-no-secret"
    system.kube.create(
        {
            "apiVersion": f"{signing.GROUP}/{signing.VERSION}",
            "kind": signing.KIND,
            "metadata": {"name": broken},
            "spec": {
                "images": [{"glob": "example.invalid/nothing/**"}],
                "authorities": [{"name": "gone", "key": {"secretRef": {"name": "no-such"}}}],
                "mode": "warn",
            },
        }
    )
    try:
        status, reason, message = eventually(
            lambda: valid(system, broken), timeout=60, what="Valid on the broken policy"
        )
        assert (status, reason) == ("False", "KeyUnavailable")
        assert f"Secret {inst.NAMESPACE}/no-such not found" in message
        table = system.kubectl("get", "clusterbundlepolicies")
        assert "MODE" in table and "VALID" in table
        assert POLICY in table and "enforce" in table and "warn" in table
    finally:
        system.kubectl("delete", "clusterbundlepolicy", broken, "--ignore-not-found")


@pytest.mark.parametrize(
    ("mode", "signer_key", "reason"),
    [
        ("bind", None, "no signature found"),
        ("fuse", None, "no signature found"),
        ("bind", "another", "no signature verifies with key"),
    ],
)
def test_an_unsigned_or_wrongly_signed_bundle_never_reaches_a_pod(
    signed: Signed,
    core: client.CoreV1Api,
    namespace: str,
    tmp_path: Path,
    mode: str,
    signer_key: str | None,
    reason: str,
) -> None:
    ref = signed.push(tmp_path, f"refused-{mode}-{signer_key or 'none'}")
    if signer_key is not None:
        with RegistryClient(timeout=10) as c:
            signer.sign(c, ref, ec.generate_private_key(ec.SECP256R1()))
    digest = RegistryClient(timeout=10).resolve(Reference.parse(ref)).digest
    name = f"refused-{mode}-{uuid.uuid4().hex[:6]}"
    volume = e2e.inline_bundle_volume(ref)
    volume.csi.volume_attributes = {"image": ref, "publishMode": mode}
    e2e.start_bundle_pod(
        core,
        namespace,
        name,
        image=signed.system.busybox_image,
        command="cat /bundle/manifests/*",
        volume=volume,
    )
    messages = eventually(
        lambda: [m for m in e2e.failed_mount_messages(core, namespace, name) if POLICY in m],
        timeout=90,
        what="a FailedMount event naming the policy",
    )
    assert "PermissionDenied" in messages[0]
    assert f"refused by ClusterBundlePolicy '{POLICY}'" in messages[0]
    assert reason in messages[0]
    assert core.read_namespaced_pod(name, namespace).status.phase == "Pending"
    hex_digest = digest.partition(":")[2]
    state = signed.system.state_dir
    assert not list(state.glob(f"**/{hex_digest}*")), "nothing of the image is cached"
    e2e.delete_pod_and_wait(core, namespace, name)


def test_a_bundle_signed_with_cosign_mounts(
    signed: Signed,
    core: client.CoreV1Api,
    namespace: str,
    cosign: Cosign,
    tmp_path: Path,
) -> None:
    ref = signed.push(tmp_path, "by-cosign")
    key_file = tmp_path / "release.pem"
    key_file.write_bytes(private_pem(signed.key))
    import_dir = cosign.home / f"import-{SUFFIX}"
    import_dir.mkdir()
    cosign.run(
        "import-key-pair", "--key", str(key_file), "--output-key-prefix", str(import_dir / "k")
    )
    cosign.sign(ref, import_dir / "k.key")
    name = f"signed-{uuid.uuid4().hex[:6]}"
    e2e.start_bundle_pod(
        core,
        namespace,
        name,
        image=signed.system.busybox_image,
        command="cat /bundle/manifests/*configmap*; sleep 3600",
        volume=e2e.inline_bundle_volume(ref),
    )
    log = eventually(
        lambda: core.read_namespaced_pod_log(name, namespace) or None,
        timeout=90,
        what="the signed bundle's pod to print its manifest",
    )
    assert "greeting" in log
    e2e.delete_pod_and_wait(core, namespace, name)


def test_a_bundledeployment_of_an_unsigned_image_fails_to_unpack_until_it_is_signed(
    signed: Signed, standing_system: inst.RukpakSystem, tmp_path: Path
) -> None:
    system = standing_system
    name, ref = signed.deploy_unsigned(tmp_path, "v2", inst.bd_v2)
    unpacked = signature_refusal(lambda: inst.live_v2(system, name), "Unpacked")
    assert unpacked["status"] == "False"
    assert f"refused by ClusterBundlePolicy '{POLICY}'" in str(unpacked["message"])
    assert inst.cond_v2(system, name, "Installed")[0] != "True"
    events = system.kubectl(
        "get", "events", "-A", "--field-selector", f"involvedObject.name={name}"
    )
    assert "SignatureVerificationFailed" in events
    refused = inst.cond_v2(system, name, "Verified")
    assert refused[:2] == ("False", "SignatureVerificationFailed"), refused
    assert f"refused by ClusterBundlePolicy '{POLICY}'" in refused[2]
    signed.sign(ref)
    inst.installed_v2(system, name, what="Installed once the image is signed")
    verified = inst.cond_v2(system, name, "Verified")
    assert verified[:2] == ("True", "Verified"), verified
    by = f"(key {keys.fingerprint(signed.key.public_key())})"
    assert f"ClusterBundlePolicy '{POLICY}': signed for authority" in verified[2], verified
    assert by in verified[2], verified
    inst.delete_v2(system, name)


def test_a_v1alpha1_bundledeployment_says_its_bundle_is_not_valid(
    signed: Signed, standing_system: inst.RukpakSystem, tmp_path: Path
) -> None:
    system = standing_system
    name, _ = signed.deploy_unsigned(tmp_path, "v1", bundles.bundle_deployment)
    bd = ObjectRef(model.GROUP, model.VERSION, model.BUNDLE_DEPLOYMENT, "", name)
    found = signature_refusal(lambda: system.kube.get(bd), "HasValidBundle")
    assert found["status"] == "False"
    assert POLICY in str(found["message"])

    def bundle_verified() -> dict[str, Any] | None:  # the pin is the Bundle's: so is Verified
        items, _ = system.kube.list(
            f"{model.GROUP}/{model.VERSION}", model.BUNDLE,
            label_selector=f"core.rukpak.io/owner-name={name}",
        )  # fmt: skip
        conds = [inst.conditions(b).get("Verified") for b in items]
        return next((c for c in conds if c), None)

    refused = eventually(bundle_verified, timeout=60, what="the Bundle's Verified condition")
    assert (refused["status"], refused["reason"]) == ("False", "SignatureVerificationFailed")
    assert f"refused by ClusterBundlePolicy '{POLICY}'" in refused["message"]
    system.kubectl("delete", "bundledeployment", name, timeout=150)
