//! The integration tests of the `sluice` facade, as one test binary: each module was once its
//! own file under `tests/` (and so its own binary that linked tokio and the stores again);
//! here they build once. It needs both store features (`memory`, `redis`, the defaults).
//!
//! All tests share one process and run on parallel threads; each builds its own limiters and
//! starts its own servers. One module: `cargo test -p sluice --test suite -- leased_redis::`.

mod control_cost;
mod control_scale;
mod control_shared_store;
mod deny_cache;
mod lease_compensation;
mod leased_property;
mod leased_redis;
mod local_fallback;
mod overload;
mod reservation;
mod state_ops;
mod store_options;
