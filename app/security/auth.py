"""Client authentication: a JWT bearer token or a static API key becomes the request's Principal.

``Authenticator.authenticate(headers)`` returns the caller or raises ``Unauthenticated`` (with a reason for
the log); ``app.security.gate.AuthGate`` asks it for every request to a protected path.

Choices:

- **PyJWT** (with ``cryptography``): the most used JWT library for Python, small and typed; its ``decode``
  checks signature, ``exp``/``nbf``/``iat`` with a leeway, ``iss`` and ``aud`` in one call, its PyJWK binds
  each key to one algorithm (a token cannot pick how its signature is checked), and its PyJWKClient fetches a
  JWKS without following redirects. joserfc would do as well; it brings JWE and JWS serializations we have
  no use for.
- **Algorithms are fixed by the setting, never by the token**: HS256 with ``jwt_secret`` (at least 32
  bytes, RFC 7518 §3.2), RS256/ES256 with ``jwt_jwks``; a JWKS never verifies an HS* token (no
  algorithm confusion) and ``none`` is never accepted. ``exp``, ``sub``, ``iss`` and ``aud`` are required.
- **JWKS keys are cached here** (``JwksKeys``), so a known ``kid`` costs no I/O and no thread hop. The set is
  fetched (URL: PyJWKClient, no redirects) or re-read (file) in a thread when it is older than five
  minutes, or when a token names an unknown ``kid`` — at most one such refetch per 10 s, so tokens with
  random kids cannot make a node hammer the issuer. A failed refresh keeps the keys it had (and waits
  10 s before the next try). A JWKS file is read at start: a missing or invalid one stops the node.
- **API keys are stored hashed** (SHA-256 hex in the ``api_keys`` TOML file) and compared with
  ``hmac.compare_digest`` against every configured key.
- **What is logged**: each refusal at INFO with a short reason ("expired", "wrong issuer", "unknown kid",
  ...) and the client's address — never a token, a key, or a claim's value. The client learns nothing of
  the reason.
"""

from __future__ import annotations

import asyncio
import hashlib
import hmac
import json
import logging
import math
import time
import tomllib
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import jwt

from iqgraph.app.settings import ENV_PREFIX, Settings, SettingsError
from iqgraph.schema.access import Principal

__all__ = ["ApiKeys", "Authenticator", "JwksKeys", "JwtVerifier", "Unauthenticated"]

log = logging.getLogger(__name__)

HS_ALGORITHM = "HS256"
JWKS_ALGORITHMS = frozenset({"RS256", "ES256"})
REFETCH_INTERVAL_S = 10.0  # at most one JWKS refetch for unknown kids (or retry after a failure) per interval
JWKS_MAX_AGE_S = 300.0  # a JWKS older than this is refreshed (revoked keys go away)
JWKS_TIMEOUT_S = 10.0


class Unauthenticated(Exception):
    """A request's credential is missing or not accepted; ``reason`` is for the log, never for the client."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


# -- JWT ----------------------------------------------------------------------------------------------------

Keys = dict[str | None, jwt.PyJWK]


def _signing_keys(jwk_set: jwt.PyJWKSet) -> Keys:
    """Return the set's RS256/ES256 signing keys by kid (a lone key without kid under None)."""
    usable = [k for k in jwk_set.keys if k.algorithm_name in JWKS_ALGORITHMS and k.public_key_use in ("sig", None)]
    if not usable:
        raise jwt.PyJWKSetError("no RS256 or ES256 signing key in the JWK set")
    keys: Keys = {k.key_id: k for k in usable if k.key_id}
    if len(usable) == 1 and not usable[0].key_id:
        keys[None] = usable[0]
    return keys


def _parse_jwks(data: bytes) -> jwt.PyJWKSet:
    parsed = json.loads(data)
    if not isinstance(parsed, dict):
        raise ValueError("not a JWK set (a JSON object with keys)")
    return jwt.PyJWKSet.from_dict(parsed)


#: What refreshing the JWK set may raise (the set is kept, the failure logged).
_LOAD_ERRORS = (OSError, ValueError, jwt.PyJWTError)


