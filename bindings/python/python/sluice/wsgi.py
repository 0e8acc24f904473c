"""WSGI middleware for Flask, Django and any WSGI app.

    app.wsgi_app = sluice.wsgi.RateLimitMiddleware(
        app.wsgi_app, limiter=sluice.Limiter.connect_sync("redis://..."),
        policies=[burst], api_key_header="x-api-key")

Django: wrap ``application`` in ``wsgi.py`` the same way. Each request is decided in Rust
with the GIL released, so other threads keep running while the store answers. Denials and
headers are those of the Rust layer (see :mod:`sluice.asgi`); concurrency leases are
released when the server closes the response iterable. The identity is put in
``environ["sluice.identity"]``.
"""

from __future__ import annotations

from http import HTTPStatus
from typing import Any, Callable, Iterable, List, Tuple

from ._rules import build_guard


def environ_headers(environ) -> List[Tuple[bytes, bytes]]:
    """The request headers of a WSGI environ as ``(name, value)`` byte pairs."""
    out = []
    for key, value in environ.items():
        if key.startswith("HTTP_"):
            name = key[5:]
        elif key in ("CONTENT_TYPE", "CONTENT_LENGTH"):
            name = key
        else:
            continue
        out.append((name.replace("_", "-").lower().encode("latin-1"), value.encode("latin-1")))
    return out


def status_line(status: int) -> str:
    try:
        return f"{status} {HTTPStatus(status).phrase}"
    except ValueError:
        return str(status)


class _Releasing:
    """The app's response iterable, releasing the request's leases before its last chunk is
    handed to the server (so a client that sends its next request on seeing the response
    complete finds the lease free), and at the latest when the server closes it."""

    def __init__(self, inner: Iterable[bytes], verdict) -> None:
        self._inner = inner
        self._verdict = verdict

    def __iter__(self):
        held = None
        have = False
        for chunk in self._inner:
            if have:
                yield held
            held, have = chunk, True
        self._verdict.release_sync()
        if have:
            yield held

    def close(self) -> None:
        try:
            close = getattr(self._inner, "close", None)
            if close is not None:
                close()
        finally:
            self._verdict.release_sync()


class RateLimitMiddleware:
    """Rate limits requests of a WSGI app; options as :class:`sluice.asgi.RateLimitMiddleware`."""

    def __init__(self, app: Callable, limiter, rules=None, policies=None, **options: Any) -> None:
        self.app = app
        self.guard = build_guard(limiter, rules, policies, **options)

    def __call__(self, environ, start_response):
        path = environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", "")
        verdict = self.guard.decide_sync(
            environ.get("REQUEST_METHOD", "GET"),
            path or "/",
            environ_headers(environ),
            environ.get("REMOTE_ADDR"),
        )
        if not verdict.limited:
            return self.app(environ, start_response)
        environ["sluice.identity"] = verdict.identity
        if not verdict.allowed:
            body = verdict.body
            headers = list(verdict.headers) + [("Content-Length", str(len(body)))]
            start_response(status_line(verdict.status), headers)
            return [body]
        extra = verdict.headers

        def start_with_headers(status, headers, exc_info=None):
            return start_response(status, list(headers) + extra, exc_info)

        result = self.app(environ, start_with_headers if extra else start_response)
        if verdict.leases:
            return _Releasing(result, verdict)
        return result
