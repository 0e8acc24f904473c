"""The core API: policies, checks on memory and Redis, admitted counts against arithmetic."""

import asyncio
import os
import threading
import time

import pytest

import sluice
from sluice import Config, ConfigError, Limiter, Policy, PolicyError

ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", "..", ".."))

# Policies whose quota is 10 and which refill or slide so slowly (per hour or day) that a
# burst of 25 quick checks admits exactly 10: the arithmetic each test checks against.
QUOTA = 10
ALGORITHMS = {
    "token-bucket": lambda: Policy.token_bucket("tb", capacity=10, rate="10/h"),
    "gcra": lambda: Policy.gcra("gcra", rate="10/h", burst=9),
    "leaky-bucket": lambda: Policy.leaky_bucket("lb", capacity=10, rate="10/h"),
    "fixed-window": lambda: Policy.fixed_window("fw", limit=10, window="1d"),
    "sliding-counter": lambda: Policy.sliding_counter("sc", limit=10, window="1h"),
    "sliding-log": lambda: Policy.sliding_log("sl", limit=10, window="1h"),
    "concurrency": lambda: Policy.concurrency("cc", limit=10, lease="1m"),
}


def test_constructors_name_their_algorithm_and_quota():
    for kind, make in ALGORITHMS.items():
        p = make()
        assert p.algorithm == kind
        assert p.quota == QUOTA
    burst = Policy.token_bucket("burst", capacity=10, rate="5/s")
    assert (burst.name, burst.window_ms, burst.failure_mode, burst.shadow, burst.shards) == (
        "burst", 2000, "open", False, 1)
    assert Policy.fixed_window("w", limit=3, window=60).window_ms == 60_000


def test_bad_policies_are_refused_with_the_registry_words():
    with pytest.raises(PolicyError, match="invalid rate"):
        Policy.token_bucket("b", capacity=10, rate="fast")
    with pytest.raises(PolicyError, match="capacity must be at least 1"):
        Policy.token_bucket("b", capacity=0, rate="5/s")
    with pytest.raises(PolicyError, match="policy name"):
        Policy.gcra("bad name", rate="5/s")
    with pytest.raises(PolicyError, match="failure_mode"):
        Policy.gcra("g", rate="5/s", failure_mode="maybe")
    with pytest.raises(PolicyError, match="leaky-bucket mode"):
        Policy.leaky_bucket("l", capacity=1, rate="1/s", mode="sometimes")
    with pytest.raises(TypeError):
        Policy.token_bucket("b", capacity=10)  # rate missing


def test_from_toml_is_the_sluice_toml_reader():
    q = Policy.from_toml('[policies.login]\nalgorithm = "sliding-log"\nlimit = 5\nwindow = "15m"\nfailure_mode = "closed"\n')
    assert (q.name, q.algorithm, q.quota, q.window_ms, q.failure_mode) == (
        "login", "sliding-log", 5, 900_000, "closed")
    p = Policy.from_toml('[policies.burst]\nalgorithm = "token-bucket"\ncapacity = 10\nrate = "5/s"\n')
    assert p == Policy.token_bucket("burst", capacity=10, rate="5/s")
    many = Policy.all_from_toml('[policies.a]\nalgorithm = "gcra"\nrate = "1/s"\n[policies.b]\nalgorithm = "concurrency"\nlimit = 2\n')
    assert [p.name for p in many] == ["a", "b"]
    with pytest.raises(ConfigError, match="exactly one"):
        Policy.from_toml('[policies.a]\nalgorithm = "gcra"\nrate = "1/s"\n[policies.b]\nalgorithm = "gcra"\nrate = "1/s"\n')
    # Errors are the lines `sluice validate` prints: FILE:LINE: field: message.
    with pytest.raises(ConfigError) as e:
        Policy.from_toml('[policies.g]\nalgorithm = "gcra"\nrate = "1/s"\ncapacity = 3\n', file="limits.toml")
    assert str(e.value).startswith("limits.toml:4: policies.g.capacity: "), str(e.value)
    assert "gcra takes no capacity" in str(e.value)
    with pytest.raises(ConfigError) as e:
        Policy.all_from_toml('[policies.g]\nalgorithm = "gcra"\nrate = "1/s"\nburts = 3\n')
    assert str(e.value).startswith("<inline>:4: policies.g"), str(e.value)
    with pytest.raises(ConfigError, match=r"^<inline>:1: "):
        Policy.from_toml("name = ")


def test_the_shipped_sluice_toml_loads():
    # The text alone (the issue's own call), the file with its Envoy files, and a limiter from it.
    text = open(os.path.join(ROOT, "examples", "sluice.toml")).read()
    names = [p.name for p in Policy.all_from_toml(text)]
    assert names == sorted(["burst", "daily", "per-ip", "login", "uploads", "experimental", "global-search"])
    config = Config.load(os.path.join(ROOT, "examples", "sluice.toml"))
    assert sorted(config.policies) == names
    burst = config.policies["burst"]
    assert (burst.algorithm, burst.quota) == ("token-bucket", 10)
    assert config.store_url == "memory"
    limiter = Limiter.from_config_sync(config)
    assert limiter.store == "memory"
    results = [limiter.check_sync(burst, "someone") for _ in range(11)]
    assert [r.allowed for r in results] == [True] * 10 + [False]
    # One name for a check's result in Rust, Python and Node.
    assert type(results[0]) is sluice.Checked and type(results[0]).__name__ == "Checked"
    # The same limiter from the path.
    assert Limiter.from_config_sync(os.path.join(ROOT, "examples", "sluice.toml")).store == "memory"


