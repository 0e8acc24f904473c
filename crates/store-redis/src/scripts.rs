//! The Lua sources, assembled at compile time from the files in `lua/`.
//!
//! Each algorithm's logic lives in exactly one file; a script is `common.lua` (helpers, the
//! server-clock read and the per-item call) + the algorithm files it needs + `check.lua` + a
//! `return`. The multi script (every algorithm) serves multi-limit checks, each
//! single-algorithm script the common one-limit check, and the function library wraps the same
//! text for `FUNCTION LOAD` / `FCALL`.
//!
//! Which algorithms exist, their names and the codes the Lua files register them under come
//! from [`sluice_core::algorithm::registry`]: [`algorithm_source`] and [`single`] map every
//! registry entry to its file and script (an exhaustive match, so a new algorithm cannot be
//! forgotten here), and a test holds each file to its registry code.

use sluice_core::algorithm::AlgorithmKind;

macro_rules! lua {
    ($name:literal) => {
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $name))
    };
}

macro_rules! check_script {
    ($($alg:literal),+) => {
        concat!(lua!("common.lua"), $(lua!($alg),)+ lua!("check.lua"), "return check(KEYS, ARGV)\n")
    };
}

/// Token bucket only.
pub(crate) const TOKEN_BUCKET: &str = check_script!("token_bucket.lua");
/// GCRA only.
pub(crate) const GCRA: &str = check_script!("gcra.lua");
/// Leaky bucket only.
pub(crate) const LEAKY_BUCKET: &str = check_script!("leaky_bucket.lua");
/// Fixed window only.
pub(crate) const FIXED_WINDOW: &str = check_script!("fixed_window.lua");
/// Sliding window counter only.
pub(crate) const SLIDING_WINDOW_COUNTER: &str = check_script!("sliding_window_counter.lua");
/// Sliding window log only.
pub(crate) const SLIDING_WINDOW_LOG: &str = check_script!("sliding_window_log.lua");
/// Concurrency only.
pub(crate) const CONCURRENCY: &str = check_script!("concurrency.lua");
/// Every algorithm file, in registry order (the one list of them; [`algorithm_source`] names
/// the same files per algorithm).
macro_rules! every_algorithm {
    () => {
        concat!(
            lua!("token_bucket.lua"),
            lua!("gcra.lua"),
            lua!("leaky_bucket.lua"),
            lua!("fixed_window.lua"),
            lua!("sliding_window_counter.lua"),
            lua!("sliding_window_log.lua"),
            lua!("concurrency.lua"),
        )
    };
}

/// Every algorithm: multi-limit checks of mixed algorithms.
pub(crate) const MULTI: &str = concat!(
    lua!("common.lua"),
    every_algorithm!(),
    lua!("check.lua"),
    "return check(KEYS, ARGV)\n"
);
/// Independent one-limit checks in one call (automatic batching, `src/batch.rs`).
pub(crate) const BATCH: &str = concat!(
    lua!("common.lua"),
    every_algorithm!(),
    lua!("batch.lua"),
    "return batch(KEYS, ARGV)\n"
);

/// A one-policy batch script (`lua/batch_common.lua` + the algorithm's batch file): `cluster`
/// builds the form a Cluster node runs (its items' keys in several slots of the node, each
/// read with its own GET, hence the `allow-cross-slot-keys` flag).
macro_rules! one_policy_batch {
    ($file:literal, $entry:literal, standalone) => {
        concat!(
            "local BATCH_PER_KEY_READS = false\n",
            lua!("common.lua"),
            lua!("batch_common.lua"),
            lua!($file),
            "return ",
            $entry,
            "(KEYS, ARGV)\n"
        )
    };
    ($file:literal, $entry:literal, cluster) => {
        concat!(
            "#!lua flags=allow-cross-slot-keys\n",
            "local BATCH_PER_KEY_READS = true\n",
            lua!("common.lua"),
            lua!("batch_common.lua"),
            lua!($file),
            "return ",
            $entry,
            "(KEYS, ARGV)\n"
        )
    };
}

/// Checks of one policy in one call, standalone: token bucket, GCRA, fixed window, leaky
/// bucket (the order of `BatchScript`'s one-policy variants).
pub(crate) const BATCHES: [&str; 4] = [
    one_policy_batch!("batch_token_bucket.lua", "batch_token_bucket", standalone),
    one_policy_batch!("batch_gcra.lua", "batch_gcra", standalone),
    one_policy_batch!("batch_fixed_window.lua", "batch_fixed_window", standalone),
    one_policy_batch!("batch_leaky_bucket.lua", "batch_leaky_bucket", standalone),
];
/// The same on one Cluster node.
pub(crate) const CLUSTER_BATCHES: [&str; 4] = [
    one_policy_batch!("batch_token_bucket.lua", "batch_token_bucket", cluster),
    one_policy_batch!("batch_gcra.lua", "batch_gcra", cluster),
    one_policy_batch!("batch_fixed_window.lua", "batch_fixed_window", cluster),
    one_policy_batch!("batch_leaky_bucket.lua", "batch_leaky_bucket", cluster),
];

