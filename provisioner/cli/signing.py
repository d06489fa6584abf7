"""``rukpak bundle sign|verify``: cosign-compatible signatures from the command line.

The edge over ``rukpak.signing``: ``sign`` writes what ``cosign sign --key`` writes (cosign
3's Sigstore bundle as a referrer by default; ``--format simple-signing`` for cosign 2's
``sha256-<hex>.sig`` tag), with a PEM private key or a cosign key (password from
``$COSIGN_PASSWORD``); ``verify`` reads both formats and checks an image as a
ClusterBundlePolicy would, with a public key, a keyless identity under a given Fulcio root
(and Rekor key), or a policy file, and exits non-zero, saying why, when nothing verifies.
Registry options and credentials are those of the other ``rukpak bundle`` commands.
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING, Any

from provisioner.cli import output
from provisioner.runtime import flags
from rukpak.common import command, errors

# Signing and verifying are imported by the commands that run them (start-up).
if TYPE_CHECKING:
    from rukpak.oci.reference import Reference
    from rukpak.signing import policy as signing

PASSWORD_ENV = "COSIGN_PASSWORD"
FORMATS = ("bundle", "simple-signing")


def register(commands: Any) -> None:
    sign = command.add(commands, "sign", run_sign)
    sign.add_argument("reference", metavar="REF")
    sign.add_argument("--key", required=True, type=Path, metavar="KEY", help="private key file")
    sign.add_argument(
        "--format",
        choices=FORMATS,
        default="bundle",
        help="signature format (default: bundle, what cosign 3 writes)",
    )
    sign.add_argument(
        "--timestamp-server-url",
        default="",
        metavar="URL",
        help="an RFC 3161 timestamp authority's API (as cosign's flag): the signature gets its "
        "timestamp, which a policy's rfc3161timestamp authority requires",
    )
    flags.add_registry_command(sign)

    check = command.add(commands, "verify", run_verify)
    check.add_argument("reference", metavar="REF")
    how = check.add_mutually_exclusive_group(required=True)
    how.add_argument("--key", type=Path, metavar="PUB", help="public key file (PEM)")
    how.add_argument("--ca-roots", type=Path, metavar="PEM", help="Fulcio root certificate(s)")
    how.add_argument("--policy", type=Path, metavar="FILE", help="a ClusterBundlePolicy (YAML)")
    check.add_argument("--certificate-identity", default="", metavar="SUBJECT")
    check.add_argument("--certificate-identity-regexp", default="", metavar="REGEXP")
    check.add_argument("--certificate-oidc-issuer", default="", metavar="ISSUER")
    check.add_argument("--certificate-oidc-issuer-regexp", default="", metavar="REGEXP")
    check.add_argument("--rekor-key", type=Path, metavar="PUB", help="Rekor's public key (PEM)")
    output.add_output(check)
    flags.add_registry_command(check)


def _read(path: Path, what: str) -> bytes:
    try:
        return path.read_bytes()
    except OSError as exc:
        raise errors.InvalidArgument(f"cannot read {what} {path}: {exc.strerror}") from None


def run_sign(args: argparse.Namespace) -> int:
    """sign a bundle image (as cosign sign --key does)

    Sign the digest REF names now and push the signature to the image's repository, where
    cosign verify reads it: a Sigstore bundle referring to the digest, as cosign 3 writes
    (--format bundle, the default), or a layer of the tag sha256-<hex>.sig, as cosign 2
    writes (--format simple-signing). KEY is a PEM private key or a cosign.key; an encrypted
    key's password comes from $COSIGN_PASSWORD.
    """
    from rukpak.oci.reference import Reference
    from rukpak.signing import keys
    from rukpak.signing import sign as signer

    ref = Reference.parse(args.reference)
    password = os.environ.get(PASSWORD_ENV)
    key = keys.load_private_key(
        _read(args.key, "key"), password.encode() if password is not None else None
    )
    with flags.registry_client(args, ref) as client:
        tsa = args.timestamp_server_url
        if args.format == "bundle":
            signed = signer.sign_bundle(client, args.reference, key, tsa_url=tsa)
        else:
            signed = signer.sign(client, args.reference, key, tsa_url=tsa)
    state = "signed" if signed.added else "already signed with this key"
    print(f"{state}: {ref.name}@{signed.digest} (signature in {signed.signature_ref})")
    return 0


def _policy(args: argparse.Namespace, ref: Reference) -> signing.Policy:
    import yaml

    from rukpak.signing import policy as signing

    glob = [{"glob": ref.name}]
    if args.policy is not None:
        try:
            obj = yaml.safe_load(_read(args.policy, "policy"))
        except yaml.YAMLError as exc:
            raise errors.InvalidArgument(f"policy {args.policy} is not YAML: {exc}") from None
        if not isinstance(obj, dict) or obj.get("kind") != signing.KIND:
            raise errors.InvalidArgument(f"{args.policy} is not a {signing.KIND}")
        parsed = signing.parse(obj)
        if not parsed.selects(ref):
            print(f"note: policy {parsed.name!r} does not select {ref.name}", file=sys.stderr)
        return parsed
    if args.key is not None:
        authority: dict[str, Any] = {
            "name": "key",
            "key": {"data": _read(args.key, "key").decode()},
        }
    else:
        identity = {
            "issuer": args.certificate_oidc_issuer,
            "issuerRegExp": args.certificate_oidc_issuer_regexp,
            "subject": args.certificate_identity,
            "subjectRegExp": args.certificate_identity_regexp,
        }
        trust = {"fulcioCertificates": _read(args.ca_roots, "CA roots").decode()}
        if args.rekor_key is not None:
            trust["rekorPublicKey"] = _read(args.rekor_key, "Rekor key").decode()
        authority = {
            "name": "keyless",
            "keyless": {
                "identities": [{k: v for k, v in identity.items() if v}],
                "trustRoot": trust,
            },
        }
    obj = {
        "metadata": {"name": "command-line"},
        "spec": {"images": glob, "authorities": [authority]},
    }
    return signing.parse(obj)


def run_verify(args: argparse.Namespace) -> int:
    """verify a bundle image's signatures (as a ClusterBundlePolicy would)

    Check that a signature of the digest REF names satisfies a public key (--key), a keyless
    identity (--certificate-identity[-regexp] and --certificate-oidc-issuer[-regexp] under
    --ca-roots, with --rekor-key to require a Rekor bundle) or a ClusterBundlePolicy file
    (--policy). Exit 0 when it does.
    """
    from rukpak.oci.reference import Reference
    from rukpak.signing import discover, verify

    ref = Reference.parse(args.reference)
    policy = _policy(args, ref)

    def no_secrets(name: str) -> bytes:
        raise errors.InvalidArgument(
            f"the policy's key names Secret {name!r}, which the command line cannot read: "
            "give the key as key.data, or use --key"
        )

    with flags.registry_client(args, ref) as client:
        digest = ref.digest or client.resolve(ref).digest
        found = discover.signatures(client, ref, digest)
    outcome = verify.check(policy, found, digest, read_secret=no_secrets)
    if not outcome.ok:
        raise errors.PermissionDenied(f"{ref.name}@{digest}: {outcome.reason}")
    said = f"verified: {ref.name}@{digest}: {outcome.reason} ({len(found.signatures)} found)\n"
    document = {
        "reference": ref.name,
        "digest": digest,
        "verified": True,
        "reason": outcome.reason,
        "signatures": len(found.signatures),
    }
    output.emit(output.View(document, names=[f"{ref.name}@{digest}"], text=said), args.output)
    return 0
