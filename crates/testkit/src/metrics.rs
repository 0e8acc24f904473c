//! A `metrics` recorder for unit tests that checks which metric keys a code path emits.
//!
//! The hot paths spell their metric labels out as literals so the keys stay static (no
//! allocation per call); a test proves each literal arm produces the key it claims by running
//! the code under [`metrics::with_local_recorder`] with a [`KeyLog`] and comparing the log.
//! One recorder serves every crate's such tests, so the `Recorder` boilerplate lives here once.

use std::sync::Mutex;

use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};

/// Notes `name{label=value,...}` of every counter, gauge and histogram registered through
/// it, in order; the handles it returns record nothing.
#[derive(Debug, Default)]
pub struct KeyLog(Mutex<Vec<String>>);

impl KeyLog {
    /// The keys registered so far, oldest first.
    pub fn keys(&self) -> Vec<String> {
        self.0.lock().unwrap().clone()
    }

    fn note(&self, key: &Key) {
        let labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        self.0
            .lock()
            .unwrap()
            .push(format!("{}{{{}}}", key.name(), labels.join(",")));
    }
}

impl Recorder for KeyLog {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        self.note(key);
        Counter::noop()
    }
    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        self.note(key);
        Gauge::noop()
    }
    fn register_histogram(&self, key: &Key, _: &Metadata<'_>) -> Histogram {
        self.note(key);
        Histogram::noop()
    }
}
