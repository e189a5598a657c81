"""Client authentication (app.auth): a token matrix, JWKS caching and refresh, API keys, and the ASGI gate.

Real keys (cryptography), real tokens (PyJWT), a real JWKS server on loopback counting its requests, and a
small Starlette app behind the gate; no mocks but a clock for the refresh intervals.
"""

from __future__ import annotations

import asyncio
import base64
import hashlib
import hmac
import http.server
import json
import logging
import threading
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import httpx
import jwt
import pytest
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from jwt.algorithms import ECAlgorithm, RSAAlgorithm
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse
from starlette.routing import Route, WebSocketRoute
from starlette.types import Message
from starlette.websockets import WebSocket

from iqgraph.app.security.auth import Authenticator, Unauthenticated
from iqgraph.app.security.gate import AuthGate
from iqgraph.app.settings import Settings, SettingsError
from iqgraph.schema.access import ANONYMOUS, PRINCIPAL_SCOPE_KEY, Principal, principal_of

ISSUER = "https://issuer.test/"
AUDIENCE = "iqgraph"
SECRET = "a-shared-secret-long-enough-for-hs256-and-even-for-hs384-tokens"  # noqa: S105 - a test's
REFUSAL = (
    b'{"errors":[{"message":"authentication required: send a valid bearer token or API key",'
    b'"extensions":{"code":"UNAUTHENTICATED"}}]}'
)


@dataclass(frozen=True)
class Signer:
    """Who signs test tokens: a secret (HS*) or a private key (RS256/ES256), under a kid."""

    key: Any
    alg: str
    kid: str | None = None

    def jwk(self) -> dict[str, Any]:
        algorithm: Any = RSAAlgorithm if self.alg == "RS256" else ECAlgorithm
        public = algorithm.to_jwk(self.key.public_key(), as_dict=True)
        return {**public, "kid": self.kid, "use": "sig", "alg": self.alg}

    def token(self, **claims: Any) -> str:
        """Return a token valid for five minutes; a claim given as None is left out."""
        now = int(time.time())
        payload = {"iss": ISSUER, "aud": AUDIENCE, "sub": "alice", "iat": now, "exp": now + 300, "scope": "read:orders"}
        payload.update(claims)
        headers = None if self.kid is None else {"kid": self.kid}
        return jwt.encode({k: v for k, v in payload.items() if v is not None}, self.key, self.alg, headers)


def jwks(*signers: Signer) -> dict[str, Any]:
    return {"keys": [s.jwk() for s in signers]}


HS = Signer(SECRET, "HS256")


@pytest.fixture(scope="module")
def rsa_key() -> rsa.RSAPrivateKey:
    return rsa.generate_private_key(public_exponent=65537, key_size=2048)


@pytest.fixture(scope="module")
def rs(rsa_key: rsa.RSAPrivateKey) -> Signer:
    return Signer(rsa_key, "RS256", "rsa-1")


def es(kid: str) -> Signer:
    return Signer(ec.generate_private_key(ec.SECP256R1()), "ES256", kid)


class JwksServer:
    """A JWKS endpoint on loopback serving ``keys`` (or ``status``), counting the requests it gets."""

    def __init__(self) -> None:
        self.keys: dict[str, Any] = {"keys": []}
        self.status = 200
        self.requests = 0
        self.url = ""
        self.delay_s = 0.0

    async def served(self, requests: int) -> None:
        """Wait until it has had that many requests (a refresh in the background)."""
        for _ in range(200):
            if self.requests >= requests:
                await asyncio.sleep(0.05)  # its answer handled too
                return
            await asyncio.sleep(0.02)
        raise AssertionError(f"{self.requests} requests, not {requests}")


@pytest.fixture
def issuer() -> Iterator[JwksServer]:
    state = JwksServer()

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_GET(self) -> None:  # noqa: N802 - http.server's name
            state.requests += 1
            time.sleep(state.delay_s)
            body = json.dumps(state.keys).encode()
            self.send_response(state.status)
            self.send_header("content-type", "application/json")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args: Any) -> None:
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, args=(0.05,), daemon=True)
    thread.start()
    state.url = f"http://127.0.0.1:{server.server_address[1]}/.well-known/jwks.json"
    yield state
    server.shutdown()
    server.server_close()
    thread.join()


