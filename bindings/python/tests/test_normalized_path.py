"""The app is called with the path the middleware limited: FastAPI under uvicorn and Flask
under werkzeug, sent other spellings of a limited route (repeated slashes, dot segments,
encoded unreserved characters) over a raw HTTP connection that sends the target as written.
The route's one request is used by whichever spelling comes first, and the app sees and
routes the normal form, as behind ``sluice serve``'s proxy."""

import http.client
import json
from urllib.parse import urlsplit

import pytest
from fastapi import FastAPI, Request
from flask import Flask, request as flask_request

import sluice
import sluice.asgi
import sluice.wsgi
from conftest import serve_uvicorn, serve_wsgi


def rules():
    one = sluice.Policy.fixed_window("one", limit=1, window="1m")
    return [sluice.Rule("/admin", [one]), sluice.Rule("/")]


def fastapi_app(limiter):
    app = FastAPI()
    app.add_middleware(sluice.asgi.RateLimitMiddleware, limiter=limiter, rules=rules())

    @app.get("/admin")
    async def admin(request: Request):
        return {"path": request.scope["path"], "raw_path": request.scope["raw_path"].decode()}

    @app.get("/open/{rest:path}")
    async def open_(request: Request):
        return {"path": request.scope["path"], "raw_path": request.scope["raw_path"].decode()}

    return app


def flask_app(limiter):
    app = Flask(__name__)

    @app.get("/admin")
    def admin():
        return {"path": flask_request.path, "raw_path": flask_request.environ.get("RAW_URI", "")}

    @app.get("/open/<path:rest>")
    def open_(rest):
        return {"path": flask_request.path, "raw_path": flask_request.environ.get("RAW_URI", "")}

    app.wsgi_app = sluice.wsgi.RateLimitMiddleware(app.wsgi_app, limiter=limiter, rules=rules())
    return app


@pytest.fixture(params=["fastapi", "flask"])
def base(request):
    limiter = sluice.Limiter.connect_sync("memory")
    serve = serve_uvicorn if request.param == "fastapi" else serve_wsgi
    url, stop = serve(fastapi_app(limiter) if request.param == "fastapi" else flask_app(limiter))
    yield url
    stop()


def raw_get(base, target):
    """GET with the target sent exactly as written (no client-side normalization)."""
    u = urlsplit(base)
    conn = http.client.HTTPConnection(u.hostname, u.port, timeout=5)
    try:
        conn.request("GET", target)
        res = conn.getresponse()
        return res.status, {k.lower(): v for k, v in res.getheaders()}, res.read()
    finally:
        conn.close()


def test_the_app_routes_the_normalized_path_that_was_limited(base):
    # `//admin` is `/admin` to the limiter: limited, and the app's /admin route serves it.
    status, headers, body = raw_get(base, "//admin")
    assert status == 200, body
    assert headers["ratelimit-policy"] == '"one";q=1;w=60'
    assert json.loads(body)["path"] == "/admin"
    # Other spellings of the same route share its one request: limited, never routed apart.
    for target in ["/x/../%61dmin", "/./admin", "/%61dmin?q=1"]:
        status, _, body = raw_get(base, target)
        assert status == 429, (target, body)
    # An unlimited route is handed its normal form too (query kept).
    status, _, body = raw_get(base, "/open//a/./b/../%63?x=1")
    assert status == 200, body
    assert json.loads(body)["path"] == "/open/a/c"


def test_a_path_that_is_already_normal_reaches_the_app_unchanged(base):
    status, _, body = raw_get(base, "/open/caf%C3%A9")
    assert status == 200, body
    assert json.loads(body)["path"] == "/open/café"
