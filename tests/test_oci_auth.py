"""Pull secrets, WWW-Authenticate challenges, token caching and URL scheme choice (no network)."""

from __future__ import annotations

import base64
import json

import pytest

from rukpak.common import errors
from rukpak.oci import auth, transport
from rukpak.oci.client import RegistryClient
from rukpak.oci.reference import Reference


def b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode()


@pytest.mark.parametrize(
    ("key", "host"),
    [
        ("quay.io", "quay.io"),
        ("https://quay.io", "quay.io"),
        ("https://quay.io/v1/", "quay.io"),
        ("http://localhost:5000/v2/", "localhost:5000"),
        ("HTTPS://Quay.IO/", "quay.io"),
        ("https://index.docker.io/v1/", "docker.io"),
        ("index.docker.io", "docker.io"),
        ("registry-1.docker.io", "docker.io"),
        ("docker.io", "docker.io"),
    ],
)
def test_dockerconfigjson_keys_match_hosts_with_or_without_scheme_and_path(
    key: str, host: str
) -> None:
    creds = auth.Credentials.from_dockerconfigjson(
        json.dumps({"auths": {key: {"auth": b64("me:pw")}}})
    )
    credential = creds.for_host(host)
    assert credential is not None
    assert (credential.username, credential.password) == ("me", "pw")


def test_docker_hub_credentials_serve_its_api_host() -> None:
    creds = auth.Credentials.from_dockerconfigjson(
        json.dumps({"auths": {"https://index.docker.io/v1/": {"auth": b64("u:p")}}})
    )
    assert creds.for_host(Reference.parse("ubuntu").api_host) is not None


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        ({"auth": b64("user:pa:ss")}, ("user", "pa:ss", "")),
        ({"username": "u", "password": "p"}, ("u", "p", "")),
        ({"auth": b64("a:b"), "username": "ignored", "password": "x"}, ("a", "b", "")),
        ({"identitytoken": "refresh"}, ("", "", "refresh")),
        ({"auth": "", "username": "u", "password": "p"}, ("u", "p", "")),
    ],
)
def test_dockerconfigjson_entries_read_every_field_docker_writes(
    entry: dict[str, str], expected: tuple[str, str, str]
) -> None:
    creds = auth.Credentials.from_dockerconfigjson(json.dumps({"auths": {"r.io": entry}}))
    credential = creds.for_host("r.io")
    assert credential is not None
    assert (credential.username, credential.password, credential.identity_token) == expected


def test_legacy_dockercfg_without_auths_is_accepted() -> None:
    creds = auth.Credentials.from_dockerconfigjson(json.dumps({"r.io": {"auth": b64("u:p")}}))
    assert creds.hosts() == ["r.io"]


def test_wildcard_entries_match_one_subdomain_level() -> None:
    creds = auth.Credentials({"*.example.com": auth.Credential("u", "p")})
    assert creds.for_host("reg.example.com:5000") is not None
    assert creds.for_host("example.com") is None
    assert creds.for_host("a.b.example.com") is None


def test_hosts_without_an_entry_are_anonymous() -> None:
    creds = auth.Credentials.from_dockerconfigjson(b'{"auths": {}}')
    assert creds.for_host("quay.io") is None and len(creds) == 0


SECRET = "hunter2-very-secret"

MALFORMED = [
    # raw pull secret, words in the message
    ('{"auths": {"r.io": {"auth": "' + SECRET, "not valid JSON"),
    (f'["{SECRET}"]', "must be a JSON object"),
    (json.dumps({"auths": [SECRET]}), "'auths' must be an object"),
    (json.dumps({"auths": {"r.io": SECRET}}), "entry for r.io is not an object"),
    (json.dumps({"auths": {"r.io": {"auth": SECRET + "!"}}}), "not base64"),
    (json.dumps({"auths": {"r.io": {"auth": b64(SECRET)}}}), "does not decode"),
    (json.dumps({"auths": {"r.io": {"password": 42}}}), "'password' for r.io is not a string"),
    (json.dumps({"auths": {"": {"auth": b64("a:" + SECRET)}}}), "empty registry name"),
    (b"\xff\xfe" + SECRET.encode(), "pull secret"),
]


