//! The Lua sources, composed once per process from the pieces in `lua/`.
//!
//! Each algorithm's decision is written once, in its own file (`lua/<algorithm>.lua`). The
//! algorithms whose state is one string (the registry's `step`: token bucket, GCRA, leaky
//! bucket, fixed and calendar windows, sliding counter) write it as a step, `STEP.<code>`:
//! stored value in, decision and new value out, with no Redis command of its own. Their
//! one-key check (`CHECK.<code>`, one GET and one SET around the step), the one-policy batch
//! loop (`lua/batch_step.lua`) and charge and refund (`ADJUST.<code>`, in the same file,
//! through the same state readers such as the token bucket's refill `tb_tokens`) all run
//! that one text. The sliding log and concurrency keep sorted sets and several commands per
//! decision; they write `CHECK.<code>` directly and are not batched per policy. Everything
//! about one algorithm in Lua (state encoding, reader, step, check, charge and refund) is in
//! its file; the entry files only dispatch.
//!
//! A script is `common.lua` (helpers, the server-clock read, the `STEP`/`CHECK` tables) +
//! the algorithm files it needs + its entry file (`check.lua`, `batch.lua`,
//! `batch_step.lua`, `release.lua`, `adjust.lua`) + a `return`. The composed text is what is
//! sent and hashed: every script's SHA is computed from it (`store.rs`), so a changed piece
//! changes every script that holds it. The function library wraps the same pieces for
//! `FUNCTION LOAD` / `FCALL`.
//!
//! Which algorithms exist, their codes and which have a step come from
//! [`sluice_core::algorithm::registry`]; [`algorithm_source`] maps every registry entry to
//! its file (an exhaustive match, so a new algorithm cannot be forgotten here), the scripts
//! holding several algorithms take them from the registry in its order, and tests hold each
//! file to its registry code and step flag.

use std::sync::LazyLock;

use sluice_core::algorithm::AlgorithmKind;

macro_rules! lua {
    ($name:literal) => {
        include_str!(concat!(env!("CARGO_MANIFEST_DIR"), "/lua/", $name))
    };
}

const COMMON: &str = lua!("common.lua");

/// The Lua file implementing `kind` (registering `CHECK.<lua_code>`, and `STEP.<lua_code>`
/// for an algorithm with a step).
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

/// `head`, `common.lua`, the files of `kinds` in registry order, then `tail`.
fn compose(head: &[&str], kinds: impl Iterator<Item = AlgorithmKind>, tail: &[&str]) -> String {
    let mut s = String::new();
    for part in head {
        s.push_str(part);
    }
    s.push_str(COMMON);
    for kind in kinds {
        s.push_str(algorithm_source(kind));
    }
    for part in tail {
        s.push_str(part);
    }
    s
}

fn every_algorithm() -> impl Iterator<Item = AlgorithmKind> {
    AlgorithmKind::ALL.into_iter()
}

const CHECK_ENTRY: [&str; 2] = [lua!("check.lua"), "return check(KEYS, ARGV)\n"];

/// The one-limit check script of each algorithm, in registry order.
static SINGLE: LazyLock<Vec<String>> = LazyLock::new(|| {
    every_algorithm()
        .map(|kind| compose(&[], std::iter::once(kind), &CHECK_ENTRY))
        .collect()
});

/// The one-limit check script of `kind`.
pub(crate) fn single(kind: AlgorithmKind) -> &'static str {
    &SINGLE[kind.index()]
}

/// Every algorithm: multi-limit checks of mixed algorithms.
pub(crate) static MULTI: LazyLock<String> =
    LazyLock::new(|| compose(&[], every_algorithm(), &CHECK_ENTRY));

/// Independent one-limit checks of any algorithms in one call (automatic batching,
/// `src/batch.rs`).
pub(crate) static BATCH: LazyLock<String> = LazyLock::new(|| {
    compose(
        &[],
        every_algorithm(),
        &[lua!("batch.lua"), "return batch(KEYS, ARGV)\n"],
    )
});

