//! A [`Store`] decorator that counts every request by operation and outcome.
//!
//! Used by the benchmark to report storage requests per message, and by anything that
//! wants to export them as metrics. Counting is lock-free and adds no storage calls.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use super::{DynStore, ETag, Fetched, Listed, Object, Store, StoreError, StoreResult};

/// A kind of storage request, as counted and billed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StoreOp {
    /// A read, conditional or not.
    Get,
    /// A create-if-absent write.
    PutIfAbsent,
    /// A replace-if-unchanged write.
    PutIfMatch,
    /// A delete.
    Delete,
    /// A listing of any kind.
    List,
}

impl StoreOp {
    /// Every operation, in the order [`Counts`] keeps them.
    pub const ALL: [StoreOp; 5] = [
        StoreOp::Get,
        StoreOp::PutIfAbsent,
        StoreOp::PutIfMatch,
        StoreOp::Delete,
        StoreOp::List,
    ];

    /// Its name in `/metrics` (`op="…"`).
    pub fn name(self) -> &'static str {
        match self {
            StoreOp::Get => "get",
            StoreOp::PutIfAbsent => "put_if_absent",
            StoreOp::PutIfMatch => "put_if_match",
            StoreOp::Delete => "delete",
            StoreOp::List => "list",
        }
    }

    /// The operation named `name` in `/metrics`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.name() == name)
    }
}

/// How a storage request ended, as counted.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Outcome {
    /// It succeeded.
    Ok,
    /// A conditional write lost (412/409).
    Conflict,
    /// The object was not there (a replace of a missing key).
    NotFound,
    /// The store was unavailable (a timeout, a 5xx, throttling).
    Unavailable,
    /// Anything else.
    Error,
}

impl Outcome {
    /// Every outcome, in the order [`Counts`] keeps them.
    pub const ALL: [Outcome; 5] = [
        Outcome::Ok,
        Outcome::Conflict,
        Outcome::NotFound,
        Outcome::Unavailable,
        Outcome::Error,
    ];

    /// Its name in `/metrics` (`outcome="…"`).
    pub fn name(self) -> &'static str {
        match self {
            Outcome::Ok => "ok",
            Outcome::Conflict => "conflict",
            Outcome::NotFound => "not_found",
            Outcome::Unavailable => "unavailable",
            Outcome::Error => "error",
        }
    }

    /// The outcome named `name` in `/metrics`.
    pub fn parse(name: &str) -> Option<Self> {
        Self::ALL.into_iter().find(|o| o.name() == name)
    }

    /// How `r` ended.
    pub fn of<T>(r: &StoreResult<T>) -> Self {
        match r {
            Ok(_) => Outcome::Ok,
            Err(StoreError::Conflict) => Outcome::Conflict,
            Err(StoreError::NotFound) => Outcome::NotFound,
            Err(StoreError::Unavailable(_)) => Outcome::Unavailable,
            Err(StoreError::Other(_) | StoreError::Corrupt(_)) => Outcome::Error,
        }
    }
}

/// Request counts by operation and outcome.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Counts([[u64; 5]; 5]);

impl Counts {
    /// Requests of one operation with one outcome.
    pub fn get(&self, op: StoreOp, outcome: Outcome) -> u64 {
        self.0[op as usize][outcome as usize]
    }

    /// Adds `n` requests of `op` that ended with `outcome`.
    pub fn add(&mut self, op: StoreOp, outcome: Outcome, n: u64) {
        self.0[op as usize][outcome as usize] += n;
    }

    /// Every (operation, outcome, count), in the order of [`StoreOp::ALL`] and
    /// [`Outcome::ALL`].
    pub fn iter(&self) -> impl Iterator<Item = (StoreOp, Outcome, u64)> + '_ {
        StoreOp::ALL.into_iter().flat_map(move |op| {
            Outcome::ALL
                .into_iter()
                .map(move |outcome| (op, outcome, self.get(op, outcome)))
        })
    }

    /// Requests of one operation, any outcome.
    pub fn op(&self, op: StoreOp) -> u64 {
        self.0[op as usize].iter().sum()
    }

    /// PUT requests (both conditional kinds), any outcome: what S3 bills as PUTs.
    pub fn puts(&self) -> u64 {
        self.op(StoreOp::PutIfAbsent) + self.op(StoreOp::PutIfMatch)
    }

    /// Conditional PUTs that lost (412/409): billed, but wasted.
    pub fn failed_puts(&self) -> u64 {
        self.get(StoreOp::PutIfAbsent, Outcome::Conflict)
            + self.get(StoreOp::PutIfMatch, Outcome::Conflict)
            + self.get(StoreOp::PutIfMatch, Outcome::NotFound)
    }

    /// GET requests.
    pub fn gets(&self) -> u64 {
        self.op(StoreOp::Get)
    }

    /// What these requests cost at S3 Standard prices in us-east-1, in dollars: $0.005
    /// per 1000 PUTs and LISTs (a LIST is billed as a PUT), $0.0004 per 1000 GETs,
    /// DELETEs free.
    pub fn s3_standard_dollars(&self) -> f64 {
        let puts = self.puts() + self.op(StoreOp::List);
        puts as f64 * 0.005 / 1000.0 + self.gets() as f64 * 0.0004 / 1000.0
    }

    /// Every request.
    pub fn total(&self) -> u64 {
        self.0.iter().flatten().sum()
    }

    /// `self - earlier`, for the requests made between two snapshots.
    pub fn since(&self, earlier: &Counts) -> Counts {
        let mut out = Counts::default();
        for (op, outcome, n) in self.iter() {
            out.add(op, outcome, n.saturating_sub(earlier.get(op, outcome)));
        }
        out
    }

    /// `self + other`.
    pub fn plus(&self, other: &Counts) -> Counts {
        let mut out = *self;
        for (op, outcome, n) in other.iter() {
            out.add(op, outcome, n);
        }
        out
    }
}