class JwksKeys:
    """The JWKS signing keys, cached; refreshed in a thread when stale or on an unknown kid (rate limited)."""

    def __init__(
        self,
        source: str,
        load: Callable[[], Keys],
        initial: Keys | None = None,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.source = source
        self._load = load
        self._clock = clock
        self._keys: Keys = initial or {}
        self._fetched_at = clock() if initial is not None else None
        self._next_try = -math.inf  # earliest unscheduled fetch: refetch for an unknown kid, retry after failure
        self._lock = asyncio.Lock()
        self._background: asyncio.Task[None] | None = None  # the refresh of a stale set, while one runs

    @classmethod
    def from_setting(cls, source: str, clock: Callable[[], float] = time.monotonic) -> JwksKeys:
        """Return the keys of jwt_jwks: a URL is fetched on first use, a file is read now (SettingsError if bad)."""
        if source.startswith(("http://", "https://")):
            client = jwt.PyJWKClient(source, cache_jwk_set=False, timeout=JWKS_TIMEOUT_S)
            return cls(source, lambda: _signing_keys(client.get_jwk_set()), clock=clock)
        path = Path(source)

        def load() -> Keys:
            return _signing_keys(_parse_jwks(path.read_bytes()))

        try:
            initial = load()
        except _LOAD_ERRORS as exc:
            hint = f"--jwt-jwks / {ENV_PREFIX}JWT_JWKS: a JWKS file or an http(s) URL"
            raise SettingsError(f"jwt_jwks {source!r} cannot be used: {exc} ({hint})") from None
        return cls(source, load, initial, clock)

    async def key(self, kid: str | None) -> jwt.PyJWK:
        """Return the key of kid; raise Unauthenticated("unknown kid") if the (refreshed) set has none."""
        found = self._fresh(kid)
        if found is not None:
            return found
        stale = self._keys.get(kid)
        if stale is not None:  # only old: answer with it now and refresh in the background (a slow issuer
            self._refresh_in_background()  # must not hold every request)
            return stale
        async with self._lock:  # one refresh at a time; the waiting requests then find its keys
            found = self._fresh(kid)
            if found is None:
                await self._refresh()
                found = self._keys.get(kid)
        if found is None:
            raise Unauthenticated("unknown kid" if kid is not None else "token has no kid")
        return found

    def _fresh(self, kid: str | None) -> jwt.PyJWK | None:
        if self._fetched_at is None or self._clock() - self._fetched_at >= JWKS_MAX_AGE_S:
            return None
        return self._keys.get(kid)

    def _refresh_in_background(self) -> None:
        if self._background is not None and not self._background.done():
            return

        async def refresh() -> None:
            async with self._lock:
                if self._fetched_at is None or self._clock() - self._fetched_at >= JWKS_MAX_AGE_S:
                    await self._refresh()

        self._background = asyncio.get_running_loop().create_task(refresh())

    async def _refresh(self) -> None:
        now = self._clock()
        scheduled = self._fetched_at is None or now - self._fetched_at >= JWKS_MAX_AGE_S
        if now < self._next_try:
            return
        try:
            keys = await asyncio.to_thread(self._load)
        except _LOAD_ERRORS as exc:
            self._next_try = self._clock() + REFETCH_INTERVAL_S  # from the failure: a slow fetch is not retried at once
            log.warning("cannot refresh the JWKS from %s (keeping %d keys): %s", self.source, len(self._keys), exc)
            return
        if not scheduled:
            self._next_try = now + REFETCH_INTERVAL_S
        self._keys, self._fetched_at = keys, self._clock()


@dataclass(frozen=True)
class JwtRules:
    """What every token must satisfy beside its signature."""

    issuer: str
    audience: str
    leeway_s: int
    scope_claim: str


#: PyJWT's refusals, most specific first, and the reason logged for each.
_JWT_REASONS: tuple[tuple[type[jwt.PyJWTError], str], ...] = (
    (jwt.ExpiredSignatureError, "expired"),
    (jwt.ImmatureSignatureError, "not yet valid (nbf or iat in the future)"),
    (jwt.InvalidIssuerError, "wrong issuer"),
    (jwt.InvalidAudienceError, "wrong audience"),
    (jwt.InvalidSignatureError, "bad signature"),
    (jwt.InvalidAlgorithmError, "algorithm not allowed"),
    (jwt.InvalidKeyError, "key not usable"),
    (jwt.DecodeError, "malformed token"),
)


def _jwt_reason(exc: jwt.PyJWTError) -> str:
    if isinstance(exc, jwt.MissingRequiredClaimError):
        return f"missing claim {exc.claim}"
    fallback = f"invalid token ({type(exc).__name__})"  # never the message: it may quote the token's claims
    return next((reason for kind, reason in _JWT_REASONS if isinstance(exc, kind)), fallback)


def _kid(header: Mapping[str, Any]) -> str | None:
    kid = header.get("kid")
    if kid is not None and not isinstance(kid, str):
        raise Unauthenticated("malformed token")
    return kid


class JwtVerifier:
    """Verify bearer tokens: HS256 with a shared secret, or RS256/ES256 with the keys of a JWKS."""

    def __init__(self, rules: JwtRules, key: str | JwksKeys) -> None:
        """Verify tokens against rules, signed with key: HS256's shared secret, or the keys of a JWKS."""
        self.rules = rules
        self._key = key

    @classmethod
    def from_settings(cls, settings: Settings, *, clock: Callable[[], float] = time.monotonic) -> JwtVerifier:
        """Return the verifier the jwt_* settings describe (Settings checked them); SettingsError for a bad JWKS."""
        issuer, audience = settings.jwt_issuer, settings.jwt_audience
        assert issuer and audience and (settings.jwt_secret or settings.jwt_jwks)  # noqa: S101 - Settings checks
        rules = JwtRules(issuer, audience, settings.jwt_leeway_s, settings.scope_claim)
        if settings.jwt_secret is not None:
            return cls(rules, settings.jwt_secret)
        assert settings.jwt_jwks is not None  # noqa: S101 - Settings checks: one of the two
        return cls(rules, JwksKeys.from_setting(settings.jwt_jwks, clock))

    async def verify(self, token: str) -> Principal:
        """Return the principal of a valid token; raise Unauthenticated with the reason it is not."""
        try:
            header = jwt.get_unverified_header(token)
        except jwt.PyJWTError:
            raise Unauthenticated("malformed token") from None
        alg = header.get("alg")
        if not isinstance(alg, str) or alg not in (JWKS_ALGORITHMS if self.jwks else {HS_ALGORITHM}):
            # checked before any key is looked up: an HS* or "none" token cannot make us fetch the JWKS
            raise Unauthenticated("algorithm not allowed")
        key = self._key if isinstance(self._key, str) else await self._key.key(_kid(header))
        try:
            claims = jwt.decode(
                token,
                key,
                algorithms=[alg],
                audience=self.rules.audience,
                issuer=self.rules.issuer,
                leeway=self.rules.leeway_s,
                options={"require": ["exp", "sub", "iss", "aud"], "enforce_minimum_key_length": True},
            )
        except jwt.PyJWTError as exc:
            raise Unauthenticated(_jwt_reason(exc)) from None
        _check_numeric_dates(claims)
        return self._principal(claims)

    @property
    def jwks(self) -> bool:
        """Return whether tokens are verified with a JWKS (RS256/ES256) rather than a shared secret (HS256)."""
        return isinstance(self._key, JwksKeys)

    def _principal(self, claims: Mapping[str, Any]) -> Principal:
        subject, scopes = claims["sub"], claims.get(self.rules.scope_claim)
        if not isinstance(subject, str) or not subject:
            raise Unauthenticated("empty sub")
        if scopes is None:
            scopes = []
        elif isinstance(scopes, str):
            scopes = scopes.split()
        elif not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
            raise Unauthenticated(f"claim {self.rules.scope_claim} is not a string or a list of strings")
        return Principal.from_scopes(subject, scopes)


def _check_numeric_dates(claims: Mapping[str, Any]) -> None:
    """Refuse exp, nbf or iat that is not a number (RFC 7519's NumericDate): PyJWT takes "1767225600" as one."""
    for claim in ("exp", "nbf", "iat"):
        value = claims.get(claim)
        if value is not None and (isinstance(value, bool) or not isinstance(value, int | float)):
            raise Unauthenticated(f"claim {claim} is not a NumericDate")


# -- API keys -----------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ApiKey:
    """A configured key: its name, the hex SHA-256 of its secret, and what it grants."""

    name: str
    sha256: bytes
    principal: Principal


class ApiKeys:
    """The static API keys of machine clients, as hashes."""

    def __init__(self, keys: Iterable[ApiKey]) -> None:
        self._keys = tuple(keys)

    @classmethod
    def load(cls, path: Path) -> ApiKeys:
        """Return the keys of an api_keys TOML file; raise SettingsError saying what to fix."""
        try:
            table = tomllib.loads(path.read_text()).get("keys")
        except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError) as exc:
            raise SettingsError(f"api_keys file {path} cannot be read: {exc} (--api-keys)") from None
        if not isinstance(table, dict) or not table:
            raise SettingsError(f"api_keys file {path} has no keys: add [keys.<name>] tables (--api-keys)")
        keys = [_api_key(path, name, entry) for name, entry in table.items()]
        if len({k.sha256 for k in keys}) < len(keys):
            raise SettingsError(f"api_keys file {path}: two keys have the same sha256")
        return cls(keys)

    def principal(self, key: str) -> Principal:
        """Return the principal of a presented key; raise Unauthenticated if no configured key matches."""
        digest = hashlib.sha256(key.encode()).hexdigest().encode()
        found = None
        for candidate in self._keys:  # every key is compared: the time taken says nothing of which matched
            if hmac.compare_digest(digest, candidate.sha256):
                found = candidate
        if found is None:
            raise Unauthenticated("unknown API key")
        return found.principal


