"""ASGI middleware for Starlette and FastAPI.

    app.add_middleware(
        sluice.asgi.RateLimitMiddleware,
        limiter=limiter,
        rules=[sluice.Rule("/", [burst]), sluice.Rule("/health")],
        api_key_header="x-api-key",
        trusted_proxies=["10.0.0.0/8"],
    )

or, for the routes of a ``sluice.toml`` exactly as ``sluice serve`` limits them::

    app.add_middleware(sluice.asgi.RateLimitMiddleware, config="sluice.toml")

Each HTTP request is decided in Rust (:class:`sluice.HttpGuard`, the decision function of
the Rust layer and the proxy) without blocking the event loop. A refusal is answered here:
429 with ``Retry-After``, the ``RateLimit`` fields, ``Cache-Control: no-store`` and a
problem+json body; 403 for a deny-listed client; the fail-closed status (503 by default) when
the store is down and a policy fails closed; 400 for a path with no safe normal form. An
admitted response is settled by its status when it starts (a route counting by outcome
refunds what it does not count) and gets the ``RateLimit`` fields; concurrency leases are
released when the response has been sent (or the app raised). The identity is put in ``scope["state"]["sluice_identity"]``
(``request.state.sluice_identity`` in Starlette).

The app is called with the path the request was limited as: when the guard normalized it
(``/%6cogin``, ``//login`` and ``/a/../login`` are all ``/login``), ``scope["path"]`` and
``scope["raw_path"]`` are that normal form, as ``sluice serve``'s proxy forwards it, so the
app's router serves the route that was limited and not another spelling of it.
"""

from __future__ import annotations

from typing import Any, Awaitable, Callable, MutableMapping
from urllib.parse import unquote

from ._rules import build_guard

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]


def request_target(scope: Scope) -> str:
    """The target as sent (the path percent-encoded, as the Rust layer reads it, and the
    query), else the decoded path."""
    raw = scope.get("raw_path")
    path = raw.decode("latin-1") if raw else scope.get("root_path", "") + scope["path"]
    query = scope.get("query_string")
    return f"{path}?{query.decode('latin-1')}" if query else path


def use_normalized_path(scope: Scope, path: str) -> None:
    """Hands the app ``path`` (percent-encoded, the full path the guard limited): as
    ``raw_path``, and decoded as ``path`` the way ASGI servers decode it."""
    scope["raw_path"] = path.encode("latin-1")
    scope["path"] = unquote(path)


def _encoded(headers) -> list:
    return [(n.encode("latin-1"), v.encode("latin-1")) for n, v in headers]


class RateLimitMiddleware:
    """Rate limits HTTP requests of an ASGI app; see the module docs for the options
    (those of :func:`sluice._rules.build_guard`). ``config="sluice.toml"`` limits the file's
    routes as ``sluice serve`` does."""

    def __init__(self, app: ASGIApp, limiter=None, rules=None, policies=None, **options: Any) -> None:
        self.app = app
        self.guard = build_guard(limiter, rules, policies, **options)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        client = scope.get("client")
        verdict = await self.guard.decide(
            scope["method"], request_target(scope), scope["headers"], client[0] if client else None
        )
        if not verdict.allowed:
            if verdict.identity is not None:
                scope.setdefault("state", {})["sluice_identity"] = verdict.identity
            await send_denial(send, verdict)
            return
        if verdict.path is not None:
            use_normalized_path(scope, verdict.path)
        if not verdict.limited:
            await self.app(scope, receive, send)
            return
        scope.setdefault("state", {})["sluice_identity"] = verdict.identity

        async def send_finishing(message: Message) -> None:
            if message["type"] == "http.response.start":
                # Settled by the status (a route counting by outcome refunds here), so the
                # fields describe the state after the refund.
                added = verdict.finish_now(message["status"])
                if added is None:
                    added = await verdict.finish(message["status"])
                if added:
                    message = dict(message)
                    message["headers"] = list(message.get("headers", ())) + _encoded(added)
            elif message["type"] == "http.response.body" and not message.get("more_body") and verdict.leases:
                # Released before the last byte goes out, so a client that sends its next
                # request on seeing the response complete finds the lease free.
                await verdict.release()
            await send(message)

        try:
            await self.app(scope, receive, send_finishing)
        finally:
            # Leases still held (an admission never finished, because the app raised, keeps
            # its charge).
            if verdict.leases:
                await verdict.release()


async def send_denial(send: Send, verdict) -> None:
    """Sends the refusal the Rust layer would send: status, headers and body as given."""
    body = verdict.body
    headers = _encoded(verdict.headers)
    headers.append((b"content-length", str(len(body)).encode()))
    await send({"type": "http.response.start", "status": verdict.status, "headers": headers})
    await send({"type": "http.response.body", "body": body})
