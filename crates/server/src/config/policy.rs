//! `[policies.NAME]`: each policy's algorithm and parameters, failure mode, shards and the
//! identity the proxy limits it by.
//!
//! Parameters that an algorithm does not take are reported rather than ignored: a `capacity`
//! on a GCRA policy is a misunderstanding worth a line in `sluice validate`.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use sluice::core::policy::parse_duration_ms;
use sluice::{Algorithm, FailureMode, LeakyMode, Policy, Rate};
use toml::Spanned;

use super::check::failure_mode;
use super::error::Checker;
use super::raw::{RawConfig, RawDuration, RawPolicy};
use super::{IdentitySource, PolicyConfig};

/// Checks every `[policies.NAME]`; the policies with errors are left out (and reported).
pub(super) fn check_policies(
    ck: &mut Checker<'_>,
    raw: &RawConfig,
    default_failure: FailureMode,
) -> BTreeMap<String, PolicyConfig> {
    let mut policies = BTreeMap::new();
    for (name, p) in &raw.policies {
        let n = name.get_ref();
        let field = format!("policies.{n}");
        if let Err(e) = sluice::core::policy::validate_policy_name(n) {
            ck.at(name.span(), &field, e.to_string());
            continue;
        }
        if let Some(pc) = check_policy(ck, n, p, default_failure, raw.shadow) {
            policies.insert(n.clone(), pc);
        }
    }
    policies
}