class Clock:
    """A monotonic clock the test moves."""

    def __init__(self) -> None:
        self.now = 1_000.0

    def __call__(self) -> float:
        return self.now


def jwt_settings(**overrides: Any) -> Settings:
    values: dict[str, Any] = {"auth": "jwt", "jwt_issuer": ISSUER, "jwt_audience": AUDIENCE, **overrides}
    if "jwt_jwks" not in values:
        values.setdefault("jwt_secret", SECRET)
    return Settings(**values)


def authenticator(settings: Settings, clock: Callable[[], float] = time.monotonic) -> Authenticator:
    built = Authenticator.from_settings(settings, clock=clock)
    assert built is not None
    return built


def bearer(token: str) -> dict[str, str]:
    return {"authorization": f"Bearer {token}"}


async def refusal(auth: Authenticator, headers: dict[str, str]) -> str:
    with pytest.raises(Unauthenticated) as refused:
        await auth.authenticate(headers)
    return refused.value.reason


def segment(data: bytes) -> str:
    return base64.urlsafe_b64encode(data).rstrip(b"=").decode()


def forged_claims() -> bytes:
    now = int(time.time())
    claims = {"iss": ISSUER, "aud": AUDIENCE, "sub": "mallory", "exp": now + 300, "scope": "read:*"}
    return json.dumps(claims).encode()


def unsigned_token() -> str:
    """Return an ``alg: none`` token with otherwise valid claims (PyJWT would not make one)."""
    return f"{segment(json.dumps({'alg': 'none', 'typ': 'JWT'}).encode())}.{segment(forged_claims())}."


def hmac_token(secret: bytes, header: dict[str, Any]) -> str:
    """Return a token signed with HMAC-SHA256 under any secret (PyJWT refuses a PEM key as one)."""
    signing_input = f"{segment(json.dumps(header).encode())}.{segment(forged_claims())}"
    return f"{signing_input}.{segment(hmac.new(secret, signing_input.encode(), hashlib.sha256).digest())}"


# -- the HS256 token matrix ---------------------------------------------------------------------------------

HS_REFUSED: list[tuple[str, Callable[[], dict[str, str]], str]] = [
    ("no credential", lambda: {}, "no credential"),
    ("empty bearer", lambda: {"authorization": "Bearer "}, "malformed credential"),
    ("bearer with spaces", lambda: {"authorization": "Bearer a b"}, "malformed credential"),
    ("basic scheme", lambda: {"authorization": "Basic YWxpY2U6cHc="}, "unsupported authorization scheme"),
    ("not a jwt", lambda: bearer("not.a.jwt"), "malformed token"),
    ("one segment", lambda: bearer("garbage"), "malformed token"),
    ("alg none", lambda: bearer(unsigned_token()), "algorithm not allowed"),
    ("HS384", lambda: bearer(Signer(SECRET, "HS384").token()), "algorithm not allowed"),
    ("expired beyond leeway", lambda: bearer(HS.token(exp=int(time.time()) - 60)), "expired"),
    (
        "nbf in the future",
        lambda: bearer(HS.token(nbf=int(time.time()) + 120)),
        "not yet valid (nbf or iat in the future)",
    ),
    (
        "iat in the future",
        lambda: bearer(HS.token(iat=int(time.time()) + 120)),
        "not yet valid (nbf or iat in the future)",
    ),
    ("wrong issuer", lambda: bearer(HS.token(iss="https://evil.test/")), "wrong issuer"),
    ("wrong audience", lambda: bearer(HS.token(aud="another-api")), "wrong audience"),
    ("missing sub", lambda: bearer(HS.token(sub=None)), "missing claim sub"),
    ("empty sub", lambda: bearer(HS.token(sub="")), "empty sub"),
    ("missing exp", lambda: bearer(HS.token(exp=None)), "missing claim exp"),
    ("missing iss", lambda: bearer(HS.token(iss=None)), "missing claim iss"),
    ("missing aud", lambda: bearer(HS.token(aud=None)), "missing claim aud"),
    (
        "wrong signature",
        lambda: bearer(Signer("another-secret-also-32-bytes-long!!", "HS256").token()),
        "bad signature",
    ),
    ("scope not strings", lambda: bearer(HS.token(scope=[1, 2])), "claim scope is not a string or a list of strings"),
    # RFC 7519 §2: a NumericDate is a number; PyJWT alone would turn a string of digits into one
    ("exp a string", lambda: bearer(HS.token(exp=str(int(time.time()) + 300))), "claim exp is not a NumericDate"),
    ("nbf a string", lambda: bearer(HS.token(nbf=str(int(time.time()) - 5))), "claim nbf is not a NumericDate"),
    ("iat a string", lambda: bearer(HS.token(iat=str(int(time.time())))), "claim iat is not a NumericDate"),
    ("api key to a jwt node", lambda: {"x-api-key": "k"}, "API key sent but api-key is not enabled"),
    ("ApiKey to a jwt node", lambda: {"authorization": "ApiKey k"}, "API key sent but api-key is not enabled"),
    ("two credentials", lambda: {**bearer(HS.token()), "x-api-key": "k"}, "both authorization and x-api-key sent"),
]