/// Checks of one policy of an algorithm with a step in one call: per algorithm (registry
/// order), `lua/batch_step.lua` around that algorithm's step, on a standalone server; `None`
/// for an algorithm without a step.
static BATCH_STEP: LazyLock<Vec<Option<String>>> = LazyLock::new(|| batch_steps(false));
/// The same on one Cluster node: its items' keys in several slots of the node, each read with
/// its own GET, hence the `allow-cross-slot-keys` flag.
static CLUSTER_BATCH_STEP: LazyLock<Vec<Option<String>>> = LazyLock::new(|| batch_steps(true));

fn batch_steps(cluster: bool) -> Vec<Option<String>> {
    let head: &[&str] = if cluster {
        &[
            "#!lua flags=allow-cross-slot-keys\n",
            "local BATCH_PER_KEY_READS = true\n",
        ]
    } else {
        &["local BATCH_PER_KEY_READS = false\n"]
    };
    AlgorithmKind::ALL
        .into_iter()
        .map(|kind| {
            kind.info().step.then(|| {
                let entry = format!("return batch_step(STEP.{}, KEYS, ARGV)\n", kind.lua_code());
                compose(
                    head,
                    std::iter::once(kind),
                    &[lua!("batch_step.lua"), &entry],
                )
            })
        })
        .collect()
}

/// The one-policy batch script of `kind` (`cluster`: its Cluster form), if `kind` has a step.
pub(crate) fn batch_step(kind: AlgorithmKind, cluster: bool) -> Option<&'static str> {
    let all = if cluster {
        &*CLUSTER_BATCH_STEP
    } else {
        &*BATCH_STEP
    };
    all[kind.index()].as_deref()
}

/// The one-policy batch scripts as one function library per form (standalone, Cluster), for
/// `FUNCTION LOAD` + `FCALL`: the same text as [`batch_step`]'s scripts, loaded once, so a call
/// skips what `EVALSHA` pays on every call (running the composed text again, defining every
/// helper before the loop starts: ~35k instructions per call on Redis 7.0, 8% of a decision
/// at 11 items per call; callgrind, `docs/benchmarks.md`, "Round 4").
///
/// A function is called by name, not by the hash of its text as a script is, so the names
/// carry a hash of the library's body: two sluice versions sharing a server each call their
/// own code, and neither replaces the other's library.
pub(crate) struct BatchLibrary {
    /// `#!lua name=sluice_batch_<tag>` and the body.
    pub(crate) src: String,
    /// The function of each algorithm with a step (registry index), `None` for the others.
    functions: Vec<Option<String>>,
}

impl BatchLibrary {
    fn new(cluster: bool) -> Self {
        let head: &[&str] = if cluster {
            &["local BATCH_PER_KEY_READS = true\n"]
        } else {
            &["local BATCH_PER_KEY_READS = false\n"]
        };
        let steps = || AlgorithmKind::ALL.into_iter().filter(|k| k.info().step);
        let body = compose(head, steps(), &[lua!("batch_step.lua")]);
        let hash = redis::Script::new(&body).get_hash().to_string();
        let tag = &hash[..12];
        let flags = if cluster {
            ", flags = { 'allow-cross-slot-keys' }"
        } else {
            ""
        };
        let mut src = format!("#!lua name=sluice_batch_{tag}\n{body}");
        let mut functions = vec![None; AlgorithmKind::ALL.len()];
        for kind in steps() {
            let code = kind.lua_code();
            let name = format!("sluice_batch_{code}_{tag}");
            src.push_str(&format!(
                "redis.register_function{{ function_name = '{name}', callback = function(keys, \
                 argv) return batch_step(STEP.{code}, keys, argv) end{flags} }}\n"
            ));
            functions[kind.index()] = Some(name);
        }
        Self { src, functions }
    }

    /// The function deciding one-policy batches of `kind`, if `kind` has a step.
    pub(crate) fn function(&self, kind: AlgorithmKind) -> Option<&str> {
        self.functions[kind.index()].as_deref()
    }
}

