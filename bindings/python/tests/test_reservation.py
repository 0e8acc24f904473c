"""Reservations from Python: reserve a maximum, settle the real cost once, on the embedded
store and across two limiters sharing one real redis-server."""

import asyncio

import pytest

from sluice import Checked, Limiter, Policy, Reservation, Settled

BUDGET = 1000


def budget() -> Policy:
    return Policy.fixed_window("llm-tokens", limit=BUDGET, window="1d")


def test_reserve_settle_once_on_the_embedded_store(ident):
    limiter = Limiter.connect_sync("memory")
    tokens = budget()
    r = limiter.reserve_sync(tokens, ident, max_cost=600)
    assert isinstance(r, Reservation)
    # A reservation is the check of its maximum: it reads as a Checked does.
    assert isinstance(r, Checked)
    assert (r.verdict, r.limit, r.reason) == ("decided", BUDGET, None)
    assert r.allowed and r.id is not None and len(r.id) == 32
    assert (r.max_cost, r.remaining) == (600, 400)
    # 600 are held: 500 more do not fit, and nothing is reserved for a denial.
    denied = limiter.reserve_sync(tokens, ident, max_cost=500)
    assert not denied.allowed and denied.id is None
    assert (denied.reason, denied.retry_after_ms > 0) == ("limited", True)
    assert "Retry-After" in denied.headers
    with pytest.raises(RuntimeError, match="nothing to settle"):
        denied.settle_sync(0)
    s = r.settle_sync(150)
    assert isinstance(s, Settled)
    assert (s.max_cost, s.cost, s.refunded, s.debt) == (600, 150, 450, 0)
    with pytest.raises(RuntimeError, match="settled already"):
        r.settle_sync(0)
    with pytest.raises(RuntimeError, match="settled already"):
        limiter.settle_sync(r.id, 0)
    assert limiter.check_sync(tokens, ident, cost=0).remaining == BUDGET - 150


def test_a_reservation_made_by_one_limiter_is_settled_by_another(redis_server, ident):
    async def run():
        a = await Limiter.connect(redis_server.url, timeout_ms=2000)
        b = await Limiter.connect(redis_server.url, timeout_ms=2000)
        tokens = budget()
        r = await a.reserve(tokens, ident, max_cost=100, ttl_ms=30_000)
        assert r.allowed
        # Overrunning the maximum is charged as debt and reported.
        s = await b.settle(r.id, 250)
        assert (s.refunded, s.debt) == (0, 150)
        with pytest.raises(RuntimeError):
            await a.settle(r.id, 0)
        # Unsettled when its ttl ends: it counted in full.
        short = await b.reserve(tokens, ident, max_cost=300, ttl_ms=100)
        await asyncio.sleep(0.3)
        with pytest.raises(RuntimeError, match="no such reservation"):
            await short.settle(0)
        return (await a.check(tokens, ident, cost=0)).remaining

    assert asyncio.run(run()) == BUDGET - 250 - 300
