//! The bounds of docs/guarantees.md, each driven to its worst case and asserted as the formula
//! with the test's parameters: the modes in which sluice may admit other than exactly (local
//! fallback with `local_share`, sharded policies, the deny cache after a reset made elsewhere,
//! the sliding window counter and fixed windows across a boundary, calendar windows across the
//! days daylight saving time moves, on real Redis; counting by outcome behind the real proxy;
//! a key rebuilt from its eviction trace in the embedded store). Leased slices are driven by
//! the tests the table names in `crates/limiter/tests`.
//!
//! Where a test controls time it gives the same `ManualClock` to the Redis store (whose
//! scripts then take their time from it) and to the limiter, so the worst case lands on the
//! exact millisecond instead of hoping the scheduler does.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::core::ManualClock;
use sluice::core::policy::CalendarPeriod;
use sluice::deny_cache::MAX_TRUST_MS;
use sluice::{
    Algorithm, DenyCacheMode, FailureMode, Identity, Limiter, LocalShare, Policy, StoreOptions,
    StoreUrl, Verdict,
};
use sluice_redis::RedisStore;
use sluice_testkit::servers::RedisServer;

/// One sluice instance on the Redis at `url`, with the store timeout of a deployment.
async fn instance(url: &str, share: f64, deny_cache: DenyCacheMode) -> Limiter {
    let options = StoreOptions {
        timeout: Duration::from_millis(50),
        ..Default::default()
    };
    let store = url
        .parse::<StoreUrl>()
        .unwrap()
        .connect(&options)
        .await
        .unwrap();
    Limiter::builder(store)
        .timeout(options.timeout)
        .local_share(LocalShare::new(share).unwrap())
        .deny_cache(deny_cache)
        .build()
}

/// An instance on the Redis at `url` whose store scripts and limiter both read `clock`.
async fn manual_instance(url: &str, clock: &ManualClock) -> Limiter {
    let store = RedisStore::builder(url)
        .clock(Arc::new(clock.clone()))
        .timeout(Duration::from_secs(5))
        .connect()
        .await
        .unwrap();
    Limiter::builder(Arc::new(store))
        .clock(Arc::new(clock.clone()))
        .deny_cache(DenyCacheMode::Off)
        .build()
}

fn policy(name: &str, algorithm: Algorithm) -> Policy {
    Policy::new(name, algorithm).unwrap()
}

/// `n` checks one after the other on `l`: how many were admitted. Every one must be decided
/// (never failed open or closed).
async fn admitted_of(l: &Limiter, p: &Arc<Policy>, id: &Identity, n: u64) -> u64 {
    let mut admitted = 0;
    for _ in 0..n {
        let c = l.check(id, p, 1).await;
        assert_eq!(c.verdict, Verdict::Decided, "{c:?}");
        admitted += u64::from(c.allowed);
    }
    admitted
}

/// `local_share = s` with N instances: in one window that an outage starts in, the store has
/// admitted up to L and each instance's fresh local store admits `max(1, floor(s * L))` more:
/// at most `L + N * max(1, floor(s * L))`. With the traffic on one instance only, the
/// instances admit `max(1, floor(s * L))` where the policy allows L: short by
/// `L - max(1, floor(s * L))`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_share_over_admits_at_most_n_shares_per_outage_and_under_admits_at_most_l_minus_one_share()
 {
    const N: usize = 4;
    const L: u64 = 12;
    const SHARE: f64 = 0.25;
    let local_limit = ((L as f64 * SHARE).floor() as u64).max(1);
    let mut server = RedisServer::redis();
    let mut instances = Vec::new();
    for _ in 0..N {
        instances.push(instance(&server.url(), SHARE, DenyCacheMode::Off).await);
    }
    let mut p = policy(
        "local-fw",
        Algorithm::FixedWindow {
            limit: L,
            window_ms: 600_000,
        },
    );
    p.failure_mode = FailureMode::Local;
    let p = Arc::new(p);
    let (busy, lone) = (Identity::new("busy"), Identity::new("lone"));

    // Up: the shared store admits exactly L in all.
    let mut before = 0;
    for l in &instances {
        before += admitted_of(l, &p, &busy, 5).await;
    }
    assert_eq!(before, L);

    // Down: every instance admits its local share on top.
    server.stop();
    let mut during = 0;
    for l in &instances {
        during += admitted_of(l, &p, &busy, 2 * local_limit + 2).await;
    }
    let bound = L + N as u64 * local_limit;
    assert!(
        before + during <= bound,
        "{} admitted in one window, bound L + N x share = {bound}",
        before + during
    );
    assert_eq!(before + during, bound, "the worst case is reached");

    // Down, all of one identity's traffic on one instance: only its share.
    let alone = admitted_of(&instances[0], &p, &lone, 2 * L).await;
    assert_eq!(alone, local_limit);
    assert!(L - alone <= L - local_limit, "short by {}", L - alone);
}