@pytest.mark.parametrize(("headers", "reason"), [c[1:] for c in HS_REFUSED], ids=[c[0] for c in HS_REFUSED])
async def test_an_hs256_node_refuses_each_bad_credential_with_its_reason(
    headers: Callable[[], dict[str, str]], reason: str
) -> None:
    assert await refusal(authenticator(jwt_settings()), headers()) == reason


HS_ACCEPTED: list[tuple[str, dict[str, Any], Principal]] = [
    (
        "scopes as a string",
        {"scope": "read:orders read:customers write:x"},
        Principal("alice", frozenset({"orders", "customers"})),
    ),
    (
        "scopes as a list",
        {"scope": ["read:orders", "read:customers"]},
        Principal("alice", frozenset({"orders", "customers"})),
    ),
    ("read:* reads every store", {"scope": "read:orders read:*"}, Principal("alice", None)),
    ("no scope reads nothing", {"scope": None}, Principal("alice", frozenset())),
    ("expired within the leeway", {"exp": -10}, Principal("alice", frozenset({"orders"}))),  # (relative: now - 10)
    ("aud among several", {"aud": ["other", AUDIENCE]}, Principal("alice", frozenset({"orders"}))),
]


@pytest.mark.parametrize(("claims", "principal"), [c[1:] for c in HS_ACCEPTED], ids=[c[0] for c in HS_ACCEPTED])
async def test_a_valid_hs256_token_is_its_subject_with_the_stores_its_scopes_grant(
    claims: dict[str, Any], principal: Principal
) -> None:
    if claims.get("exp", 0) < 0:  # relative to now, not to when the module was collected
        claims = {**claims, "exp": int(time.time()) + claims["exp"]}
    assert await authenticator(jwt_settings()).authenticate(bearer(HS.token(**claims))) == principal


async def test_the_scope_claim_and_the_leeway_are_settings() -> None:
    auth = authenticator(jwt_settings(scope_claim="permissions", jwt_leeway_s=0))
    principal = await auth.authenticate(bearer(HS.token(scope="read:*", permissions=["read:orders"])))
    assert principal == Principal("alice", frozenset({"orders"}))
    assert await refusal(auth, bearer(HS.token(exp=int(time.time()) - 2))) == "expired"


