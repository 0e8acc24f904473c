//! The backend-generic store conformance suite (`sluice_testkit::conformance`), run against the
//! embedded store.

use std::sync::Arc;

use sluice_core::{ManualClock, Store};
use sluice_memory::MemoryStore;

async fn memory_store(clock: ManualClock) -> Arc<dyn Store> {
    Arc::new(MemoryStore::with_clock(Arc::new(clock)))
}

sluice_testkit::store_conformance_tests!(memory_store);
