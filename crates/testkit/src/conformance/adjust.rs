//! Reset, charge and refund (`Store::reset`, `Store::adjust`): the same arithmetic on every
//! store, the numbers of `sluice_core::algorithm::adjust` worked out by hand.

use std::sync::Arc;

use sluice_core::algorithm::Adjustment;
use sluice_core::{ManualClock, Store, StoreError};

use super::{Harness, align, all_algorithms};

/// Consuming a whole quota and resetting restores it; a reset reports whether state existed.
pub async fn reset_restores_the_limit(store: Arc<dyn Store>, clock: ManualClock) {
    let h = Harness::new(store, clock);
    align(&h.clock, 10_000);
    for (name, alg) in all_algorithms() {
        let k = h.key("user:reset", name);
        assert!(
            !h.store.reset(&k).await.unwrap(),
            "{name}: nothing to reset"
        );
        let d = h.one(&k, &alg, 3).await;
        assert!(d.allowed, "{name}");
        assert!(!h.one(&k, &alg, 1).await.allowed, "{name}: quota used");
        assert!(h.store.reset(&k).await.unwrap(), "{name}: state was there");
        let peek = h.one(&k, &alg, 0).await;
        assert_eq!((peek.remaining, peek.reset_after_ms), (3, 0), "{name}");
        assert!(
            h.one(&k, &alg, 3).await.allowed,
            "{name}: whole quota again"
        );
    }
}

/// `(remaining, reset_after_ms, allowed)` after one charge or refund.
type Step = (u64, u64, bool);

/// Charge 5 against a quota of 3, refund 3, then refund far more than was charged:
/// `(remaining, reset_after_ms, allowed)` after each step, per algorithm.
pub async fn charge_goes_into_debt_and_refund_stops_at_capacity(
    store: Arc<dyn Store>,
    clock: ManualClock,
) {
    let h = Harness::new(store, clock);
    align(&h.clock, 10_000);
    // Every quota is 3, every rate 1/s, every window 10 s (see `all_algorithms`).
    let want: &[(&str, [Step; 3])] = &[
        // Empty at 0 (no negative tokens), so the refund of 3 fills it again.
        ("tb", [(0, 3000, true), (3, 0, true), (3, 0, true)]),
        // TAT 5 s ahead with a tolerance of 3 s; the refund takes it to 2 s.
        ("gcra", [(0, 5000, false), (1, 2000, true), (3, 0, true)]),
        ("lbp", [(0, 5000, false), (1, 2000, true), (3, 0, true)]),
        ("lbs", [(0, 5000, false), (1, 2000, true), (3, 0, true)]),
        ("fw", [(0, 10_000, false), (1, 10_000, true), (3, 0, true)]),
        ("swc", [(0, 20_000, false), (1, 20_000, true), (3, 0, true)]),
        ("swl", [(0, 10_000, false), (1, 10_000, true), (3, 0, true)]),
    ];
    for (name, alg) in all_algorithms() {
        let Some((_, steps)) = want.iter().find(|(n, _)| *n == name) else {
            continue;
        };
        let k = h.key("user:adjust", name);
        for (adj, step) in [
            Adjustment::Charge(5),
            Adjustment::Refund(3),
            Adjustment::Refund(100),
        ]
        .into_iter()
        .zip(steps)
        {
            let d = h.store.adjust(&k, &alg, adj).await.expect("store answers");
            assert_eq!(
                (d.remaining, d.reset_after_ms, d.allowed),
                *step,
                "{name} {adj:?}: {d:?}"
            );
            assert_eq!(d.limit, 3, "{name}");
            // The answer is what a check of cost 0 sees.
            let peek = h.one(&k, &alg, 0).await;
            assert_eq!(
                (peek.remaining, peek.reset_after_ms),
                (step.0, step.1),
                "{name}"
            );
        }
    }
}

/// After a check of an estimated cost, a refund of the difference frees exactly that much, and
/// a charge of a further difference takes exactly that much (the settle pattern).
pub async fn settle_an_estimate_exactly(store: Arc<dyn Store>, clock: ManualClock) {
    let h = Harness::new(store, clock);
    align(&h.clock, 10_000);
    let alg = sluice_core::Algorithm::FixedWindow {
        limit: 1000,
        window_ms: 10_000,
    };
    let k = h.key("user:llm", "tokens");
    assert_eq!(h.one(&k, &alg, 500).await.remaining, 500);
    // Used 320 of the estimated 500: give back 180.
    let d = h
        .store
        .adjust(&k, &alg, Adjustment::Refund(180))
        .await
        .unwrap();
    assert_eq!(d.remaining, 680);
    assert_eq!(h.one(&k, &alg, 500).await.remaining, 180);
    // Used 740 of the estimated 500: charge 240 more, past the limit.
    let d = h
        .store
        .adjust(&k, &alg, Adjustment::Charge(240))
        .await
        .unwrap();
    assert_eq!((d.remaining, d.allowed), (0, false));
    assert!(!h.one(&k, &alg, 1).await.allowed);
    // 320 + 740 = 1060 used: a refund of 60 leaves the window exactly full.
    let d = h
        .store
        .adjust(&k, &alg, Adjustment::Refund(60))
        .await
        .unwrap();
    assert_eq!((d.remaining, d.allowed), (0, true));
    let d = h
        .store
        .adjust(&k, &alg, Adjustment::Refund(1))
        .await
        .unwrap();
    assert_eq!(d.remaining, 1);
}