def test_config_errors_name_file_line_and_field(tmp_path):
    path = tmp_path / "sluice.toml"
    path.write_text('[store]\nurl = "memory"\n\n[policies.api]\nalgorithm = "token-bucket"\ncapacity = 10\nrate = "fast"\n')
    with pytest.raises(ConfigError) as e:
        Config.load(path)
    assert str(e.value).startswith(f"{path}:7: policies.api.rate: "), str(e.value)
    with pytest.raises(ConfigError) as e:
        Limiter.from_config_sync(str(path))
    assert f"{path}:7: policies.api.rate: " in str(e.value)


async def admitted(limiter, policy, identity, n):
    ds = await asyncio.gather(*[limiter.check(policy, identity) for _ in range(n)])
    return sum(d.allowed for d in ds)


@pytest.mark.parametrize("kind", sorted(ALGORITHMS))
def test_every_algorithm_admits_its_quota_on_memory(kind, ident):
    async def run():
        limiter = await Limiter.connect("memory")
        return await admitted(limiter, ALGORITHMS[kind](), ident, 25)

    assert asyncio.run(run()) == QUOTA


@pytest.mark.parametrize("kind", sorted(ALGORITHMS))
def test_every_algorithm_admits_its_quota_on_redis(kind, ident, redis_server):
    async def run():
        limiter = await Limiter.connect(redis_server.url, timeout_ms=2000)
        assert limiter.store == "redis"
        return await admitted(limiter, ALGORITHMS[kind](), ident, 25)

    assert asyncio.run(run()) == QUOTA


def test_decision_numbers_and_headers_follow_the_guide(ident):
    async def run():
        limiter = await Limiter.connect()
        burst = Policy.token_bucket("burst", capacity=10, rate="5/s")
        return [await limiter.check(burst, ident) for _ in range(11)]

    ds = asyncio.run(run())
    assert [d.remaining for d in ds[:10]] == list(range(9, -1, -1))
    first, last = ds[0], ds[10]
    assert (first.allowed, first.limit, first.retry_after_ms, first.verdict) == (True, 10, 0, "decided")
    assert first.headers == {"RateLimit-Policy": '"burst";q=10;w=2', "RateLimit": '"burst";r=9;t=1'}
    assert not last.allowed and last.reason == "limited"
    assert 1 <= last.retry_after_ms <= 200
    assert last.headers == {
        "RateLimit-Policy": '"burst";q=10;w=2',
        "RateLimit": '"burst";r=0;t=2',
        "Retry-After": "1",
    }


def test_cost_and_identity_rules(ident):
    limiter = Limiter.connect_sync()
    p = Policy.fixed_window("fw", limit=10, window="1d")
    assert limiter.check_sync(p, ident, cost=7).remaining == 3
    assert not limiter.check_sync(p, ident, cost=4).allowed
    d = limiter.check_sync(p, ident, cost=11)
    assert d.reason == "cost_exceeds_limit" and "Retry-After" not in d.headers
    with pytest.raises(ValueError, match="not both"):
        limiter.check_sync(p, "a", credential="b")
    with pytest.raises(ValueError, match="missing identity"):
        limiter.check_sync(p)
    with pytest.raises(ValueError, match="must not be empty"):
        limiter.check_sync(p, credential="")


def test_credentials_are_hashed_as_the_rust_layer_hashes_them():
    limiter = Limiter.connect_sync()
    ident = limiter.credential_identity("sk_live_1")
    assert ident == sluice.hash_credential("sk_live_1") == sluice.hash_credential(b"sk_live_1")
    assert ident.startswith("key:h") and len(ident) == 5 + 32 and "sk_live" not in ident
    other = "11" * 32
    assert sluice.hash_credential("sk_live_1", other) != ident
    keyed = Limiter.connect_sync(hash_key=other)
    assert keyed.credential_identity("sk_live_1") == sluice.hash_credential("sk_live_1", other)
    with pytest.raises(ValueError, match="64 hex digits"):
        Limiter.connect_sync(hash_key="abc")
    # A credential check and an identity check on the hashed identity share one bucket.
    p = Policy.fixed_window("fw", limit=2, window="1d")
    assert limiter.check_sync(p, credential="sk_live_1").allowed
    assert limiter.check_sync(p, ident).remaining == 0
    assert limiter.key(p, ident) == "rl:{" + ident + "}:fw"


def test_concurrency_leases_are_released():
    limiter = Limiter.connect_sync()
    p = Policy.concurrency("inflight", limit=1, lease="1m")
    d = limiter.check_sync(p, "worker")
    assert d.allowed and d.leases == 1
    assert not limiter.check_sync(p, "worker").allowed
    assert d.release_sync() == 1
    assert d.release_sync() == 0
    d2 = limiter.check_sync(p, "worker")
    assert d2.allowed

    async def run():
        assert await d2.release() == 1
        return (await limiter.check(p, "worker")).allowed

    assert asyncio.run(run())