static BATCH_LIBRARIES: LazyLock<[BatchLibrary; 2]> =
    LazyLock::new(|| [BatchLibrary::new(false), BatchLibrary::new(true)]);

/// The batch function library of a standalone server or (`cluster`) of a Cluster node.
pub(crate) fn batch_library(cluster: bool) -> &'static BatchLibrary {
    &BATCH_LIBRARIES[usize::from(cluster)]
}

/// Releases a concurrency lease.
pub(crate) static RELEASE: LazyLock<String> = LazyLock::new(|| {
    let mut s = String::from(COMMON);
    s.push_str(lua!("release.lua"));
    s.push_str("return release(KEYS, ARGV)\n");
    s
});

/// Charges or refunds one key without a check (`lua/adjust.lua`).
pub(crate) static ADJUST: LazyLock<String> = LazyLock::new(|| {
    compose(
        &[],
        every_algorithm(),
        &[lua!("adjust.lua"), "return adjust(KEYS, ARGV)\n"],
    )
});

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
static FUNCTION_LIBRARY: LazyLock<String> = LazyLock::new(|| {
    compose(
        &["#!lua name=sluice\n"],
        every_algorithm(),
        &[
            lua!("check.lua"),
            lua!("release.lua"),
            lua!("adjust.lua"),
            "redis.register_function('sluice_check_v1', check)\n",
            "redis.register_function('sluice_release_v1', release)\n",
            "redis.register_function('sluice_adjust_v1', adjust)\n",
        ],
    )
});

/// Every script as `(name, Lua source)`: one per algorithm of the registry (under its name),
/// the multi-limit script, the release and adjust scripts and the batch scripts (for
/// `sluice scripts`).
pub fn scripts() -> Vec<(&'static str, &'static str)> {
    AlgorithmKind::ALL
        .into_iter()
        .map(|kind| (kind.name(), single(kind)))
        .chain([
            ("multi", MULTI.as_str()),
            ("release", RELEASE.as_str()),
            ("adjust", ADJUST.as_str()),
            ("batch", BATCH.as_str()),
        ])
        .chain(
            AlgorithmKind::ALL
                .into_iter()
                .filter_map(|kind| Some((batch_name(kind)?, batch_step(kind, false)?))),
        )
        .collect()
}

/// `batch-<algorithm>`, the name `sluice scripts` shows a one-policy batch script under.
fn batch_name(kind: AlgorithmKind) -> Option<&'static str> {
    static NAMES: LazyLock<Vec<String>> = LazyLock::new(|| {
        AlgorithmKind::ALL
            .iter()
            .map(|k| format!("batch-{}", k.name()))
            .collect()
    });
    kind.info().step.then(|| NAMES[kind.index()].as_str())
}

