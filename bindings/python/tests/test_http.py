"""The middleware over real HTTP: FastAPI under uvicorn, Flask under werkzeug, driven by
httpx. The guide's 12-request sequence, exact headers, identities and both failure modes."""

import json
import time

import httpx
import pytest
from fastapi import FastAPI, Request
from flask import Flask, request as flask_request

import sluice
import sluice.asgi
import sluice.fastapi
import sluice.wsgi
from conftest import serve_uvicorn, serve_wsgi

BURST = dict(capacity=10, rate="5/s")


def fastapi_app(limiter, **options):
    app = FastAPI()
    app.add_middleware(sluice.asgi.RateLimitMiddleware, limiter=limiter, **options)

    @app.get("/hello")
    async def hello():
        return {"ok": True}

    @app.get("/whoami")
    async def whoami(request: Request):
        return {"identity": request.state.sluice_identity}

    @app.get("/health")
    async def health():
        return {"ok": True}

    return app


def flask_app(limiter, **options):
    app = Flask(__name__)

    @app.get("/hello")
    def hello():
        return {"ok": True}

    @app.get("/health")
    def health():
        return {"ok": True}

    @app.get("/whoami")
    def whoami():
        return {"identity": flask_request.environ["sluice.identity"]}

    app.wsgi_app = sluice.wsgi.RateLimitMiddleware(app.wsgi_app, limiter=limiter, **options)
    return app


@pytest.fixture(params=["fastapi", "flask"])
def serve(request):
    """Starts the app of the parametrised framework; returns a function (limiter, **options) -> base URL."""
    stops = []

    def start(limiter, **options):
        if request.param == "fastapi":
            base, stop = serve_uvicorn(fastapi_app(limiter, **options))
        else:
            base, stop = serve_wsgi(flask_app(limiter, **options))
        stops.append(stop)
        return base

    yield start
    for stop in stops:
        stop()


def guide_options(policy):
    return dict(
        rules=[sluice.Rule("/", [policy]), sluice.Rule("/health")],
        api_key_header="x-api-key",
    )


@pytest.mark.parametrize("store", ["memory", "redis"])
def test_twelve_quick_requests_give_ten_200_then_429_with_the_guide_headers(serve, store, redis_server):
    url = "memory" if store == "memory" else redis_server.url
    limiter = sluice.Limiter.connect_sync(url, timeout_ms=2000)
    burst = sluice.Policy.token_bucket("burst", **BURST)
    base = serve(limiter, **guide_options(burst))
    key = f"demo-{time.monotonic_ns()}"  # a fresh bucket on the shared Redis
    with httpx.Client(base_url=base, timeout=5) as c:
        statuses, denials = [], []
        for _ in range(12):
            r = c.get("/hello", headers={"x-api-key": key})
            statuses.append(r.status_code)
            if r.status_code == 200:
                assert r.json() == {"ok": True}
                assert r.headers["ratelimit-policy"] == '"burst";q=10;w=2'
                assert "retry-after" not in r.headers
            else:
                denials.append(r)
        assert statuses[:11] == [200] * 10 + [429]
        r = denials[0]
        assert r.headers["ratelimit-policy"] == '"burst";q=10;w=2'
        assert r.headers["ratelimit"] == '"burst";r=0;t=2'
        assert r.headers["retry-after"] == "1"
        assert r.headers["cache-control"] == "no-store"
        assert r.headers["content-type"] == "application/problem+json"
        body = r.json()
        assert (body["status"], body["policy"], body["title"]) == (429, "burst", "Too Many Requests")
        assert body["detail"] == 'rate limit "burst" exceeded (10 per 2 s); retry after 1 s'
        assert 1 <= body["retry_after_ms"] <= 200
        # Another key, and an anonymous client (limited by IP), have buckets of their own.
        assert c.get("/hello", headers={"x-api-key": key + "-other"}).status_code == 200
        assert c.get("/hello").status_code == 200
        # Exempt paths are never limited and carry no headers.
        h = c.get("/health", headers={"x-api-key": key})
        assert h.status_code == 200 and "ratelimit" not in h.headers
        # The bucket refills at 5/s: 250 ms later one more request is admitted.
        time.sleep(0.25)
        assert c.get("/hello", headers={"x-api-key": key}).status_code == 200


