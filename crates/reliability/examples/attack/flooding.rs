//! Findings 2 and 7: floods of fresh identities through `/v1/check` on the embedded store.
//! Eviction must never turn a victim's denial into an admission, and memory must stay bounded
//! when every identity is as long as the API allows. Issue 21 item 3: after the flood,
//! identities that never sent a request must not be denied (at most 1 % of [`FRESH`]).

use std::time::{Duration, Instant};

use crate::harness::{self, FloodCount, Launch, Sluice};
use crate::{Args, Outcome};

/// Connections and pipeline depth of a flood: enough to keep the server busy on 2 cores.
const CONNS: usize = 8;
const DEPTH: usize = 32;
const TIMEOUT: Duration = Duration::from_secs(3);
/// New identities asked for once after a flood.
const FRESH: u64 = 300;

const POLICIES: &str = r#"
[policies.victim]
algorithm = "sliding-log"
limit = 3
window = "1m"

[policies.flood]
algorithm = "sliding-log"
limit = 3
window = "1h"

# 10 per hour: a victim emptied before a flood of up to minutes gets no token back meanwhile.
[policies.bucket]
algorithm = "token-bucket"
capacity = 10
rate = "10/h"
"#;

async fn start(a: &Args, max_keys: Option<u64>) -> Result<Sluice, String> {
    let (server, http, grpc) = harness::server_section();
    let cap = max_keys.map_or(String::new(), |n| format!("max_keys = {n}\n"));
    let toml = format!("{server}\n[store]\nurl = \"memory\"\n{cap}{POLICIES}");
    Sluice::start(&a.bin, &toml, http, grpc, &Launch::default()).await
}

