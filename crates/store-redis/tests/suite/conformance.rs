//! The store conformance suite of `sluice-testkit`, unchanged, on Redis 7, Valkey 9.1 and a
//! 6-node Redis Cluster (scripts via EVALSHA), and on Redis in Functions mode.

use crate::support;

use sluice_core::{ManualClock, Store};
use sluice_redis::ScriptMode;
use std::sync::Arc;
use support::{Kind, manual_store};

async fn on_redis(clock: ManualClock) -> Arc<dyn Store> {
    Arc::new(manual_store(Kind::Redis, &clock, ScriptMode::Eval).await)
}
async fn on_valkey(clock: ManualClock) -> Arc<dyn Store> {
    Arc::new(manual_store(Kind::Valkey, &clock, ScriptMode::Eval).await)
}
async fn on_cluster(clock: ManualClock) -> Arc<dyn Store> {
    Arc::new(manual_store(Kind::Cluster, &clock, ScriptMode::Eval).await)
}
async fn on_redis_functions(clock: ManualClock) -> Arc<dyn Store> {
    Arc::new(manual_store(Kind::Redis, &clock, ScriptMode::Functions).await)
}

mod redis7 {
    sluice_testkit::store_conformance_tests!(super::on_redis);
}
mod valkey9 {
    sluice_testkit::store_conformance_tests!(super::on_valkey);
}
mod cluster {
    sluice_testkit::store_conformance_tests!(super::on_cluster);
}
mod redis7_functions {
    sluice_testkit::store_conformance_tests!(super::on_redis_functions);
}