/// A concurrency limit is neither charged nor refunded, and its leases stay as they were.
pub async fn concurrency_is_not_adjustable(store: Arc<dyn Store>, clock: ManualClock) {
    let h = Harness::new(store, clock);
    let (_, cc) = all_algorithms().pop().expect("concurrency is last");
    let k = h.key("user:cc", "cc");
    assert!(h.one(&k, &cc, 2).await.allowed);
    for adj in [Adjustment::Charge(1), Adjustment::Refund(1)] {
        match h.store.adjust(&k, &cc, adj).await {
            Err(StoreError::Invalid(msg)) => assert!(msg.contains("concurrency"), "{msg}"),
            other => panic!("{adj:?}: {other:?}"),
        }
    }
    assert_eq!(h.one(&k, &cc, 0).await.remaining, 1);
}

/// µs of `y-m-d hh:mm:ss` UTC.
fn utc(y: i64, m: u32, d: u32, hms: (u64, u64, u64)) -> u64 {
    let days = sluice_core::algorithm::calendar::days_from_civil(y, m, d) as u64;
    (days * 86_400 + hms.0 * 3600 + hms.1 * 60 + hms.2) * 1_000_000
}

/// A calendar-month window resets on the 1st at 00:00 UTC, after 31 days in January and 29 in
/// February of a leap year, with the real time to the boundary as the reset.
pub async fn calendar_month_resets_on_the_first(store: Arc<dyn Store>, clock: ManualClock) {
    use sluice_core::algorithm::calendar::CalendarPeriod;
    let h = Harness::new(store, clock);
    let month = sluice_core::Algorithm::CalendarWindow {
        limit: 10_000,
        period: CalendarPeriod::Month,
    };
    let k = h.key("user:cal", "monthly");
    const DAY: u64 = 86_400_000;
    h.clock.set(utc(2024, 1, 31, (23, 59, 59)));
    h.expect(&k, &month, 9000, (true, 1000, 0, 1000)).await;
    h.expect(&k, &month, 1001, (false, 1000, 1000, 1000)).await;
    h.clock.advance_ms(1000); // 2024-02-01T00:00:00Z
    h.expect(&k, &month, 10_000, (true, 0, 0, 29 * DAY)).await;
    h.clock.set(utc(2024, 2, 29, (23, 59, 59)));
    h.expect(&k, &month, 1, (false, 0, 1000, 1000)).await;
    // A refund and a charge land in the same calendar month.
    let d = h
        .store
        .adjust(&k, &month, Adjustment::Refund(5))
        .await
        .unwrap();
    assert_eq!((d.remaining, d.reset_after_ms), (5, 1000));
    let d = h
        .store
        .adjust(&k, &month, Adjustment::Charge(2))
        .await
        .unwrap();
    assert_eq!(d.remaining, 3);
    h.clock.advance_ms(1000); // 2024-03-01T00:00:00Z
    h.expect(&k, &month, 1, (true, 9999, 0, 31 * DAY)).await;
}

/// A calendar week runs Monday 00:00 UTC to Monday; a calendar day, midnight to midnight.
pub async fn calendar_week_and_day_boundaries(store: Arc<dyn Store>, clock: ManualClock) {
    use sluice_core::algorithm::calendar::CalendarPeriod;
    let h = Harness::new(store, clock);
    const DAY: u64 = 86_400_000;
    let week = sluice_core::Algorithm::CalendarWindow {
        limit: 2,
        period: CalendarPeriod::Week,
    };
    let day = sluice_core::Algorithm::CalendarWindow {
        limit: 2,
        period: CalendarPeriod::Day,
    };
    let (kw, kd) = (h.key("user:cal", "weekly"), h.key("user:cal", "daily"));
    // Wednesday 2025-12-31 12:00: the week began Monday the 29th, ends Monday 2026-01-05.
    h.clock.set(utc(2025, 12, 31, (12, 0, 0)));
    h.expect(&kw, &week, 2, (true, 0, 0, 4 * DAY + DAY / 2))
        .await;
    h.expect(&kd, &day, 2, (true, 0, 0, DAY / 2)).await;
    h.clock.set(utc(2026, 1, 4, (23, 59, 59))); // Sunday
    h.expect(&kw, &week, 1, (false, 0, 1000, 1000)).await;
    h.expect(&kd, &day, 1, (true, 1, 0, 1000)).await;
    h.clock.advance_ms(1000); // Monday 2026-01-05 00:00
    h.expect(&kw, &week, 1, (true, 1, 0, 7 * DAY)).await;
}