/// The Lua file implementing `kind` (registering `CHECK.<lua_code>`).
pub fn algorithm_source(kind: AlgorithmKind) -> &'static str {
    match kind {
        AlgorithmKind::TokenBucket => lua!("token_bucket.lua"),
        AlgorithmKind::Gcra => lua!("gcra.lua"),
        AlgorithmKind::LeakyBucket => lua!("leaky_bucket.lua"),
        AlgorithmKind::FixedWindow => lua!("fixed_window.lua"),
        AlgorithmKind::SlidingWindowCounter => lua!("sliding_window_counter.lua"),
        AlgorithmKind::SlidingWindowLog => lua!("sliding_window_log.lua"),
        AlgorithmKind::Concurrency => lua!("concurrency.lua"),
    }
}

/// The one-limit check script of `kind`.
pub(crate) fn single(kind: AlgorithmKind) -> &'static str {
    match kind {
        AlgorithmKind::TokenBucket => TOKEN_BUCKET,
        AlgorithmKind::Gcra => GCRA,
        AlgorithmKind::LeakyBucket => LEAKY_BUCKET,
        AlgorithmKind::FixedWindow => FIXED_WINDOW,
        AlgorithmKind::SlidingWindowCounter => SLIDING_WINDOW_COUNTER,
        AlgorithmKind::SlidingWindowLog => SLIDING_WINDOW_LOG,
        AlgorithmKind::Concurrency => CONCURRENCY,
    }
}
/// Releases a concurrency lease.
pub(crate) const RELEASE: &str = concat!(
    lua!("common.lua"),
    lua!("release.lua"),
    "return release(KEYS, ARGV)\n"
);

/// Charges or refunds one key without a check (`lua/adjust.lua`).
pub(crate) const ADJUST: &str = concat!(
    lua!("common.lua"),
    every_algorithm!(),
    lua!("adjust.lua"),
    "return adjust(KEYS, ARGV)\n"
);

/// The name of the function library.
pub const LIBRARY_NAME: &str = "sluice";
/// The library version, part of the function names so that a new release and an old one can
/// share a server while both run (`FUNCTION LOAD REPLACE` of one library keeps both names only
/// if both are in it; versioned names make the intent explicit).
pub(crate) const FN_CHECK: &str = "sluice_check_v1";
pub(crate) const FN_RELEASE: &str = "sluice_release_v1";
pub(crate) const FN_ADJUST: &str = "sluice_adjust_v1";

/// The function library: the same code registered as `sluice_check_v1`, `sluice_release_v1`
/// and `sluice_adjust_v1`.
pub const FUNCTION_LIBRARY: &str = concat!(
    "#!lua name=sluice\n",
    lua!("common.lua"),
    every_algorithm!(),
    lua!("check.lua"),
    lua!("release.lua"),
    lua!("adjust.lua"),
    "redis.register_function('sluice_check_v1', check)\n",
    "redis.register_function('sluice_release_v1', release)\n",
    "redis.register_function('sluice_adjust_v1', adjust)\n",
);

/// Every script as `(name, Lua source)`: one per algorithm of the registry (under its name),
/// the multi-limit script and the release script (for `sluice scripts`).
pub fn scripts() -> Vec<(&'static str, &'static str)> {
    AlgorithmKind::ALL
        .into_iter()
        .map(|kind| (kind.name(), single(kind)))
        .chain([("multi", MULTI), ("release", RELEASE), ("adjust", ADJUST)])
        .collect()
}

/// The function library source (`FUNCTION LOAD REPLACE`), for `sluice scripts`.
pub fn function_library() -> &'static str {
    FUNCTION_LIBRARY
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The `CHECK.<code> = function` registrations in `src`.
    fn registered_codes(src: &str) -> Vec<&str> {
        src.lines()
            .filter_map(|l| l.strip_prefix("CHECK."))
            .filter_map(|l| l.split_once(" = function"))
            .map(|(code, _)| code)
            .collect()
    }

    #[test]
    fn each_algorithm_file_registers_its_registry_code() {
        for kind in AlgorithmKind::ALL {
            assert_eq!(
                registered_codes(algorithm_source(kind)),
                [kind.lua_code()],
                "{kind}"
            );
            let script = single(kind);
            assert!(script.contains(algorithm_source(kind)), "{kind}");
            assert_eq!(registered_codes(script), [kind.lua_code()], "{kind}");
        }
    }

    #[test]
    fn combined_scripts_hold_every_algorithm_once() {
        let every: Vec<&str> = AlgorithmKind::ALL.iter().map(|k| k.lua_code()).collect();
        for src in [MULTI, BATCH, FUNCTION_LIBRARY] {
            assert_eq!(registered_codes(src), every);
        }
        let names: Vec<&str> = scripts().iter().map(|(n, _)| *n).collect();
        assert_eq!(
            names,
            [
                "token-bucket",
                "gcra",
                "leaky-bucket",
                "fixed-window",
                "sliding-counter",
                "sliding-log",
                "concurrency",
                "multi",
                "release",
                "adjust"
            ]
        );
    }
}
