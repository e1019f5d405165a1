"""Certificates of a test's own: a self-signed CA, a server certificate for ``127.0.0.1`` and
``localhost``, and a client certificate, written as PEM files.

Why generated per test run: a checked-in certificate expires, and a test that verifies
certificates must be able to make a second, unrelated CA (the "wrong CA" a client must
refuse). RSA 2048 keys take a few milliseconds each with ``cryptography``.
"""

from __future__ import annotations

import datetime
import ipaddress
import os
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

_DAY = datetime.timedelta(days=1)


@dataclass(frozen=True)
class CertPair:
    """A certificate and its private key, as PEM files."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class PKI:
    """A CA and what it signed; ``wrong_ca`` is a second CA that signed nothing here."""

    ca: Path
    server: CertPair
    client: CertPair
    wrong_ca: Path


def _key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


def _name(common_name: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, common_name)])


def _write_key(key: rsa.RSAPrivateKey, path: Path) -> None:
    """Readable by its owner only: libpq and PostgreSQL refuse a key others may read."""
    path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.TraditionalOpenSSL,
            serialization.NoEncryption(),
        )
    )
    os.chmod(path, 0o600)


def _write_cert(cert: x509.Certificate, path: Path) -> None:
    path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))


def _ca(common_name: str) -> tuple[x509.Certificate, rsa.RSAPrivateKey]:
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    cert = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(_name(common_name))
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _DAY)
        .not_valid_after(now + _DAY)
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
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
    return cert, key


def _leaf(
    ca: tuple[x509.Certificate, rsa.RSAPrivateKey], common_name: str, *, server: bool
) -> tuple[x509.Certificate, rsa.RSAPrivateKey]:
    ca_cert, ca_key = ca
    key = _key()
    now = datetime.datetime.now(datetime.UTC)
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        x509.CertificateBuilder()
        .subject_name(_name(common_name))
        .issuer_name(ca_cert.subject)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - _DAY)
        .not_valid_after(now + _DAY)
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    if server:
        names: list[x509.GeneralName] = [
            x509.DNSName("localhost"),
            x509.IPAddress(ipaddress.ip_address("127.0.0.1")),
        ]
        builder = builder.add_extension(x509.SubjectAlternativeName(names), critical=False)
    return builder.sign(ca_key, hashes.SHA256()), key


def make_pki(folder: Path, *, client_name: str = "flowx") -> PKI:
    """Write a CA, a server pair for 127.0.0.1/localhost, a client pair whose common name is
    ``client_name`` (PostgreSQL's ``cert`` authentication maps it to the role), and a second,
    unrelated CA into ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    ca = _ca("FlowX test CA")
    _write_cert(ca[0], folder / "ca.crt")
    pairs = {}
    for stem, common_name, server in (
        ("server", "localhost", True),
        ("client", client_name, False),
    ):
        cert, key = _leaf(ca, common_name, server=server)
        pairs[stem] = CertPair(folder / f"{stem}.crt", folder / f"{stem}.key")
        _write_cert(cert, pairs[stem].cert)
        _write_key(key, pairs[stem].key)
    wrong, _ = _ca("FlowX test CA")  # the same name, another key: only the key tells them apart
    _write_cert(wrong, folder / "wrong-ca.crt")
    return PKI(folder / "ca.crt", pairs["server"], pairs["client"], folder / "wrong-ca.crt")