async def test_a_refusal_is_logged_with_its_reason_and_client_never_the_token(caplog: pytest.LogCaptureFixture) -> None:
    token = HS.token(exp=int(time.time()) - 600)
    caplog.set_level(logging.INFO, logger="iqgraph.app.security.auth")
    with pytest.raises(Unauthenticated):
        await authenticator(jwt_settings()).authenticate(bearer(token), client="10.0.0.7:50123")
    [record] = caplog.records
    assert record.levelno == logging.INFO
    assert "expired" in record.getMessage() and "10.0.0.7:50123" in record.getMessage()
    assert token not in caplog.text and token.split(".")[1] not in caplog.text


def test_a_short_secret_is_refused_at_start() -> None:
    with pytest.raises(SettingsError, match="jwt_secret must be at least 32 bytes"):
        Authenticator.from_settings(jwt_settings(jwt_secret="short"))  # noqa: S106 - a test's


def test_auth_none_has_no_authenticator() -> None:
    assert Authenticator.from_settings(Settings()) is None


# -- JWKS: RS256 / ES256 ------------------------------------------------------------------------------------


def jwks_file(path: Path, *signers: Signer) -> Path:
    path.write_text(json.dumps(jwks(*signers)))
    return path


async def test_rs256_from_a_jwks_file(tmp_path: Path, rs: Signer) -> None:
    auth = authenticator(jwt_settings(jwt_jwks=str(jwks_file(tmp_path / "jwks.json", rs))))
    assert await auth.authenticate(bearer(rs.token(scope="read:*"))) == Principal("alice", None)


async def test_es256_from_a_jwks_url(issuer: JwksServer) -> None:
    signer = es("ec-1")
    issuer.keys = jwks(signer)
    auth = authenticator(jwt_settings(jwt_jwks=issuer.url))
    assert await auth.authenticate(bearer(signer.token())) == Principal("alice", frozenset({"orders"}))
    assert await auth.authenticate(bearer(signer.token(sub="bob"))) == Principal("bob", frozenset({"orders"}))
    assert issuer.requests == 1  # the set is cached


async def test_a_jwks_node_refuses_hs_tokens_without_fetching_keys(issuer: JwksServer, rs: Signer) -> None:
    issuer.keys = jwks(rs)
    auth = authenticator(jwt_settings(jwt_jwks=issuer.url))
    public_pem = rs.key.public_key().public_bytes(
        serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
    )
    confused = hmac_token(public_pem, {"alg": "HS256", "kid": rs.kid})  # the public key as an HMAC secret
    assert await refusal(auth, bearer(confused)) == "algorithm not allowed"
    assert await refusal(auth, bearer(HS.token())) == "algorithm not allowed"
    assert await refusal(auth, bearer(unsigned_token())) == "algorithm not allowed"
    assert issuer.requests == 0


async def test_a_token_must_match_its_keys_algorithm_and_signature(tmp_path: Path, rs: Signer) -> None:
    auth = authenticator(jwt_settings(jwt_jwks=str(jwks_file(tmp_path / "jwks.json", rs))))
    impostor_rsa = Signer(rsa.generate_private_key(public_exponent=65537, key_size=2048), "RS256", rs.kid)
    assert await refusal(auth, bearer(impostor_rsa.token())) == "bad signature"
    impostor_ec = Signer(ec.generate_private_key(ec.SECP256R1()), "ES256", rs.kid)  # ES256 claiming the RSA kid
    assert await refusal(auth, bearer(impostor_ec.token())) == "algorithm not allowed"
    assert await refusal(auth, bearer(Signer(rs.key, "RS256").token())) == "token has no kid"


async def test_an_unknown_kid_refetches_once_per_interval(issuer: JwksServer) -> None:
    old, new, random = es("2024"), es("2025"), es("random")
    issuer.keys = jwks(old)
    clock = Clock()
    auth = authenticator(jwt_settings(jwt_jwks=issuer.url), clock)
    assert (await auth.authenticate(bearer(old.token()))).subject == "alice"
    assert issuer.requests == 1

    issuer.keys = jwks(new)  # the issuer rotates its key
    assert (await auth.authenticate(bearer(new.token()))).subject == "alice"
    assert issuer.requests == 2

    clock.now += 9  # within 10 s of that refetch: unknown kids cost nothing
    assert await refusal(auth, bearer(random.token())) == "unknown kid"
    assert await refusal(auth, bearer(old.token())) == "unknown kid"  # the rotated-out key is gone
    assert issuer.requests == 2

    clock.now += 2
    assert await refusal(auth, bearer(random.token())) == "unknown kid"
    assert issuer.requests == 3


