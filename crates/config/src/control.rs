//! `[plans.NAME.POLICY]`, `[lists]`, `[control]` and each policy's `ban = {...}`: what the
//! configuration gives the limiter's control plane ([`sluice::control`]).
//!
//! A plan's table carries a policy's parameters under the policy's own field names; they are
//! laid over the policy's parameters, so a plan only names what differs. The same overlay
//! reads the `params` of an override set through the API ([`overlay`]).

use std::collections::{BTreeMap, HashMap};

use serde::Deserialize;
use sluice::control::ControlLimits;
use sluice::core::algorithm::Param;
use sluice::core::policy::parse_duration_ms;
use sluice::{Algorithm, BanRule, ControlConfig, LeakyMode, ListEntry, Policy, Rate};
use toml::Spanned;

use super::PolicyConfig;
use super::error::Checker;
use super::raw::RawConfig;

/// A number or a string (`window = 60` or `window = "1m"`).
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum NumberOrText {
    /// A whole number (seconds, for durations).
    Number(u64),
    /// Text such as `1m` or `5/s`.
    Text(String),
}

impl NumberOrText {
    fn duration_ms(&self) -> Result<u64, String> {
        match self {
            NumberOrText::Number(s) => {
                sluice::core::policy::within_max_duration(s.saturating_mul(1000))
                    .map_err(|e| e.to_string())
            }
            NumberOrText::Text(t) => parse_duration_ms(t).map_err(|e| e.to_string()),
        }
    }
}

/// Algorithm parameters by the names `[policies.*]` uses, every one optional: a plan's table,
/// or an override's `params`.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ParamsText {
    /// `capacity`.
    pub capacity: Option<u64>,
    /// `rate` such as `5/s`.
    pub rate: Option<String>,
    /// `burst`.
    pub burst: Option<u64>,
    /// `limit`.
    pub limit: Option<u64>,
    /// `window` such as `1m`.
    pub window: Option<NumberOrText>,
    /// `mode`: `policing` or `shaping`.
    pub mode: Option<String>,
    /// `lease` such as `30s`.
    pub lease: Option<NumberOrText>,
}

/// `ban = { after, within, duration, multiplier, max }` of a policy.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawBan {
    pub after: u32,
    pub within: NumberOrText,
    pub duration: NumberOrText,
    pub multiplier: Option<f64>,
    pub max: Option<NumberOrText>,
}

/// `[control]`: the most entries of each control table and the control endpoints' body
/// limit.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawControl {
    pub max_allow: Option<Spanned<u64>>,
    pub max_deny: Option<Spanned<u64>>,
    pub max_bans: Option<Spanned<u64>>,
    pub max_overrides: Option<Spanned<u64>>,
    pub max_body_bytes: Option<Spanned<super::raw::RawBytes>>,
}

/// The largest any table may be configured (memory: a few hundred bytes per entry).
const MAX_TABLE: u64 = 100_000_000;

/// Reads `[control]`.
fn limits(ck: &mut Checker<'_>, raw: &RawControl) -> ControlLimits {
    let d = ControlLimits::default();
    ControlLimits {
        max_allow: ck.bounded(&raw.max_allow, "control.max_allow", d.max_allow, MAX_TABLE),
        max_deny: ck.bounded(&raw.max_deny, "control.max_deny", d.max_deny, MAX_TABLE),
        max_bans: ck.bounded(&raw.max_bans, "control.max_bans", d.max_bans, MAX_TABLE),
        max_overrides: ck.bounded(
            &raw.max_overrides,
            "control.max_overrides",
            d.max_overrides,
            MAX_TABLE,
        ),
        max_body_bytes: ck.bytes(
            &raw.max_body_bytes,
            "control.max_body_bytes",
            d.max_body_bytes,
            (16 << 10, 64 << 20),
        ),
    }
}

/// `[lists]`.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub(super) struct RawLists {
    #[serde(default)]
    pub allow: Vec<Spanned<String>>,
    #[serde(default)]
    pub deny: Vec<Spanned<String>>,
}

