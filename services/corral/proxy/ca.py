"""A fresh certificate authority per session, in the files mitmproxy reads from its confdir.

The gateway makes it before the sidecar starts, so the sandbox can be given the certificate (and
only the certificate) at the same moment; the private key stays with the proxy.
"""

from __future__ import annotations

import datetime
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

KEY_AND_CERT = "mitmproxy-ca.pem"  # what mitmproxy loads: key then certificate
CERT_ONLY = "mitmproxy-ca-cert.pem"


@dataclass(frozen=True, slots=True)
class SessionCA:
    cert_pem: str
    fingerprint_sha256: str
    not_after: float  # when it expires (a Unix time): a CA made ahead must outlast the session it serves


def create(confdir: Path, session: str, days: int = 30, owner: tuple[int, int] | None = None) -> SessionCA:
    """Write a new CA into ``confdir`` (mode 0600 for the key) and return its certificate."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name(
        [
            x509.NameAttribute(NameOID.ORGANIZATION_NAME, "Corral egress"),
            x509.NameAttribute(NameOID.COMMON_NAME, f"Corral session CA {session}"),
        ]
    )
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(days=1))
        .not_valid_after(now + datetime.timedelta(days=days))
        .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    cert_pem = cert.public_bytes(serialization.Encoding.PEM).decode()
    key_pem = key.private_bytes(
        serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8, serialization.NoEncryption()
    ).decode()
    confdir.mkdir(parents=True, exist_ok=True)
    secret = confdir / KEY_AND_CERT
    fd = os.open(secret, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as out:
        out.write(key_pem + cert_pem)
    (confdir / CERT_ONLY).write_text(cert_pem)
    if owner is not None:
        for path in (confdir, secret, confdir / CERT_ONLY):
            os.chown(path, *owner)
    return SessionCA(cert_pem, cert.fingerprint(hashes.SHA256()).hex(), cert.not_valid_after_utc.timestamp())
