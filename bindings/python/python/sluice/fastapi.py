"""A per-route FastAPI dependency.

    @app.get("/search", dependencies=[sluice.fastapi.rate_limit(limiter, burst, api_key_header="x-api-key")])
    async def search(): ...

or as a parameter, to read the verdict: ``verdict: sluice.HttpVerdict = sluice.fastapi.rate_limit(...)``.
A denial raises :class:`RateLimitExceeded` (an ``HTTPException`` carrying ``Retry-After`` and
the ``RateLimit`` fields); call :func:`install` once to answer it with exactly the Rust
layer's problem+json body instead of FastAPI's ``{"detail": ...}``. An admitted response
gets the ``RateLimit`` fields; concurrency leases are released when the request ends.
"""

from __future__ import annotations

import json
from typing import Any

from fastapi import Depends, HTTPException, Request, Response

from ._rules import Rule, build_guard


class RateLimitExceeded(HTTPException):
    """A request denied by a :func:`rate_limit` dependency (or failed closed)."""

    def __init__(self, verdict) -> None:
        self.verdict = verdict
        try:
            detail = json.loads(verdict.body).get("detail", "rate limit exceeded")
        except ValueError:
            detail = "rate limit exceeded"
        headers = {n: v for n, v in verdict.headers if n != "content-type"}
        super().__init__(status_code=verdict.status, detail=detail, headers=headers)


async def _answer(_request: Request, exc: RateLimitExceeded) -> Response:
    v = exc.verdict
    return Response(content=v.body, status_code=v.status, headers=dict(v.headers))


def install(app) -> None:
    """Answers :class:`RateLimitExceeded` with the Rust layer's exact 429 (or fail-closed) answer."""
    app.add_exception_handler(RateLimitExceeded, _answer)


def rate_limit(limiter, *policies, cost: int = 1, **options: Any):
    """A dependency checking ``policies`` (all or nothing) at ``cost`` for every request of
    the routes it is added to; identity options as :class:`sluice.asgi.RateLimitMiddleware`."""
    if not policies:
        raise ValueError("rate_limit needs at least one policy")
    guard = build_guard(limiter, [Rule("/", policies, cost=cost)], **options)

    async def dependency(request: Request, response: Response):
        client = request.client
        target = request.scope.get("raw_path") or request.url.path.encode("latin-1")
        verdict = await guard.decide(
            request.method, target.decode("latin-1"), request.headers.raw, client.host if client else None
        )
        request.state.sluice_identity = verdict.identity
        if not verdict.allowed:
            raise RateLimitExceeded(verdict)
        # The rule counts every request, so its status does not matter to the settling.
        added = verdict.finish_now(200)
        if added is None:
            added = await verdict.finish(200)
        for name, value in added:
            response.headers[name] = value
        try:
            yield verdict
        finally:
            if verdict.leases:
                await verdict.release()

    return Depends(dependency)