async def test_concurrent_tokens_with_a_new_kid_share_one_refetch(issuer: JwksServer) -> None:
    old, new = es("old"), es("new")
    issuer.keys = jwks(old)
    auth = authenticator(jwt_settings(jwt_jwks=issuer.url))
    await auth.authenticate(bearer(old.token()))
    issuer.keys = jwks(old, new)
    principals = await asyncio.gather(*(auth.authenticate(bearer(new.token(sub=f"u{i}"))) for i in range(8)))
    assert [p.subject for p in principals] == [f"u{i}" for i in range(8)]
    assert issuer.requests == 2


async def test_a_stale_set_is_refreshed_and_kept_while_the_issuer_is_down(issuer: JwksServer) -> None:
    signer = es("k1")
    issuer.keys = jwks(signer)
    clock = Clock()
    auth = authenticator(jwt_settings(jwt_jwks=issuer.url), clock)
    await auth.authenticate(bearer(signer.token()))
    issuer.status = 503
    clock.now += 301  # older than five minutes: refreshed in the background, the refresh fails, the keys are kept
    assert (await auth.authenticate(bearer(signer.token()))).subject == "alice"
    await issuer.served(2)
    assert (await auth.authenticate(bearer(signer.token()))).subject == "alice"
    await asyncio.sleep(0.2)
    assert issuer.requests == 2  # the next try waits 10 s
    issuer.status = 200
    clock.now += 11
    assert (await auth.authenticate(bearer(signer.token()))).subject == "alice"
    await issuer.served(3)


async def test_a_slow_issuer_holds_no_request_whose_key_is_cached(issuer: JwksServer) -> None:
    signer = es("k1")
    issuer.keys = jwks(signer)
    clock = Clock()
    auth = authenticator(jwt_settings(jwt_jwks=issuer.url), clock)
    await auth.authenticate(bearer(signer.token()))
    issuer.delay_s, issuer.status = 2.0, 503
    clock.now += 301  # stale: every request answers from the cached key while one refresh waits on the issuer
    started = time.monotonic()
    answers = await asyncio.gather(*(auth.authenticate(bearer(signer.token())) for _ in range(8)))
    assert {a.subject for a in answers} == {"alice"} and time.monotonic() - started < 0.5
    await issuer.served(2)
    await asyncio.sleep(2.2)
    assert issuer.requests == 2  # one background refresh, not one per request


async def test_a_jwks_url_that_fails_at_first_refuses_with_unknown_kid(issuer: JwksServer) -> None:
    issuer.status = 500
    auth = authenticator(jwt_settings(jwt_jwks=issuer.url))
    assert await refusal(auth, bearer(es("k").token())) == "unknown kid"
    assert await refusal(auth, bearer(es("k").token())) == "unknown kid"
    assert issuer.requests == 1


async def test_a_jwks_file_is_reread_on_an_unknown_kid(tmp_path: Path, rs: Signer) -> None:
    path = jwks_file(tmp_path / "jwks.json", rs)
    auth = authenticator(jwt_settings(jwt_jwks=str(path)))
    added = es("ec-2")
    jwks_file(path, rs, added)
    assert (await auth.authenticate(bearer(added.token()))).subject == "alice"