/// A policy of quota L in `n` shards runs `ceil(L / n)` per shard: when every shard is spent
/// the identity has been admitted `n * ceil(L / n)`, at most `L + n - 1`.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_sharded_policy_admits_at_most_the_limit_plus_shards_minus_one() {
    const L: u64 = 10;
    const SHARDS: u32 = 4;
    let server = RedisServer::redis();
    let l = instance(&server.url(), 1.0, DenyCacheMode::Auto).await;
    let mut p = policy(
        "sharded",
        Algorithm::FixedWindow {
            limit: L,
            window_ms: 600_000,
        },
    );
    p.shards = SHARDS;
    let p = Arc::new(p);
    let id = Identity::new("hot-tenant");
    // 400 checks pick shards at random: every shard is spent (each needs 3 of ~100 picks).
    let admitted = admitted_of(&l, &p, &id, 400).await;
    let per_shard = L.div_ceil(SHARDS as u64);
    assert_eq!(admitted, SHARDS as u64 * per_shard);
    assert!(
        admitted <= L + SHARDS as u64 - 1,
        "admitted {admitted}, bound L + n - 1 = {}",
        L + SHARDS as u64 - 1
    );
    // The floor: never below L once every shard is spent (quotas are rounded up).
    assert!(admitted >= L);
}

/// The deny cache never admits (0 over). After a reset made through another instance, an
/// instance that remembers a denial keeps denying the key for at most `MAX_TRUST_MS` after
/// the store's denial was asked for, then asks the store again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_remembered_denial_outlives_a_reset_elsewhere_by_at_most_max_trust_and_admits_nothing_extra()
 {
    const L: u64 = 3;
    let server = RedisServer::redis();
    let a = instance(&server.url(), 1.0, DenyCacheMode::Exact).await;
    let b = instance(&server.url(), 1.0, DenyCacheMode::Exact).await;
    let p = Arc::new(policy(
        "daily-reset",
        Algorithm::FixedWindow {
            limit: L,
            window_ms: 86_400_000,
        },
    ));
    let id = Identity::new("reset-me");
    assert_eq!(admitted_of(&a, &p, &id, L).await, L);
    let denied_at = Instant::now();
    assert!(!a.check(&id, &p, 1).await.allowed);
    assert!(b.reset(&id, &p).await.unwrap());
    // The reset is the store's at once; the other instance still answers from its cache.
    let hits = a.deny_cache_hits();
    assert!(!a.check(&id, &p, 1).await.allowed);
    assert_eq!(
        a.deny_cache_hits(),
        hits + 1,
        "denied locally after the reset"
    );
    let first_admit = loop {
        if a.check(&id, &p, 1).await.allowed {
            break denied_at.elapsed();
        }
        assert!(
            denied_at.elapsed() < Duration::from_secs(5),
            "never admitted"
        );
        tokio::time::sleep(Duration::from_millis(10)).await;
    };
    // The cache trusts the denial until (sent + MAX_TRUST_MS); the next check then reaches the
    // store. The margin is the one store call and the 10 ms poll.
    assert!(
        first_admit <= Duration::from_millis(MAX_TRUST_MS + 250),
        "denied for {first_admit:?} after the reset"
    );
    assert!(
        first_admit >= Duration::from_millis(MAX_TRUST_MS - 50),
        "{first_admit:?}: the cache did not hold the denial"
    );
    // Nothing extra: the reset window admits exactly L across both instances.
    let rest = admitted_of(&a, &p, &id, 2).await + admitted_of(&b, &p, &id, 2).await;
    assert_eq!(1 + rest, L);
}

