"""The manager's half of signed bundles, without a cluster: a policy's ``Valid`` status
(``provisioner.manager.signatures.policy_status``) and the key a Secret holds."""

from __future__ import annotations

import base64
from typing import Any

import pytest
from cryptography.hazmat.primitives.asymmetric import ec

from provisioner.manager import signatures
from rukpak.common import errors
from rukpak.signing import keys
from rukpak.signing import policy as signing
from rukpak.signing.gate import SignatureDenied, Verdict

NOW = "2026-11-26T00:00:00Z"
PEM = keys.public_pem(ec.generate_private_key(ec.SECP256R1()))


def policy(*authorities: dict[str, Any], generation: int = 3, **extra: Any) -> dict[str, Any]:
    return {
        "metadata": {"name": "p", "generation": generation},
        "spec": {"images": [{"glob": "r.example/**"}], "authorities": list(authorities), **extra},
    }


def valid_of(status: dict[str, Any]) -> tuple[str, str, str]:
    (cond,) = status["conditions"]
    assert cond["type"] == "Valid" and cond["observedGeneration"] == status["observedGeneration"]
    return cond["status"], cond["reason"], cond["message"]


def no_secret(name: str) -> bytes:
    raise errors.NotFound(f"Secret rukpak-system/{name} not found")


def test_a_valid_policy_says_what_it_refuses_and_for_whom() -> None:
    status = signatures.policy_status(
        policy({"name": "release", "key": {"data": PEM.decode()}}), read=no_secret, now=NOW
    )
    assert status["observedGeneration"] == 3
    assert valid_of(status) == (
        "True",
        "Valid",
        "refuses images matching r.example/** unless signed for 1 authority: release",
    )


def test_an_invalid_spec_lists_its_problems() -> None:
    status = signatures.policy_status(
        policy({"name": "k", "key": {"data": "not a key"}}, mode="sometimes"),
        read=no_secret,
        now=NOW,
    )
    state, reason, message = valid_of(status)
    assert (state, reason) == ("False", "InvalidSpec")
    assert "PUBLIC KEY" in message and "'sometimes' is not one of enforce, warn" in message


def test_a_missing_key_secret_makes_the_policy_not_valid() -> None:
    status = signatures.policy_status(
        policy({"name": "k", "key": {"secretRef": {"name": "gone"}}}), read=no_secret, now=NOW
    )
    assert valid_of(status) == (
        "False",
        "KeyUnavailable",
        "authority 'k': Secret rukpak-system/gone not found",
    )


def test_the_transition_time_holds_while_the_status_does() -> None:
    obj = policy({"name": "k", "key": {"data": PEM.decode()}})
    first = signatures.policy_status(obj, read=no_secret, now=NOW)
    obj["status"] = first
    again = signatures.policy_status(obj, read=no_secret, now="2026-11-27T00:00:00Z")
    assert again["conditions"][0]["lastTransitionTime"] == NOW
    obj["spec"]["authorities"][0]["key"] = {"secretRef": {"name": "gone"}}
    changed = signatures.policy_status(obj, read=no_secret, now="2026-11-27T00:00:00Z")
    assert changed["conditions"][0]["lastTransitionTime"] == "2026-11-27T00:00:00Z"


@pytest.mark.parametrize(
    ("data", "expected"),
    [
        ({"cosign.pub": base64.b64encode(PEM).decode(), "cosign.key": "eA=="}, PEM),
        ({"release.pem": base64.b64encode(PEM).decode()}, PEM),
    ],
)
def test_a_key_secret_gives_cosign_pub_or_its_only_entry(
    data: dict[str, str], expected: bytes
) -> None:
    assert signing.key_from_secret(data, "ns/s") == expected


@pytest.mark.parametrize("data", [{}, {"a": "eA==", "b": "eA=="}, {"cosign.pub": "%%% not base64"}])
def test_a_key_secret_without_one_clear_key_is_refused(data: dict[str, str]) -> None:
    with pytest.raises(errors.InvalidArgument, match="Secret ns/s"):
        signing.key_from_secret(data, "ns/s")


# -- Verified: which policy and key verified a BundleDeployment's images ----------------------