async def test_a_cached_key_costs_no_thread(issuer: JwksServer, rs: Signer, monkeypatch: pytest.MonkeyPatch) -> None:
    issuer.keys = jwks(rs)
    auth = authenticator(jwt_settings(jwt_jwks=issuer.url))
    await auth.authenticate(bearer(rs.token()))

    async def no_thread(*args: Any) -> Any:
        raise AssertionError("a cached key went to a thread")

    monkeypatch.setattr(asyncio, "to_thread", no_thread)
    assert (await auth.authenticate(bearer(rs.token()))).subject == "alice"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        (None, "No such file"),
        ("{not json", "Expecting property name"),
        ("[]", "not a JWK set"),
        ('{"keys": [{"kty": "oct", "k": "c2VjcmV0", "kid": "h"}]}', "no RS256 or ES256 signing key"),
    ],
    ids=["missing", "not json", "not an object", "only an HMAC key"],
)
def test_a_bad_jwks_file_stops_the_start_naming_the_setting(tmp_path: Path, content: str | None, message: str) -> None:
    path = tmp_path / "jwks.json"
    if content is not None:
        path.write_text(content)
    with pytest.raises(SettingsError, match=rf"jwt_jwks .*{message}.*--jwt-jwks"):
        Authenticator.from_settings(jwt_settings(jwt_jwks=str(path)))


# -- API keys -----------------------------------------------------------------------------------------------

REPORTING_KEY = "ik_reporting_0123456789abcdef"
ADMIN_KEY = "ik_admin_fedcba9876543210"


def sha256(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


def api_keys_file(tmp_path: Path) -> Path:
    path = tmp_path / "keys.toml"
    path.write_text(
        f'[keys.reporting]\nsha256 = "{sha256(REPORTING_KEY)}"\nscopes = ["read:orders"]\n'
        f'[keys.admin]\nsha256 = "{sha256(ADMIN_KEY).upper()}"\nscopes = ["read:*"]\n'
    )
    return path


async def test_an_api_key_in_either_header_is_its_named_principal(tmp_path: Path) -> None:
    auth = authenticator(Settings(auth="api-key", api_keys=api_keys_file(tmp_path)))
    reporting = Principal("api-key:reporting", frozenset({"orders"}))
    assert await auth.authenticate({"x-api-key": REPORTING_KEY}) == reporting
    assert await auth.authenticate({"authorization": f"ApiKey {REPORTING_KEY}"}) == reporting
    assert await auth.authenticate({"authorization": f"apikey {ADMIN_KEY}"}) == Principal("api-key:admin", None)
    assert await refusal(auth, {"x-api-key": "ik_guessed"}) == "unknown API key"
    assert await refusal(auth, {"x-api-key": sha256(REPORTING_KEY)}) == "unknown API key"  # the hash is no key
    assert await refusal(auth, {}) == "no credential"
    assert await refusal(auth, bearer(HS.token())) == "bearer token sent but jwt is not enabled"


async def test_with_both_methods_either_works(tmp_path: Path) -> None:
    auth = authenticator(jwt_settings(auth="jwt,api-key", api_keys=api_keys_file(tmp_path)))
    assert (await auth.authenticate(bearer(HS.token()))).subject == "alice"
    assert (await auth.authenticate({"x-api-key": ADMIN_KEY})).subject == "api-key:admin"
    assert await refusal(auth, bearer(HS.token(iss="https://evil.test/"))) == "wrong issuer"
    assert await refusal(auth, {"x-api-key": "nope"}) == "unknown API key"
    assert auth.challenge == "Bearer, ApiKey"


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ("keys = [", "cannot be read"),
        ("[other]\nx = 1\n", "has no keys"),
        ('[keys.a]\nsha256 = "abc"\nscopes = []\n', r"\[keys.a\]: sha256 must be 64 hex digits"),
        (f'[keys.a]\nsha256 = "{"z" * 64}"\nscopes = []\n', "sha256 must be 64 hex digits"),
        (f'[keys.a]\nsha256 = "{"a" * 64}"\nscopes = "read:*"\n', "scopes must be a list of strings"),
        (f'[keys.a]\nsha256 = "{"a" * 64}"\nscope = ["read:*"]\n', "needs exactly sha256"),
        (
            f'[keys.a]\nsha256 = "{"a" * 64}"\nscopes = []\n[keys.b]\nsha256 = "{"A" * 64}"\nscopes = []\n',
            "same sha256",
        ),
    ],
    ids=["not toml", "no keys", "short hash", "not hex", "scopes a string", "misspelt field", "duplicate"],
)
def test_a_bad_api_keys_file_stops_the_start_saying_what_to_fix(tmp_path: Path, content: str, message: str) -> None:
    path = tmp_path / "keys.toml"
    path.write_text(content)
    with pytest.raises(SettingsError, match=rf"api_keys file .*{message}"):
        Authenticator.from_settings(Settings(auth="api-key", api_keys=path))


