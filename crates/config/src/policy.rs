//! `[policies.NAME]`: each policy's algorithm and parameters, failure mode, shards and the
//! identity the proxy limits it by.
//!
//! Parameters that an algorithm does not take are reported rather than ignored: a `capacity`
//! on a GCRA policy is a misunderstanding worth a line in `sluice validate`. Names, aliases,
//! the parameters each algorithm takes and those messages come from the core registry
//! ([`sluice::core::algorithm::registry`]), as they do for the CLI and Envoy files.

use std::collections::BTreeMap;
use std::ops::Range;
use std::sync::Arc;

use sluice::core::algorithm::{AlgorithmKind, Param, Params};
use sluice::core::policy::{CalendarPeriod, parse_duration_ms};
use sluice::{Algorithm, DecisionMode, FailureMode, LeakyMode, Policy, Rate};
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
    jwt: Option<&Arc<sluice_http::identity::JwtVerifier>>,
) -> BTreeMap<String, PolicyConfig> {
    let mut policies = BTreeMap::new();
    for (name, p) in &raw.policies {
        let n = name.get_ref();
        let field = format!("policies.{n}");
        if let Err(e) = sluice::core::policy::validate_policy_name(n) {
            ck.at(name.span(), &field, e.to_string());
            continue;
        }
        if let Some(pc) = check_policy(ck, n, p, default_failure, raw.shadow, jwt) {
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
    jwt: Option<&Arc<sluice_http::identity::JwtVerifier>>,
) -> Option<PolicyConfig> {
    let f = |k: &str| format!("policies.{name}.{k}");
    let r = p.get_ref();
    let header = p.span();
    let before = ck.errors.len();
    // `mode` names the decision mode (exact, leased) on every algorithm, and the leaky
    // bucket's policing or shaping.
    let decision_mode = r
        .mode
        .as_ref()
        .filter(|m| matches!(m.get_ref().as_str(), "exact" | "leased"));
    let leaky_mode = r.mode.as_ref().filter(|_| decision_mode.is_none());
    let kind = match r.algorithm.get_ref().parse::<AlgorithmKind>() {
        Ok(kind) => kind,
        Err(e) => {
            ck.at(r.algorithm.span(), f("algorithm"), e.to_string());
            return None;
        }
    };
    // Parameters that do not belong to the algorithm are mistakes worth reporting.
    let spans: [(Param, Option<Range<usize>>); 6] = [
        (Param::Capacity, r.capacity.as_ref().map(|v| v.span())),
        (Param::Rate, r.rate.as_ref().map(|v| v.span())),
        (Param::Burst, r.burst.as_ref().map(|v| v.span())),
        (Param::Limit, r.limit.as_ref().map(|v| v.span())),
        (Param::Window, r.window.as_ref().map(|v| v.span())),
        (Param::Lease, r.lease.as_ref().map(|v| v.span())),
    ];
    if let Some(m) = leaky_mode
        && let Err(e) = kind.check_param(Param::Mode)
    {
        ck.at(
            m.span(),
            f("mode"),
            match m.get_ref().as_str() {
                // A leaky bucket's own modes on another algorithm.
                "policing" | "shaping" => format!(
                    "{e}: {:?} is a leaky-bucket mode; every algorithm takes exact or leased",
                    m.get_ref()
                ),
                other => format!("unknown mode {other:?}: expected exact or leased"),
            },
        );
    }
    for (param, span) in spans {
        if let Some(span) = span
            && let Err(e) = kind.check_param(param)
        {
            ck.at(span, f(param.name()), e.to_string());
        }
    }
    // The values of the parameters it takes; one that does not parse is reported and stands
    // in as a placeholder, so it is not also reported missing.
    let duration = |ck: &mut Checker<'_>, v: &Spanned<RawDuration>, param: Param| -> u64 {
        match parse_duration_ms(v.get_ref()) {
            Ok(0) => {
                ck.at(v.span(), f(param.name()), "must be above 0");
                1
            }
            Ok(ms) => ms,
            Err(e) => {
                ck.at(v.span(), f(param.name()), e.to_string());
                1
            }
        }
    };
    let takes = |param: Param| kind.takes(param);
    let params = Params {
        capacity: r
            .capacity
            .as_ref()
            .filter(|_| takes(Param::Capacity))
            .map(|v| *v.get_ref()),
        rate: r.rate.as_ref().filter(|_| takes(Param::Rate)).map(|v| {
            v.get_ref().parse::<Rate>().unwrap_or_else(|e| {
                ck.at(v.span(), f("rate"), e.to_string());
                Rate::per_second(1)
            })
        }),
        burst: r
            .burst
            .as_ref()
            .filter(|_| takes(Param::Burst))
            .map(|v| *v.get_ref()),
        limit: r
            .limit
            .as_ref()
            .filter(|_| takes(Param::Limit))
            .map(|v| *v.get_ref()),
        // A calendar window ("1 month") stands in as its longest length until the algorithm
        // is built, then becomes its calendar form below.
        window_ms: r.window.as_ref().filter(|_| takes(Param::Window)).map(|v| {
            match CalendarPeriod::parse(v.get_ref()) {
                Some(period) => period.max_ms(),
                None => duration(ck, v, Param::Window),
            }
        }),
        mode: leaky_mode.filter(|_| takes(Param::Mode)).map(|v| {
            v.get_ref().parse::<LeakyMode>().unwrap_or_else(|e| {
                ck.at(v.span(), f("mode"), e.to_string());
                LeakyMode::Policing
            })
        }),
        lease_ms: r
            .lease
            .as_ref()
            .filter(|_| takes(Param::Lease))
            .map(|v| duration(ck, v, Param::Lease)),
    };
    let algorithm = match kind.build(&params) {
        Ok(a) => Some(a),
        Err(missing) => {
            for e in missing {
                ck.at(header.clone(), f(e.param().name()), e.to_string());
            }
            None
        }
    };
    let calendar = r
        .window
        .as_ref()
        .filter(|_| takes(Param::Window))
        .and_then(|v| Some((CalendarPeriod::parse(v.get_ref())?, v.span())));
    let algorithm = match (algorithm, calendar) {
        (Some(a), Some((period, span))) => match a.on_calendar(period) {
            Ok(a) => Some(a),
            Err(e) => {
                ck.at(span, f("window"), e.to_string());
                None
            }
        },
        (a, _) => a,
    };
    if ck.errors.len() == before
        && let Some(Err(e)) = algorithm.as_ref().map(Algorithm::validate)
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
        Some(i) => match IdentitySource::from_raw(i.get_ref()) {
            Ok(src) if src.uses_jwt() && jwt.is_none() && !ck.skip_env_secrets => {
                ck.at(
                    i.span(),
                    f("identity"),
                    "jwt:CLAIM needs a [jwt] key (missing or unusable) to verify tokens",
                );
                src
            }
            Ok(src) => src,
            Err(e) => {
                ck.at(i.span(), f("identity"), e);
                IdentitySource::Ip
            }
        },
    };
    let mode = decision_mode_of(ck, r, &f, algorithm.as_ref());
    if ck.errors.len() != before {
        return None;
    }
    let policy = Policy {
        name: name.to_string(),
        algorithm: algorithm?,
        failure_mode: failure,
        shadow: r.shadow || global_shadow,
        shards,
        mode,
    };
    Some(PolicyConfig {
        policy: Arc::new(policy),
        layer_identity: identity.layer_source(jwt),
        identity,
    })
}

