//! A [`Store`] decorator that injects failures, for tests.
//!
//! Every request draws from a seeded random generator, so a run with the same seed and
//! the same sequence of requests injects the same faults. The faults are the ambiguous
//! outcomes a real object store produces:
//!
//! * **error before**: the request fails with [`StoreError::Unavailable`] and is not applied
//!   (a refused connection, a 503 SlowDown);
//! * **error after**: the request is applied, then fails with [`StoreError::Unavailable`]
//!   (a lost response, a timeout after the write landed);
//! * **spurious conflict**: a conditional manifest write answers [`StoreError::Conflict`]
//!   without being applied (a 409 ConditionalRequestConflict);
//! * **latency**: the request waits a random time first (use a paused tokio clock).
//!
//! Segment writes (keys containing `/segments/`) get no spurious conflicts: their ids are
//! unique, so a real store never answers them 412.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};

use crate::store::{DynStore, ETag, Fetched, Listed, Object, Store, StoreError, StoreResult};

/// How often each fault happens, as probabilities per request.
#[derive(Debug, Clone, Copy)]
pub struct FaultPlan {
    /// Fail before applying.
    pub error_before: f64,
    /// Apply, then fail (writes and deletes only).
    pub error_after: f64,
    /// Answer `Conflict` without applying (conditional manifest writes only).
    pub conflict: f64,
    /// Upper bound of the random delay added to each request.
    pub max_latency: Duration,
}

impl Default for FaultPlan {
    fn default() -> Self {
        Self {
            error_before: 0.05,
            error_after: 0.05,
            conflict: 0.05,
            max_latency: Duration::from_millis(5),
        }
    }
}

/// Counts of injected faults.
#[derive(Debug, Default)]
pub struct FaultCounts {
    /// Errors before applying.
    pub before: AtomicU64,
    /// Errors after applying.
    pub after: AtomicU64,
    /// Spurious conflicts.
    pub conflicts: AtomicU64,
}

/// The decorator.
pub struct FaultStore {
    inner: DynStore,
    plan: FaultPlan,
    rng: Mutex<StdRng>,
    enabled: AtomicBool,
    /// What was injected so far.
    pub counts: FaultCounts,
}

impl std::fmt::Debug for FaultStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FaultStore")
            .field("enabled", &self.enabled)
            .finish_non_exhaustive()
    }
}

enum Fault {
    None,
    Before,
    After,
    Conflict,
}

impl FaultStore {
    /// Wraps `inner`; faults drawn from `seed`.
    pub fn new(inner: DynStore, plan: FaultPlan, seed: u64) -> Arc<Self> {
        Arc::new(Self {
            inner,
            plan,
            rng: Mutex::new(StdRng::seed_from_u64(seed)),
            enabled: AtomicBool::new(true),
            counts: FaultCounts::default(),
        })
    }

    /// Turns injection on or off (off: a plain pass-through).
    pub fn set_enabled(&self, on: bool) {
        self.enabled.store(on, Ordering::SeqCst);
    }

    async fn draw(&self, write: bool, may_conflict: bool) -> Fault {
        if !self.enabled.load(Ordering::SeqCst) {
            return Fault::None;
        }
        let (r, delay) = {
            let mut rng = self.rng.lock().unwrap_or_else(|p| p.into_inner());
            let max = self.plan.max_latency.as_micros() as u64;
            (
                rng.gen::<f64>(),
                if max == 0 { 0 } else { rng.gen_range(0..=max) },
            )
        };
        if delay > 0 {
            tokio::time::sleep(Duration::from_micros(delay)).await;
        }
        let p = &self.plan;
        if r < p.error_before {
            self.counts.before.fetch_add(1, Ordering::Relaxed);
            Fault::Before
        } else if write && r < p.error_before + p.error_after {
            self.counts.after.fetch_add(1, Ordering::Relaxed);
            Fault::After
        } else if may_conflict && r < p.error_before + p.error_after + p.conflict {
            self.counts.conflicts.fetch_add(1, Ordering::Relaxed);
            Fault::Conflict
        } else {
            Fault::None
        }
    }
}

fn unavailable(what: &str) -> StoreError {
    StoreError::unavailable(format!("injected fault: {what}"))
}

#[async_trait]
impl Store for FaultStore {
    async fn get(&self, key: &str) -> StoreResult<Option<Object>> {
        match self.draw(false, false).await {
            Fault::Before => Err(unavailable("get")),
            _ => self.inner.get(key).await,
        }
    }

    async fn get_if_changed(&self, key: &str, etag: &ETag) -> StoreResult<Fetched> {
        match self.draw(false, false).await {
            Fault::Before => Err(unavailable("get_if_changed")),
            _ => self.inner.get_if_changed(key, etag).await,
        }
    }

    async fn put_if_absent(&self, key: &str, data: Bytes) -> StoreResult<ETag> {
        match self.draw(true, !key.contains("/segments/")).await {
            Fault::Before => Err(unavailable("put_if_absent before")),
            Fault::Conflict => Err(StoreError::Conflict),
            Fault::After => {
                self.inner.put_if_absent(key, data).await?;
                Err(unavailable("put_if_absent after"))
            }
            Fault::None => self.inner.put_if_absent(key, data).await,
        }
    }

    async fn put_if_match(&self, key: &str, data: Bytes, etag: &ETag) -> StoreResult<ETag> {
        match self.draw(true, true).await {
            Fault::Before => Err(unavailable("put_if_match before")),
            Fault::Conflict => Err(StoreError::Conflict),
            Fault::After => {
                self.inner.put_if_match(key, data, etag).await?;
                Err(unavailable("put_if_match after"))
            }
            Fault::None => self.inner.put_if_match(key, data, etag).await,
        }
    }

    async fn delete(&self, key: &str) -> StoreResult<()> {
        match self.draw(true, false).await {
            Fault::Before => Err(unavailable("delete before")),
            Fault::After => {
                self.inner.delete(key).await?;
                Err(unavailable("delete after"))
            }
            _ => self.inner.delete(key).await,
        }
    }

    async fn list(&self, prefix: &str) -> StoreResult<Vec<String>> {
        match self.draw(false, false).await {
            Fault::Before => Err(unavailable("list")),
            _ => self.inner.list(prefix).await,
        }
    }

    async fn list_after(&self, prefix: &str, after: &str, max: usize) -> StoreResult<Vec<String>> {
        match self.draw(false, false).await {
            Fault::Before => Err(unavailable("list")),
            _ => self.inner.list_after(prefix, after, max).await,
        }
    }

    async fn list_dirs(&self, prefix: &str, after: &str, max: usize) -> StoreResult<Vec<String>> {
        match self.draw(false, false).await {
            Fault::Before => Err(unavailable("list")),
            _ => self.inner.list_dirs(prefix, after, max).await,
        }
    }

    async fn list_files(&self, prefix: &str) -> StoreResult<Vec<Listed>> {
        match self.draw(false, false).await {
            Fault::Before => Err(unavailable("list")),
            _ => self.inner.list_files(prefix).await,
        }
    }

    async fn delete_folders(&self, prefix: &str, deleted: &[String]) -> StoreResult<()> {
        self.inner.delete_folders(prefix, deleted).await
    }

    fn describe(&self) -> String {
        format!("faulty {}", self.inner.describe())
    }
}