def _api_key(path: Path, name: str, entry: Any) -> ApiKey:
    where = f"api_keys file {path}, [keys.{name}]"
    if not isinstance(entry, dict) or set(entry) != {"sha256", "scopes"}:
        raise SettingsError(f'{where}: needs exactly sha256 = "<hex>" and scopes = [...]')
    digest, scopes = entry["sha256"], entry["scopes"]
    if not isinstance(digest, str) or len(digest) != 64 or any(c not in "0123456789abcdefABCDEF" for c in digest):
        raise SettingsError(f"{where}: sha256 must be 64 hex digits (sha256sum of the key)")
    if not isinstance(scopes, list) or not all(isinstance(s, str) for s in scopes):
        raise SettingsError(f'{where}: scopes must be a list of strings, e.g. ["read:orders"]')
    return ApiKey(name, digest.lower().encode(), Principal.from_scopes(f"api-key:{name}", scopes))


# -- the authenticator --------------------------------------------------------------------------------------


def _credential(headers: Mapping[str, str]) -> tuple[str, str]:
    """Return the request's credential as ("bearer" | "apikey", value); raise Unauthenticated if none or unclear."""
    authorization, api_key = headers.get("authorization"), headers.get("x-api-key")
    if authorization is not None and api_key is not None:
        raise Unauthenticated("both authorization and x-api-key sent")
    if api_key is not None:
        scheme, value = "apikey", api_key.strip()
    elif authorization is None:
        raise Unauthenticated("no credential")
    else:
        scheme, _, value = authorization.strip().partition(" ")
        scheme, value = scheme.lower(), value.strip()
        if scheme not in ("bearer", "apikey"):
            raise Unauthenticated("unsupported authorization scheme")
    if not value or any(c.isspace() for c in value):
        raise Unauthenticated("malformed credential")
    return scheme, value


