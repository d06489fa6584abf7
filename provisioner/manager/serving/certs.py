"""The webhook's certificate, managed by the manager itself (no cert-manager).

Sits beside ``webhook``: at start the manager calls ``ensure`` which reads the
Secret ``rukpak-webhook-cert`` in the system namespace; when it is missing,
unreadable, about to expire or made for other DNS names, a new self-signed CA
and a serving certificate signed by it are generated (``generate``, pure) and
stored (create; an update guarded by resourceVersion, so two replicas
starting together converge on one Secret: the loser re-reads the winner's).
``publish_ca`` then writes the CA into every webhook of the
ValidatingWebhookConfiguration as its ``caBundle``.

Keys never reach a log.
"""

from __future__ import annotations

import base64
import datetime
import ipaddress
import logging
from dataclasses import dataclass

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from provisioner.engine.kube.kube import Kube
from provisioner.engine.objects import ObjectRef, meta_of
from rukpak.common import errors

log = logging.getLogger("rukpak.manager")

SECRET_NAME = "rukpak-webhook-cert"
VALIDITY = datetime.timedelta(days=365)
RENEW_BEFORE = datetime.timedelta(days=30)


@dataclass(frozen=True)
class Bundle:
    """PEM texts: the CA certificate, the serving certificate and its private key."""

    ca: bytes
    cert: bytes
    key: bytes


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _san(hosts: list[str]) -> x509.SubjectAlternativeName:
    names: list[x509.GeneralName] = []
    for host in hosts:
        try:
            names.append(x509.IPAddress(ipaddress.ip_address(host)))
        except ValueError:
            names.append(x509.DNSName(host))
    return x509.SubjectAlternativeName(names)


def generate(hosts: list[str], *, now: datetime.datetime | None = None) -> Bundle:
    """A fresh CA and a serving certificate for ``hosts`` (DNS names or IP addresses)."""
    now = now or datetime.datetime.now(datetime.UTC)
    start = now - datetime.timedelta(minutes=5)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca_name = _name("rukpak-webhook-ca")
    ca = (
        x509.CertificateBuilder()
        .subject_name(ca_name)
        .issuer_name(ca_name)
        .public_key(ca_key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                key_cert_sign=True,
                crl_sign=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .sign(ca_key, hashes.SHA256())
    )
    key = ec.generate_private_key(ec.SECP256R1())
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(hosts[0]))
        .issuer_name(ca_name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(start)
        .not_valid_after(now + VALIDITY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), critical=False)
        .add_extension(_san(hosts), critical=False)
        .sign(ca_key, hashes.SHA256())
    )
    return Bundle(
        ca=ca.public_bytes(serialization.Encoding.PEM),
        cert=cert.public_bytes(serialization.Encoding.PEM),
        key=key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        ),
    )


def usable(bundle: Bundle, hosts: list[str], *, now: datetime.datetime | None = None) -> bool:
    """Whether ``bundle`` serves ``hosts`` and stays valid for longer than ``RENEW_BEFORE``."""
    now = now or datetime.datetime.now(datetime.UTC)
    try:
        cert = x509.load_pem_x509_certificate(bundle.cert)
        x509.load_pem_x509_certificate(bundle.ca)
        serialization.load_pem_private_key(bundle.key, password=None)
        san = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    except (ValueError, TypeError, x509.ExtensionNotFound):
        return False
    served = {str(n) for n in san.get_values_for_type(x509.DNSName)}
    served |= {str(ip) for ip in san.get_values_for_type(x509.IPAddress)}
    return set(hosts) <= served and cert.not_valid_after_utc - now > RENEW_BEFORE


def expiry(bundle: Bundle) -> dict[str, float]:
    """When the serving certificate and the CA stop being valid (``notAfter``), in seconds
    since the epoch: the samples of ``rukpak_webhook_certificate_expiry_timestamp_seconds``
    (``certificate`` = ``serving`` or ``ca``). The manager reads the Secret only at start
    (``ensure`` renews within ``RENEW_BEFORE``), so a replica that runs that long serves an
    expiring certificate: the alert RukpakWebhookCertificateExpiring says to restart it."""
    out: dict[str, float] = {}
    for which, pem in (("serving", bundle.cert), ("ca", bundle.ca)):
        out[which] = x509.load_pem_x509_certificate(pem).not_valid_after_utc.timestamp()
    return out


