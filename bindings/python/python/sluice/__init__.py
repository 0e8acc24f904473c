"""sluice: the sluice rate limiter's Rust engine for Python.

The algorithms, Redis scripts, batching, deny cache, circuit breaker, failure modes and
IETF ``RateLimit`` headers are those of the Rust crates, so a Python app, a Rust service and
``sluice serve`` on one Redis share one limit exactly.

    limiter = await sluice.Limiter.connect("redis://127.0.0.1:6379")
    burst = sluice.Policy.token_bucket("burst", capacity=10, rate="5/s")
    d = await limiter.check(burst, "user:42")
    if not d.allowed: ...  # d.retry_after_ms, d.headers

Middleware: :mod:`sluice.asgi` (Starlette, FastAPI), :mod:`sluice.fastapi` (per-route
dependency), :mod:`sluice.wsgi` (Flask, Django).
"""

from ._sluice import (
    Checked,
    Config,
    ConfigError,
    HttpGuard,
    HttpVerdict,
    Limiter,
    Reservation,
    Settled,
    Policy,
    PolicyError,
    StoreError,
    __version__,
    hash_credential,
)
from ._rules import Rule

import atexit as _atexit
import time as _time


@_atexit.register
def _let_runtime_threads_leave_python() -> None:
    # The engine's worker threads hand each finished check to the event loop with
    # call_soon_threadsafe; the last hand-off can still be writing to the loop's wake-up socket
    # when the script ends. On CPython before 3.14, a thread that asks for the GIL while the
    # interpreter finalizes is ended with pthread_exit, which aborts a Rust thread (exit 134).
    # Exit handlers run before finalization: sleeping here (GIL released) lets it finish.
    _time.sleep(0.05)

__all__ = [
    "Checked",
    "Config",
    "ConfigError",
    "HttpGuard",
    "HttpVerdict",
    "Limiter",
    "Reservation",
    "Settled",
    "Policy",
    "PolicyError",
    "Rule",
    "StoreError",
    "__version__",
    "hash_credential",
]