class Authenticator:
    """Turn a request's credential into a Principal: a JWT bearer token, an API key, or either."""

    def __init__(self, jwt_verifier: JwtVerifier | None = None, api_keys: ApiKeys | None = None) -> None:
        if jwt_verifier is None and api_keys is None:
            raise ValueError("an Authenticator needs a JWT verifier, API keys or both")
        self.jwt = jwt_verifier
        self.api_keys = api_keys

    @classmethod
    def from_settings(cls, settings: Settings, *, clock: Callable[[], float] = time.monotonic) -> Authenticator | None:
        """Return the authenticator of settings.auth (None when it is "none"); raise SettingsError if unusable.

        A JWKS file and the API keys file are read now; a JWKS URL is fetched on the first token. clock (monotonic
        seconds) paces the JWKS refreshes.
        """
        methods = settings.auth_methods
        if not methods:
            return None
        verifier = JwtVerifier.from_settings(settings, clock=clock) if "jwt" in methods else None
        keys = None
        if "api-key" in methods:
            assert settings.api_keys is not None  # noqa: S101 - Settings checks it
            keys = ApiKeys.load(settings.api_keys)
        return cls(verifier, keys)

    @property
    def challenge(self) -> str:
        """Return the 401's WWW-Authenticate value: the schemes a client may use."""
        return ", ".join(s for s, on in (("Bearer", self.jwt), ("ApiKey", self.api_keys)) if on is not None)

    async def authenticate(self, headers: Mapping[str, str], client: str | None = None) -> Principal:
        """Return the caller of a request (headers by lower-case name); log and raise Unauthenticated if refused.

        Args:
            client: the client's address, for the log.
        """
        try:
            return await self._authenticate(headers)
        except Unauthenticated as exc:
            log.info("authentication refused (%s) from %s", exc.reason, client or "an unknown address")
            raise

    async def _authenticate(self, headers: Mapping[str, str]) -> Principal:
        scheme, value = _credential(headers)
        if scheme == "bearer":
            if self.jwt is None:
                raise Unauthenticated("bearer token sent but jwt is not enabled")
            return await self.jwt.verify(value)
        if self.api_keys is None:
            raise Unauthenticated("API key sent but api-key is not enabled")
        return self.api_keys.principal(value)
