"""Manifests and indexes are shape-checked; platforms normalise and select like containerd."""

from __future__ import annotations

import json
from typing import Any

import pytest

from rukpak.common import errors
from rukpak.oci import digest as digests
from rukpak.oci import manifest, mediatypes

D1 = "sha256:" + "1" * 64
D2 = "sha256:" + "2" * 64
D3 = "sha256:" + "3" * 64


def image_body(**overrides: Any) -> bytes:
    doc: dict[str, Any] = {
        "schemaVersion": 2,
        "mediaType": mediatypes.OCI_MANIFEST,
        "config": {"mediaType": mediatypes.OCI_CONFIG, "digest": D1, "size": 2},
        "layers": [{"mediaType": mediatypes.OCI_LAYER_GZIP, "digest": D2, "size": 10}],
    }
    doc.update(overrides)
    return json.dumps({k: v for k, v in doc.items() if v is not None}).encode()


def index_of(*platforms: str | None, media_type: str = mediatypes.OCI_INDEX) -> manifest.Index:
    entries = [
        manifest.Descriptor(
            mediatypes.OCI_MANIFEST
            if media_type == mediatypes.OCI_INDEX
            else mediatypes.DOCKER_MANIFEST,
            "sha256:" + f"{i:x}" * 64,
            100 + i,
            platform=manifest.Platform.parse(p) if p else None,
        )
        for i, p in enumerate(platforms)
    ]
    return manifest.Index(media_type, entries)


def test_an_oci_image_manifest_parses_into_config_and_layers() -> None:
    parsed = manifest.parse_manifest(mediatypes.OCI_MANIFEST, image_body())
    assert isinstance(parsed, manifest.Manifest)
    assert parsed.config.digest == D1
    assert [(layer.media_type, layer.digest, layer.size) for layer in parsed.layers] == [
        (mediatypes.OCI_LAYER_GZIP, D2, 10)
    ]


def test_a_docker_manifest_list_parses_with_platforms() -> None:
    body = index_of("linux/amd64", "linux/arm64", media_type=mediatypes.DOCKER_LIST).to_json()
    parsed = manifest.parse_manifest(mediatypes.DOCKER_LIST, body)
    assert isinstance(parsed, manifest.Index)
    assert [str(m.platform) for m in parsed.manifests] == ["linux/amd64", "linux/arm64/v8"]


def test_a_generic_content_type_defers_to_the_bodys_media_type() -> None:
    parsed = manifest.parse_manifest("application/json", image_body())
    assert parsed.media_type == mediatypes.OCI_MANIFEST


def test_a_manifest_round_trips_through_to_json() -> None:
    parsed = manifest.parse_manifest(mediatypes.OCI_MANIFEST, image_body(annotations={"a": "b"}))
    assert isinstance(parsed, manifest.Manifest)
    again = manifest.parse_manifest(parsed.media_type, parsed.to_json())
    assert again == parsed


MALFORMED = [
    # media type, body, words in the message
    (mediatypes.OCI_MANIFEST, b"{not json", "not valid JSON"),
    (mediatypes.OCI_MANIFEST, b"[]", "not a JSON object"),
    ("application/vnd.example.thing+json", image_body(mediaType=None), "is not an image manifest"),
    (mediatypes.DOCKER_MANIFEST_V1_SIGNED, b'{"schemaVersion": 1}', "schema 1"),
    (mediatypes.OCI_MANIFEST, image_body(schemaVersion=3), "schemaVersion must be 2"),
    (mediatypes.DOCKER_MANIFEST, image_body(), "body says"),
    (mediatypes.OCI_MANIFEST, image_body(config=None), "'config'"),
    (mediatypes.OCI_MANIFEST, image_body(layers={"x": 1}), "'layers'"),
    (mediatypes.OCI_INDEX, b'{"schemaVersion": 2}', "'manifests'"),
    (
        mediatypes.OCI_MANIFEST,
        image_body(layers=[{"mediaType": "x", "digest": "sha256:12", "size": 1}]),
        "layers[0]",
    ),
    (
        mediatypes.OCI_MANIFEST,
        image_body(layers=[{"mediaType": "x", "digest": D2, "size": -1}]),
        "size",
    ),
    (
        mediatypes.OCI_MANIFEST,
        image_body(layers=[{"mediaType": "x", "digest": D2, "size": True}]),
        "size",
    ),
    (mediatypes.OCI_MANIFEST, image_body(layers=[{"digest": D2, "size": 1}]), "mediaType"),
    (mediatypes.OCI_MANIFEST, image_body(annotations={"a": 1}), "annotations"),
    (
        mediatypes.OCI_INDEX,
        json.dumps(
            {
                "schemaVersion": 2,
                "manifests": [
                    {"mediaType": "x", "digest": D1, "size": 1, "platform": {"os": "linux"}}
                ],
            }
        ).encode(),
        "os and architecture",
    ),
]


@pytest.mark.parametrize(("media_type", "body", "words"), MALFORMED)
def test_malformed_manifests_are_invalid_argument_naming_the_problem(
    media_type: str, body: bytes, words: str
) -> None:
    with pytest.raises(errors.InvalidArgument) as caught:
        manifest.parse_manifest(media_type, body, what="image reg/x:1")
    assert words in caught.value.message
    assert "image reg/x:1" in caught.value.message


