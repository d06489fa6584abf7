"""Image references parse like ``docker pull`` reads them, and bad ones fail clearly."""

from __future__ import annotations

import pytest

from rukpak.common import errors
from rukpak.oci.reference import Reference

D = "sha256:" + "a" * 64
E = "sha512:" + "b" * 128

VALID = [
    # text, registry, repository, tag, digest
    ("ubuntu", "docker.io", "library/ubuntu", "latest", None),
    ("ubuntu:22.04", "docker.io", "library/ubuntu", "22.04", None),
    ("library/ubuntu:22.04", "docker.io", "library/ubuntu", "22.04", None),
    ("docker.io/ubuntu", "docker.io", "library/ubuntu", "latest", None),
    ("index.docker.io/library/ubuntu", "docker.io", "library/ubuntu", "latest", None),
    ("bitnami/nginx:1.25", "docker.io", "bitnami/nginx", "1.25", None),
    (
        "quay.io/operator-framework/rukpak:v0.1",
        "quay.io",
        "operator-framework/rukpak",
        "v0.1",
        None,
    ),
    ("localhost/x", "localhost", "x", "latest", None),
    ("localhost:5000/x", "localhost:5000", "x", "latest", None),
    (f"127.0.0.1:5000/a/b@{D}", "127.0.0.1:5000", "a/b", None, D),
    (f"gcr.io/a/b/c:tag@{D}", "gcr.io", "a/b/c", "tag", D),
    (f"ghcr.io/org/img@{E}", "ghcr.io", "org/img", None, E),
    ("[::1]:5000/ns/img:t", "[::1]:5000", "ns/img", "t", None),
    ("Registry.Example/foo", "Registry.Example", "foo", "latest", None),
    ("example.com/a__b/c-d/e.f:T_1.x-y", "example.com", "a__b/c-d/e.f", "T_1.x-y", None),
    ("example.com/a---b:" + "t" * 128, "example.com", "a---b", "t" * 128, None),
]


@pytest.mark.parametrize(("text", "registry", "repository", "tag", "digest"), VALID)
def test_real_world_references_parse_with_docker_defaults(
    text: str, registry: str, repository: str, tag: str | None, digest: str | None
) -> None:
    ref = Reference.parse(text)
    assert (ref.registry, ref.repository, ref.tag, ref.digest) == (
        registry,
        repository,
        tag,
        digest,
    )


@pytest.mark.parametrize(("text", "_r", "_p", "_t", "_d"), VALID)
def test_a_parsed_reference_prints_back_to_something_that_parses_the_same(
    text: str, _r: str, _p: str, _t: str, _d: str
) -> None:
    ref = Reference.parse(text)
    assert Reference.parse(str(ref)) == ref


INVALID = [
    # text, words the message must contain
    ("", "empty"),
    ("Ubuntu", "lowercase"),
    ("quay.io/Org/img", "lowercase"),
    ("ubuntu@sha256:1234", "64"),
    (f"ubuntu@md5:{'a' * 32}", "not supported"),
    ("ubuntu@sha256:" + "A" * 64, "lowercase hex"),
    ("ubuntu:" + "t" * 129, "limit is 128"),
    ("ubuntu:-bad", "invalid"),
    ("ubuntu:", "empty tag"),
    ("quay.io//img", "empty path component"),
    ("quay.io/img/", "empty path component"),
    ("quay.io/a..b", "invalid path component"),
    ("quay.io/-a", "invalid path component"),
    ("https://quay.io/a/b", "scheme"),
    (" ubuntu", "whitespace"),
    ("ubu ntu", "whitespace"),
    ("a" * 64, "64-character hex"),
    ("bad_host.io:x/a", "not a valid registry"),
    ("quay.io/" + "a" * 250, "longer than 255"),
    (f"a@{D}@{D}", "more than one '@'"),
]


@pytest.mark.parametrize(("text", "words"), INVALID)
def test_invalid_references_fail_with_a_message_naming_the_text(text: str, words: str) -> None:
    with pytest.raises(errors.InvalidArgument) as caught:
        Reference.parse(text)
    assert words in caught.value.message
    if text:
        assert repr(text)[:40].rstrip("'") in caught.value.message


def test_with_digest_pins_and_keeps_the_tag_for_display() -> None:
    ref = Reference.parse("quay.io/a/b:v1").with_digest(D)
    assert (ref.tag, ref.digest, ref.identifier) == ("v1", D, D)
    assert str(ref) == f"quay.io/a/b:v1@{D}"


def test_with_digest_refuses_a_malformed_digest() -> None:
    with pytest.raises(errors.InvalidArgument, match=r"quay\.io/a/b:v1"):
        Reference.parse("quay.io/a/b:v1").with_digest("sha256:nothex")


def test_with_tag_drops_the_digest() -> None:
    ref = Reference.parse(f"quay.io/a/b@{D}").with_tag("v2")
    assert (ref.tag, ref.digest, ref.identifier) == ("v2", None, "v2")


def test_with_tag_refuses_an_invalid_tag() -> None:
    with pytest.raises(errors.InvalidArgument, match="tag"):
        Reference.parse("quay.io/a/b").with_tag("no/slashes")


def test_docker_hub_api_host_differs_from_its_name() -> None:
    assert Reference.parse("ubuntu").api_host == "registry-1.docker.io"
    assert Reference.parse("quay.io/a/b").api_host == "quay.io"


def test_references_are_hashable_values() -> None:
    assert len({Reference.parse("ubuntu"), Reference.parse("docker.io/library/ubuntu:latest")}) == 1
