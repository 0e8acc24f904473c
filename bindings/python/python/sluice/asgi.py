"""ASGI middleware for Starlette and FastAPI.

    app.add_middleware(
        sluice.asgi.RateLimitMiddleware,
        limiter=limiter,
        rules=[sluice.Rule("/", [burst]), sluice.Rule("/health")],
        api_key_header="x-api-key",
        trusted_proxies=["10.0.0.0/8"],
    )

Each HTTP request is decided in Rust (:class:`sluice.HttpGuard`) without blocking the event
loop. A denial is answered here: 429 with ``Retry-After``, the ``RateLimit`` fields,
``Cache-Control: no-store`` and a problem+json body, or the fail-closed status (503 by
default) when the store is down and a policy fails closed. An admitted response gets the
``RateLimit`` fields; concurrency leases are released when the response has been sent (or
the app raised). The identity is put in ``scope["state"]["sluice_identity"]``
(``request.state.sluice_identity`` in Starlette).
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, MutableMapping

from ._rules import build_guard

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def request_path(scope: Scope) -> str:
    """The path as sent (percent-encoded, as the Rust layer matches it), else the decoded one."""
    raw = scope.get("raw_path")
    if raw:
        path = raw.decode("latin-1")
        q = path.find("?")
        return path if q < 0 else path[:q]
    return scope.get("root_path", "") + scope["path"]


class RateLimitMiddleware:
    """Rate limits HTTP requests of an ASGI app; see the module docs for the options
    (those of :func:`sluice._rules.build_guard`)."""

    def __init__(self, app: ASGIApp, limiter, rules=None, policies=None, **options: Any) -> None:
        self.app = app
        self.guard = build_guard(limiter, rules, policies, **options)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        verdict = await self.guard.decide(
            scope["method"], request_path(scope), scope["headers"], client[0] if client else None
        )
        if not verdict.limited:
            await self.app(scope, receive, send)
            return
        scope.setdefault("state", {})["sluice_identity"] = verdict.identity
        if not verdict.allowed:
            await send_denial(send, verdict)
            return
        extra = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in verdict.headers]
        holds_leases = verdict.leases > 0

        async def send_with_headers(message: Message) -> None:
            if message["type"] == "http.response.start" and extra:
                message = dict(message)
                message["headers"] = list(message.get("headers", ())) + extra
            elif holds_leases and message["type"] == "http.response.body" and not message.get("more_body"):
                # Released before the last byte goes out, so a client that sends its next
                # request on seeing the response complete finds the lease free.
                await verdict.release()
            await send(message)

        try:
            await self.app(scope, receive, send_with_headers if extra or holds_leases else send)
        finally:
            if holds_leases:
                await verdict.release()


async def send_denial(send: Send, verdict) -> None:
    """Sends the denial the Rust layer would send: status, headers and body as given."""
    body = verdict.body
    headers = [(n.encode("latin-1"), v.encode("latin-1")) for n, v in verdict.headers]
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": verdict.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