/// The function library source (`FUNCTION LOAD REPLACE`), for `sluice scripts`.
pub fn function_library() -> &'static str {
    FUNCTION_LIBRARY.as_str()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The codes `src` registers in `table` (`CHECK` or `STEP`), in order.
    fn registered<'a>(src: &'a str, table: &str) -> Vec<&'a str> {
        let prefix = format!("{table}.");
        src.lines()
            .filter_map(|l| l.strip_prefix(prefix.as_str()))
            .filter_map(|l| l.split_once(" = "))
            .map(|(code, _)| code)
            .collect()
    }

    #[test]
    fn each_algorithm_file_registers_its_registry_code_and_step() {
        for kind in AlgorithmKind::ALL {
            let src = algorithm_source(kind);
            assert_eq!(registered(src, "CHECK"), [kind.lua_code()], "{kind}");
            let steps: &[&str] = if kind.info().step {
                &[kind.lua_code()]
            } else {
                &[]
            };
            assert_eq!(registered(src, "STEP"), steps, "{kind}");
            // Charge and refund too, for every algorithm without leases.
            let adjusts: &[&str] = if kind.info().leases {
                &[]
            } else {
                &[kind.lua_code()]
            };
            assert_eq!(registered(src, "ADJUST"), adjusts, "{kind}");
            let script = single(kind);
            assert!(script.contains(src), "{kind}");
            assert_eq!(registered(script, "CHECK"), [kind.lua_code()], "{kind}");
        }
    }

    #[test]
    fn combined_scripts_hold_every_algorithm_once() {
        let every: Vec<&str> = AlgorithmKind::ALL.iter().map(|k| k.lua_code()).collect();
        for src in [
            MULTI.as_str(),
            BATCH.as_str(),
            ADJUST.as_str(),
            function_library(),
        ] {
            assert_eq!(registered(src, "CHECK"), every);
        }
        let steps: Vec<&str> = AlgorithmKind::ALL
            .into_iter()
            .filter(|k| k.info().step)
            .map(|k| k.lua_code())
            .collect();
        assert_eq!(steps, ["tb", "gcra", "lb", "fw", "swc"]);
        for kind in AlgorithmKind::ALL {
            for cluster in [false, true] {
                let Some(src) = batch_step(kind, cluster) else {
                    assert!(!kind.info().step, "{kind}");
                    continue;
                };
                assert_eq!(registered(src, "STEP"), [kind.lua_code()]);
                let entry = format!("return batch_step(STEP.{}, KEYS, ARGV)\n", kind.lua_code());
                assert!(src.ends_with(&entry), "{kind}");
                assert_eq!(
                    src.starts_with("#!lua flags=allow-cross-slot-keys\n"),
                    cluster
                );
            }
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
                "adjust",
                "batch",
                "batch-token-bucket",
                "batch-gcra",
                "batch-leaky-bucket",
                "batch-fixed-window",
                "batch-sliding-counter"
            ]
        );
    }

    #[test]
    fn batch_libraries_hold_every_step_under_a_name_tagged_with_their_body() {
        let (standalone, cluster) = (batch_library(false), batch_library(true));
        assert_ne!(standalone.src, cluster.src);
        for lib in [standalone, cluster] {
            let tag = lib
                .src
                .lines()
                .next()
                .and_then(|l| l.strip_prefix("#!lua name=sluice_batch_"))
                .expect("library name");
            assert_eq!(tag.len(), 12);
            assert!(lib.src.contains(lua!("batch_step.lua")));
            for kind in AlgorithmKind::ALL {
                match lib.function(kind) {
                    Some(name) => {
                        assert!(kind.info().step, "{kind}");
                        assert_eq!(name, format!("sluice_batch_{}_{tag}", kind.lua_code()));
                        assert!(lib.src.contains(&format!("'{name}'")));
                    }
                    None => assert!(!kind.info().step, "{kind}"),
                }
            }
            assert_eq!(
                registered(&lib.src, "STEP"),
                ["tb", "gcra", "lb", "fw", "swc"]
            );
        }
        assert!(cluster.src.contains("flags = { 'allow-cross-slot-keys' }"));
        assert!(!standalone.src.contains("allow-cross-slot-keys"));
    }

    /// The token bucket's refill, GCRA's TAT and the windows' readers are each defined once
    /// in the Lua sources, however many scripts run them.
    #[test]
    fn each_formula_is_defined_once() {
        let every: String = AlgorithmKind::ALL
            .into_iter()
            .map(algorithm_source)
            .chain([
                COMMON,
                lua!("check.lua"),
                lua!("batch.lua"),
                lua!("batch_step.lua"),
                lua!("adjust.lua"),
                lua!("release.lua"),
            ])
            .collect();
        for reader in [
            "tb_tokens",
            "gcra_tat",
            "lb_level",
            "fw_window",
            "swc_window",
        ] {
            let defined = format!("local function {reader}(");
            assert_eq!(every.matches(defined.as_str()).count(), 1, "{reader}");
        }
        // The refill itself: `t + elapsed * r` appears in tb_tokens alone.
        assert_eq!(
            every.matches("elapsed * r").count(),
            2,
            "tb refill and lb drain"
        );
    }
}