/// `policy`'s algorithm with the parameters of `text` laid over its own. Parameters the
/// algorithm does not take, values that do not parse and invalid results are errors.
pub fn overlay(policy: &Policy, text: &ParamsText) -> Result<Algorithm, String> {
    let kind = policy.algorithm.algorithm_kind();
    let mut p = Algorithm::params(&policy.algorithm);
    let given = [
        (Param::Capacity, text.capacity.is_some()),
        (Param::Rate, text.rate.is_some()),
        (Param::Burst, text.burst.is_some()),
        (Param::Limit, text.limit.is_some()),
        (Param::Window, text.window.is_some()),
        (Param::Mode, text.mode.is_some()),
        (Param::Lease, text.lease.is_some()),
    ];
    for (param, is_given) in given {
        if is_given {
            kind.check_param(param)
                .map_err(|e| format!("{}: {e}", param.name()))?;
        }
    }
    if given.iter().all(|(_, g)| !g) {
        return Err("no parameters given".into());
    }
    p.capacity = text.capacity.or(p.capacity);
    p.burst = text.burst.or(p.burst);
    p.limit = text.limit.or(p.limit);
    if let Some(r) = &text.rate {
        p.rate = Some(r.parse::<Rate>().map_err(|e| format!("rate: {e}"))?);
    }
    if let Some(w) = &text.window {
        p.window_ms = Some(w.duration_ms().map_err(|e| format!("window: {e}"))?);
    }
    if let Some(l) = &text.lease {
        p.lease_ms = Some(l.duration_ms().map_err(|e| format!("lease: {e}"))?);
    }
    if let Some(m) = &text.mode {
        p.mode = Some(m.parse::<LeakyMode>().map_err(|e| format!("mode: {e}"))?);
    }
    let a = kind.build(&p).map_err(|errs| {
        errs.iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join("; ")
    })?;
    // A calendar window keeps its period unless the override gives a window of its own.
    let a = match policy.algorithm.calendar_period() {
        Some(period) if text.window.is_none() => {
            a.on_calendar(period).map_err(|e| e.to_string())?
        }
        _ => a,
    };
    a.validate().map_err(|e| e.to_string())?;
    Ok(a)
}

/// Reads a ban rule.
fn ban_rule(b: &RawBan) -> Result<BanRule, String> {
    if b.after == 0 {
        return Err("after must be at least 1".into());
    }
    let positive = |what: &str, v: &NumberOrText| match v.duration_ms() {
        Ok(0) => Err(format!("{what} must be above 0")),
        Ok(ms) => Ok(ms),
        Err(e) => Err(format!("{what}: {e}")),
    };
    let within_ms = positive("within", &b.within)?;
    let duration_ms = positive("duration", &b.duration)?;
    let multiplier = b.multiplier.unwrap_or(1.0);
    if !multiplier.is_finite() || !(1.0..=1000.0).contains(&multiplier) {
        return Err("multiplier must be between 1 and 1000".into());
    }
    let max_ms = match &b.max {
        None => duration_ms,
        Some(m) => positive("max", m)?,
    };
    if max_ms < duration_ms {
        return Err("max must be at least duration".into());
    }
    Ok(BanRule {
        after: b.after,
        within_ms,
        duration_ms,
        multiplier,
        max_ms,
    })
}

