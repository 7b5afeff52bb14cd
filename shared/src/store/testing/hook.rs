//! A [`Store`] decorator that lets a test decide what a conditional replace answers, for
//! tests of one precise moment (a timeout that did not apply, a race lost while the clock
//! jumps).
//!
//! Before every `put_if_match` it calls the hook with the key: `Some(error)` is answered
//! without reaching the store, `None` lets the write through. Everything else passes
//! through unchanged. Made with [`ReplaceHook::creates`], it hooks every `put_if_absent`
//! instead (a segment write that fails).

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

use crate::store::{DynStore, ETag, Fetched, Listed, Object, Store, StoreError, StoreResult};

type Hook = Box<dyn Fn(&str) -> Option<StoreError> + Send + Sync>;

/// The decorator.
pub struct ReplaceHook {
    inner: DynStore,
    hook: Hook,
    /// Whether the hook decides `put_if_absent` rather than `put_if_match`.
    creates: bool,
}

impl std::fmt::Debug for ReplaceHook {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ReplaceHook").finish_non_exhaustive()
    }
}

impl ReplaceHook {
    /// Wraps `inner`; `hook` decides each conditional replace.
    pub fn new(
        inner: DynStore,
        hook: impl Fn(&str) -> Option<StoreError> + Send + Sync + 'static,
    ) -> Arc<Self> {
        Self::on(inner, Box::new(hook), false)
    }

    /// Wraps `inner`; `hook` decides each conditional create (`If-None-Match: *`).
    pub fn creates(
        inner: DynStore,
        hook: impl Fn(&str) -> Option<StoreError> + Send + Sync + 'static,
    ) -> Arc<Self> {
        Self::on(inner, Box::new(hook), true)
    }

    fn on(inner: DynStore, hook: Hook, creates: bool) -> Arc<Self> {
        Arc::new(Self {
            inner,
            hook,
            creates,
        })
    }
}

#[async_trait]
impl Store for ReplaceHook {
    async fn get(&self, key: &str) -> StoreResult<Option<Object>> {
        self.inner.get(key).await
    }

    async fn get_if_changed(&self, key: &str, etag: &ETag) -> StoreResult<Fetched> {
        self.inner.get_if_changed(key, etag).await
    }

    async fn put_if_absent(&self, key: &str, data: Bytes) -> StoreResult<ETag> {
        if let Some(e) = self.creates.then(|| (self.hook)(key)).flatten() {
            return Err(e);
        }
        self.inner.put_if_absent(key, data).await
    }

    async fn put_if_match(&self, key: &str, data: Bytes, etag: &ETag) -> StoreResult<ETag> {
        if let Some(e) = (!self.creates).then(|| (self.hook)(key)).flatten() {
            return Err(e);
        }
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

    fn describe(&self) -> String {
        format!("hooked {}", self.inner.describe())
    }
}