def test_a_missing_api_keys_file_stops_the_start(tmp_path: Path) -> None:
    with pytest.raises(SettingsError, match="api_keys file .*missing.toml cannot be read"):
        Authenticator.from_settings(Settings(auth="api-key", api_keys=tmp_path / "missing.toml"))


# -- the ASGI gate ------------------------------------------------------------------------------------------


async def echo(request: Request) -> JSONResponse:
    """Answer with the principal the gate put in the scope (None: none)."""
    principal = request.scope.get(PRINCIPAL_SCOPE_KEY)
    return JSONResponse({"principal": None if principal is None else principal.to_json()})


async def echo_socket(websocket: WebSocket) -> None:
    await websocket.accept()
    await websocket.send_json(principal_of(websocket.scope).to_json())
    await websocket.close()


ROUTES = [
    Route("/graphql", echo, methods=["GET", "POST"]),
    WebSocketRoute("/graphql", echo_socket),
    Route("/graphql/static/{path:path}", echo),
    Route("/healthz", echo),
    Route("/readyz", echo),
    Route("/metrics", echo),
    Route("/dashboard", echo),
    Route("/internal/graphql", echo, methods=["POST"]),
    Route("/stores/{store}/keys/{key}", echo),
    Route("/raw/{store}/{key}", echo),
]


def gate(auth: Authenticator | None, **options: Any) -> AuthGate:
    return AuthGate(Starlette(routes=ROUTES), auth, **options)


async def call(app: AuthGate, method: str, path: str, headers: dict[str, str] | None = None) -> httpx.Response:
    transport = httpx.ASGITransport(app=app, client=("10.0.0.7", 50123))
    async with httpx.AsyncClient(transport=transport, base_url="http://node") as client:
        return await client.request(method, path, headers=headers)


BROWSER = "text/html,application/xhtml+xml,application/xml;q=0.9,*/*;q=0.8"


async def test_a_refused_request_gets_401_and_one_unauthenticated_error() -> None:
    response = await call(gate(authenticator(jwt_settings())), "POST", "/graphql", bearer(HS.token(aud="x")))
    assert response.status_code == 401
    assert response.content == REFUSAL
    assert response.headers["content-type"] == "application/json"
    assert response.headers["www-authenticate"] == "Bearer"
    assert "data" not in response.json()


async def test_the_challenge_names_api_keys_when_they_are_on(tmp_path: Path) -> None:
    app = gate(authenticator(Settings(auth="api-key", api_keys=api_keys_file(tmp_path))))
    response = await call(app, "GET", "/stores/orders/keys/1")
    assert (response.status_code, response.headers["www-authenticate"]) == (401, "ApiKey")


async def test_the_principal_reaches_the_app() -> None:
    response = await call(gate(authenticator(jwt_settings())), "POST", "/graphql", bearer(HS.token()))
    assert response.json() == {"principal": {"sub": "alice", "stores": ["orders"]}}


@pytest.mark.parametrize(
    ("method", "path", "headers"),
    [
        ("POST", "/graphql", {}),
        ("GET", "/graphql", {"accept": "application/json"}),
        ("GET", "/graphql", {"accept": "*/*"}),
        ("GET", "/graphql?query={orders{key}}", {"accept": BROWSER}),  # a query: data, whatever it accepts
        ("GET", "/graphql?query=", {"accept": BROWSER}),
        ("GET", "/graphql", {"accept": "text/html;q=0, application/json"}),
        ("GET", "/stores/orders/keys/1", {}),
        ("GET", "/raw/orders/1", {}),  # not named public: protected
        ("GET", "/healthz/../graphql", {}),
        ("GET", "/nowhere", {}),
    ],
)
async def test_protected_requests_without_a_credential_are_refused(
    method: str, path: str, headers: dict[str, str]
) -> None:
    response = await call(gate(authenticator(jwt_settings())), method, path, headers)
    assert (response.status_code, response.content) == (401, REFUSAL)


