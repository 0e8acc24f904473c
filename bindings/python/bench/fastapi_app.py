"""The guide's FastAPI app (GET /hello -> {"ok": true}) with the sluice ASGI middleware in
place of the guide's `@app.middleware("http")` token bucket, for the anchors harness's HTTP
step (EXTRA_STACKS). The harness runs it in three modes, each its own process:

    baseline  no middleware (the same app, nothing in front of it)
    allowed   the middleware with limits no bench run reaches (1e9 burst, 1e9/s)
    denied    the guide's limits: token bucket of 10 burst + 5/s per x-api-key

Like the guide's app: one Redis, the identity is the x-api-key header (sluice hashes it
before it becomes a key), one uvicorn worker, asyncio loop and h11 (`uvicorn` without
extras). The run command is in scripts/bench-bindings:

    SLUICE_BENCH_MODE=allowed REDIS_URL=redis://127.0.0.1:6390/0 \
      python -m uvicorn fastapi_app:app --app-dir bindings/python/bench --port 8100 ...
"""

import os

from fastapi import FastAPI

import sluice
from sluice.asgi import RateLimitMiddleware

MODES = {
    "allowed": (1_000_000_000, "1000000000/s"),
    "denied": (10, "5/s"),
}

mode = os.environ.get("SLUICE_BENCH_MODE", "denied")
if mode != "baseline" and mode not in MODES:
    raise SystemExit(f"SLUICE_BENCH_MODE must be baseline, allowed or denied, not {mode!r}")

app = FastAPI()

if mode != "baseline":
    capacity, rate = MODES[mode]
    # connect_sync: the app module is imported before uvicorn's loop runs; the limiter's
    # own Rust runtime does the I/O, so it needs no loop of its own.
    limiter = sluice.Limiter.connect_sync(os.environ["REDIS_URL"], timeout_ms=50)
    burst = sluice.Policy.token_bucket("burst", capacity=capacity, rate=rate)
    app.add_middleware(RateLimitMiddleware, limiter=limiter, policies=[burst], api_key_header="x-api-key")


@app.get("/hello")
async def hello():
    return {"ok": True}