@pytest.mark.parametrize(("raw", "words"), MALFORMED)
def test_malformed_pull_secrets_are_invalid_argument_without_echoing_secrets(
    raw: str | bytes, words: str
) -> None:
    with pytest.raises(errors.InvalidArgument) as caught:
        auth.Credentials.from_dockerconfigjson(raw)
    assert words in caught.value.message
    assert SECRET not in caught.value.message and SECRET not in repr(caught.value)
    # No chained exception (a JSONDecodeError keeps the whole document) reaches a traceback.
    error = caught.value
    assert error.__cause__ is None and (error.__context__ is None or error.__suppress_context__)


def test_credentials_never_show_secrets_in_repr() -> None:
    credential = auth.Credential("me", SECRET, identity_token=SECRET + "1")
    creds = auth.Credentials({"r.io": credential})
    for text in (repr(credential), str(credential), repr(creds)):
        assert SECRET not in text
    assert "me" in repr(credential) and "r.io" in repr(creds)


CHALLENGES = [
    (
        'Bearer realm="https://auth.docker.io/token",service="registry.docker.io",'
        'scope="repository:library/ubuntu:pull"',
        [
            (
                "bearer",
                {
                    "realm": "https://auth.docker.io/token",
                    "service": "registry.docker.io",
                    "scope": "repository:library/ubuntu:pull",
                },
            )
        ],
    ),
    ('Basic realm="Registry Realm"', [("basic", {"realm": "Registry Realm"})]),
    (
        'Bearer realm="https://r/t", scope="repository:a/b:pull,push", error="insufficient_scope"',
        [
            (
                "bearer",
                {
                    "realm": "https://r/t",
                    "scope": "repository:a/b:pull,push",
                    "error": "insufficient_scope",
                },
            )
        ],
    ),
    (
        'Basic realm="x", Bearer realm="https://r/t",service=svc',
        [("basic", {"realm": "x"}), ("bearer", {"realm": "https://r/t", "service": "svc"})],
    ),
    ('Basic realm="say \\"hi\\""', [("basic", {"realm": 'say "hi"'})]),
    ("BEARER Realm=https://r/t", [("bearer", {"realm": "https://r/t"})]),
    ("", []),
]


@pytest.mark.parametrize(("header", "expected"), CHALLENGES)
def test_www_authenticate_challenges_parse(
    header: str, expected: list[tuple[str, dict[str, str]]]
) -> None:
    parsed = auth.parse_challenges(header)
    assert [(c.scheme, c.params) for c in parsed] == expected


def test_token_cache_keeps_tokens_per_scope_until_they_expire() -> None:
    cache = auth.TokenCache()
    pull, push = ("realm", "svc", "repository:a:pull"), ("realm", "svc", "repository:a:pull,push")
    cache.put(pull, auth.Token("t1", expires_at=float("inf")))
    cache.put(push, auth.Token("t2", expires_at=0.0))
    token = cache.get(pull)
    assert token is not None and token.value == "t1"
    assert cache.get(push) is None
    assert len(cache) == 1
    assert "t1" not in repr(token)


SCHEMES = [
    # host, insecure list, scheme
    ("127.0.0.1:5000", (), "http"),
    ("127.3.4.5", (), "http"),
    ("localhost:5000", (), "http"),
    ("localhost", (), "http"),
    ("[::1]:5000", (), "http"),
    ("quay.io", (), "https"),
    ("10.0.0.5:5000", (), "https"),
    ("registry.local:5000", (), "https"),
    ("registry.local:5000", ("registry.local:5000",), "http"),
    ("registry.local:5000", ("registry.local",), "http"),
    ("registry.local:5000", ("other.local",), "https"),
    ("localhost.evil.com", (), "https"),
    ("127.0.0.1.nip.io", (), "https"),
]


@pytest.mark.parametrize(("host", "insecure", "scheme"), SCHEMES)
def test_plain_http_only_for_loopback_or_hosts_listed_insecure(
    host: str, insecure: tuple[str, ...], scheme: str
) -> None:
    assert transport.scheme_for(host, insecure) == scheme
    client = RegistryClient(insecure=insecure)
    ref = Reference.parse(f"{host}/a/b:c")
    assert client.base_url(ref) == f"{scheme}://{host}"


def test_docker_hub_is_always_reached_over_https() -> None:
    assert RegistryClient().base_url(Reference.parse("ubuntu")) == "https://registry-1.docker.io"
