"""A throwaway certificate authority for TLS tests, made with ``cryptography``.

:func:`make_certs` writes, in a folder: the CA (``ca.crt``), a server certificate for
``localhost``, ``registry.test`` (a name tests resolve to loopback) and ``127.0.0.1``
(``server.crt``/``server.key``), one for another name
only (``wrong.crt``/``wrong.key``), and a client certificate (``client.cert``/
``client.key``, the names Docker's ``certs.d`` uses), all signed by the CA. Keys are
P-256: quick to make.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

import pytest

x509 = pytest.importorskip("cryptography.x509")
from cryptography.hazmat.primitives import hashes, serialization  # noqa: E402
from cryptography.hazmat.primitives.asymmetric import ec  # noqa: E402
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID  # noqa: E402


@dataclass(frozen=True)
class Certs:
    folder: Path
    ca: Path
    server: tuple[Path, Path]  # certificate, key: localhost and 127.0.0.1
    wrong: tuple[Path, Path]  # certificate, key: wrong.invalid only
    client: tuple[Path, Path]  # certificate, key: a client's


def _name(text: str) -> x509.Name:
    return x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, text)])


def _write_key(key: ec.EllipticCurvePrivateKey, path: Path) -> None:
    path.write_bytes(key.private_bytes(serialization.Encoding.PEM,
                                       serialization.PrivateFormat.PKCS8,
                                       serialization.NoEncryption()))


def _sign(subject: str, key: ec.EllipticCurvePrivateKey, issuer: str,
          issuer_key: ec.EllipticCurvePrivateKey, extensions: list) -> x509.Certificate:
    now = datetime.datetime.now(datetime.timezone.utc)
    builder = (x509.CertificateBuilder().subject_name(_name(subject))
               .issuer_name(_name(issuer)).public_key(key.public_key())
               .serial_number(x509.random_serial_number())
               .not_valid_before(now - datetime.timedelta(minutes=5))
               .not_valid_after(now + datetime.timedelta(days=1)))
    for ext, critical in extensions:
        builder = builder.add_extension(ext, critical=critical)
    return builder.sign(issuer_key, hashes.SHA256())


def _leaf(folder: Path, name: str, subject: str, ca_key: ec.EllipticCurvePrivateKey,
          extensions: list, suffix: str = ".crt") -> tuple[Path, Path]:
    key = ec.generate_private_key(ec.SECP256R1())
    cert = _sign(subject, key, "weightstore test CA", ca_key,
                 [(x509.BasicConstraints(ca=False, path_length=None), True), *extensions])
    cert_path, key_path = folder / f"{name}{suffix}", folder / f"{name}.key"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    _write_key(key, key_path)
    return cert_path, key_path


def make_certs(folder: Path) -> Certs:
    folder.mkdir(parents=True, exist_ok=True)
    ca_key = ec.generate_private_key(ec.SECP256R1())
    ca = _sign("weightstore test CA", ca_key, "weightstore test CA", ca_key, [
        (x509.BasicConstraints(ca=True, path_length=None), True),
        (x509.KeyUsage(digital_signature=True, key_cert_sign=True, crl_sign=True,
                       content_commitment=False, key_encipherment=False,
                       data_encipherment=False, key_agreement=False,
                       encipher_only=False, decipher_only=False), True),
        (x509.SubjectKeyIdentifier.from_public_key(ca_key.public_key()), False)])
    (folder / "ca.crt").write_bytes(ca.public_bytes(serialization.Encoding.PEM))
    aki = x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key())
    server_use = (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.SERVER_AUTH]), False)
    server = _leaf(folder, "server", "localhost", ca_key, [
        (x509.SubjectAlternativeName([x509.DNSName("localhost"), x509.DNSName("registry.test"),
                                      x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]),
         False), server_use, (aki, False)])
    wrong = _leaf(folder, "wrong", "wrong.invalid", ca_key, [
        (x509.SubjectAlternativeName([x509.DNSName("wrong.invalid")]), False),
        server_use, (aki, False)])
    client = _leaf(folder, "client", "weightstore test client", ca_key, [
        (x509.ExtendedKeyUsage([ExtendedKeyUsageOID.CLIENT_AUTH]), False), (aki, False)],
        suffix=".cert")
    return Certs(folder, folder / "ca.crt", server, wrong, client)
