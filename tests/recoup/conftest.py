"""A real OIDC provider for the auth tests: fresh RS256 and ES256 key pairs, a JWKS served over
HTTP from 127.0.0.1, and a helper that mints tokens the way an identity provider would."""

import json
import threading
import time
import uuid
from collections.abc import Iterator
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import jwt
import pytest
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm

ISSUER = "https://idp.example.test/"
AUDIENCE = "recoup-api"


def _jwk(algorithm: type, public_key: object, kid: str, alg: str) -> dict:
    jwk = algorithm.to_jwk(public_key, as_dict=True)
    return {**jwk, "kid": kid, "alg": alg, "use": "sig"}


@dataclass
class OidcProvider:
    """Signs tokens with keys whose public halves the served JWKS publishes."""

    jwks_url: str
    rsa_key: rsa.RSAPrivateKey = field(repr=False)
    ec_key: ec.EllipticCurvePrivateKey = field(repr=False)
    rsa_kid: str
    ec_kid: str
    issuer: str = ISSUER
    audience: str = AUDIENCE

    def token(
        self,
        *,
        alg: str = "RS256",
        sub: str = "idp|alice",
        email: str | None = "alice@example.com",
        expires_in: int = 300,
        issuer: str | None = None,
        audience: str | None = None,
        kid: str | None = None,
        key: object | None = None,
        extra: dict | None = None,
    ) -> str:
        now = int(time.time())
        claims: dict = {
            "sub": sub,
            "iss": issuer if issuer is not None else self.issuer,
            "aud": audience if audience is not None else self.audience,
            "iat": now,
            "exp": now + expires_in,
        }
        if email is not None:
            claims["email"] = email
        claims.update(extra or {})
        own_key, own_kid = (
            (self.rsa_key, self.rsa_kid)
            if alg == "RS256"
            else (
                self.ec_key,
                self.ec_kid,
            )
        )
        return jwt.encode(
            claims,
            key if key is not None else own_key,
            algorithm=alg,
            headers={"kid": kid if kid is not None else own_kid},
        )


def _serve(document: dict, path: str) -> tuple[ThreadingHTTPServer, threading.Thread]:
    body = json.dumps(document).encode()

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's naming
            if self.path != path:
                self.send_response(404)
                self.end_headers()
                return
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, format: str, *args: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    return server, thread


@pytest.fixture
def oidc(settings, monkeypatch) -> Iterator[OidcProvider]:
    """A running JWKS endpoint, and OIDC settings pointing at it."""
    for proxy in ("http_proxy", "HTTP_PROXY", "all_proxy", "ALL_PROXY"):
        monkeypatch.delenv(proxy, raising=False)  # PyJWKClient's urllib would honour them
    rsa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    ec_key = ec.generate_private_key(ec.SECP256R1())
    rsa_kid, ec_kid = f"rsa-{uuid.uuid4().hex}", f"ec-{uuid.uuid4().hex}"
    jwks = {
        "keys": [
            _jwk(RSAAlgorithm, rsa_key.public_key(), rsa_kid, "RS256"),
            _jwk(ECAlgorithm, ec_key.public_key(), ec_kid, "ES256"),
        ]
    }
    # A unique path as well as a fresh port: the auth module caches one JWKS client per URL.
    path = f"/{uuid.uuid4().hex}/.well-known/jwks.json"
    server, thread = _serve(jwks, path)
    provider = OidcProvider(
        jwks_url=f"http://127.0.0.1:{server.server_address[1]}{path}",
        rsa_key=rsa_key,
        ec_key=ec_key,
        rsa_kid=rsa_kid,
        ec_kid=ec_kid,
    )
    settings.OIDC_JWKS_URL = provider.jwks_url
    settings.OIDC_ISSUER = provider.issuer
    settings.OIDC_AUDIENCE = provider.audience
    try:
        yield provider
    finally:
        server.shutdown()
        server.server_close()
        thread.join(timeout=5)