/// The sliding window counter on Redis admits up to 2L within one window of W ms: L in the
/// last millisecond of an aligned window, and L more `x` ms before the end of the next with
/// `floor(L * (x + 1) / W) = 0`. Never more: the next request is denied.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_sliding_counter_admits_at_most_twice_the_limit_in_one_window() {
    const L: u64 = 4;
    const W: u64 = 10_000;
    let server = RedisServer::redis();
    // An aligned window start (a multiple of W ms), in µs.
    let start = 1_800_000_000_000 / W * W * 1000;
    let clock = ManualClock::new(start);
    let l = manual_instance(&server.url(), &clock).await;
    let p = Arc::new(policy(
        "sliding",
        Algorithm::SlidingWindowCounter {
            limit: L,
            window_ms: W,
        },
    ));
    let id = Identity::new("edge");
    clock.set(start + (W - 1) * 1000); // 9.999 s
    assert_eq!(admitted_of(&l, &p, &id, L).await, L);
    clock.set(start + (2 * W - 2) * 1000); // 19.998 s: x = 1, floor(4 * 2 / 10000) = 0
    let second = admitted_of(&l, &p, &id, L + 1).await;
    let in_one_window = L + second;
    // 9.999 s -> 19.998 s is 9.999 s: one window of W.
    assert_eq!(in_one_window, 2 * L, "the worst case is 2L, reached");

    // And a fixed window: L in the last ms of one window, L in the first of the next.
    let fixed = Arc::new(policy(
        "fixed",
        Algorithm::FixedWindow {
            limit: L,
            window_ms: W,
        },
    ));
    clock.set(start + (3 * W - 1) * 1000);
    let a = admitted_of(&l, &fixed, &id, L + 1).await;
    clock.advance_ms(1);
    let b = admitted_of(&l, &fixed, &id, L + 1).await;
    assert_eq!((a, b), (L, L), "2L within 1 ms, L per aligned window");
}

/// Calendar windows are UTC periods: a day is 24 h even on the dates daylight saving time
/// makes a local day 23 or 25 h, so each UTC day admits exactly L (and 2L across a
/// midnight, as any fixed window); the month is the UTC month.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn calendar_days_admit_exactly_the_limit_across_daylight_saving_changes() {
    const L: u64 = 5;
    const DAY_MS: u64 = 86_400_000;
    let server = RedisServer::redis();
    // 2026-03-07 00:00 UTC (US clocks change on the 8th) and 2026-03-28 (EU on the 29th),
    // 2026-10-24 (EU back on the 25th) and 2026-11-01 (US back that day).
    let starts_ms = [
        1_772_841_600_000u64,
        1_774_656_000_000,
        1_792_800_000_000,
        1_793_491_200_000,
    ];
    let clock = ManualClock::new(starts_ms[0] * 1000);
    let l = manual_instance(&server.url(), &clock).await;
    let p = Arc::new(policy(
        "daily",
        Algorithm::CalendarWindow {
            limit: L,
            period: CalendarPeriod::Day,
        },
    ));
    for (k, &day0) in starts_ms.iter().enumerate() {
        let id = Identity::new(format!("dst-{k}"));
        // Three UTC days, a request every 20 minutes (72 per day).
        for d in 0..3 {
            let mut admitted = 0;
            let mut last_admit_ms = 0;
            for i in 0..72 {
                let t = day0 + d * DAY_MS + i * 1_200_000;
                clock.set(t * 1000);
                let c = l.check(&id, &p, 1).await;
                if c.allowed {
                    admitted += 1;
                    last_admit_ms = t;
                }
            }
            assert_eq!(admitted, L, "UTC day {d} after {day0}");
            // The window ends at the UTC midnight: a denial's retry is the time to it.
            clock.set((day0 + (d + 1) * DAY_MS - 1) * 1000);
            let c = l.check(&id, &p, 1).await;
            assert!(!c.allowed);
            assert_eq!(c.retry_after_ms(), 1, "day {d}: the boundary is 00:00 UTC");
            assert!(last_admit_ms < day0 + (d + 1) * DAY_MS);
        }
    }
    // The month: 2026-03-31 23:59:59.999 then 2026-04-01 00:00:00.000 UTC: L each, 2L in 1 ms.
    let month = Arc::new(policy(
        "monthly",
        Algorithm::CalendarWindow {
            limit: L,
            period: CalendarPeriod::Month,
        },
    ));
    let id = Identity::new("month-edge");
    clock.set((1_775_001_600_000 - 1) * 1000);
    assert_eq!(admitted_of(&l, &month, &id, L + 1).await, L);
    clock.advance_ms(1);
    assert_eq!(admitted_of(&l, &month, &id, L + 1).await, L);
}