/// Whether a check of `cost` on `policy` for `identity` is admitted (`None`: no answer).
async fn admitted(s: &Sluice, policy: &str, identity: &str, cost: u64) -> Option<bool> {
    let body = format!(r#"{{"policy":"{policy}","identity":"{identity}","cost":{cost}}}"#);
    let r = harness::check(s.http, &body, TIMEOUT).await.ok()?;
    r.json()["allowed"].as_bool()
}

fn rate(c: &FloodCount, t: Instant) -> u64 {
    (c.sent as f64 / t.elapsed().as_secs_f64().max(0.001)) as u64
}

/// What one flood left behind.
struct Run {
    /// "reset (admitted)", "held (denied)" or what went wrong.
    victim: String,
    /// "N of 300": new identities denied on their first request (cost 1, the flood's policy).
    fresh_denied: String,
    count: FloodCount,
    per_second: u64,
}

impl Run {
    fn failed(why: String) -> Self {
        Run {
            victim: why,
            fresh_denied: "not measured".into(),
            count: FloodCount::default(),
            per_second: 0,
        }
    }
}

/// One run: exhaust the victim, flood `flood` fresh identities, ask for the victim again and
/// for [`FRESH`] identities never seen.
async fn eviction_run(
    a: &Args,
    max_keys: Option<u64>,
    flood: u64,
    bucket: bool,
    bound: Duration,
) -> Run {
    let s = match start(a, max_keys).await {
        Ok(s) => s,
        Err(e) => return Run::failed(format!("server did not start: {e}")),
    };
    // Exhaust: sliding log 3 of 3 then one more; token bucket its whole capacity then 1.
    let (policy, exhaust, cost) = if bucket {
        ("bucket", 1, 10)
    } else {
        ("victim", 3, 1)
    };
    for _ in 0..exhaust {
        admitted(&s, policy, "victim", cost).await;
    }
    if admitted(&s, policy, "victim", 1).await != Some(false) {
        return Run::failed("victim was not denied before the flood".into());
    }
    let t = Instant::now();
    let flood_policy = if bucket { "bucket" } else { "flood" };
    let count = harness::flood(s.http, flood, CONNS, DEPTH, t + bound, move |i| {
        format!(r#"{{"policy":"{flood_policy}","identity":"f:{i}","cost":{cost}}}"#)
    })
    .await;
    let per_second = rate(&count, t);
    let victim = match admitted(&s, policy, "victim", 1).await {
        Some(true) => "reset (admitted)".to_string(),
        Some(false) => "held (denied)".to_string(),
        None => "no answer".to_string(),
    };
    let (mut denied, mut unanswered) = (0, 0);
    for i in 0..FRESH {
        match admitted(&s, flood_policy, &format!("new:{i}"), 1).await {
            Some(true) => {}
            Some(false) => denied += 1,
            None => unanswered += 1,
        }
    }
    let mut fresh_denied = format!("{denied} of {FRESH}");
    if unanswered > 0 {
        fresh_denied += &format!(" ({unanswered} unanswered)");
    }
    Run {
        victim,
        fresh_denied,
        count,
        per_second,
    }
}

/// `max_keys = 10000` and 20,000 fresh identities on a longer sliding log; 300,000 at cost =
/// capacity on a token bucket; then the default cap and 1.1M requests. After each: the victim,
/// and how many of 300 new identities are denied on their first request.
pub(crate) async fn eviction(a: &Args) -> Outcome {
    let (cap, flood, full_cost, big) = if a.quick {
        (1_000, 2_000, 30_000, None)
    } else {
        (10_000, 20_000, 300_000, Some(1_100_000))
    };
    let size = match big {
        Some(b) => format!(
            "max_keys {cap}, {flood} identities (log), {full_cost} (cost = capacity); \
             default cap, {b} requests"
        ),
        None => format!("max_keys {cap}, {flood} identities (log), {full_cost} (cost = capacity)"),
    };
    let mut out = Outcome::new("eviction", size);
    let bound = Duration::from_secs(60);
    let r = eviction_run(a, Some(cap), flood, false, bound).await;
    out.set("victim_after_longer_log_flood", r.victim);
    out.set("fresh_denied_after_longer_log_flood", r.fresh_denied);
    let t = Instant::now();
    let r = eviction_run(a, Some(cap), full_cost, true, Duration::from_secs(120)).await;
    out.set("victim_after_cost_capacity_flood", r.victim);
    out.set("fresh_denied_after_cost_capacity_flood", r.fresh_denied);
    out.set("cost_capacity_flood_sent", r.count.sent);
    out.set("cost_capacity_flood_seconds", t.elapsed().as_secs());
    if let Some(big) = big {
        let t = Instant::now();
        let r = eviction_run(a, None, big, false, Duration::from_secs(240)).await;
        out.set("victim_after_default_cap_flood", r.victim);
        out.set("fresh_denied_after_default_cap_flood", r.fresh_denied);
        out.set("default_cap_flood_sent", r.count.sent);
        out.set("default_cap_flood_seconds", t.elapsed().as_secs());
        out.set("default_cap_flood_per_s", r.per_second);
    }
    out
}

/// 1.1M identities of 512 bytes on the embedded store at the default cap: server RSS.
pub(crate) async fn memory(a: &Args) -> Outcome {
    let n: u64 = if a.quick { 50_000 } else { 1_100_000 };
    let mut out = Outcome::new(
        "memory",
        format!("{n} identities of 512 bytes, default cap"),
    );
    let s = match start(a, None).await {
        Ok(s) => s,
        Err(e) => {
            out.set("error", e);
            return out;
        }
    };
    out.set("rss_mb_before", s.rss_mb().round());
    let t = Instant::now();
    let bound = Duration::from_secs(if a.quick { 60 } else { 300 });
    let c = harness::flood(s.http, n, CONNS, DEPTH, t + bound, |i| {
        format!(r#"{{"policy":"bucket","identity":"{i:0>512}"}}"#)
    })
    .await;
    out.set("sent", c.sent);
    out.set("answered_200", c.ok);
    out.set("per_s", rate(&c, t));
    out.set("rss_mb", s.rss_mb().round());
    out
}
