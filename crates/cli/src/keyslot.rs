//! `sluice keyslot`: which Redis Cluster slot a key (or an identity's key) lands in.

use clap::Args;
use sluice_core::key::key_slot;
use sluice_core::{Identity, KeyScheme};

/// Arguments of `sluice keyslot`.
#[derive(Debug, Clone, Args)]
pub struct KeyslotArgs {
    /// Keys whose slot to print.
    pub keys: Vec<String>,
    /// Build the key sluice uses for this identity (with --policy).
    #[arg(long, requires = "policy")]
    pub identity: Option<String>,
    /// The policy name for --identity.
    #[arg(long)]
    pub policy: Option<String>,
    /// Key prefix.
    #[arg(long, default_value = "rl")]
    pub prefix: String,
}

/// The lines `sluice keyslot` prints: `<slot> <key>`.
pub fn run(args: &KeyslotArgs) -> Result<Vec<String>, String> {
    let mut keys = args.keys.clone();
    if let (Some(id), Some(p)) = (&args.identity, &args.policy) {
        sluice_core::policy::validate_policy_name(p).map_err(|e| e.to_string())?;
        keys.push(KeyScheme::with_prefix(args.prefix.clone()).key(&Identity::new(id.clone()), p));
    }
    if keys.is_empty() {
        return Err("give one or more keys, or --identity ID --policy NAME".into());
    }
    Ok(keys
        .iter()
        .map(|k| format!("{} {k}", key_slot(k.as_bytes())))
        .collect())
}