def _secret_ref(namespace: str) -> ObjectRef:
    return ObjectRef("", "v1", "Secret", namespace, SECRET_NAME)


def _from_secret(secret: dict[str, object]) -> Bundle | None:
    data = secret.get("data")
    if not isinstance(data, dict):
        return None
    try:
        return Bundle(
            ca=base64.b64decode(str(data["ca.crt"])),
            cert=base64.b64decode(str(data["tls.crt"])),
            key=base64.b64decode(str(data["tls.key"])),
        )
    except (KeyError, ValueError):
        return None


def _secret_body(namespace: str, bundle: Bundle, resource_version: str = "") -> dict[str, object]:
    meta: dict[str, object] = {
        "name": SECRET_NAME,
        "namespace": namespace,
        "labels": {
            "app.kubernetes.io/name": "rukpak-manager",
            "app.kubernetes.io/part-of": "rukpak",
        },
    }
    if resource_version:
        meta["resourceVersion"] = resource_version
    return {
        "apiVersion": "v1",
        "kind": "Secret",
        "metadata": meta,
        "type": "kubernetes.io/tls",
        "data": {
            "ca.crt": base64.b64encode(bundle.ca).decode(),
            "tls.crt": base64.b64encode(bundle.cert).decode(),
            "tls.key": base64.b64encode(bundle.key).decode(),
        },
    }


def ensure(kube: Kube, namespace: str, hosts: list[str]) -> Bundle:
    """The stored certificate for ``hosts``, generated and stored when needed."""
    ref = _secret_ref(namespace)
    for _ in range(3):
        live = kube.get(ref)
        current = _from_secret(live) if live is not None else None
        if current is not None and usable(current, hosts):
            return current
        fresh = generate(hosts)
        try:
            if live is None:
                kube.create(_secret_body(namespace, fresh))
            else:
                rv = str(meta_of(live).get("resourceVersion") or "")
                kube.merge_patch(ref, _secret_body(namespace, fresh, rv))
        except (errors.AlreadyExists, errors.Aborted):
            continue  # another replica stored one first: use it
        log.info("msg='webhook certificate generated' secret=%s/%s", namespace, SECRET_NAME)
        return fresh
    raise errors.Unavailable(
        f"cannot settle the webhook certificate Secret {namespace}/{SECRET_NAME}"
    )


def publish_ca(kube: Kube, configuration: str, ca: bytes) -> bool:
    """Set ``caBundle`` on every webhook of the ValidatingWebhookConfiguration; False if absent."""
    ref = ObjectRef(
        "admissionregistration.k8s.io", "v1", "ValidatingWebhookConfiguration", "", configuration
    )
    live = kube.get(ref)
    if live is None:
        return False
    encoded = base64.b64encode(ca).decode()
    hooks = live.get("webhooks") or []
    if all((h.get("clientConfig") or {}).get("caBundle") == encoded for h in hooks):
        return True
    for hook in hooks:
        hook.setdefault("clientConfig", {})["caBundle"] = encoded
    rv = meta_of(live).get("resourceVersion")
    kube.merge_patch(ref, {"metadata": {"resourceVersion": rv}, "webhooks": hooks})
    log.info("msg='webhook caBundle published' configuration=%s", configuration)
    return True


def publish_conversion_ca(kube: Kube, crd_name: str, ca: bytes) -> bool:
    """Set the CRD's conversion webhook ``caBundle``; False if the CRD is absent or converts
    without a webhook."""
    ref = ObjectRef("apiextensions.k8s.io", "v1", "CustomResourceDefinition", "", crd_name)
    live = kube.get(ref)
    if live is None:
        return False
    conversion = (live.get("spec") or {}).get("conversion") or {}
    if conversion.get("strategy") != "Webhook":
        return False
    encoded = base64.b64encode(ca).decode()
    client = (conversion.get("webhook") or {}).get("clientConfig") or {}
    if client.get("caBundle") == encoded:
        return True
    rv = meta_of(live).get("resourceVersion")
    patch = {
        "metadata": {"resourceVersion": rv},
        "spec": {"conversion": {"webhook": {"clientConfig": {"caBundle": encoded}}}},
    }
    kube.merge_patch(ref, patch)
    log.info("msg='conversion caBundle published' crd=%s", crd_name)
    return True
