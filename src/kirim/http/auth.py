"""Bearer tokens: ``Authorization: Bearer kirim_…`` on every /v1 route.

A feed token (``kfeed_…``, ``kirim.feed_tokens``) is not one of them: it reaches only
its recipient's feed (``routes_feed``), and any other route answers it 403.

Tokens are verified against the store (their sha256); a verified token is
remembered for ``ttl`` seconds (1 by default), so a revoked token stops working on
every server within that time, without a database read per request. The token
itself is never logged: requests are logged with the token's *name*.
"""

from __future__ import annotations

import time
from typing import Annotated

from fastapi import Depends, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from kirim.feed_tokens import is_feed_token
from kirim.http.errors import ApiError
from kirim.store.base import ApiToken, Tokens
from kirim.tokens import hash_token

#: the dashboard's login cookie (HttpOnly, SameSite=Strict)
COOKIE = "kirim_session"
REALM = 'Bearer realm="kirim"'
_MAX_CACHED = 4096

bearer = HTTPBearer(
    auto_error=False,
    scheme_name="bearerToken",
    description="A token from `kirim token create --name NAME`.",
)


class TokenVerifier:
    """Checks secrets against the store, remembering good ones for ``ttl`` seconds."""

    def __init__(self, store: Tokens, *, ttl: float = 1.0) -> None:
        self.store = store
        self.ttl = ttl
        self._cache: dict[str, tuple[ApiToken, float]] = {}

    async def verify(self, secret: str) -> ApiToken | None:
        if not secret or len(secret) > 512:
            return None
        digest = hash_token(secret)
        now = time.monotonic()
        hit = self._cache.get(digest)
        if hit is not None and hit[1] > now:
            return hit[0]
        token = await self.store.verify_token(digest)
        if token is None:
            self._cache.pop(digest, None)
            return None
        if self.ttl > 0:
            if len(self._cache) >= _MAX_CACHED:
                self._cache.clear()
            self._cache[digest] = (token, now + self.ttl)
        return token


def unauthorized(given: bool) -> ApiError:
    if given:
        return ApiError(
            401,
            "unauthorized",
            "the bearer token is unknown or revoked",
            headers={"WWW-Authenticate": f'{REALM}, error="invalid_token"'},
        )
    return ApiError(
        401,
        "unauthorized",
        "a bearer token is required: Authorization: Bearer TOKEN "
        "(create one with `kirim token create --name NAME`)",
        headers={"WWW-Authenticate": REALM},
    )


def feed_only() -> ApiError:
    """A feed token where an operator token is needed."""
    return ApiError(
        403,
        "forbidden",
        "a feed token reaches only its recipient's feed (/v1/recipients/{id}/feed…); "
        "this route needs an operator token",
    )


async def authenticate(request: Request, secret: str | None) -> ApiToken:
    """The token for ``secret``, recorded on the request for the access log; else 401
    (403 for a feed token: it reaches only its recipient's feed, ``routes_feed``)."""
    verifier: TokenVerifier = request.app.state.verifier
    if secret is None:
        raise unauthorized(False)
    if is_feed_token(secret):
        raise feed_only()
    token = await verifier.verify(secret)
    if token is None:
        raise unauthorized(True)
    request.scope.setdefault("state", {})["kirim_client"] = token.name
    return token


async def require_token(
    request: Request,
    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(bearer)],
) -> ApiToken:
    """The dependency of every /v1 route."""
    return await authenticate(request, None if credentials is None else credentials.credentials)


def bearer_secret(request: Request) -> str | None:
    """The token of an ``Authorization: Bearer`` header, if any."""
    header = request.headers.get("authorization", "")
    scheme, _, value = header.partition(" ")
    if scheme.lower() != "bearer" or not value.strip():
        return None
    return value.strip()


async def optional_client(request: Request, *, required: bool, cookie: bool = False) -> str | None:
    """For /metrics and the dashboard: verify a token only when they are protected
    (from the header, or the dashboard's cookie). Returns the token's name."""
    if not required:
        return None
    secret = bearer_secret(request)
    if secret is None and cookie:
        secret = request.cookies.get(COOKIE)
    token = await authenticate(request, secret)
    return token.name
