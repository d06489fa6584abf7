"""Certificates and keys of the local cluster, made with the ``openssl`` command.

One CA signs the apiserver's serving certificate, the admin client certificate
(O=system:masters), the kubelet's client (system:node:NAME) and serving certificates,
and the apiserver's client certificate for kubelets; an EC key pair signs
service-account tokens. ``localcluster`` writes them once into its work directory.
"""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

DAYS = "3650"


@dataclass(frozen=True)
class Pair:
    """A certificate and its private key, as PEM files."""

    cert: Path
    key: Path


def _openssl(*args: str, cwd: Path) -> None:
    try:
        subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)
    except subprocess.CalledProcessError as e:
        raise RuntimeError(f"openssl {' '.join(args)} failed: {e.stderr.decode()}") from e


def _ec_key(path: Path) -> None:
    _openssl(
        "genpkey", "-algorithm", "EC", "-pkeyopt", "ec_paramgen_curve:P-256",
        "-out", str(path), cwd=path.parent,
    )  # fmt: skip
    path.chmod(0o600)


def make_ca(directory: Path, *, name: str = "rukpak-test-ca") -> Pair:
    """A self-signed CA in ``directory``/ca.{crt,key}."""
    directory.mkdir(parents=True, exist_ok=True)
    ca = Pair(directory / "ca.crt", directory / "ca.key")
    _ec_key(ca.key)
    _openssl(
        "req", "-x509", "-new", "-key", str(ca.key), "-out", str(ca.cert), "-days", DAYS,
        "-subj", f"/CN={name}",
        "-addext", "basicConstraints=critical,CA:TRUE",
        "-addext", "keyUsage=critical,keyCertSign,cRLSign,digitalSignature",
        cwd=directory,
    )  # fmt: skip
    return ca


def issue(
    ca: Pair,
    name: str,
    *,
    cn: str,
    orgs: tuple[str, ...] = (),
    sans: tuple[str, ...] = (),
    server: bool = False,
    client: bool = False,
) -> Pair:
    """A certificate ``name``.{crt,key} beside the CA, signed by it.

    ``sans`` are openssl subjectAltName entries such as ``IP:127.0.0.1``, ``DNS:localhost``.
    """
    directory = ca.cert.parent
    pair = Pair(directory / f"{name}.crt", directory / f"{name}.key")
    _ec_key(pair.key)
    subject = "".join(f"/O={o}" for o in orgs) + f"/CN={cn}"
    usages = [u for u, on in (("serverAuth", server), ("clientAuth", client)) if on]
    ext = [
        "basicConstraints=critical,CA:FALSE",
        "keyUsage=critical,digitalSignature,keyEncipherment",
        f"extendedKeyUsage={','.join(usages)}",
    ]
    if sans:
        ext.append(f"subjectAltName={','.join(sans)}")
    ext_file = directory / f"{name}.ext"
    ext_file.write_text("\n".join(ext) + "\n")
    csr = directory / f"{name}.csr"
    _openssl(
        "req", "-new", "-key", str(pair.key), "-subj", subject, "-out", str(csr), cwd=directory
    )
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key),
        "-CAcreateserial", "-out", str(pair.cert), "-days", DAYS, "-extfile", str(ext_file),
        cwd=directory,
    )  # fmt: skip
    csr.unlink()
    ext_file.unlink()
    return pair


def service_account_keys(directory: Path) -> Pair:
    """The key pair signing service-account tokens: ``sa.key`` and its public ``sa.pub``."""
    directory.mkdir(parents=True, exist_ok=True)
    pair = Pair(directory / "sa.pub", directory / "sa.key")
    _ec_key(pair.key)
    _openssl("pkey", "-in", str(pair.key), "-pubout", "-out", str(pair.cert), cwd=directory)
    return pair


def kubeconfig(path: Path, *, server: str, ca: Path, client: Pair, user: str) -> Path:
    """A kubeconfig file for ``user`` authenticating with a client certificate."""
    import yaml

    config = {
        "apiVersion": "v1",
        "kind": "Config",
        "clusters": [
            {"name": "local", "cluster": {"server": server, "certificate-authority": str(ca)}}
        ],
        "users": [
            {
                "name": user,
                "user": {
                    "client-certificate": str(client.cert),
                    "client-key": str(client.key),
                },
            }
        ],
        "contexts": [{"name": "local", "context": {"cluster": "local", "user": user}}],
        "current-context": "local",
    }
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    path.chmod(0o600)
    return path


def client_kubeconfig(
    ca: Pair, name: str, path: Path, *, server: str, user: str, orgs: tuple[str, ...] = ()
) -> Path:
    """A client certificate ``name`` for ``user`` (its CN; ``orgs`` its groups), signed by
    ``ca``, and a kubeconfig at ``path`` that authenticates with it."""
    client = issue(ca, name, cn=user, orgs=orgs, client=True)
    return kubeconfig(path, server=server, ca=ca.cert, client=client, user=user)