def test_identities_are_the_rust_layers(serve):
    limiter = sluice.Limiter.connect_sync()
    policy = sluice.Policy.fixed_window("p", limit=100, window="1m")
    base = serve(limiter, policies=[policy], api_key_header="x-api-key", trusted_proxies=["127.0.0.1/32"])
    with httpx.Client(base_url=base, timeout=5) as c:
        who = lambda **h: c.get("/whoami", headers=h).json()["identity"]
        assert who(**{"x-api-key": "sk_live_1"}) == sluice.hash_credential("sk_live_1")
        assert who() == "ip:127.0.0.1"
        # The peer is a trusted proxy: the right-most untrusted forwarded address is the client.
        assert who(**{"x-forwarded-for": "6.6.6.6, 203.0.113.7"}) == "ip:203.0.113.7"
        assert who(**{"x-forwarded-for": "2001:db8:1:2::9"}) == "ip6:2001:db8:1:2::/64"
    untrusted = serve(limiter, policies=[policy])
    with httpx.Client(base_url=untrusted, timeout=5) as c:
        r = c.get("/whoami", headers={"x-forwarded-for": "203.0.113.7"})
        assert r.json()["identity"] == "ip:127.0.0.1"


def test_fail_open_with_redis_stopped_passes_without_headers(serve, stopped_redis):
    limiter = sluice.Limiter.connect_sync(stopped_redis.url, timeout_ms=50)
    stopped_redis.stop()
    policy = sluice.Policy.fixed_window("p", limit=1, window="1m")
    base = serve(limiter, policies=[policy])
    with httpx.Client(base_url=base, timeout=5) as c:
        for _ in range(3):
            start = time.monotonic()
            r = c.get("/hello")
            assert time.monotonic() - start < 1
            assert r.status_code == 200 and r.json() == {"ok": True}
            for h in ("ratelimit", "ratelimit-policy", "x-ratelimit-limit", "retry-after"):
                assert h not in r.headers, h


@pytest.mark.parametrize("configured,expected", [(None, 503), (429, 429)])
def test_fail_closed_with_redis_stopped_answers_the_configured_status(serve, stopped_redis, configured, expected):
    limiter = sluice.Limiter.connect_sync(stopped_redis.url, timeout_ms=50)
    stopped_redis.stop()
    strict = sluice.Policy.fixed_window("strict", limit=100, window="1m", failure_mode="closed")
    options = {} if configured is None else {"fail_closed_status": configured}
    base = serve(limiter, policies=[strict], **options)
    with httpx.Client(base_url=base, timeout=5) as c:
        start = time.monotonic()
        r = c.get("/hello")
        assert time.monotonic() - start < 1
    assert r.status_code == expected
    assert r.headers["retry-after"] == "1"
    assert r.headers["cache-control"] == "no-store"
    assert r.headers["content-type"] == "application/problem+json"
    assert "ratelimit" not in r.headers
    body = r.json()
    assert (body["policy"], body["status"], body["retry_after_ms"]) == ("strict", expected, 1000)


def test_rules_pick_policies_by_prefix_and_method(serve):
    limiter = sluice.Limiter.connect_sync()
    one = sluice.Policy.fixed_window("one", limit=1, window="1m")
    many = sluice.Policy.fixed_window("many", limit=100, window="1m")
    base = serve(limiter, rules=[
        sluice.Rule("/", [many]),
        sluice.Rule("/hello", [one], methods=["GET"]),
    ])
    with httpx.Client(base_url=base, timeout=5) as c:
        assert c.get("/hello").headers["ratelimit-policy"] == '"one";q=1;w=60'
        assert c.get("/hello").status_code == 429
        assert c.get("/whoami").headers["ratelimit-policy"] == '"many";q=100;w=60'


def test_fastapi_dependency_limits_one_route():
    limiter = sluice.Limiter.connect_sync()
    two = sluice.Policy.fixed_window("search", limit=2, window="1m")
    app = FastAPI()
    sluice.fastapi.install(app)

    @app.get("/search", dependencies=[sluice.fastapi.rate_limit(limiter, two, api_key_header="x-api-key")])
    async def search():
        return {"hits": []}

    @app.get("/free")
    async def free():
        return {"ok": True}

    base, stop = serve_uvicorn(app)
    try:
        with httpx.Client(base_url=base, timeout=5) as c:
            h = {"x-api-key": "k1"}
            r1, r2, r3 = (c.get("/search", headers=h) for _ in range(3))
            assert [r1.status_code, r2.status_code, r3.status_code] == [200, 200, 429]
            assert r1.headers["ratelimit"].startswith('"search";r=1;t=')
            assert r3.headers["retry-after"] and r3.headers["content-type"] == "application/problem+json"
            assert json.loads(r3.content)["policy"] == "search"
            assert c.get("/search", headers={"x-api-key": "k2"}).status_code == 200
            free = c.get("/free", headers=h)
            assert free.status_code == 200 and "ratelimit" not in free.headers
    finally:
        stop()


