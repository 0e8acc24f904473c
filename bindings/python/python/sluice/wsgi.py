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
from urllib.parse import quote, unquote_to_bytes

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


def use_normalized_path(environ, path: str) -> None:
    """Hands the app ``path`` (percent-encoded, the full path the guard limited): decoded
    into ``PATH_INFO`` after ``SCRIPT_NAME`` (bytes as latin-1, as PEP 3333 has it), and as
    ``RAW_URI`` / ``REQUEST_URI`` with the query where the server set those. A path that left
    ``SCRIPT_NAME`` (``/app/../admin`` under ``/app``) is not this app's: it goes on as ``/``."""
    decoded = unquote_to_bytes(path).decode("latin-1")
    script = environ.get("SCRIPT_NAME", "")
    if script:
        inside = decoded == script or decoded.startswith(script + "/")
        decoded = (decoded[len(script):] or "/") if inside else "/"
    environ["PATH_INFO"] = decoded
    query = environ.get("QUERY_STRING")
    for key in ("RAW_URI", "REQUEST_URI"):
        if key in environ:
            environ[key] = f"{path}?{query}" if query else path


def request_target(environ) -> str:
    """The target as sent when the server gives it (``RAW_URI``, ``REQUEST_URI``), else the
    path re-encoded with the query."""
    raw = environ.get("RAW_URI") or environ.get("REQUEST_URI")
    if raw and raw.startswith("/"):
        return raw
    path = quote(environ.get("SCRIPT_NAME", "") + environ.get("PATH_INFO", ""), safe="/;=,:@!$&'()*+~") or "/"
    query = environ.get("QUERY_STRING")
    return f"{path}?{query}" if query else path


class RateLimitMiddleware:
    """Rate limits requests of a WSGI app; options as :class:`sluice.asgi.RateLimitMiddleware`
    (``config="sluice.toml"`` limits the file's routes as ``sluice serve`` does)."""

    def __init__(self, app: Callable, limiter=None, rules=None, policies=None, **options: Any) -> None:
        self.app = app
        self.guard = build_guard(limiter, rules, policies, **options)

    def __call__(self, environ, start_response):
        verdict = self.guard.decide_sync(
            environ.get("REQUEST_METHOD", "GET"),
            request_target(environ),
            environ_headers(environ),
            environ.get("REMOTE_ADDR"),
        )
        if not verdict.allowed:
            environ["sluice.identity"] = verdict.identity
            body = verdict.body
            headers = list(verdict.headers) + [("Content-Length", str(len(body)))]
            start_response(status_line(verdict.status), headers)
            return [body]
        if verdict.path is not None:
            use_normalized_path(environ, verdict.path)
        if not verdict.limited:
            return self.app(environ, start_response)
        environ["sluice.identity"] = verdict.identity

        def start_finishing(status, headers, exc_info=None):
            # Settled by the status (a route counting by outcome refunds here).
            try:
                code = int(str(status).split(" ", 1)[0])
            except ValueError:
                code = 0
            added = verdict.finish_sync(code)
            return start_response(status, list(headers) + added, exc_info)

        try:
            result = self.app(environ, start_finishing)
        except BaseException:
            verdict.release_sync()
            raise
        return _Releasing(result, verdict)
