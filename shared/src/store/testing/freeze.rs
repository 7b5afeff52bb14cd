//! A [`Store`] decorator for an instance that stops mid-operation and never comes back, for
//! tests.
//!
//! Each broker of a multi-instance test gets its own [`FreezeStore`] over the shared store.
//! Once [`FreezeStore::freeze`] is called, every request through it (those in flight that
//! have not reached the inner store yet, and every later one) waits forever: the instance's
//! requests stop reaching storage, exactly as if its process were paused for good. With
//! `after_applying`, a request that arrives applies first and then never answers, as when
//! an instance dies between its write landing and the response arriving.

use std::sync::atomic::{AtomicU8, Ordering};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use crate::store::{DynStore, ETag, Fetched, Listed, Object, Store, StoreResult};

const RUNNING: u8 = 0;
const BEFORE: u8 = 1;
const AFTER: u8 = 2;

/// The decorator.
pub struct FreezeStore {
    inner: DynStore,
    state: AtomicU8,
}

impl std::fmt::Debug for FreezeStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FreezeStore")
            .field("state", &self.state)
            .finish_non_exhaustive()
    }
}

impl FreezeStore {
    /// Wraps `inner`, running.
    pub fn new(inner: DynStore) -> Arc<Self> {
        Arc::new(Self {
            inner,
            state: AtomicU8::new(RUNNING),
        })
    }

    /// Stops this instance for good; with `after_applying`, the next write still lands
    /// (every request after it hangs before reaching the store).
    pub fn freeze(&self, after_applying: bool) {
        let to = if after_applying { AFTER } else { BEFORE };
        let _ = self
            .state
            .compare_exchange(RUNNING, to, Ordering::SeqCst, Ordering::SeqCst);
    }

    /// Whether [`Self::freeze`] was called.
    pub fn is_frozen(&self) -> bool {
        self.state.load(Ordering::SeqCst) != RUNNING
    }

    /// Hangs forever when frozen before applying.
    async fn gate(&self) {
        if self.state.load(Ordering::SeqCst) == BEFORE {
            std::future::pending::<()>().await;
        }
    }

    /// Runs `op` unless frozen, and hangs instead of answering if frozen meanwhile.
    async fn read<T>(
        &self,
        op: impl std::future::Future<Output = StoreResult<T>>,
    ) -> StoreResult<T> {
        self.gate().await;
        let r = op.await;
        self.gate().await;
        r
    }

    /// Applies `op`, then hangs forever if frozen after applying (one write lands, the
    /// instance never hears of it, and nothing after it reaches the store).
    async fn write<T>(
        &self,
        op: impl std::future::Future<Output = StoreResult<T>>,
    ) -> StoreResult<T> {
        self.gate().await;
        let r = op.await;
        if self
            .state
            .compare_exchange(AFTER, BEFORE, Ordering::SeqCst, Ordering::SeqCst)
            .is_ok()
        {
            std::future::pending::<()>().await;
        }
        self.gate().await;
        r
    }
}

#[async_trait]
impl Store for FreezeStore {
    async fn get(&self, key: &str) -> StoreResult<Option<Object>> {
        self.read(self.inner.get(key)).await
    }

    async fn get_if_changed(&self, key: &str, etag: &ETag) -> StoreResult<Fetched> {
        self.read(self.inner.get_if_changed(key, etag)).await
    }

    async fn put_if_absent(&self, key: &str, data: Bytes) -> StoreResult<ETag> {
        self.write(self.inner.put_if_absent(key, data)).await
    }

    async fn put_if_match(&self, key: &str, data: Bytes, etag: &ETag) -> StoreResult<ETag> {
        self.write(self.inner.put_if_match(key, data, etag)).await
    }

    async fn delete(&self, key: &str) -> StoreResult<()> {
        self.write(self.inner.delete(key)).await
    }

    async fn list(&self, prefix: &str) -> StoreResult<Vec<String>> {
        self.read(self.inner.list(prefix)).await
    }

    async fn list_after(&self, prefix: &str, after: &str, max: usize) -> StoreResult<Vec<String>> {
        self.read(self.inner.list_after(prefix, after, max)).await
    }

    async fn list_dirs(&self, prefix: &str, after: &str, max: usize) -> StoreResult<Vec<String>> {
        self.read(self.inner.list_dirs(prefix, after, max)).await
    }

    async fn list_files(&self, prefix: &str) -> StoreResult<Vec<Listed>> {
        self.read(self.inner.list_files(prefix)).await
    }

    async fn delete_folders(&self, prefix: &str, deleted: &[String]) -> StoreResult<()> {
        self.write(self.inner.delete_folders(prefix, deleted)).await
    }

    fn describe(&self) -> String {
        format!("freezable {}", self.inner.describe())
    }
}