/// Counting by outcome reserves the cost at the check, so counted responses never pass the
/// limit (0 over); the price is the units held by requests in flight that will not be
/// counted: while L of them are in flight, the next request is refused although none of them
/// ends up counted (the under-admit, at most L units at any instant).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn counting_by_outcome_holds_at_most_l_units_in_flight_and_never_counts_past_l() {
    const L: usize = 3;
    // The upstream: a right password answers 200 after 600 ms, a wrong one 401 at once.
    let app = axum::Router::new().route(
        "/login",
        axum::routing::get(
            |axum::extract::RawQuery(q): axum::extract::RawQuery| async move {
                if q.as_deref() == Some("password=right") {
                    tokio::time::sleep(Duration::from_millis(600)).await;
                    http::StatusCode::OK
                } else {
                    http::StatusCode::UNAUTHORIZED
                }
            },
        ),
    );
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
    let upstream = listener.local_addr().unwrap();
    tokio::spawn(async move { axum::serve(listener, app).await.unwrap() });
    let server = sluice_server::testing::start(&format!(
        "[policies.login]\nalgorithm = \"fixed-window\"\nlimit = {L}\nwindow = \"1h\"\n\
         identity = \"ip\"\n\n[[routes]]\nprefix = \"/\"\npolicies = [\"login\"]\n\
         upstream = \"http://{upstream}\"\ncount = [401]\n"
    ))
    .await;
    let client = reqwest::Client::new();
    let get = |password: &'static str| {
        let (client, url) = (client.clone(), server.proxy_url("/login"));
        async move {
            client
                .get(format!("{url}?password={password}"))
                .send()
                .await
                .unwrap()
                .status()
                .as_u16()
        }
    };
    // L right passwords in flight hold every unit: a wrong password is refused meanwhile.
    let held: Vec<_> = (0..L).map(|_| tokio::spawn(get("right"))).collect();
    tokio::time::sleep(Duration::from_millis(250)).await;
    let refused_while_held = get("wrong").await;
    assert_eq!(refused_while_held, 429, "all L units are held in flight");
    for h in held {
        assert_eq!(h.await.unwrap(), 200);
    }
    // Their units came back: nothing was counted, and the limit counts exactly L failures.
    let mut statuses = Vec::new();
    for _ in 0..L + 3 {
        statuses.push(get("wrong").await);
    }
    let counted = statuses.iter().filter(|&&s| s == 401).count();
    assert_eq!(counted, L, "{statuses:?}");
    assert!(statuses[L..].iter().all(|&s| s == 429), "{statuses:?}");
    server.stop().await;
}

/// Eviction in the embedded store never admits more than an unbounded store (0 over). A
/// sliding log key rebuilt from its trace holds its whole amount until the latest of its
/// requests leaves the window: short of exact by at most that amount, for at most W after its
/// last admitted request.
#[test]
fn an_evicted_key_is_short_of_exact_by_at_most_its_amount_until_its_last_request_leaves() {
    use sluice::core::CheckItem;
    use sluice_memory::MemoryStore;
    const L: u64 = 4;
    const W: u64 = 10_000;
    const T0: u64 = 1_700_000_000_000_000;
    let clock = ManualClock::new(T0);
    let bounded = MemoryStore::builder()
        .clock(Arc::new(clock.clone()))
        .max_keys(16)
        .build();
    let exact = MemoryStore::builder()
        .clock(Arc::new(clock.clone()))
        .build();
    let log = Algorithm::SlidingWindowLog {
        limit: L,
        window_ms: W,
    };
    // The same request to both stores: (bounded allowed, exact allowed).
    let both = |key: &str| {
        let item = CheckItem {
            key,
            algorithm: &log,
            cost: 1,
        };
        (
            bounded.check_one(&item).allowed,
            exact.check_one(&item).allowed,
        )
    };
    // Two victims each spend 1 at 0 s and 1 at 5 s: an amount of 2, the last leaving at 15 s.
    for victim in ["rl:{a}:log", "rl:{b}:log"] {
        assert_eq!(both(victim), (true, true));
    }
    clock.advance_ms(5_000);
    for victim in ["rl:{a}:log", "rl:{b}:log"] {
        assert_eq!(both(victim), (true, true));
    }
    // 6 s: 200 fresh identities push both victims out of a store of 16 keys.
    clock.advance_ms(1_000);
    for i in 0..200 {
        both(&format!("rl:{{fresh-{i}}}:log"));
    }
    assert!(bounded.len() <= 16);
    assert!(bounded.eviction_counts().informative > 0);
    // 11 s: the 0 s request has left the window; exact admits 3, the rebuilt state 2.
    clock.set(T0 + 11_000 * 1000);
    let (mut got, mut want) = (0, 0);
    for _ in 0..L + 1 {
        let (b, e) = both("rl:{a}:log");
        assert!(!b || e, "the bounded store admitted what exact denied");
        got += u64::from(b);
        want += u64::from(e);
    }
    assert_eq!((got, want), (2, 3));
    assert!(want - got <= 2, "short by more than the amount held");
    // Just after 15 s (5 s + W) the held amount is gone: no shortfall left.
    clock.set(T0 + 15_001 * 1000);
    let (mut got, mut want) = (0, 0);
    for _ in 0..L + 1 {
        let (b, e) = both("rl:{b}:log");
        got += u64::from(b);
        want += u64::from(e);
    }
    assert_eq!((got, want), (L, L));
}
