//! A [`Store`] decorator that counts every request by operation and outcome.
//!
//! Used by the benchmark to report storage requests per message, and by anything that
//! wants to export them as metrics. Counting is lock-free and adds no storage calls.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use super::{DynStore, ETag, Fetched, Listed, Object, Store, StoreError, StoreResult};

/// Operations, in the order [`Counts`] reports them.
pub const OPS: [&str; 5] = ["get", "put_if_absent", "put_if_match", "delete", "list"];
/// Outcomes, in the order [`Counts`] reports them.
pub const OUTCOMES: [&str; 5] = ["ok", "conflict", "not_found", "unavailable", "error"];

/// Request counts: `counts[op][outcome]` with indices into [`OPS`] and [`OUTCOMES`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts(pub [[u64; 5]; 5]);

impl Counts {
    /// Requests of one operation, any outcome.
    pub fn op(&self, op: &str) -> u64 {
        OPS.iter()
            .position(|o| *o == op)
            .map_or(0, |i| self.0[i].iter().sum())
    }

    /// Requests of one operation with one outcome.
    pub fn of(&self, op: &str, outcome: &str) -> u64 {
        match (
            OPS.iter().position(|o| *o == op),
            OUTCOMES.iter().position(|o| *o == outcome),
        ) {
            (Some(i), Some(j)) => self.0[i][j],
            _ => 0,
        }
    }

    /// PUT requests (both conditional kinds), any outcome: what S3 bills as PUTs.
    pub fn puts(&self) -> u64 {
        self.op("put_if_absent") + self.op("put_if_match")
    }

    /// Conditional PUTs that lost (412/409): billed, but wasted.
    pub fn failed_puts(&self) -> u64 {
        self.of("put_if_absent", "conflict")
            + self.of("put_if_match", "conflict")
            + self.of("put_if_match", "not_found")
    }

    /// GET requests.
    pub fn gets(&self) -> u64 {
        self.op("get")
    }

    /// Every request.
    pub fn total(&self) -> u64 {
        self.0.iter().flatten().sum()
    }

    /// `self - earlier`, for the requests made between two snapshots.
    pub fn since(&self, earlier: &Counts) -> Counts {
        let mut out = Counts::default();
        for i in 0..5 {
            for j in 0..5 {
                out.0[i][j] = self.0[i][j].saturating_sub(earlier.0[i][j]);
            }
        }
        out
    }
}

/// Wraps a store and counts its requests.
pub struct MeteredStore {
    inner: DynStore,
    counts: [[AtomicU64; 5]; 5],
}

impl MeteredStore {
    /// Wraps `inner`.
    pub fn new(inner: DynStore) -> Arc<Self> {
        Arc::new(Self {
            inner,
            counts: Default::default(),
        })
    }

    /// The counts so far.
    pub fn counts(&self) -> Counts {
        let mut out = Counts::default();
        for (i, row) in self.counts.iter().enumerate() {
            for (j, c) in row.iter().enumerate() {
                out.0[i][j] = c.load(Ordering::Relaxed);
            }
        }
        out
    }

    fn record<T>(&self, op: usize, r: &StoreResult<T>) {
        let outcome = match r {
            Ok(_) => 0,
            Err(StoreError::Conflict) => 1,
            Err(StoreError::NotFound) => 2,
            Err(StoreError::Unavailable(_)) => 3,
            Err(StoreError::Other(_) | StoreError::Corrupt(_)) => 4,
        };
        self.counts[op][outcome].fetch_add(1, Ordering::Relaxed);
    }
}

#[async_trait]
impl Store for MeteredStore {
    async fn get(&self, key: &str) -> StoreResult<Option<Object>> {
        let r = self.inner.get(key).await;
        self.record(0, &r);
        r
    }

    async fn get_if_changed(&self, key: &str, etag: &ETag) -> StoreResult<Fetched> {
        let r = self.inner.get_if_changed(key, etag).await;
        self.record(0, &r);
        r
    }

    async fn put_if_absent(&self, key: &str, data: Bytes) -> StoreResult<ETag> {
        let r = self.inner.put_if_absent(key, data).await;
        self.record(1, &r);
        r
    }

    async fn put_if_match(&self, key: &str, data: Bytes, etag: &ETag) -> StoreResult<ETag> {
        let r = self.inner.put_if_match(key, data, etag).await;
        self.record(2, &r);
        r
    }

    async fn delete(&self, key: &str) -> StoreResult<()> {
        let r = self.inner.delete(key).await;
        self.record(3, &r);
        r
    }

    async fn list(&self, prefix: &str) -> StoreResult<Vec<String>> {
        let r = self.inner.list(prefix).await;
        self.record(4, &r);
        r
    }

    async fn list_after(&self, prefix: &str, after: &str, max: usize) -> StoreResult<Vec<String>> {
        let r = self.inner.list_after(prefix, after, max).await;
        self.record(4, &r);
        r
    }

    async fn list_dirs(&self, prefix: &str, after: &str, max: usize) -> StoreResult<Vec<String>> {
        let r = self.inner.list_dirs(prefix, after, max).await;
        self.record(4, &r);
        r
    }

    async fn list_files(&self, prefix: &str) -> StoreResult<Vec<Listed>> {
        let r = self.inner.list_files(prefix).await;
        self.record(4, &r);
        r
    }

    /// Counted as one delete, whatever number of folder keys the store deletes.
    async fn delete_folders(&self, prefix: &str, deleted: &[String]) -> StoreResult<()> {
        let r = self.inner.delete_folders(prefix, deleted).await;
        self.record(3, &r);
        r
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::memory::MemoryStore;

    #[tokio::test]
    async fn counts_by_op_and_outcome() {
        let m = MeteredStore::new(Arc::new(MemoryStore::new()));
        let e = m
            .put_if_absent("k", Bytes::from_static(b"1"))
            .await
            .unwrap();
        assert!(m
            .put_if_absent("k", Bytes::from_static(b"1"))
            .await
            .is_err());
        m.put_if_match("k", Bytes::from_static(b"2"), &ETag::new("nope"))
            .await
            .unwrap_err();
        m.put_if_match("k", Bytes::from_static(b"2"), &e)
            .await
            .unwrap();
        m.get("k").await.unwrap();
        let c = m.counts();
        assert_eq!(
            (c.puts(), c.failed_puts(), c.gets(), c.total()),
            (4, 2, 1, 5)
        );
        assert_eq!(c.since(&c).total(), 0);
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn conformance() {
        let m = MeteredStore::new(Arc::new(MemoryStore::new()));
        crate::store::testing::conformance::run_all(m, "t").await;
    }
}
