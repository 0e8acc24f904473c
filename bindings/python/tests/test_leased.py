"""Leased mode from the Policy constructors (`mode="leased"`, `lease_ttl`), the decision mode
`mode = "leased"` / `lease_ttl` give a sluice.toml policy. Two limiters on one real
redis-server are two instances taking slices of one key's quota: together they never admit
more than the limit. Bad modes are refused with the reason."""

import asyncio

import pytest

from sluice import Limiter, Policy, PolicyError

# Quotas of 20 that refill far too slowly to matter within a test.
LEASED = {
    "token-bucket": lambda: Policy.token_bucket("ltb", capacity=20, rate="1/h", mode="leased", lease_ttl="1s"),
    "gcra": lambda: Policy.gcra("lgcra", rate="1/h", burst=19, mode="leased"),
    "fixed-window": lambda: Policy.fixed_window("lfw", limit=20, window="1d", mode="leased", lease_ttl=2),
}


@pytest.mark.parametrize("kind", sorted(LEASED))
def test_two_leased_limiters_on_one_redis_never_admit_more_than_the_limit(kind, ident, redis_server):
    policy = LEASED[kind]()
    assert policy.decision_mode == "leased"

    async def run():
        a = await Limiter.connect(redis_server.url, timeout_ms=2000)
        b = await Limiter.connect(redis_server.url, timeout_ms=2000)
        admitted = 0
        # 3 rounds of 20 checks at once on each limiter, interleaved: 120 asks of a limit of 20.
        for _ in range(3):
            checks = []
            for _ in range(20):
                checks += [a.check(policy, ident), b.check(policy, ident)]
            for d in await asyncio.gather(*checks):
                assert d.verdict == "decided"
                admitted += d.allowed
        return admitted

    admitted = asyncio.run(run())
    assert admitted <= 20, f"two leased limiters admitted {admitted} of a limit of 20"
    assert admitted > 0, "leased mode admitted nothing"


def test_a_leased_policy_reports_its_mode_and_slice_lifetime():
    leased = Policy.token_bucket("l", capacity=5, rate="1/s", mode="leased", lease_ttl="250ms")
    assert (leased.decision_mode, leased.lease_ttl_ms) == ("leased", 250)
    assert Policy.gcra("g", rate="1/s", mode="leased").lease_ttl_ms == 1000
    exact = Policy.token_bucket("e", capacity=5, rate="1/s")
    assert (exact.decision_mode, exact.lease_ttl_ms) == ("exact", None)
    assert Policy.fixed_window("f", limit=5, window="1m", mode="exact").decision_mode == "exact"
    # A leaky bucket's own modes still work beside the decision mode.
    assert Policy.leaky_bucket("lb", capacity=5, rate="1/s", mode="shaping").decision_mode == "exact"


@pytest.mark.parametrize(
    "make, words",
    [
        (lambda: Policy.token_bucket("x", capacity=5, rate="1/s", mode="fast"), 'mode must be "exact" or "leased", not "fast"'),
        (lambda: Policy.token_bucket("x", capacity=5, rate="1/s", lease_ttl="1s"), 'only a policy with mode="leased" takes lease_ttl'),
        (lambda: Policy.token_bucket("x", capacity=5, rate="1/s", mode="leased", lease_ttl="2m"), "lease_ttl must be between 1ms and"),
        (lambda: Policy.sliding_log("x", limit=5, window="1m", mode="leased"), 'mode = "leased" supports token-bucket, gcra and fixed-window, not sliding-log'),
        (lambda: Policy.concurrency("x", limit=5, mode="leased"), "not concurrency"),
        (lambda: Policy.leaky_bucket("x", capacity=5, rate="1/s", mode="leased"), "not leaky-bucket"),
        (lambda: Policy.leaky_bucket("x", capacity=5, rate="1/s", mode="fast"), 'unknown leaky-bucket mode "fast"'),
        (lambda: Policy.gcra("x", rate="1/s", mode="leased", lease_ttl="soon"), "lease_ttl"),
    ],
)
def test_bad_decision_modes_are_refused_with_the_reason(make, words):
    with pytest.raises(PolicyError) as e:
        make()
    assert words in str(e.value), str(e.value)
