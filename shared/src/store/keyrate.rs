//! A [`Store`] decorator that refuses a second write of one key within an interval, as
//! Cloudflare R2 does ("maximum concurrent writes to the same object name: 1 per second";
//! beyond it R2 answers 429, error 10058): emulation for tests and benchmarks, so that the
//! committer's pacing ([`Store::key_write_interval`]) is checked on any store. Enabled only
//! by `NARAD_STORE_KEY_WRITE_INTERVAL_MS` (see `config`); never part of a production setup,
//! where R2 itself refuses.
//!
//! A write is a `put_if_absent` or a `put_if_match` that reaches the store, whether its
//! condition holds or not: R2 counts requests, not successes. A refused write is not
//! forwarded and answers [`StoreError::Unavailable`], which is what R2's 429 maps to. Deletes
//! are not counted (R2 documents the limit for writes of an object).

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Mutex;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use super::{DynStore, ETag, Fetched, Listed, Object, Store, StoreError, StoreResult};
use crate::runtime::{now, Instant};

/// Keys remembered before the ones whose interval has passed are forgotten.
const REMEMBERED: usize = 4096;

/// Wraps a store; a write of a key written less than `interval` ago is refused.
pub struct KeyRateStore {
    inner: DynStore,
    interval: Duration,
    /// When each key was last written.
    last: Mutex<HashMap<String, Instant>>,
    refused: AtomicU64,
}

impl std::fmt::Debug for KeyRateStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KeyRateStore")
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

impl KeyRateStore {
    /// `inner`, refusing a second write of one key within `interval`.
    pub fn new(inner: DynStore, interval: Duration) -> Self {
        Self {
            inner,
            interval,
            last: Mutex::new(HashMap::new()),
            refused: AtomicU64::new(0),
        }
    }

    /// Writes refused so far.
    pub fn refused(&self) -> u64 {
        self.refused.load(Ordering::Relaxed)
    }

    /// Admits a write of `key` now, or refuses it as R2 would.
    fn admit(&self, key: &str) -> StoreResult<()> {
        let at = now();
        let mut last = self.last.lock().unwrap_or_else(|p| p.into_inner());
        if let Some(prev) = last.get(key) {
            if at.saturating_duration_since(*prev) < self.interval {
                self.refused.fetch_add(1, Ordering::Relaxed);
                return Err(StoreError::unavailable(format!(
                    "{key}: more than one write of this key within {} ms (R2: 429, 10058)",
                    self.interval.as_millis()
                )));
            }
        }
        if last.len() >= REMEMBERED {
            let interval = self.interval;
            last.retain(|_, t| at.saturating_duration_since(*t) < interval);
        }
        last.insert(key.to_owned(), at);
        Ok(())
    }
}

#[async_trait]
impl Store for KeyRateStore {
    async fn get(&self, key: &str) -> StoreResult<Option<Object>> {
        self.inner.get(key).await
    }

    async fn get_if_changed(&self, key: &str, etag: &ETag) -> StoreResult<Fetched> {
        self.inner.get_if_changed(key, etag).await
    }

    async fn put_if_absent(&self, key: &str, data: Bytes) -> StoreResult<ETag> {
        self.admit(key)?;
        self.inner.put_if_absent(key, data).await
    }

    async fn put_if_match(&self, key: &str, data: Bytes, etag: &ETag) -> StoreResult<ETag> {
        self.admit(key)?;
        self.inner.put_if_match(key, data, etag).await
    }

    async fn delete(&self, key: &str) -> StoreResult<()> {
        self.inner.delete(key).await
    }

    async fn list(&self, prefix: &str) -> StoreResult<Vec<String>> {
        self.inner.list(prefix).await
    }

    async fn list_after(&self, prefix: &str, after: &str, max: usize) -> StoreResult<Vec<String>> {
        self.inner.list_after(prefix, after, max).await
    }

    async fn list_dirs(&self, prefix: &str, after: &str, max: usize) -> StoreResult<Vec<String>> {
        self.inner.list_dirs(prefix, after, max).await
    }

    async fn list_files(&self, prefix: &str) -> StoreResult<Vec<Listed>> {
        self.inner.list_files(prefix).await
    }

    async fn delete_folders(&self, prefix: &str, deleted: &[String]) -> StoreResult<()> {
        self.inner.delete_folders(prefix, deleted).await
    }

    fn key_write_interval(&self) -> Duration {
        self.interval.max(self.inner.key_write_interval())
    }

    fn describe(&self) -> String {
        format!(
            "{} (one write per key per {} ms, as R2)",
            self.inner.describe(),
            self.interval.as_millis()
        )
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use super::*;
    use crate::store::memory::MemoryStore;

    #[tokio::test(start_paused = true)]
    async fn a_second_write_of_a_key_within_the_interval_is_refused_and_not_applied() {
        let s = KeyRateStore::new(Arc::new(MemoryStore::new()), Duration::from_secs(1));
        let e = s.put_if_absent("k", Bytes::from("a")).await.unwrap();
        // Another key is not limited; the same key is, and nothing is written.
        s.put_if_absent("other", Bytes::from("b")).await.unwrap();
        let refused = s.put_if_match("k", Bytes::from("c"), &e).await;
        assert!(
            matches!(refused, Err(StoreError::Unavailable(_))),
            "{refused:?}"
        );
        assert_eq!(s.get("k").await.unwrap().unwrap().data, Bytes::from("a"));
        assert_eq!(s.refused(), 1);
        // A failed condition counts as a write too; after the interval, writes pass.
        crate::runtime::sleep(Duration::from_millis(1000)).await;
        let lost = s.put_if_absent("k", Bytes::from("d")).await;
        assert!(matches!(lost, Err(StoreError::Conflict)), "{lost:?}");
        crate::runtime::sleep(Duration::from_millis(999)).await;
        assert!(s.put_if_match("k", Bytes::from("e"), &e).await.is_err());
        assert_eq!(s.refused(), 2);
        crate::runtime::sleep(Duration::from_millis(1000)).await;
        s.put_if_match("k", Bytes::from("f"), &e).await.unwrap();
        assert_eq!(s.key_write_interval(), Duration::from_secs(1));
    }

    #[tokio::test]
    async fn passes_the_conformance_suite_when_writes_are_spaced() {
        // The suite writes keys again at once, so it runs with no interval: what the
        // decorator forwards is checked, not its refusals (the test above).
        let s: DynStore = Arc::new(KeyRateStore::new(
            Arc::new(MemoryStore::new()),
            Duration::ZERO,
        ));
        crate::store::testing::conformance::run_all(s, "keyrate").await;
    }
}
