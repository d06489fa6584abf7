"""RFC 3161 timestamps on signatures, against real components: sigstore's timestamp
authority (``timestamp-server``, built from its Go module by ``hack/gotool.sh tsa``, with
its in-memory signer and its own test chain) on loopback, the test registry, and cosign
2.6.5 and 3.1.3 signing with it (cosign 2: ``--timestamp-server-url``, the timestamp in a
layer annotation; cosign 3: a signing config naming the TSA, the timestamp in the
Sigstore bundle).

A ClusterBundlePolicy authority with ``rfc3161timestamp.certificateChain`` accepts a
signature only when one of its timestamps verifies under that chain over the signature:
the TSA's own chain is accepted, another chain is refused, and so is a signature without
a timestamp.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import json
import re
import subprocess
import sys
import time
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec

from rukpak.common import errors
from rukpak.oci.client import RegistryClient
from rukpak.oci.reference import Reference
from rukpak.signing import discover, keys, sigstore, timestamps, verify
from rukpak.signing import policy as signing
from rukpak.signing.discover import Found
from rukpak.signing.gate import SignatureDenied
from tests import signing_helpers, tls_helpers
from tests.csi_helpers import PushedImage, simple_image
from tests.registry import RegistryServer, _die_with_parent, free_port
from tests.signing_helpers import GOTOOL, Cosign, cosign, cosign3
from tests.test_signing import gate_of, key_authority

pytestmark = pytest.mark.registry
__all__ = ["cosign", "cosign3"]  # the session fixtures, used by name
START_TIMEOUT = 60.0
NAME = "registry.example.com/bundles/app"
DIGEST = "sha256:" + "a" * 64
DER = serialization.Encoding.DER


@dataclasses.dataclass(frozen=True)
class TSA:
    url: str  # the timestamp API cosign is given
    chain: str  # the TSA's certificate chain (PEM: leaf, intermediate, root)


def _tsa_binary() -> Path:
    done = subprocess.run(
        ["bash", str(GOTOOL), "tsa", "--quiet"], capture_output=True, text=True, timeout=900
    )
    if done.returncode != 0:
        pytest.fail(f"hack/gotool.sh tsa failed (it needs go):\n{done.stderr}")
    found = subprocess.run(
        ["bash", str(GOTOOL), "tsa", "--print-path"], capture_output=True, text=True, check=True
    )
    return Path(found.stdout.strip())


@pytest.fixture(scope="module")
def tsa(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TSA]:
    binary = _tsa_binary()
    port = free_port()
    log = tmp_path_factory.mktemp("tsa") / "tsa.log"
    with open(log, "wb") as out:
        process = subprocess.Popen(
            [str(binary), "serve", "--host", "127.0.0.1", "--port", str(port),
             "--timestamp-signer", "memory"],
            stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
            preexec_fn=_die_with_parent,
        )  # fmt: skip
    base = f"http://127.0.0.1:{port}/api/v1/timestamp"
    try:
        chain = ""
        deadline = time.monotonic() + START_TIMEOUT
        while not chain and time.monotonic() < deadline and process.poll() is None:
            with contextlib.suppress(requests.RequestException):
                answer = requests.get(f"{base}/certchain", timeout=2)
                if answer.status_code == 200:
                    chain = answer.text
                    break
            time.sleep(0.1)  # the server is starting: no event to wait on but its port
        if not chain:
            pytest.fail(f"timestamp-server did not start:\n{log.read_text()[-2000:]}")
        yield TSA(url=base, chain=chain)
    finally:
        process.terminate()
        try:
            process.wait(timeout=10)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=10)


def pinned(pushed: PushedImage) -> str:
    return f"{Reference.parse(pushed.ref).name}@{pushed.manifest_digest}"


def policy_for(glob: str, public: bytes, chain: str | None, *, name: str = "stamped") -> Any:
    authority: dict[str, Any] = key_authority(public)
    if chain is not None:
        authority["rfc3161timestamp"] = {"certificateChain": chain}
    return signing.parse(
        {
            "metadata": {"name": name, "uid": f"uid-{name}", "generation": 1},
            "spec": {"images": [{"glob": glob}], "authorities": [authority]},
        }
    )


def sign2(c: Cosign, pushed: PushedImage, key: Path, tsa: TSA | None) -> None:
    extra = ["--timestamp-server-url", tsa.url] if tsa else []
    c.sign(pinned(pushed), key, *extra)


def sign3(c: Cosign, pushed: PushedImage, key: Path, tsa: TSA | None) -> None:
    config = c.home / ("sc-tsa.json" if tsa else "sc.json")
    if not config.exists():
        spec = [
            "--tsa", f"url={tsa.url},api-version=1,start-time=2024-01-01T00:00:00Z,operator=local",
            "--tsa-config", "ANY",
        ] if tsa else []  # fmt: skip
        c.run("signing-config", "create", *spec, "--out", str(config))
    c.run(
        "sign", "--yes", "--key", str(key), "--signing-config", str(config),
        "--allow-http-registry", "--allow-insecure-registry", pinned(pushed),
    )  # fmt: skip


@pytest.mark.parametrize("version", ["cosign2", "cosign3"])
def test_a_signature_timestamped_by_the_tsa_satisfies_an_authority_naming_its_chain(
    version: str, tsa: TSA, registry: RegistryServer, request: pytest.FixtureRequest
) -> None:
    c: Cosign = request.getfixturevalue("cosign" if version == "cosign2" else "cosign3")
    sign = sign2 if version == "cosign2" else sign3
    key, public = c.key_pair(f"tsa-{version}")
    glob = f"{registry.host}/stamped-{version}/*"
    stamped = simple_image(registry.host, f"stamped-{version}/yes", text="stamped")
    sign(c, stamped, key, tsa)
    with RegistryClient(timeout=10) as client:
        found = discover.signatures(client, Reference.parse(stamped.ref), stamped.manifest_digest)
    assert [len(s.timestamps) for s in found.signatures] == [1], found.skipped
    verdict = gate_of(policy_for(glob, public.read_bytes(), tsa.chain)).check(stamped.ref)
    assert verdict is not None and verdict.digest == stamped.manifest_digest
    # another TSA's chain: the same signature is refused, saying why
    other = tls_helpers.make_ca("another-tsa").pem
    with pytest.raises(SignatureDenied, match="no RFC 3161 timestamp verifies"):
        gate_of(policy_for(glob, public.read_bytes(), other, name="other")).check(stamped.ref)
    # a signature without a timestamp: accepted without a TSA, refused with one
    plain = simple_image(registry.host, f"stamped-{version}/no", text="plain")
    sign(c, plain, key, None)
    assert gate_of(policy_for(glob, public.read_bytes(), None, name="any")).check(plain.ref)
    with pytest.raises(SignatureDenied, match="carries no RFC 3161 timestamp"):
        gate_of(policy_for(glob, public.read_bytes(), tsa.chain, name="p2")).check(plain.ref)


def test_a_timestamp_over_another_signature_does_not_verify(tsa: TSA) -> None:
    """The TSA's token for one signature is not one for another (pure check of the
    verifier on a real token)."""
    token = requests.post(
        tsa.url,
        data=_request_for(b"the signature"),
        headers={"Content-Type": "application/timestamp-query"},
        timeout=10,
    ).content
    chain = timestamps.load_chain(tsa.chain.encode(), what="chain")
    assert timestamps.verify([token], b"the signature", chain).year >= 2026
    with pytest.raises(timestamps.TimestampError, match="timestamp 0"):
        timestamps.verify([token], b"another signature", chain)
    with pytest.raises(timestamps.TimestampError, match="not a TimeStampResp"):
        timestamps.verify([b"garbage"], b"the signature", chain)


def _request_for(message: bytes) -> bytes:
    from rfc3161_client import TimestampRequestBuilder

    built = TimestampRequestBuilder().data(message).cert_request(cert_request=True).build()
    return bytes(built.as_bytes())


@pytest.mark.parametrize(
    ("chain", "words"),
    [
        ("not PEM", "rfc3161timestamp.certificateChain is not PEM certificates"),
        ("LEAF", "rfc3161timestamp.certificateChain has no root (self-signed) certificate"),
    ],
)
def test_a_policy_whose_tsa_chain_is_not_a_whole_chain_is_invalid(
    chain: str, words: str, tmp_path: Path
) -> None:
    if chain == "LEAF":  # a certificate its CA signed, without the CA
        chain = tls_helpers.pem_of(tls_helpers.issue(tls_helpers.make_ca(), tmp_path, "leaf"))
    obj = {
        "metadata": {"name": "p"},
        "spec": {
            "images": [{"glob": "r/*"}],
            "authorities": [
                {
                    "name": "a",
                    "key": {"secretRef": {"name": "k"}},
                    "rfc3161timestamp": {"certificateChain": chain},
                }
            ],
        },
    }
    with pytest.raises(errors.InvalidArgument, match=re.escape(words)):
        signing.parse(obj)
    assert "rfc3161timestamp" in signing.parse(obj, strict=False).problem


def keyless_bundle(tsa: TSA, leaf_key: Any, leaf: Any, *, stamped: bool = True) -> bytes:
    """A v0.3 bundle signed with ``leaf`` as cosign 3 writes it keyless, with the TSA's
    token over its signature when ``stamped``."""
    payload = sigstore.statement(NAME, DIGEST)
    signature = keys.sign(leaf_key, sigstore.pae(sigstore.IN_TOTO, payload))
    doc = json.loads(sigstore.dsse_bundle(payload, signature, key_hint="unused"))
    raw_cert = base64.b64encode(leaf.public_bytes(serialization.Encoding.DER)).decode()
    material: dict[str, Any] = {"certificate": {"rawBytes": raw_cert}}
    if stamped:
        token = requests.post(
            tsa.url,
            data=_request_for(signature),
            headers={"Content-Type": "application/timestamp-query"},
            timeout=10,
        ).content
        material["timestampVerificationData"] = {
            "rfc3161Timestamps": [{"signedTimestamp": base64.b64encode(token).decode()}]
        }
    doc["verificationMaterial"] = material
    return json.dumps(doc).encode()


def keyless_check(root: Any, body: bytes, chain: str | None) -> Any:
    authority: dict[str, Any] = {
        "name": "ci",
        "keyless": {
            "identities": [{"issuer": signing_helpers.OIDC, "subject": signing_helpers.EMAIL}],
            "trustRoot": {"fulcioCertificates": signing_helpers.pem(root.cert).decode()},
        },
    }
    if chain is not None:
        authority["rfc3161timestamp"] = {"certificateChain": chain}
    policy = signing.parse(
        {
            "metadata": {"name": "keyless", "uid": "u", "generation": 1},
            "spec": {"images": [{"glob": "*"}], "authorities": [authority]},
        }
    )
    found = Found(signatures=[sigstore.signature(body, where=f"{NAME}@{DIGEST}")])
    return verify.check(policy, found, DIGEST, read_secret=lambda name: b"")


def test_a_keyless_certificate_must_be_valid_when_the_tsa_says_the_signature_was_made(
    tsa: TSA,
) -> None:
    root = signing_helpers.make_ca("fulcio-root")
    fresh_key, fresh = signing_helpers.make_leaf(root, not_before=datetime.now(UTC))
    outcome = keyless_check(root, keyless_bundle(tsa, fresh_key, fresh), tsa.chain)
    assert outcome.ok, outcome.reason
    # a certificate that had expired when the TSA stamped the signature
    old_key, old = signing_helpers.make_leaf(
        root, not_before=datetime.now(UTC) - timedelta(hours=1)
    )
    late = keyless_bundle(tsa, old_key, old)
    refused = keyless_check(root, late, tsa.chain)
    assert not refused.ok and "certificate expired at" in refused.reason, refused.reason
    # without a TSA (nor a Rekor key) no time is checked: the same bundle passes
    assert keyless_check(root, late, None).ok
    # and with one, an unstamped signature is refused
    unstamped = keyless_check(root, keyless_bundle(tsa, fresh_key, fresh, stamped=False), tsa.chain)
    assert not unstamped.ok and "carries no RFC 3161 timestamp" in unstamped.reason


def trusted_root(tsa_url: str, chain: str, path: Path) -> Path:
    """A Sigstore trusted root naming only a TSA (no log, no CA) with ``chain``: what
    ``cosign verify --trusted-root`` checks a timestamp against, offline."""
    certs = x509.load_pem_x509_certificates(chain.encode())
    path.write_text(
        json.dumps(
            {
                "mediaType": "application/vnd.dev.sigstore.trustedroot+json;version=0.1",
                "tlogs": [],
                "certificateAuthorities": [],
                "ctlogs": [],
                "timestampAuthorities": [
                    {
                        "subject": {"organization": "local", "commonName": "Test TSA"},
                        "uri": tsa_url,
                        "certChain": {
                            "certificates": [
                                {"rawBytes": base64.b64encode(c.public_bytes(DER)).decode()}
                                for c in certs
                            ]
                        },
                        "validFor": {"start": "2024-01-01T00:00:00Z"},
                    }
                ],
            }
        )
    )
    return path


def cosign_verify_args(
    fmt: str, cosign: Cosign, cosign3: Cosign, public: Path, tsa_url: str, chain: str, at: Path
) -> tuple[list[str], Path]:
    """``cosign verify`` of a key signature whose timestamp must verify under ``chain``:
    cosign 3 with a trusted root (bundles), cosign 2 with the chain as a file."""
    if fmt == "bundle":
        root = trusted_root(tsa_url, chain, at / "trusted_root.json")
        return [str(cosign3.binary), "verify", "--key", str(public), "--trusted-root",
                str(root), "--use-signed-timestamps", "--insecure-ignore-tlog",
                "--allow-http-registry", "--allow-insecure-registry"], cosign3.home  # fmt: skip
    (at / "tsa-chain.pem").write_text(chain)
    return [str(cosign.binary), "verify", "--key", str(public), "--timestamp-certificate-chain",
            str(at / "tsa-chain.pem"), "--use-signed-timestamps", "--insecure-ignore-tlog",
            "--allow-http-registry"], cosign.home  # fmt: skip


@pytest.mark.parametrize("fmt", ["bundle", "simple-signing"])
def test_what_rukpak_signs_with_a_tsa_cosign_verifies_with_the_timestamp_offline(
    fmt: str, tsa: TSA, registry: RegistryServer, cosign: Cosign, cosign3: Cosign, tmp_path: Path
) -> None:
    key = ec.generate_private_key(ec.SECP256R1())
    (tmp_path / "key.pem").write_bytes(signing_helpers.private_pem(key))
    public = tmp_path / "key.pub"
    public.write_bytes(signing_helpers.public_pem(key))
    pushed = simple_image(registry.host, f"stamped-by-rukpak/{fmt}", text=fmt)
    done = subprocess.run(
        [str(Path(sys.executable).parent / "rukpak"), "bundle", "sign", "--insecure",
         "--key", str(tmp_path / "key.pem"), "--format", fmt,
         "--timestamp-server-url", tsa.url, pinned(pushed)],
        capture_output=True, text=True, timeout=120, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    glob = f"{registry.host}/stamped-by-rukpak/*"
    verdict = gate_of(policy_for(glob, public.read_bytes(), tsa.chain)).check(pushed.ref)
    assert verdict is not None and verdict.digest == pushed.manifest_digest
    for chain, accepted in ((tsa.chain, True), (tls_helpers.make_ca("other-tsa").pem, False)):
        work = tmp_path / ("tsa" if accepted else "other")
        work.mkdir()
        args, home = cosign_verify_args(fmt, cosign, cosign3, public, tsa.url, chain, work)
        checked = subprocess.run(
            [*args, pinned(pushed)], capture_output=True, text=True, timeout=120, check=False,
            env={"HOME": str(home), "PATH": "/usr/bin:/bin"},
        )  # fmt: skip
        # accepted under the TSA's chain; refused under another: cosign read our timestamp
        assert (checked.returncode == 0) is accepted, checked.stderr
        if accepted:
            assert pushed.manifest_digest in checked.stdout