PINNED = "r.example/app@sha256:" + "1" * 64


class Checker:
    """The gate's answer for each digest (pure: no registry), as ``Gate.check`` gives it."""

    def __init__(self, verdict: Verdict | None = None, refusal: SignatureDenied | None = None):
        self.verdict, self.refusal = verdict, refusal

    def check(self, image: str, credentials: object = None) -> Verdict | None:
        if self.refusal is not None:
            raise self.refusal
        return self.verdict


def resolver(checker: Checker) -> signatures.SignedResolver:
    return signatures.SignedResolver(lambda ref, credentials=None: PINNED, checker)  # type: ignore[arg-type]


def test_verified_names_the_policy_and_the_key_that_verified_the_image() -> None:
    by = "ClusterBundlePolicy 'p': signed for authority 'release' (key 0123456789ab)"
    resolve = resolver(Checker(Verdict("sha256:" + "1" * 64, PINNED, ("p",), verified=(by,))))
    assert resolve("r.example/app:v1") == PINNED
    assert signatures.verified(resolve, [PINNED]) == ("True", "Verified", f"{PINNED}: {by}")


def test_verified_is_absent_when_no_policy_selects_the_image() -> None:
    resolve = resolver(Checker(None))
    resolve("r.example/app:v1")
    assert signatures.verified(resolve, [PINNED]) is None
    assert signatures.verified(lambda ref: ref, [PINNED]) is None  # no policies at all


def test_a_warn_mode_policy_not_satisfied_is_verified_false() -> None:
    warning = "ClusterBundlePolicy 'w' (warn): no signature found"
    resolve = resolver(Checker(Verdict("d", PINNED, ("w",), warnings=(warning,))))
    resolve("r.example/app:v1")
    assert signatures.verified(resolve, [PINNED]) == (
        "False",
        "NotVerified",
        f"{PINNED}: {warning}",
    )


def test_a_refusal_is_verified_false_with_the_policy_and_the_reason() -> None:
    denied = SignatureDenied("r.example/app:v1", "p", "no signature found")
    resolve = resolver(Checker(refusal=denied))
    with pytest.raises(SignatureDenied):
        resolve("r.example/app:v1")
    status, reason, message = signatures.refused(denied)
    assert (status, reason) == ("False", "SignatureVerificationFailed")
    assert "refused by ClusterBundlePolicy 'p': no signature found" in message


def test_verified_replaces_the_old_condition_and_keeps_its_time_while_it_holds() -> None:
    old = {"type": "Verified", "status": "True", "reason": "Verified", "message": "old",
           "lastTransitionTime": "2026-11-01T00:00:00Z"}  # fmt: skip
    unpacked = {"type": "Unpacked", "status": "True"}
    status = {"conditions": [unpacked, old]}
    same = signatures.with_verified(status, ("True", "Verified", "new"), now=NOW, generation=2)
    assert same["conditions"][0] == unpacked
    assert same["conditions"][1]["message"] == "new"
    assert same["conditions"][1]["lastTransitionTime"] == "2026-11-01T00:00:00Z"
    failed = signatures.with_verified(status, ("False", "NotVerified", "x"), now=NOW, generation=2)
    assert failed["conditions"][1]["lastTransitionTime"] == NOW
    assert signatures.with_verified(status, None, now=NOW, generation=2) == {
        "conditions": [unpacked]
    }


def test_a_bundles_verified_condition_outlives_its_later_statuses() -> None:
    from provisioner.manager.planning import bundleplan

    verified = {"type": "Verified", "status": "True", "reason": "Verified", "message": "by p"}
    bundle = {
        "metadata": {"name": "b", "generation": 1},
        "status": {"conditions": [{"type": "Unpacked", "status": "False"}, verified]},
    }
    status = bundleplan.status_for(bundle, bundleplan.PHASE_UNPACKED, "UnpackSuccessful", "", NOW)
    assert [c["type"] for c in status["conditions"]] == ["Unpacked", "Verified"]
    assert status["conditions"][1] == verified
    plain = bundleplan.status_for({"metadata": {}}, bundleplan.PHASE_PENDING, "P", "", NOW)
    assert [c["type"] for c in plain["conditions"]] == ["Unpacked"]
