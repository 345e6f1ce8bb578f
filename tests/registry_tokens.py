"""A Bearer token service for the test registry (``auth: token``), as Harbor, GHCR or
Docker Hub run one: Basic credentials in, an ES256-signed JWT out, whose certificate the
registry trusts (``rootcertbundle``) and finds in the token's ``x5c`` header. An identity
token (``refresh_token``) is traded too, by docker's OAuth2 POST
(``grant_type=refresh_token``)."""

from __future__ import annotations

import base64
import datetime
import json
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path
from urllib.parse import parse_qs, urlparse

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.asymmetric.utils import decode_dss_signature
from cryptography.x509.oid import NameOID

ISSUER = "weightstore-test-issuer"
SERVICE = "weightstore-test-registry"


def _b64(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


class TokenService:
    """Grants every requested action to ``user``/``password`` (or to ``refresh_token``);
    counts tokens issued, and those issued for the refresh token."""

    def __init__(self, folder: Path, user: str, password: str,
                 refresh_token: str | None = None) -> None:
        self.key = ec.generate_private_key(ec.SECP256R1())
        name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "token-signer")])
        now = datetime.datetime.now(datetime.timezone.utc)
        self.cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name)
                     .public_key(self.key.public_key()).serial_number(1)
                     .not_valid_before(now - datetime.timedelta(days=1))
                     .not_valid_after(now + datetime.timedelta(days=1))
                     .add_extension(x509.BasicConstraints(ca=True, path_length=None), True)
                     .sign(self.key, hashes.SHA256()))
        self.bundle = folder / "token-ca.pem"
        self.bundle.write_bytes(self.cert.public_bytes(serialization.Encoding.PEM))
        self.user, self.password = user, password
        self.refresh_token = refresh_token
        self.issued = 0
        self.refreshed = 0
        service = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *args: object) -> None:
                pass

            def do_GET(self) -> None:
                expected = "Basic " + base64.b64encode(
                    f"{service.user}:{service.password}".encode()).decode()
                if self.headers.get("Authorization") != expected:
                    self.send_response(401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                query = parse_qs(urlparse(self.path).query)
                self.answer({"token": service.token(query.get("scope", []))})

            def do_POST(self) -> None:
                length = int(self.headers.get("Content-Length", "0"))
                form = parse_qs(self.rfile.read(length).decode())
                if (service.refresh_token is None
                        or form.get("grant_type") != ["refresh_token"]
                        or form.get("refresh_token") != [service.refresh_token]
                        or form.get("service") != [SERVICE]):
                    self.send_response(401)
                    self.send_header("Content-Length", "0")
                    self.end_headers()
                    return
                scopes = " ".join(form.get("scope", [])).split()
                service.refreshed += 1
                self.answer({"access_token": service.token(scopes), "expires_in": 300,
                             "refresh_token": service.refresh_token})

            def answer(self, doc: dict) -> None:
                body = json.dumps(doc).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        self.server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.realm = f"http://127.0.0.1:{self.server.server_port}/token"
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    def token(self, scopes: list[str]) -> str:
        access = []
        for scope in scopes:
            kind, name, actions = scope.split(":")
            access.append({"type": kind, "name": name, "actions": actions.split(",")})
        now = int(time.time())
        header = {"typ": "JWT", "alg": "ES256",
                  "x5c": [base64.b64encode(self.cert.public_bytes(
                      serialization.Encoding.DER)).decode()]}
        claims = {"iss": ISSUER, "sub": self.user, "aud": SERVICE, "exp": now + 300,
                  "nbf": now - 10, "iat": now, "jti": f"t{self.issued}", "access": access}
        signing_input = f"{_b64(json.dumps(header).encode())}.{_b64(json.dumps(claims).encode())}"
        r, s = decode_dss_signature(self.key.sign(signing_input.encode(),
                                                  ec.ECDSA(hashes.SHA256())))
        self.issued += 1
        return f"{signing_input}.{_b64(r.to_bytes(32, 'big') + s.to_bytes(32, 'big'))}"

    def config(self) -> str:
        """The registry's ``auth:`` section."""
        return (f"auth:\n  token:\n    realm: {self.realm}\n    service: {SERVICE}\n"
                f"    issuer: {ISSUER}\n    rootcertbundle: {self.bundle}\n")

    def __enter__(self) -> TokenService:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.server.shutdown()
        self.server.server_close()
