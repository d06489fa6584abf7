"""The pull policy over a node's cache, as both image caches (bind and FUSE) apply it."""

from __future__ import annotations

import pytest

from rukpak.common import errors
from rukpak.image.cache import ImageAsk
from rukpak.image.grants import Grants
from rukpak.image.seams import Puller, PullPolicy
from rukpak.oci.auth import Credentials
from rukpak.oci.manifest import Platform
from rukpak.oci.reference import Reference

REF = Reference.parse("registry.example/team/bundle:v1")
DIGEST = "sha256:" + "a" * 64
PLATFORM = Platform.parse("linux/amd64")


def no_registry(credentials: Credentials | None) -> Puller:
    raise AssertionError("the registry must not be asked here")


def reusable(cached: str | None, policy: PullPolicy, *, private: bool = False) -> str | None:
    ask = ImageAsk(REF, PLATFORM, None, policy)
    return ask.committed(Grants(no_registry), cached, private=lambda digest: private)


@pytest.mark.parametrize("policy", [PullPolicy.IF_NOT_PRESENT, PullPolicy.NEVER])
def test_a_cached_public_tree_serves_without_asking_the_registry(policy: PullPolicy) -> None:
    assert reusable(DIGEST, policy) == DIGEST


def test_pull_policy_always_pulls_even_with_the_tree_cached() -> None:
    assert reusable(DIGEST, PullPolicy.ALWAYS) is None


@pytest.mark.parametrize("policy", [PullPolicy.IF_NOT_PRESENT, PullPolicy.ALWAYS])
def test_nothing_cached_means_pull(policy: PullPolicy) -> None:
    assert reusable(None, policy) is None


def test_nothing_cached_under_never_is_failed_precondition() -> None:
    with pytest.raises(errors.FailedPrecondition, match="pullPolicy is Never"):
        reusable(None, PullPolicy.NEVER)


def test_a_cached_private_tree_under_never_without_credentials_is_permission_denied() -> None:
    with pytest.raises(errors.PermissionDenied, match="pulled with credentials"):
        reusable(DIGEST, PullPolicy.NEVER, private=True)
