//! The Lua sources, assembled at compile time from the files in `lua/`.
//!
//! Each algorithm's logic lives in exactly one file; a script is `common.lua` + the algorithm
//! files it needs + `check.lua` + a `return`. The multi script (every algorithm) serves
//! multi-limit checks, each single-algorithm script the common one-limit check, and the
//! function library wraps the same text for `FUNCTION LOAD` / `FCALL`.

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
/// Every algorithm: multi-limit checks of mixed algorithms.
pub(crate) const MULTI: &str = check_script!(
    "token_bucket.lua",
    "gcra.lua",
    "leaky_bucket.lua",
    "fixed_window.lua",
    "sliding_window_counter.lua",
    "sliding_window_log.lua",
    "concurrency.lua"
);
/// Independent one-limit checks in one call (automatic batching, `src/batch.rs`).
pub(crate) const BATCH: &str = concat!(
    lua!("common.lua"),
    lua!("token_bucket.lua"),
    lua!("gcra.lua"),
    lua!("leaky_bucket.lua"),
    lua!("fixed_window.lua"),
    lua!("sliding_window_counter.lua"),
    lua!("sliding_window_log.lua"),
    lua!("concurrency.lua"),
    lua!("batch.lua"),
    "return batch(KEYS, ARGV)\n"
);
/// Releases a concurrency lease.
pub(crate) const RELEASE: &str = concat!(
    lua!("common.lua"),
    lua!("release.lua"),
    "return release(KEYS, ARGV)\n"
);

/// The name of the function library.
pub const LIBRARY_NAME: &str = "sluice";
/// The library version, part of the function names so that a new release and an old one can
/// share a server while both run (`FUNCTION LOAD REPLACE` of one library keeps both names only
/// if both are in it; versioned names make the intent explicit).
pub(crate) const FN_CHECK: &str = "sluice_check_v1";
pub(crate) const FN_RELEASE: &str = "sluice_release_v1";

/// The function library: the same code registered as `sluice_check_v1` and `sluice_release_v1`.
pub const FUNCTION_LIBRARY: &str = concat!(
    "#!lua name=sluice\n",
    lua!("common.lua"),
    lua!("token_bucket.lua"),
    lua!("gcra.lua"),
    lua!("leaky_bucket.lua"),
    lua!("fixed_window.lua"),
    lua!("sliding_window_counter.lua"),
    lua!("sliding_window_log.lua"),
    lua!("concurrency.lua"),
    lua!("check.lua"),
    lua!("release.lua"),
    "redis.register_function('sluice_check_v1', check)\n",
    "redis.register_function('sluice_release_v1', release)\n",
);

/// Every script as `(name, Lua source)`: one per algorithm, the multi-limit script and the
/// release script (for `sluice scripts`).
pub fn scripts() -> Vec<(&'static str, &'static str)> {
    vec![
        ("token-bucket", TOKEN_BUCKET),
        ("gcra", GCRA),
        ("leaky-bucket", LEAKY_BUCKET),
        ("fixed-window", FIXED_WINDOW),
        ("sliding-counter", SLIDING_WINDOW_COUNTER),
        ("sliding-log", SLIDING_WINDOW_LOG),
        ("concurrency", CONCURRENCY),
        ("multi", MULTI),
        ("release", RELEASE),
    ]
}

/// The function library source (`FUNCTION LOAD REPLACE`), for `sluice scripts`.
pub fn function_library() -> &'static str {
    FUNCTION_LIBRARY
}
