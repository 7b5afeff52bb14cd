//! Injectable time and ids, so lease logic is tested without sleeping.
//!
//! Production code uses [`SystemClock`] and [`RandomIds`]; tests use [`ManualClock`]
//! (time moves only when the test says so) and [`SequentialIds`].

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{SystemTime, UNIX_EPOCH};

/// Wall-clock milliseconds since the Unix epoch.
pub trait Clock: Send + Sync + 'static {
    /// Now, in milliseconds since 1970-01-01T00:00:00Z.
    fn now_ms(&self) -> u64;
}

/// The system's wall clock.
#[derive(Debug, Default, Clone, Copy)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now_ms(&self) -> u64 {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .map(|d| d.as_millis() as u64)
            .unwrap_or(0)
    }
}

/// A clock that only moves when told to. Clones share the same time.
#[derive(Debug, Clone)]
pub struct ManualClock(Arc<AtomicU64>);

impl ManualClock {
    /// A clock set to `start_ms`.
    pub fn new(start_ms: u64) -> Self {
        Self(Arc::new(AtomicU64::new(start_ms)))
    }

    /// Moves time forward by `ms`.
    pub fn advance(&self, ms: u64) {
        self.0.fetch_add(ms, Ordering::SeqCst);
    }

    /// Sets the time.
    pub fn set(&self, ms: u64) {
        self.0.store(ms, Ordering::SeqCst);
    }
}

impl Clock for ManualClock {
    fn now_ms(&self) -> u64 {
        self.0.load(Ordering::SeqCst)
    }
}

/// A source of unique ids (segment names, write ids).
pub trait IdSource: Send + Sync + 'static {
    /// A new id, unique across processes sharing a store. Only `[A-Za-z0-9-]`.
    fn new_id(&self) -> String;
}

/// UUIDv7 ids: unique, and sortable by creation time.
#[derive(Debug, Default, Clone, Copy)]
pub struct RandomIds;

impl IdSource for RandomIds {
    fn new_id(&self) -> String {
        uuid::Uuid::now_v7().simple().to_string()
    }
}

/// Predictable ids `id-000001`, `id-000002`, … for tests.
#[derive(Debug, Default)]
pub struct SequentialIds(AtomicU64);

impl IdSource for SequentialIds {
    fn new_id(&self) -> String {
        format!("id-{:06}", self.0.fetch_add(1, Ordering::SeqCst) + 1)
    }
}
