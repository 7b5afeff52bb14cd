//! Writes of one key spaced by the store's [`Store::key_write_interval`]: how Narad meets
//! Cloudflare R2's one write per second per key (docs/design.md §6, "Pacing").
//!
//! A write of a key waits until the interval has passed since the previous write of that
//! key was answered (answered, not sent: the store measures arrivals, and the next write
//! then arrives at least the interval after the previous one did), and writes of one key
//! go one at a time. Every writer in the process is paced, whoever it is: the committer,
//! a compare-and-swap retry after a lost race, a chore. While a commit of a partition
//! waits here, the operations that arrive queue behind it and ride in the next commit, so
//! the wait turns into larger commits, not into more requests. Writes of keys that are
//! written once (segments, intents) never wait. Reads, listings and deletes are not paced.
//!
//! Processes do not coordinate: two processes writing one key can still exceed the limit,
//! and the store's refusal (R2's 429) is then a failed write like any other, which the
//! writer retries (`cas.rs`) or answers 503 with `Retry-After`.

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use super::{DynStore, ETag, Fetched, Listed, Object, Store, StoreResult};
use crate::runtime::{now, sleep_until, Instant};

/// Keys remembered before those whose interval has passed (and that no write holds) are
/// forgotten.
const REMEMBERED: usize = 4096;

/// When the next write of one key may be sent; held while a write of it is in flight.
type Slot = Arc<tokio::sync::Mutex<Option<Instant>>>;

/// Wraps a store whose [`Store::key_write_interval`] is not zero.
pub struct PacedStore {
    inner: DynStore,
    interval: Duration,
    slots: Mutex<HashMap<String, Slot>>,
}

impl std::fmt::Debug for PacedStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PacedStore")
            .field("interval", &self.interval)
            .finish_non_exhaustive()
    }
}

/// `store`, paced when it needs it (its key write interval is not zero); else itself.
pub fn paced(store: DynStore) -> DynStore {
    let interval = store.key_write_interval();
    if interval.is_zero() {
        return store;
    }
    Arc::new(PacedStore {
        inner: store,
        interval,
        slots: Mutex::new(HashMap::new()),
    })
}

impl PacedStore {
    /// The slot of `key`, made when it has none.
    fn slot(&self, key: &str) -> Slot {
        let mut slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
        if slots.len() >= REMEMBERED {
            let at = now();
            slots.retain(|_, s| {
                Arc::strong_count(s) > 1
                    || s.try_lock()
                        .map_or(true, |next| next.is_some_and(|t| t > at))
            });
        }
        slots.entry(key.to_owned()).or_default().clone()
    }

    /// Runs `write` of `key` once the interval since the last one has passed.
    async fn write<T>(
        &self,
        key: &str,
        write: impl std::future::Future<Output = StoreResult<T>>,
    ) -> StoreResult<T> {
        let slot = self.slot(key);
        let mut next = slot.lock().await;
        if let Some(t) = *next {
            if t > now() {
                sleep_until(t).await;
            }
        }
        let r = write.await;
        *next = Some(now() + self.interval);
        r
    }
}

#[async_trait]
impl Store for PacedStore {
    async fn get(&self, key: &str) -> StoreResult<Option<Object>> {
        self.inner.get(key).await
    }

    async fn get_if_changed(&self, key: &str, etag: &ETag) -> StoreResult<Fetched> {
        self.inner.get_if_changed(key, etag).await
    }

    async fn put_if_absent(&self, key: &str, data: Bytes) -> StoreResult<ETag> {
        self.write(key, self.inner.put_if_absent(key, data)).await
    }

    async fn put_if_match(&self, key: &str, data: Bytes, etag: &ETag) -> StoreResult<ETag> {
        self.write(key, self.inner.put_if_match(key, data, etag))
            .await
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
        self.interval
    }

    /// Until the key's next write may go; the whole interval while one is in flight
    /// (its answer starts the interval).
    fn write_wait(&self, key: &str) -> Duration {
        let slot = {
            let slots = self.slots.lock().unwrap_or_else(|p| p.into_inner());
            match slots.get(key) {
                Some(s) => s.clone(),
                None => return Duration::ZERO,
            }
        };
        let Ok(next) = slot.try_lock() else {
            return self.interval;
        };
        next.map_or(Duration::ZERO, |t| t.saturating_duration_since(now()))
    }

    fn describe(&self) -> String {
        self.inner.describe()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::store::keyrate::KeyRateStore;
    use crate::store::memory::MemoryStore;

    #[tokio::test(start_paused = true)]
    async fn writes_of_one_key_wait_out_the_interval_and_are_never_refused() {
        let limited = Arc::new(KeyRateStore::new(
            Arc::new(MemoryStore::new()),
            Duration::from_secs(1),
        ));
        let s = paced(limited.clone());
        let t0 = now();
        assert_eq!(s.write_wait("k"), Duration::ZERO);
        let mut etag = s.put_if_absent("k", Bytes::from("0")).await.unwrap();
        // The committer waits this out before it takes a batch of `k`.
        assert_eq!(s.write_wait("k"), Duration::from_secs(1));
        assert_eq!(s.write_wait("never-written"), Duration::ZERO);
        // Other keys go at once, beside a waiting write of `k`.
        let (again, other) = tokio::join!(
            s.put_if_match("k", Bytes::from("1"), &etag),
            s.put_if_absent("seg-1", Bytes::from("x")),
        );
        other.unwrap();
        etag = again.unwrap();
        assert!(now() - t0 >= Duration::from_secs(1));
        // Concurrent writes of one key go one at a time, a second apart: one wins, the
        // other loses its condition; neither is refused.
        let (a, b) = tokio::join!(
            s.put_if_match("k", Bytes::from("2"), &etag),
            s.put_if_match("k", Bytes::from("3"), &etag),
        );
        assert!(a.is_ok() != b.is_ok(), "{a:?} {b:?}");
        assert!(now() - t0 >= Duration::from_secs(3));
        assert_eq!(limited.refused(), 0);
    }

    #[tokio::test]
    async fn a_store_without_an_interval_is_not_wrapped() {
        let m: DynStore = Arc::new(MemoryStore::new());
        assert!(Arc::ptr_eq(&paced(m.clone()), &m));
    }
}