/// `mode = "exact" | "leased"` and `lease_ttl`: the decision mode, reported at the field that
/// is wrong (an algorithm leasing cannot serve, a lifetime out of range, a `lease_ttl`
/// without leasing).
fn decision_mode_of(
    ck: &mut Checker<'_>,
    r: &RawPolicy,
    f: &dyn Fn(&str) -> String,
    algorithm: Option<&Algorithm>,
) -> DecisionMode {
    let leased = r.mode.as_ref().filter(|m| m.get_ref() == "leased");
    let Some(mode) = leased else {
        if let Some(ttl) = &r.lease_ttl {
            ck.at(
                ttl.span(),
                f("lease_ttl"),
                "only a policy with mode = \"leased\" takes lease_ttl",
            );
        }
        return DecisionMode::Exact;
    };
    let ttl_ms = match &r.lease_ttl {
        None => DecisionMode::DEFAULT_LEASE_TTL_MS,
        Some(v) => match parse_duration_ms(v.get_ref()) {
            Ok(ms) if (1..=DecisionMode::MAX_LEASE_TTL_MS).contains(&ms) => ms,
            Ok(_) => {
                ck.at(
                    v.span(),
                    f("lease_ttl"),
                    format!(
                        "must be between 1ms and {}",
                        sluice::core::policy::format_duration_ms(DecisionMode::MAX_LEASE_TTL_MS)
                    ),
                );
                return DecisionMode::Exact;
            }
            Err(e) => {
                ck.at(v.span(), f("lease_ttl"), e.to_string());
                return DecisionMode::Exact;
            }
        },
    };
    let leased = DecisionMode::Leased { ttl_ms };
    if let Some(a) = algorithm
        && let Err(e) = leased.check(a)
    {
        ck.at(mode.span(), f("mode"), e.to_string());
    }
    leased
}