PLATFORMS = [
    ("linux/amd64", manifest.Platform("linux", "amd64")),
    ("linux/x86_64", manifest.Platform("linux", "amd64")),
    ("linux/arm64", manifest.Platform("linux", "arm64", "v8")),
    ("linux/aarch64", manifest.Platform("linux", "arm64", "v8")),
    ("linux/arm64/v8", manifest.Platform("linux", "arm64", "v8")),
    ("linux/arm", manifest.Platform("linux", "arm", "v7")),
    ("linux/arm/v6", manifest.Platform("linux", "arm", "v6")),
    ("linux/arm/7", manifest.Platform("linux", "arm", "v7")),
    ("Linux/AMD64", manifest.Platform("linux", "amd64")),
    ("linux/ppc64le", manifest.Platform("linux", "ppc64le")),
]


@pytest.mark.parametrize(("text", "expected"), PLATFORMS)
def test_platforms_parse_and_normalise_like_containerd(
    text: str, expected: manifest.Platform
) -> None:
    assert manifest.Platform.parse(text) == expected


@pytest.mark.parametrize("text", ["", "linux", "linux/", "/amd64", "a/b/c/d"])
def test_malformed_platforms_are_invalid_argument(text: str) -> None:
    with pytest.raises(errors.InvalidArgument, match="os/architecture"):
        manifest.Platform.parse(text)


@pytest.mark.parametrize(
    ("machine", "expected"),
    [
        ("x86_64", "linux/amd64"),
        ("aarch64", "linux/arm64/v8"),
        ("armv7l", "linux/arm/v7"),
        ("armv6l", "linux/arm/v6"),
        ("s390x", "linux/s390x"),
    ],
)
def test_current_platform_maps_uname_machine_names(
    monkeypatch: pytest.MonkeyPatch, machine: str, expected: str
) -> None:
    monkeypatch.setattr("platform.machine", lambda: machine)
    monkeypatch.setattr("platform.system", lambda: "Linux")
    assert str(manifest.Platform.current()) == expected


SELECTIONS = [
    # offered platforms, wanted, index of the expected entry
    (["linux/amd64", "linux/arm64"], "linux/amd64", 0),
    (["linux/amd64", "linux/arm64"], "linux/arm64", 1),
    (["linux/amd64", "linux/arm64/v8"], "linux/arm64/v8", 1),
    (["linux/arm/v6", "linux/arm/v7"], "linux/arm/v7", 1),
    (["linux/arm/v5", "linux/arm/v6"], "linux/arm/v7", 1),
    (["linux/arm/v7", "linux/arm64"], "linux/arm64", 1),
    (["windows/amd64", "linux/amd64"], "linux/amd64", 1),
    (["linux/amd64/v3", "linux/amd64"], "linux/amd64", 1),
    (["linux/amd64/v3"], "linux/amd64", 0),
    ([None, "linux/amd64"], "linux/amd64", 1),
]


@pytest.mark.parametrize(("offered", "wanted", "expected"), SELECTIONS)
def test_select_platform_prefers_exact_then_compatible_variants(
    offered: list[str | None], wanted: str, expected: int
) -> None:
    index = index_of(*offered)
    assert (
        manifest.select_platform(index, manifest.Platform.parse(wanted))
        is index.manifests[expected]
    )


@pytest.mark.parametrize(
    ("offered", "wanted"),
    [
        (["linux/amd64"], "linux/arm64"),
        (["linux/arm/v7"], "linux/arm/v6"),
        (["windows/amd64"], "linux/amd64"),
        ([], "linux/amd64"),
    ],
)
def test_select_platform_names_what_is_offered_when_nothing_fits(
    offered: list[str], wanted: str
) -> None:
    with pytest.raises(errors.NotFound) as caught:
        manifest.select_platform(
            index_of(*offered), manifest.Platform.parse(wanted), what="image r/x:1"
        )
    message = caught.value.message
    assert "image r/x:1" in message and str(manifest.Platform.parse(wanted)) in message
    for platform in offered:
        assert str(manifest.Platform.parse(platform)) in message


def test_select_platform_skips_attestation_entries() -> None:
    index = index_of("unknown/unknown", "linux/amd64")
    assert (
        manifest.select_platform(index, manifest.Platform.parse("linux/amd64"))
        is index.manifests[1]
    )


@pytest.mark.parametrize(
    ("text", "valid"),
    [
        (D1, True),
        ("sha512:" + "a" * 128, True),
        ("sha256:" + "a" * 63, False),
        ("sha256:" + "A" * 64, False),
        ("md5:" + "a" * 32, False),
        ("sha256" + "a" * 64, False),
        ("", False),
    ],
)
def test_digest_validation(text: str, valid: bool) -> None:
    assert digests.is_valid(text) is valid


def test_digest_of_bytes_matches_hashlib() -> None:
    assert (
        digests.of(b"") == "sha256:e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855"
    )
    assert digests.of(b"x", "sha512").startswith("sha512:")