fn check_policy(
    ck: &mut Checker<'_>,
    name: &str,
    p: &Spanned<RawPolicy>,
    default_failure: FailureMode,
    global_shadow: bool,
) -> Option<PolicyConfig> {
    let f = |k: &str| format!("policies.{name}.{k}");
    let r = p.get_ref();
    let header = p.span();
    let before = ck.errors.len();
    let alg_name = r.algorithm.get_ref().as_str();
    let need_u64 = |ck: &mut Checker<'_>, v: &Option<Spanned<u64>>, k: &str| -> u64 {
        match v {
            Some(n) => *n.get_ref(),
            None => {
                ck.at(header.clone(), f(k), format!("{alg_name} needs {k}"));
                1
            }
        }
    };
    let rate = |ck: &mut Checker<'_>| -> Rate {
        match &r.rate {
            Some(s) => s.get_ref().parse::<Rate>().unwrap_or_else(|e| {
                ck.at(s.span(), f("rate"), e.to_string());
                Rate::per_second(1)
            }),
            None => {
                ck.at(
                    header.clone(),
                    f("rate"),
                    format!("{alg_name} needs rate (such as 5/s, 300/min)"),
                );
                Rate::per_second(1)
            }
        }
    };
    let window = |ck: &mut Checker<'_>,
                  v: &Option<Spanned<RawDuration>>,
                  k: &str,
                  default: Option<u64>|
     -> u64 {
        match (v, default) {
            (Some(s), _) => match parse_duration_ms(s.get_ref()) {
                Ok(0) => {
                    ck.at(s.span(), f(k), "must be above 0");
                    1
                }
                Ok(ms) => ms,
                Err(e) => {
                    ck.at(s.span(), f(k), e.to_string());
                    1
                }
            },
            (None, Some(d)) => d,
            (None, None) => {
                ck.at(
                    header.clone(),
                    f(k),
                    format!("{alg_name} needs {k} (such as 10s, 1m)"),
                );
                1
            }
        }
    };
    let algorithm = match alg_name {
        "token-bucket" => Algorithm::TokenBucket {
            capacity: need_u64(ck, &r.capacity, "capacity"),
            rate: rate(ck),
        },
        "gcra" => Algorithm::Gcra {
            rate: rate(ck),
            burst: r.burst.as_ref().map_or(0, |b| *b.get_ref()),
        },
        "leaky-bucket" => {
            let mode = match r.mode.as_ref().map(|m| (m.get_ref().as_str(), m.span())) {
                None | Some(("policing", _)) => LeakyMode::Policing,
                Some(("shaping", _)) => LeakyMode::Shaping,
                Some((other, span)) => {
                    ck.at(
                        span,
                        f("mode"),
                        format!(
                            "unknown leaky-bucket mode {other:?}: expected policing or shaping"
                        ),
                    );
                    LeakyMode::Policing
                }
            };
            Algorithm::LeakyBucket {
                capacity: need_u64(ck, &r.capacity, "capacity"),
                rate: rate(ck),
                mode,
            }
        }
        "fixed-window" => Algorithm::FixedWindow {
            limit: need_u64(ck, &r.limit, "limit"),
            window_ms: window(ck, &r.window, "window", None),
        },
        "sliding-counter" => Algorithm::SlidingWindowCounter {
            limit: need_u64(ck, &r.limit, "limit"),
            window_ms: window(ck, &r.window, "window", None),
        },
        "sliding-log" => Algorithm::SlidingWindowLog {
            limit: need_u64(ck, &r.limit, "limit"),
            window_ms: window(ck, &r.window, "window", None),
        },
        "concurrency" => Algorithm::Concurrency {
            limit: need_u64(ck, &r.limit, "limit"),
            lease_ms: window(ck, &r.lease, "lease", Some(30_000)),
        },
        other => {
            ck.at(
                r.algorithm.span(),
                f("algorithm"),
                format!(
                    "unknown algorithm {other:?}: expected token-bucket, gcra, leaky-bucket, fixed-window, \
                     sliding-counter, sliding-log or concurrency"
                ),
            );
            return None;
        }
    };
    // Parameters that do not belong to the algorithm are mistakes worth reporting.
    let allowed: &[&str] = match alg_name {
        "token-bucket" => &["capacity", "rate"],
        "gcra" => &["rate", "burst"],
        "leaky-bucket" => &["capacity", "rate", "mode"],
        "concurrency" => &["limit", "lease"],
        _ => &["limit", "window"],
    };
    let given: [(&str, Option<Range<usize>>); 7] = [
        ("capacity", r.capacity.as_ref().map(|v| v.span())),
        ("rate", r.rate.as_ref().map(|v| v.span())),
        ("burst", r.burst.as_ref().map(|v| v.span())),
        ("limit", r.limit.as_ref().map(|v| v.span())),
        ("window", r.window.as_ref().map(|v| v.span())),
        ("mode", r.mode.as_ref().map(|v| v.span())),
        ("lease", r.lease.as_ref().map(|v| v.span())),
    ];
    for (k, span) in given {
        if let Some(span) = span
            && !allowed.contains(&k)
        {
            ck.at(
                span,
                f(k),
                format!("{alg_name} takes no {k} (it takes {})", allowed.join(", ")),
            );
        }
    }
    if ck.errors.len() == before
        && let Err(e) = algorithm.validate()
    {
        ck.at(r.algorithm.span(), f("algorithm"), e.to_string());
    }
    let failure = match &r.failure_mode {
        None => default_failure,
        Some(m) => failure_mode(m.get_ref()).unwrap_or_else(|e| {
            ck.at(m.span(), f("failure_mode"), e);
            default_failure
        }),
    };
    let shards = match &r.shards {
        None => 1,
        Some(s) if *s.get_ref() == 0 || *s.get_ref() > 1024 => {
            ck.at(s.span(), f("shards"), "must be between 1 and 1024");
            1
        }
        Some(s) => *s.get_ref(),
    };
    let identity = match &r.identity {
        None => IdentitySource::Ip,
        Some(i) => i.get_ref().parse().unwrap_or_else(|e| {
            ck.at(i.span(), f("identity"), e);
            IdentitySource::Ip
        }),
    };
    if ck.errors.len() != before {
        return None;
    }
    let policy = Policy {
        name: name.to_string(),
        algorithm,
        failure_mode: failure,
        shadow: r.shadow || global_shadow,
        shards,
    };
    Some(PolicyConfig {
        policy: Arc::new(policy),
        layer_identity: identity.layer_source(),
        identity,
    })
}