/// Wraps a store and counts its requests.
pub struct MeteredStore {
    inner: DynStore,
    counts: [[AtomicU64; 5]; 5],
}

impl std::fmt::Debug for MeteredStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("MeteredStore").finish_non_exhaustive()
    }
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
        for op in StoreOp::ALL {
            for outcome in Outcome::ALL {
                let n = self.counts[op as usize][outcome as usize].load(Ordering::Relaxed);
                out.add(op, outcome, n);
            }
        }
        out
    }

    fn record<T>(&self, op: StoreOp, r: &StoreResult<T>) {
        let outcome = Outcome::of(r);
        self.counts[op as usize][outcome as usize].fetch_add(1, Ordering::Relaxed);
    }

    /// Runs `request` on the inner store, counts it, and traces it
    /// (`NARAD_LOG=narad_shared::store::metered=trace`: every storage request with its key,
    /// outcome and duration, for a timeline).
    async fn metered<T>(
        &self,
        op: StoreOp,
        key: &str,
        request: impl std::future::Future<Output = StoreResult<T>>,
    ) -> StoreResult<T> {
        let started = crate::runtime::now();
        let r = request.await;
        self.record(op, &r);
        tracing::trace!(
            op = op.name(),
            key,
            outcome = ?Outcome::of(&r),
            us = started.elapsed().as_micros() as u64,
            "store"
        );
        r
    }
}

#[async_trait]
impl Store for MeteredStore {
    async fn get(&self, key: &str) -> StoreResult<Option<Object>> {
        self.metered(StoreOp::Get, key, self.inner.get(key)).await
    }

    async fn get_if_changed(&self, key: &str, etag: &ETag) -> StoreResult<Fetched> {
        self.metered(StoreOp::Get, key, self.inner.get_if_changed(key, etag))
            .await
    }

    async fn put_if_absent(&self, key: &str, data: Bytes) -> StoreResult<ETag> {
        self.metered(
            StoreOp::PutIfAbsent,
            key,
            self.inner.put_if_absent(key, data),
        )
        .await
    }

    async fn put_if_match(&self, key: &str, data: Bytes, etag: &ETag) -> StoreResult<ETag> {
        self.metered(
            StoreOp::PutIfMatch,
            key,
            self.inner.put_if_match(key, data, etag),
        )
        .await
    }

    async fn delete(&self, key: &str) -> StoreResult<()> {
        self.metered(StoreOp::Delete, key, self.inner.delete(key))
            .await
    }

    async fn list(&self, prefix: &str) -> StoreResult<Vec<String>> {
        self.metered(StoreOp::List, prefix, self.inner.list(prefix))
            .await
    }

    async fn list_after(&self, prefix: &str, after: &str, max: usize) -> StoreResult<Vec<String>> {
        self.metered(
            StoreOp::List,
            prefix,
            self.inner.list_after(prefix, after, max),
        )
        .await
    }

    async fn list_dirs(&self, prefix: &str, after: &str, max: usize) -> StoreResult<Vec<String>> {
        self.metered(
            StoreOp::List,
            prefix,
            self.inner.list_dirs(prefix, after, max),
        )
        .await
    }

    async fn list_files(&self, prefix: &str) -> StoreResult<Vec<Listed>> {
        self.metered(StoreOp::List, prefix, self.inner.list_files(prefix))
            .await
    }

    /// Counted as one delete, whatever number of folder keys the store deletes.
    async fn delete_folders(&self, prefix: &str, deleted: &[String]) -> StoreResult<()> {
        self.metered(
            StoreOp::Delete,
            prefix,
            self.inner.delete_folders(prefix, deleted),
        )
        .await
    }

    fn key_write_interval(&self) -> std::time::Duration {
        self.inner.key_write_interval()
    }

    fn write_wait(&self, key: &str) -> std::time::Duration {
        self.inner.write_wait(key)
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
        assert_eq!(c.plus(&c).total(), 10);
        assert_eq!(c.get(StoreOp::PutIfMatch, Outcome::Conflict), 1);
        // Every name `/metrics` prints reads back as the same operation or outcome.
        for op in StoreOp::ALL {
            assert_eq!(StoreOp::parse(op.name()), Some(op));
        }
        for o in Outcome::ALL {
            assert_eq!(Outcome::parse(o.name()), Some(o));
        }
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn conformance() {
        let m = MeteredStore::new(Arc::new(MemoryStore::new()));
        crate::store::testing::conformance::run_all(m, "t").await;
    }
}
