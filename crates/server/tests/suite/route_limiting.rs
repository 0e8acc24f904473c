//! A `[[routes]]` entry's limiting as `sluice_config` builds it for every front end
//! (`route_rule`, `route_layers`, `route_deciders`): one decider per identity source, the
//! first listed outermost, each with the route's `count`.

use http::Method;
use sluice::Limiter;
use sluice_http::{Answer, Decider, RequestHead};
use sluice_server::Config;
use sluice_server::config::{route_deciders, route_layers, route_rule};

const FILE: &str = r#"
[policies.per-ip]
algorithm = "fixed-window"
limit = 100
window = "1h"
identity = "ip"

[policies.per-key]
algorithm = "fixed-window"
limit = 1
window = "1h"
identity = "api-key:x-api-key"

[policies.also-per-ip]
algorithm = "fixed-window"
limit = 100
window = "1h"
identity = "ip"

[[routes]]
prefix = "/login"
methods = ["POST"]
policies = ["per-ip", "per-key", "also-per-ip"]
count = [401]
upstream = "http://127.0.0.1:9"
"#;

#[tokio::test]
async fn a_route_is_one_decider_per_identity_source_first_listed_outermost() {
    let config = Config::parse(FILE, "sluice.toml", None).unwrap();
    let route = &config.routes[0];
    let rule = route_rule(&config, route);
    assert!(rule.matches(&Method::POST, "/login/x"));
    assert!(!rule.matches(&Method::GET, "/login"));

    let limiter = Limiter::memory();
    let deciders = route_deciders(&config, route, &limiter);
    assert_eq!(deciders.len(), 2);
    assert_eq!(route_layers(&config, route, &limiter).len(), 2);
    let names = |d: &Decider| -> Vec<String> {
        let r = d.rule(&Method::POST, "/login").unwrap();
        r.policies().iter().map(|p| p.name.clone()).collect()
    };
    assert_eq!(names(&deciders[0]), ["per-ip", "also-per-ip"]);
    assert_eq!(names(&deciders[1]), ["per-key"]);

    // The per-key decider limits by the hashed key, and counts only 401s.
    let head =
        || RequestHead::from_raw("POST", "/login", [("x-api-key", "k")], Some("10.0.0.1")).unwrap();
    for _ in 0..3 {
        let Answer::Admit(a) = deciders[1].decide_head(head()).await else {
            panic!("refused")
        };
        assert!(a.identity().unwrap().as_str().starts_with("key:"));
        assert!(a.counts_by_outcome());
        a.finish(200).await;
    }
    let Answer::Admit(a) = deciders[1].decide_head(head()).await else {
        panic!("refused")
    };
    a.finish(401).await;
    assert!(matches!(
        deciders[1].decide_head(head()).await,
        Answer::Refuse(r) if r.status == http::StatusCode::TOO_MANY_REQUESTS
    ));
}
