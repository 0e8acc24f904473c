//! Calendar windows in the configuration (`window = "1 month"`) served by a real
//! `sluice serve`: the answer's reset and the `RateLimit` header count to the next calendar
//! boundary, and a rate "per month" says where the calendar window is.

use crate::support::{client, start, temp_dir};
use serde_json::{Value, json};
use sluice::core::algorithm::calendar::CalendarPeriod;

const CONFIG: &str = r#"
[policies.monthly]
algorithm = "fixed-window"
limit = 10000
window = "1 month"

[policies.weekly]
algorithm = "fixed-window"
limit = 5
window = "1 week"
"#;

fn now_ms() -> u64 {
    sluice::core::Clock::now(&sluice::core::SystemClock) / 1000
}

#[tokio::test]
async fn a_month_window_resets_at_the_next_first_of_the_month() {
    let s = start(CONFIG).await;
    for (policy, period, cost, left) in [
        ("monthly", CalendarPeriod::Month, 2500, 7500),
        ("weekly", CalendarPeriod::Week, 2, 3),
    ] {
        let before = now_ms();
        let v: Value = client()
            .post(s.url("/v1/check"))
            .json(&json!({"policy": policy, "identity": "user:1", "cost": cost}))
            .send()
            .await
            .unwrap()
            .json()
            .await
            .unwrap();
        let after = now_ms();
        assert_eq!(
            (v["allowed"].as_bool(), v["remaining"].as_u64()),
            (Some(true), Some(left)),
            "{v}"
        );
        // The reset is the time from the decision to the end of the calendar period (the
        // embedded store's clock follows the wall clock within a few ms).
        let reset = v["reset_after_ms"].as_u64().unwrap();
        let end = period.bounds(before).1;
        assert!(
            (end.saturating_sub(after + 50)..=end - before + 50).contains(&reset),
            "{policy}: reset {reset} ms, boundary in {} ms: {v}",
            end - before
        );
        let header = v["headers"]["RateLimit"]
            .as_str()
            .unwrap_or_default()
            .to_string();
        let t = reset.div_ceil(1000);
        assert!(
            header.contains(&format!("t={t}")),
            "{policy}: {header} vs t={t}"
        );
    }
    s.stop().await;
}

#[test]
fn a_rate_per_month_points_to_the_calendar_window() {
    let dir = temp_dir("cal");
    let file = dir.join("sluice.toml");
    std::fs::write(
        &file,
        "[policies.q]\nalgorithm = \"token-bucket\"\ncapacity = 10000\nrate = \"10000/month\"\n",
    )
    .unwrap();
    let e = sluice_server::Config::load(&file).unwrap_err().to_string();
    assert!(e.contains("window = \"1 month\""), "{e}");
    std::fs::write(
        &file,
        "[policies.q]\nalgorithm = \"sliding-counter\"\nlimit = 10\nwindow = \"1 month\"\n",
    )
    .unwrap();
    let e = sluice_server::Config::load(&file).unwrap_err().to_string();
    assert!(e.contains("only for fixed-window"), "{e}");
    let _ = std::fs::remove_dir_all(&dir);
}
