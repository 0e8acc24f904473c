//! Encoding of check items as script arguments, and decoding of the script's reply.
//! The contract is written on top of `lua/check.lua`.

use sluice_core::{Algorithm, CheckItem, Decision, DenyReason, LeaseId, MultiDecision, StoreError};

/// Integers per item in the reply.
pub(crate) const ROW: usize = 7;

/// Appends the 7 arguments of one item: code, cost, p1..p4 ([`Algorithm::store_params`]),
/// token.
pub(crate) fn push_item_args(
    args: &mut Vec<String>,
    algorithm: &Algorithm,
    cost: u64,
    token: &str,
) {
    // The code the Lua files register the algorithm under (`CHECK.<code>`).
    let code = algorithm.algorithm_kind().lua_code();
    args.push(code.to_string());
    args.push(cost.to_string());
    args.extend(algorithm.store_params().iter().map(u64::to_string));
    args.push(token.to_string());
}

/// Whether an item stores a unique token (a log entry or a lease) when admitted.
pub(crate) fn needs_token(algorithm: &Algorithm, cost: u64) -> bool {
    algorithm.stores_member(cost)
}

/// The member a log entry or lease is stored under: `<id>` for cost 1, `<id>#<cost>` above, so
/// the scripts can sum costs from the members alone.
pub(crate) fn token_for(id: &str, cost: u64) -> String {
    if cost > 1 {
        format!("{id}#{cost}")
    } else {
        id.to_string()
    }
}

/// Decodes the reply of a check of `items`; `tokens[i]` is the lease id sent for item i.
pub(crate) fn decode(
    items: &[CheckItem<'_>],
    tokens: &[String],
    reply: &[i64],
) -> Result<MultiDecision, StoreError> {
    if reply.len() != items.len() * ROW {
        return Err(StoreError::Backend(format!(
            "script returned {} integers for {} items",
            reply.len(),
            items.len()
        )));
    }
    let mut decisions = Vec::with_capacity(items.len());
    for (i, item) in items.iter().enumerate() {
        let r = &reply[i * ROW..(i + 1) * ROW];
        let u = |v: i64| v.max(0) as u64;
        let reason = match r[6] {
            0 => None,
            1 => Some(DenyReason::Limited),
            2 => Some(DenyReason::CostExceedsLimit),
            3 => Some(DenyReason::OtherLimitDenied),
            other => return Err(StoreError::Backend(format!("unknown reason code {other}"))),
        };
        let allowed = r[0] == 1;
        let lease =
            (allowed && item.algorithm.takes_lease(item.cost)).then(|| LeaseId(tokens[i].clone()));
        decisions.push(Decision {
            allowed,
            limit: u(r[1]),
            remaining: u(r[2]),
            retry_after_ms: u(r[3]),
            reset_after_ms: u(r[4]),
            delay_ms: u(r[5]),
            reason,
            lease,
        });
    }
    let allowed = decisions.iter().all(|d| d.allowed);
    Ok(MultiDecision { allowed, decisions })
}
