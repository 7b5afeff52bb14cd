//! A [`Store`] decorator that loses the answer to one chosen write and holds the writer's
//! next read of that object, for tests.
//!
//! [`LostAnswerStore::lose_next_write`] arms it for keys a predicate accepts: the next
//! conditional write to such a key is applied, then fails with
//! [`StoreError::Unavailable`] (its answer lost), and the next read of that key through
//! this decorator (the writer's recovery read) waits until [`LostAnswerStore::release`].
//! Meanwhile other processes, on the undecorated store, commit as they like: this is
//! the deterministic form of "a lost answer, then many commits, then the recovery read"
//! (docs/design.md §3, "Lost-response recovery").

use std::sync::{Arc, Mutex};

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::watch;

use crate::store::{DynStore, ETag, Fetched, Listed, Object, Store, StoreError, StoreResult};

type Matches = Box<dyn Fn(&str) -> bool + Send + Sync>;

/// Where the one lost answer stands.
enum Phase {
    Idle,
    /// The next conditional write to a key this accepts loses its answer.
    Armed(Matches),
    /// The answer to a write of this key was lost; its next read is held.
    Lost(String),
    /// That read has been held (and released, or is waiting).
    Done,
}

/// The decorator.
pub struct LostAnswerStore {
    inner: DynStore,
    phase: Mutex<Phase>,
    holding: watch::Sender<bool>,
    released: watch::Sender<bool>,
}

impl std::fmt::Debug for LostAnswerStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LostAnswerStore").finish_non_exhaustive()
    }
}

impl LostAnswerStore {
    /// Wraps `inner`, disarmed.
    pub fn new(inner: DynStore) -> Arc<Self> {
        Arc::new(Self {
            inner,
            phase: Mutex::new(Phase::Idle),
            holding: watch::channel(false).0,
            released: watch::channel(false).0,
        })
    }

    /// Loses the answer to the next conditional write to a key `matches` accepts, and
    /// holds the next read of that key until [`Self::release`].
    pub fn lose_next_write(&self, matches: impl Fn(&str) -> bool + Send + Sync + 'static) {
        self.holding.send_replace(false);
        self.released.send_replace(false);
        *self.lock() = Phase::Armed(Box::new(matches));
    }

    /// Waits until the read after the lost answer is being held.
    pub async fn holding(&self) {
        let mut rx = self.holding.subscribe();
        let _ = rx.wait_for(|h| *h).await;
    }

    /// Lets the held read go on.
    pub fn release(&self) {
        self.released.send_replace(true);
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, Phase> {
        self.phase.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// Whether this write to `key` loses its answer (and arms the hold of its next read).
    fn loses(&self, key: &str) -> bool {
        let mut phase = self.lock();
        if matches!(&*phase, Phase::Armed(m) if m(key)) {
            *phase = Phase::Lost(key.to_owned());
            return true;
        }
        false
    }

    /// Holds this read of `key` if it is the first after the lost answer.
    async fn hold(&self, key: &str) {
        {
            let mut phase = self.lock();
            if !matches!(&*phase, Phase::Lost(k) if k == key) {
                return;
            }
            *phase = Phase::Done;
        }
        let mut rx = self.released.subscribe();
        self.holding.send_replace(true);
        let _ = rx.wait_for(|r| *r).await;
    }

    async fn conditional(&self, key: &str, put: StoreResult<ETag>) -> StoreResult<ETag> {
        match put {
            Ok(_) if self.loses(key) => Err(StoreError::Unavailable(
                "the answer was lost (LostAnswerStore)".into(),
            )),
            other => other,
        }
    }
}

#[async_trait]
impl Store for LostAnswerStore {
    async fn get(&self, key: &str) -> StoreResult<Option<Object>> {
        self.hold(key).await;
        self.inner.get(key).await
    }

    async fn get_if_changed(&self, key: &str, etag: &ETag) -> StoreResult<Fetched> {
        self.hold(key).await;
        self.inner.get_if_changed(key, etag).await
    }

    async fn put_if_absent(&self, key: &str, data: Bytes) -> StoreResult<ETag> {
        let put = self.inner.put_if_absent(key, data).await;
        self.conditional(key, put).await
    }

    async fn put_if_match(&self, key: &str, data: Bytes, etag: &ETag) -> StoreResult<ETag> {
        let put = self.inner.put_if_match(key, data, etag).await;
        self.conditional(key, put).await
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

    fn describe(&self) -> String {
        format!("lost-answer {}", self.inner.describe())
    }
}
