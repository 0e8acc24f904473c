//! Which Cluster node serves each slot, for the batcher: it puts the checks of one node (and
//! one policy) into one call. The client (redis-rs) keeps its own slot map for routing, but
//! does not share it; this one is read with `CLUSTER SLOTS` at connect and again whenever a
//! batch finds it out of date (a node refused a key of a slot it no longer serves). A stale
//! map costs speed only: the refused part is decided again one item per call.

use super::connection::Conn;
use crate::batch::NodeMap;
use redis::Value;
use sluice_core::key::key_slot;
use std::collections::HashMap;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};

const SLOTS: usize = 16_384;

/// Slot -> node index, fetched from the Cluster.
pub(crate) struct ClusterNodes {
    conn: Conn,
    slots: RwLock<Arc<Vec<u32>>>,
    fetching: AtomicBool,
}

/// `u32::MAX`: no node known for the slot.
const UNKNOWN: u32 = u32::MAX;

impl ClusterNodes {
    /// A map of `conn`'s Cluster, fetched now (empty if the fetch fails: every key is then
    /// of an unknown node, and batches still work through the refusal fallback).
    pub(crate) async fn fetch(conn: Conn) -> Arc<Self> {
        let this = Arc::new(Self {
            conn,
            slots: RwLock::new(Arc::new(vec![UNKNOWN; SLOTS])),
            fetching: AtomicBool::new(false),
        });
        this.refresh().await;
        this
    }

    async fn refresh(&self) {
        let mut cmd = redis::cmd("CLUSTER");
        cmd.arg("SLOTS");
        let Ok(reply) = self.conn.query(&cmd).await else {
            return;
        };
        if let Some(map) = parse_cluster_slots(&reply) {
            *self
                .slots
                .write()
                .unwrap_or_else(std::sync::PoisonError::into_inner) = Arc::new(map);
        }
    }
}

impl NodeMap for Arc<ClusterNodes> {
    fn node(&self, key: &str) -> Option<u32> {
        let slots = self
            .slots
            .read()
            .unwrap_or_else(std::sync::PoisonError::into_inner);
        let n = slots[usize::from(key_slot(key.as_bytes())) % SLOTS];
        (n != UNKNOWN).then_some(n)
    }

    fn stale(&self) {
        if self.fetching.swap(true, Ordering::AcqRel) {
            return;
        }
        let this = Arc::clone(self);
        tokio::spawn(async move {
            this.refresh().await;
            this.fetching.store(false, Ordering::Release);
        });
    }
}

/// The slot -> node index table of a `CLUSTER SLOTS` reply (`[start, end, [host, port,
/// ...], replicas...]` per range), nodes numbered by master address.
pub(crate) fn parse_cluster_slots(reply: &Value) -> Option<Vec<u32>> {
    let Value::Array(ranges) = reply else {
        return None;
    };
    let mut map = vec![UNKNOWN; SLOTS];
    let mut nodes: HashMap<(Vec<u8>, i64), u32> = HashMap::new();
    for range in ranges {
        let Value::Array(r) = range else {
            return None;
        };
        let (Some(Value::Int(start)), Some(Value::Int(end)), Some(Value::Array(master))) =
            (r.first(), r.get(1), r.get(2))
        else {
            return None;
        };
        let host = match master.first() {
            Some(Value::BulkString(h)) => h.clone(),
            Some(Value::SimpleString(h)) => h.clone().into_bytes(),
            _ => return None,
        };
        let Some(Value::Int(port)) = master.get(1) else {
            return None;
        };
        let next = nodes.len() as u32;
        let id = *nodes.entry((host, *port)).or_insert(next);
        let (start, end) = (usize::try_from(*start).ok()?, usize::try_from(*end).ok()?);
        for slot in map.iter_mut().take(end.min(SLOTS - 1) + 1).skip(start) {
            *slot = id;
        }
    }
    Some(map)
}
