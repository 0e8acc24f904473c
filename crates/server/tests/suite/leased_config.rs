//! `mode = "leased"` and `lease_ttl` in `[policies.NAME]`: what they build, and the errors
//! (file:line: field: message) for what leasing cannot serve.

use sluice::DecisionMode;
use sluice_server::config::Config;

fn errs(src: &str) -> Vec<String> {
    match Config::parse(src, "sluice.toml", None) {
        Ok(_) => panic!("expected errors in:\n{src}"),
        Err(e) => e.0.iter().map(ToString::to_string).collect(),
    }
}

#[test]
fn leased_mode_and_its_lifetime_are_read_and_exact_stays_the_default() {
    let src = "\
[policies.api]
algorithm = \"token-bucket\"
capacity = 100
rate = \"50/s\"
mode = \"leased\"
lease_ttl = \"250ms\"

[policies.daily]
algorithm = \"fixed-window\"
limit = 1000
window = \"1d\"
mode = \"leased\"

[policies.plain]
algorithm = \"gcra\"
rate = \"5/s\"
mode = \"exact\"

[policies.shaped]
algorithm = \"leaky-bucket\"
capacity = 10
rate = \"5/s\"
mode = \"shaping\"
";
    let c = Config::parse(src, "sluice.toml", None).unwrap_or_else(|e| panic!("{e}"));
    let mode = |n: &str| c.policies[n].policy.mode;
    assert_eq!(mode("api"), DecisionMode::Leased { ttl_ms: 250 });
    assert_eq!(mode("daily"), DecisionMode::leased());
    assert_eq!(mode("plain"), DecisionMode::Exact);
    assert_eq!(mode("shaped"), DecisionMode::Exact);
    assert!(matches!(
        c.policies["shaped"].policy.algorithm,
        sluice::Algorithm::LeakyBucket {
            mode: sluice::LeakyMode::Shaping,
            ..
        }
    ));
}

#[test]
fn what_leasing_cannot_serve_names_line_and_field() {
    let src = "\
[policies.conc]
algorithm = \"concurrency\"
limit = 5
mode = \"leased\"

[policies.log]
algorithm = \"sliding-window-log\"
limit = 5
window = \"1s\"
mode = \"leased\"

[policies.long]
algorithm = \"token-bucket\"
capacity = 5
rate = \"1/s\"
mode = \"leased\"
lease_ttl = \"2m\"

[policies.stray]
algorithm = \"gcra\"
rate = \"1/s\"
lease_ttl = \"1s\"

[policies.typo]
algorithm = \"gcra\"
rate = \"1/s\"
mode = \"leasd\"

[policies.bad_ttl]
algorithm = \"gcra\"
rate = \"1/s\"
mode = \"leased\"
lease_ttl = \"soon\"
";
    let e = errs(src);
    let want = [
        "sluice.toml:33: policies.bad_ttl.lease_ttl: invalid duration \"soon\"",
        "sluice.toml:4: policies.conc.mode: mode = \"leased\" supports token-bucket, gcra and fixed-window, not concurrency",
        "sluice.toml:10: policies.log.mode: mode = \"leased\" supports token-bucket, gcra and fixed-window, not sliding-log",
        "sluice.toml:17: policies.long.lease_ttl: must be between 1ms and 1m",
        "sluice.toml:22: policies.stray.lease_ttl: only a policy with mode = \"leased\" takes lease_ttl",
        "sluice.toml:27: policies.typo.mode: unknown mode \"leasd\": expected exact or leased",
    ];
    assert_eq!(e.len(), want.len(), "{e:#?}");
    for want in want {
        assert!(
            e.iter().any(|got| got.starts_with(want)),
            "no error starts with\n{want}\nin {e:#?}"
        );
    }
}