/// Checks `[plans]`, `[lists]` and every policy's `ban` against the checked policies.
pub(super) fn check_control(
    ck: &mut Checker<'_>,
    raw: &RawConfig,
    policies: &BTreeMap<String, PolicyConfig>,
) -> ControlConfig {
    let mut out = ControlConfig {
        limits: limits(ck, &raw.control),
        ..Default::default()
    };
    for (plan, tables) in &raw.plans {
        let plan_name = plan.get_ref();
        if let Err(e) = sluice::core::policy::validate_policy_name(plan_name) {
            ck.at(plan.span(), format!("plans.{plan_name}"), e.to_string());
            continue;
        }
        let mut by_policy = HashMap::new();
        for (policy, text) in tables {
            let field = format!("plans.{plan_name}.{}", policy.get_ref());
            let Some(pc) = policies.get(policy.get_ref()) else {
                ck.at(policy.span(), field, "no such policy in [policies]");
                continue;
            };
            match overlay(&pc.policy, text.get_ref()) {
                Ok(a) => {
                    by_policy.insert(policy.get_ref().clone(), a);
                }
                Err(e) => ck.at(text.span(), field, e),
            }
        }
        out.plans.insert(plan_name.clone(), by_policy);
    }
    for (name, p) in &raw.policies {
        if let Some(b) = &p.get_ref().ban {
            match ban_rule(b.get_ref()) {
                Ok(rule) => {
                    out.bans.insert(name.get_ref().clone(), rule);
                }
                Err(e) => ck.at(b.span(), format!("policies.{}.ban", name.get_ref()), e),
            }
        }
    }
    for (which, list, into) in [
        ("allow", &raw.lists.allow, &mut out.allow),
        ("deny", &raw.lists.deny, &mut out.deny),
    ] {
        for e in list {
            match ListEntry::parse(e.get_ref()) {
                Ok(entry) => into.push(entry),
                Err(msg) => ck.at(e.span(), format!("lists.{which}"), msg),
            }
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use crate::Config;
    use sluice::{Algorithm, ListEntry};

    const BASE: &str = r#"
[policies.api]
algorithm = "fixed-window"
limit = 10
window = "1m"
ban = { after = 3, within = "1m", duration = "10m", multiplier = 2.0, max = "24h" }
"#;

    #[test]
    fn plans_lists_and_bans_are_read() {
        let src = format!(
            "{BASE}\n[plans.gold.api]\nlimit = 100\n[lists]\nallow = [\"10.0.0.0/8\", \"user:ops\"]\ndeny = [\"ip:198.51.100.1\"]\n"
        );
        let c = Config::parse(&src, "t.toml", None).unwrap();
        assert_eq!(
            c.control.plans["gold"]["api"],
            Algorithm::FixedWindow {
                limit: 100,
                window_ms: 60_000
            }
        );
        let ban = &c.control.bans["api"];
        assert_eq!(
            (ban.after, ban.within_ms, ban.duration_ms, ban.max_ms),
            (3, 60_000, 600_000, 86_400_000)
        );
        assert_eq!(ban.duration_at(1), 1_200_000);
        assert_eq!(ban.duration_at(20), 86_400_000, "capped at max");
        assert_eq!(c.control.allow.len(), 2);
        assert_eq!(c.control.limits.max_deny, 2_000_000, "the default");
        let limited = Config::parse(
            &format!("{BASE}\n[control]\nmax_deny = 5\nmax_body_bytes = \"1MiB\"\n"),
            "t.toml",
            None,
        )
        .unwrap();
        assert_eq!(
            (
                limited.control.limits.max_deny,
                limited.control.limits.max_body_bytes
            ),
            (5, 1 << 20)
        );
        assert_eq!(
            c.control.deny,
            vec![ListEntry::parse("198.51.100.1/32").unwrap()]
        );
    }

    #[test]
    fn mistakes_are_reported_with_their_field() {
        for (extra, field, needle) in [
            (
                "[plans.gold.nope]\nlimit = 1\n",
                "plans.gold.nope",
                "no such policy",
            ),
            (
                "[plans.gold.api]\ncapacity = 1\n",
                "plans.gold.api",
                "capacity",
            ),
            (
                "[plans.gold.api]\nlimit = 0\n",
                "plans.gold.api",
                "at least 1",
            ),
            ("[lists]\ndeny = [\"\"]\n", "lists.deny", "1 to 512"),
            (
                "[lists]\ndeny = [\"1.2.3.4/33\"]\n",
                "lists.deny",
                "from 0 to 32",
            ),
            ("[control]\nmax_deny = 0\n", "control.max_deny", ""),
            (
                "[control]\nmax_body_bytes = \"1KiB\"\n",
                "control.max_body_bytes",
                "between",
            ),
        ] {
            let src = format!("{BASE}\n{extra}");
            let e = Config::parse(&src, "t.toml", None).unwrap_err().to_string();
            assert!(e.contains(field) && e.contains(needle), "{extra}: {e}");
        }
        let bad_ban = BASE.replace("max = \"24h\"", "max = \"1m\"");
        let e = Config::parse(&bad_ban, "t.toml", None)
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("policies.api.ban") && e.contains("max must be at least duration"),
            "{e}"
        );
    }
}
