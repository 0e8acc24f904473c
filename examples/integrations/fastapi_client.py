"""A FastAPI app that asks `sluice serve` before each request, over HTTP.

Python apps should use the `sluice` package first (bindings/python): the same engine
in-process, no extra hop. This example is for apps that call one central `sluice serve`.

What keeps it from failing open by accident:
- one pooled `httpx.AsyncClient` for the whole process, with kept-alive connections, so a
  burst of requests does not open (and wait for) a connection each;
- at most POOL checks in flight, the rest queued in an `asyncio.Semaphore` (first come, first
  served, O(1) each): httpx's own pool gets slow when a thousand requests queue in it;
- timeouts that hold under load, not ones tuned for an idle benchmark (a 100 ms timeout turned
  a busy moment into "sluice is down" and admitted everything): 2 s for the call to sluice
  (`SLUICE_TIMEOUT_S`), and 10 s for the wait for a free slot (`SLUICE_QUEUE_TIMEOUT_S`), which
  is the app's own queueing when it is busier than its CPU, not sluice being slow;
- when sluice cannot answer (timeout, refused connection, 503 from an overloaded sluice) the
  request is refused with 503 (fail closed). Failing open is a choice you make explicitly:
  `SLUICE_FAIL_OPEN=1`.

Run: `SLUICE_URL=http://127.0.0.1:8080 uvicorn fastapi_client:app --port 8000`
(`pip install fastapi uvicorn httpx`), next to `sluice serve --config examples/api.toml`.
"""

import asyncio
import logging
import os

import httpx
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse

SLUICE_URL = os.environ.get("SLUICE_URL", "http://127.0.0.1:8080").rstrip("/") + "/v1/check"
POLICY = os.environ.get("SLUICE_POLICY", "burst")
TOKEN = os.environ.get("SLUICE_API_TOKEN")  # when sluice sets [server] api_token
FAIL_OPEN = os.environ.get("SLUICE_FAIL_OPEN", "") == "1"
TIMEOUT_S = float(os.environ.get("SLUICE_TIMEOUT_S", "2"))
QUEUE_TIMEOUT_S = float(os.environ.get("SLUICE_QUEUE_TIMEOUT_S", "10"))
POOL = int(os.environ.get("SLUICE_POOL", "64"))

log = logging.getLogger("sluice-client")
app = FastAPI()
# One client per process: its pool keeps POOL connections alive between requests.
client = httpx.AsyncClient(
    timeout=httpx.Timeout(TIMEOUT_S),
    limits=httpx.Limits(max_connections=POOL, max_keepalive_connections=POOL, keepalive_expiry=30),
    headers={"authorization": f"Bearer {TOKEN}"} if TOKEN else {},
)
in_flight = asyncio.Semaphore(POOL)


async def ask_sluice(body: dict) -> httpx.Response:
    """One check, after waiting (at most QUEUE_TIMEOUT_S) for one of the POOL slots."""
    await asyncio.wait_for(in_flight.acquire(), QUEUE_TIMEOUT_S)
    try:
        return await client.post(SLUICE_URL, json=body)  # bounded by the client's TIMEOUT_S
    finally:
        in_flight.release()


def unavailable(reason: str) -> JSONResponse:
    return JSONResponse({"error": "rate_limiter_unavailable", "detail": reason}, status_code=503,
                        headers={"retry-after": "1"})


@app.middleware("http")
async def rate_limit(request: Request, call_next):
    key = request.headers.get("x-api-key")
    # The API key is sent as a credential: sluice hashes it, it never becomes a key name.
    who = {"credential": key} if key else {"identity": f"ip:{request.client.host}"}
    try:
        r = await ask_sluice({"policy": POLICY, **who})
    except (httpx.HTTPError, asyncio.TimeoutError) as e:
        log.warning("sluice did not answer: %r", e)
        if FAIL_OPEN:
            return await call_next(request)
        return unavailable("the rate limiter did not answer in time")
    if r.status_code == 503 and FAIL_OPEN:
        return await call_next(request)  # sluice overloaded, and failing open was chosen
    if r.status_code != 200:
        # A refusal (unknown policy, bad token) is a deployment mistake; a 503 is an
        # overloaded sluice. Either way nothing was decided: refuse rather than admit.
        log.error("sluice answered %s: %s", r.status_code, r.text[:200])
        return unavailable(f"the rate limiter answered {r.status_code}")
    d = r.json()
    if not d["allowed"]:
        return JSONResponse({"error": "rate_limited", "retry_after_ms": d["retry_after_ms"]},
                            status_code=429, headers=d["headers"])
    response = await call_next(request)
    response.headers.update(d["headers"])
    return response


@app.get("/hello")
async def hello():
    return {"message": "hello"}