@pytest.mark.parametrize(
    ("method", "path", "headers"),
    [
        ("GET", "/healthz", {}),
        ("GET", "/readyz", {}),
        ("GET", "/metrics", {}),
        ("GET", "/graphql/static/graphiql.min.js", {}),
        ("POST", "/internal/graphql", {}),  # peers are checked by their signature (app.peer_auth)
        ("GET", "/graphql", {"accept": BROWSER}),  # GraphiQL's page
        ("GET", "/dashboard", {}),  # the app's page: it holds no data, its websocket authenticates
    ],
)
async def test_public_requests_pass_without_a_principal(method: str, path: str, headers: dict[str, str]) -> None:
    response = await call(gate(authenticator(jwt_settings())), method, path, headers)
    assert (response.status_code, response.json()) == (200, {"principal": None})


async def test_a_bad_credential_on_a_public_path_is_not_looked_at() -> None:
    response = await call(gate(authenticator(jwt_settings())), "GET", "/healthz", bearer("garbage"))
    assert (response.status_code, response.json()) == (200, {"principal": None})


async def test_with_auth_off_every_request_is_anonymous() -> None:
    app = gate(None)
    for method, path in (("POST", "/graphql"), ("GET", "/stores/orders/keys/1"), ("GET", "/healthz")):
        response = await call(app, method, path, bearer("garbage"))
        assert response.json() == {"principal": ANONYMOUS.to_json()}


async def test_what_is_protected_is_a_parameter() -> None:
    app = gate(authenticator(jwt_settings()), protected=lambda method, path: method == "POST")
    assert (await call(app, "GET", "/stores/orders/keys/1")).json() == {"principal": None}
    assert (await call(app, "POST", "/graphql")).status_code == 401


async def serve(app: AuthGate, scope: dict[str, Any], *incoming: Message) -> list[Message]:
    """Return what app sends when it serves scope and reads incoming (an ASGI server's part, for websockets)."""
    inbox: asyncio.Queue[Message] = asyncio.Queue()
    for message in incoming:
        inbox.put_nowait(message)
    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    await asyncio.wait_for(app(scope, inbox.get, send), timeout=5)
    return sent


def websocket_scope(headers: dict[str, str]) -> dict[str, Any]:
    raw = [(name.encode(), value.encode()) for name, value in headers.items()]
    return {"type": "websocket", "path": "/graphql", "headers": raw, "query_string": b"", "client": ("10.0.0.7", 1)}


async def test_a_websocket_without_a_credential_is_closed_with_4401_before_accept() -> None:
    sent = await serve(gate(authenticator(jwt_settings())), websocket_scope({}), {"type": "websocket.connect"})
    assert sent == [{"type": "websocket.close", "code": 4401}]


async def test_a_websocket_with_a_token_gets_its_principal() -> None:
    scope = websocket_scope(bearer(HS.token()))
    sent = await serve(gate(authenticator(jwt_settings())), scope, {"type": "websocket.connect"})
    assert sent[0]["type"] == "websocket.accept"
    assert json.loads(sent[1]["text"]) == {"sub": "alice", "stores": ["orders"]}


async def test_the_lifespan_passes_the_gate() -> None:
    incoming = ({"type": "lifespan.startup"}, {"type": "lifespan.shutdown"})
    sent = await serve(gate(authenticator(jwt_settings())), {"type": "lifespan"}, *incoming)
    assert [m["type"] for m in sent] == ["lifespan.startup.complete", "lifespan.shutdown.complete"]


def test_principal_of_a_scope_nothing_authenticated_is_anonymous() -> None:
    assert principal_of({"type": "http"}) is ANONYMOUS