def test_concurrency_leases_are_released_when_the_response_ends(serve):
    limiter = sluice.Limiter.connect_sync()
    inflight = sluice.Policy.concurrency("inflight", limit=1, lease="1m")
    base = serve(limiter, policies=[inflight])
    with httpx.Client(base_url=base, timeout=5) as c:
        # Sequential requests each take and give back the single lease.
        assert [c.get("/hello").status_code for _ in range(5)] == [200] * 5


CONFIG_TOML = """
identity_hash_key = "5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed5eed"

[store]
url = "{url}"
timeout = "2s"

[lists]
deny = ["hdr:blocked"]

[policies.api]
algorithm = "token-bucket"
capacity = 3
rate = "3/h"
identity = "header:x-user"
ban = {{ after = 2, within = "1m", duration = "10m" }}

[policies.per-ip]
algorithm = "token-bucket"
capacity = 100
rate = "100/h"
identity = "ip"

[policies.logins]
algorithm = "token-bucket"
capacity = 2
rate = "2/h"
identity = "header:x-user"

[[routes]]
prefix = "/api"
policies = ["per-ip", "api"]
upstream = "http://127.0.0.1:9"

[[routes]]
prefix = "/login"
policies = ["logins"]
count = [401]
upstream = "http://127.0.0.1:9"
"""


def config_app(framework, path):
    if framework == "fastapi":
        app = FastAPI()
        app.add_middleware(sluice.asgi.RateLimitMiddleware, config=path)

        @app.get("/login")
        async def login(password: str = ""):
            from fastapi.responses import JSONResponse
            return JSONResponse({"ok": password == "right"}, status_code=200 if password == "right" else 401)

        @app.get("/api/items")
        async def items():
            return {"ok": True}

        return serve_uvicorn(app)
    app = Flask(__name__)

    @app.get("/login")
    def login():
        ok = flask_request.args.get("password") == "right"
        return {"ok": ok}, 200 if ok else 401

    @app.get("/api/items")
    def items():
        return {"ok": True}

    app.wsgi_app = sluice.wsgi.RateLimitMiddleware(app.wsgi_app, config=path)
    return serve_wsgi(app)


@pytest.mark.parametrize("framework", ["fastapi", "flask"])
def test_a_sluice_toml_limits_its_routes_as_the_rust_layer_does(framework, redis_server, tmp_path):
    path = tmp_path / "sluice.toml"
    path.write_text(CONFIG_TOML.format(url=redis_server.url))
    base, stop = config_app(framework, str(path))
    user = f"u{time.monotonic_ns()}"
    try:
        with httpx.Client(base_url=base, timeout=5) as c:
            # A deny-listed client: 403 problem+json, as from the tower layer and the proxy.
            r = c.get("/api/items", headers={"x-user": "blocked"})
            assert r.status_code == 403, r.text
            assert r.headers["content-type"] == "application/problem+json"
            assert "retry-after" not in r.headers
            # Three admitted, both policies of the route in the fields (two identities, two
            # deciders, merged), two denied, then banned for ten minutes.
            got = [c.get("/api/items", headers={"x-user": f"alice-{user}"}) for _ in range(5)]
            time.sleep(0.3)  # a denial is counted towards the ban in the background
            got += [c.get("/api/items", headers={"x-user": f"alice-{user}"}) for _ in range(2)]
            assert [r.status_code for r in got] == [200, 200, 200, 429, 429, 429, 429]
            assert '"api";q=3;w=3600' in got[0].headers["ratelimit-policy"]
            assert '"per-ip";q=100;w=3600' in got[0].headers["ratelimit-policy"]
            assert got[6].headers["retry-after"] == "600"
            assert "banned" in got[6].json()["detail"]
            # Counting only wrong passwords: right ones are given back.
            login = lambda pw: c.get(f"/login?password={pw}", headers={"x-user": f"carol-{user}"})
            seq = [login(p) for p in ["right", "right", "right", "wrong", "wrong", "wrong", "right"]]
            assert [r.status_code for r in seq] == [200, 200, 200, 401, 401, 429, 429]
            assert seq[2].headers["ratelimit"].startswith('"logins";r=2;')
            assert seq[3].headers["ratelimit"].startswith('"logins";r=1;')
    finally:
        stop()