def test_unknown_store_urls_are_refused():
    with pytest.raises(sluice.StoreError, match="unknown store URL"):
        Limiter.connect_sync("mongodb://x")
    with pytest.raises(TypeError):
        Limiter.connect_sync("memory", timeout=5)


def test_check_sync_releases_the_gil(stopped_redis):
    """While check_sync waits on a store that does not answer, other Python threads run."""
    # Connect while it runs, then freeze it: the check fails open after its store timeout.
    server = stopped_redis
    ticks = []
    stop = threading.Event()

    def ticker():
        while not stop.is_set():
            ticks.append(time.monotonic())
            time.sleep(0.005)

    limiter = Limiter.connect_sync(server.url, timeout_ms=300)
    server.pause()
    p = Policy.fixed_window("fw", limit=5, window="1m")
    t = threading.Thread(target=ticker)
    t.start()
    start = time.monotonic()
    d = limiter.check_sync(p, "u")
    elapsed = time.monotonic() - start
    stop.set()
    t.join()
    assert d.allowed and d.verdict == "failed_open" and d.headers == {}
    assert elapsed >= 0.1
    # The ticker kept ticking during the wait (it would stall if the GIL were held).
    assert len([x for x in ticks if start <= x <= start + elapsed]) >= 10


def test_the_async_check_does_not_block_the_event_loop(stopped_redis):
    """While a check waits on a frozen store, other coroutines keep running."""
    async def run():
        limiter = await Limiter.connect(stopped_redis.url, timeout_ms=300)
        stopped_redis.pause()
        p = Policy.fixed_window("fw", limit=5, window="1m")
        ticks = 0

        async def ticker():
            nonlocal ticks
            while True:
                ticks += 1
                await asyncio.sleep(0.005)

        task = asyncio.ensure_future(ticker())
        d = await limiter.check(p, "u")
        task.cancel()
        return d, ticks

    d, ticks = asyncio.run(run())
    assert d.verdict == "failed_open"
    assert ticks >= 10


@pytest.mark.parametrize("url", ["memory", "redis"])
def test_thousands_of_concurrent_checks_complete_with_exact_counts(url, ident, redis_server):
    """Checks finish in batches (one wake-up of the loop for many results): every awaitable
    still gets its own decision, and each identity admits exactly its quota."""
    async def run():
        limiter = await Limiter.connect(redis_server.url if url == "redis" else url, timeout_ms=5000)
        p = Policy.sliding_log("many", limit=7, window="1h")
        ids = [f"{ident}:{i}" for i in range(100)]
        # 100 identities x 20 checks, all in flight at once, interleaved.
        ds = await asyncio.gather(*[limiter.check(p, ids[j % 100]) for j in range(2000)])
        per_id = {}
        for j, d in enumerate(ds):
            assert d.limit == 7
            per_id.setdefault(ids[j % 100], []).append(d)
        return per_id

    per_id = asyncio.run(run())
    assert len(per_id) == 100
    for ds in per_id.values():
        assert sum(d.allowed for d in ds) == 7
        # Within one identity the admitted ones count down 6..0, once each.
        assert sorted(d.remaining for d in ds if d.allowed) == list(range(7))


def test_a_cancelled_check_does_not_disturb_the_others(ident, redis_server):
    async def run():
        limiter = await Limiter.connect(redis_server.url, timeout_ms=5000)
        p = Policy.fixed_window("cancel", limit=50, window="1h")
        tasks = [asyncio.ensure_future(limiter.check(p, ident)) for _ in range(40)]
        for t in tasks[::2]:
            t.cancel()
        results = await asyncio.gather(*tasks, return_exceptions=True)
        kept = [r for r in results if not isinstance(r, BaseException)]
        cancelled = [r for r in results if isinstance(r, asyncio.CancelledError)]
        # Each of the 40 checks reached the store (a cancelled await does not undo it): the
        # next one sees 50 - 40 - 1 left.
        after = await limiter.check(p, ident)
        return kept, cancelled, after

    kept, cancelled, after = asyncio.run(run())
    assert (len(kept), len(cancelled)) == (20, 20)
    assert all(d.allowed for d in kept)
    assert after.remaining == 50 - 41


def test_checks_from_event_loops_in_several_threads(ident, redis_server):
    """Each loop gets its own results, woken through its own queue."""
    limiter = Limiter.connect_sync(redis_server.url, timeout_ms=5000)
    p = Policy.token_bucket("threads", capacity=30, rate="1/h")
    out = {}

    def worker(n):
        async def run():
            ds = await asyncio.gather(*[limiter.check(p, f"{ident}:{n}") for _ in range(50)])
            return sum(d.allowed for d in ds)

        out[n] = asyncio.run(run())

    threads = [threading.Thread(target=worker, args=(n,)) for n in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=60)
    assert out == {0: 30, 1: 30, 2: 30, 3: 30}
