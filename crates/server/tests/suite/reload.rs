//! Reload safety: a file that would silently switch limiting off (empty, truncated, without
//! policies) is refused over `POST /admin/reload`, and the running policies keep being
//! enforced with their state.

use crate::support;
use crate::support::{client, start};
use serde_json::{Value, json};

/// Policies sit in the second half of the file, so its first half is valid TOML without any.
fn full_config() -> String {
    let padding = "# This comment keeps the policies in the second half of the file, as a truncated write would lose them.\n".repeat(6);
    format!(
        "[server]\nreload_poll = \"0s\"\n\n[store]\nurl = \"memory\"\n\n{padding}\n[policies.api]\nalgorithm = \"fixed-window\"\nlimit = 5\nwindow = \"1h\"\n"
    )
}

async fn check(s: &support::TestServer) -> Value {
    let res = client()
        .post(s.url("/v1/check"))
        .json(&json!({"policy": "api", "identity": "user:1"}))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), 200, "the policy is still known");
    res.json().await.unwrap()
}

/// Starts the server, spends 2 of the 5 requests, writes `bad` and reloads it: the reload is
/// refused with a message containing `needle`, and the 3 requests left are admitted (remaining
/// 2, 1, 0) before the 6th is denied.
async fn refused_and_still_enforced(bad: &str, needle: &str) {
    let s = start(&full_config()).await;
    assert_eq!(check(&s).await["remaining"], 4);
    assert_eq!(check(&s).await["remaining"], 3);

    std::fs::write(&s.file, bad).unwrap();
    let res = client().post(s.url("/admin/reload")).send().await.unwrap();
    assert!(
        res.status().is_client_error(),
        "refused with a 4xx, got {}",
        res.status()
    );
    assert_eq!(
        res.headers()["content-type"],
        "application/problem+json",
        "a refusal is a problem document"
    );
    let v: Value = res.json().await.unwrap();
    assert_eq!(v["status"], 422);
    assert_eq!(v["reloaded"], false);
    assert_eq!(v["generation"], 1, "the running configuration stays");
    let err = v["errors"][0].as_str().unwrap();
    assert!(err.contains(needle), "{err}");
    assert!(err.contains("sluice.toml"), "names the file: {err}");

    for remaining in [2, 1, 0] {
        let d = check(&s).await;
        assert_eq!(d["allowed"], true);
        assert_eq!(d["remaining"], remaining, "the old policy's state is kept");
    }
    let d = check(&s).await;
    assert_eq!(d["allowed"], false, "6th of a limit of 5 is denied");

    let metrics = client()
        .get(s.url("/metrics"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    assert!(
        metrics
            .lines()
            .any(|l| l.starts_with("sluice_config_reloads_total")
                && l.contains("result=\"refused\"")),
        "{metrics}"
    );
    s.stop().await;
}

#[tokio::test]
async fn an_empty_file_is_refused() {
    refused_and_still_enforced("", "the file is empty").await;
}

#[tokio::test]
async fn a_file_of_comments_only_is_refused() {
    refused_and_still_enforced("# nothing here yet\n\n", "the file is empty").await;
}

#[tokio::test]
async fn a_truncated_file_is_refused() {
    let full = full_config();
    let half = &full[..full.len() / 2];
    let c = sluice_server::Config::parse(half, "half.toml", None)
        .expect("the first half is valid TOML on its own (the dangerous case)");
    assert!(c.policies.is_empty(), "the first half has no policies");
    refused_and_still_enforced(half, "no policies and no Envoy domains").await;
}

#[tokio::test]
async fn a_file_dropping_every_policy_is_refused() {
    let no_policies = "[server]\nreload_poll = \"0s\"\n\n[store]\nurl = \"memory\"\n";
    refused_and_still_enforced(no_policies, "running configuration has 1 policy").await;
}

#[tokio::test]
async fn a_file_dropping_a_policy_a_route_uses_is_refused() {
    let with_route = |policies: &str| {
        format!(
            "[server]\nreload_poll = \"0s\"\n{policies}\n[[routes]]\nprefix = \"/\"\npolicies = [\"api\"]\nupstream = \"http://127.0.0.1:9\"\n"
        )
    };
    let api = "[policies.api]\nalgorithm = \"fixed-window\"\nlimit = 5\nwindow = \"1h\"\n[policies.other]\nalgorithm = \"fixed-window\"\nlimit = 5\nwindow = \"1h\"\n";
    let s = start(&with_route(api)).await;
    assert_eq!(check(&s).await["remaining"], 4);
    let only_other = "[policies.other]\nalgorithm = \"fixed-window\"\nlimit = 5\nwindow = \"1h\"\n";
    std::fs::write(&s.file, with_route(only_other)).unwrap();
    let res = client().post(s.url("/admin/reload")).send().await.unwrap();
    assert_eq!(res.status(), 422);
    let v: Value = res.json().await.unwrap();
    let err = v["errors"][0].as_str().unwrap();
    assert!(
        err.contains("routes[0].policies: unknown policy \"api\""),
        "{err}"
    );
    assert_eq!(check(&s).await["remaining"], 3, "still enforced");
    s.stop().await;
}

#[tokio::test]
async fn a_valid_file_after_a_refusal_is_installed() {
    let s = start(&full_config()).await;
    std::fs::write(&s.file, "").unwrap();
    let res = client().post(s.url("/admin/reload")).send().await.unwrap();
    assert_eq!(res.status(), 422);
    std::fs::write(&s.file, full_config().replace("limit = 5", "limit = 7")).unwrap();
    let res = client().post(s.url("/admin/reload")).send().await.unwrap();
    assert_eq!(res.status(), 200);
    let v: Value = res.json().await.unwrap();
    assert_eq!(v["generation"], 2);
    assert_eq!(check(&s).await["limit"], 7);
    s.stop().await;
}
