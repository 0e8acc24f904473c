//! What the control plane adds to a decision on the embedded store, as a timed loop:
//! decisions per second with no entries, with many entries none of which match (the usual
//! case: bans, overrides and lists for other identities), and with every identity
//! overridden. Run in release mode:
//! `cargo test --release -p sluice --test suite -- --ignored --nocapture control_cost::`.

use std::sync::Arc;
use std::time::{Duration, Instant};

use sluice::{Algorithm, Identity, Limiter, ListEntry, ListKind, OverrideTarget, Policy, Rate};

/// Checks per measured slice; the three limiters take turns slice by slice, so a change in
/// the machine's load hits all three alike, and each is rated by its median slice, so a
/// slice the scheduler cut into (a shared machine) does not count.
const SLICE: usize = 10_000;
const SLICES: usize = 40;
const IDENTITIES: usize = 1_000;

fn bucket() -> Algorithm {
    Algorithm::TokenBucket {
        capacity: 1 << 40,
        rate: Rate::per_second(1 << 30),
    }
}

/// The time of `SLICE` admitted checks over `IDENTITIES` identities.
async fn slice(l: &Limiter, p: &Arc<Policy>, ids: &[Identity]) -> Duration {
    let start = Instant::now();
    for i in 0..SLICE {
        let c = l.check(&ids[i % ids.len()], p, 1).await;
        assert!(c.allowed);
    }
    start.elapsed()
}

#[tokio::test(flavor = "current_thread")]
#[ignore = "a measurement: run in release mode with --ignored --nocapture"]
async fn control_plane_lookup_cost_on_the_embedded_store() {
    let p = Arc::new(Policy::new("api", bucket()).unwrap());
    let ids: Vec<Identity> = (0..IDENTITIES)
        .map(|i| client(&format!("ip:10.0.{}.{}", i / 256, i % 256)))
        .collect();
    let idle = Limiter::memory();
    let busy = Limiter::memory();
    let overridden = Limiter::memory();
    // Entries for other identities: 10,000 overrides, 10,000 bans, 1,000 allow identities,
    // 100 deny networks (none contains 10.0.0.0/16).
    let c = busy.control();
    for i in 0..10_000 {
        let other = format!("user:{i}");
        c.set_override("api", &other, OverrideTarget::Params(bucket()), None)
            .await
            .unwrap();
        c.ban(&other, Duration::from_secs(3600), None)
            .await
            .unwrap();
    }
    for i in 0..1_000 {
        let e = ListEntry::parse(&format!("vip:{i}")).unwrap();
        c.list_add(ListKind::Allow, &e, None).await.unwrap();
    }
    for i in 0..100 {
        let e = ListEntry::parse(&format!("172.{}.0.0/16", i + 16)).unwrap();
        c.list_add(ListKind::Deny, &e, None).await.unwrap();
    }
    for id in &ids {
        overridden
            .control()
            .set_override("api", id.as_str(), OverrideTarget::Params(bucket()), None)
            .await
            .unwrap();
    }
    let mut slices: [Vec<Duration>; 3] = Default::default();
    for _ in 0..SLICES {
        for (k, l) in [&idle, &busy, &overridden].into_iter().enumerate() {
            slices[k].push(slice(l, &p, &ids).await);
        }
    }
    let rate = |mut d: Vec<Duration>| {
        d.sort();
        SLICE as f64 / d[d.len() / 2].as_secs_f64()
    };
    let [idle, busy, overridden] = slices.map(rate);
    println!(
        "decisions/s (median slice), {} checks each, in alternating slices of {SLICE}:",
        SLICE * SLICES
    );
    println!("  no control entries:            {idle:>10.0}");
    println!(
        "  21,100 entries, none matching: {busy:>10.0} ({:+.1}%)",
        (busy / idle - 1.0) * 100.0
    );
    println!(
        "  every identity overridden:     {overridden:>10.0} ({:+.1}%)",
        (overridden / idle - 1.0) * 100.0
    );
}

/// The identity the tower layer gives a client of this address (`ip:ADDRESS`), carrying the
/// address, so the deny list's networks apply; any other text is a plain identity.
fn client(who: &str) -> Identity {
    Identity::parse_client_ip(who).unwrap_or_else(|| Identity::new(who))
}
