//! A [`Store`] decorator that adds a fixed latency to every request: emulation for
//! benchmarks, so a local store (the file store, LocalStack) can be measured with the
//! round-trip time of a remote one (S3 Standard answers in tens of milliseconds, where
//! LocalStack on loopback answers in a few). Enabled only by `NARAD_STORE_LATENCY_MS`
//! (see `config`); never part of a production setup.

use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;

use super::{DynStore, ETag, Fetched, Listed, Object, Store, StoreResult};

/// Wraps a store; every call sleeps `delay` before it is forwarded.
pub struct LatencyStore {
    inner: DynStore,
    delay: Duration,
}

impl std::fmt::Debug for LatencyStore {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LatencyStore")
            .field("delay", &self.delay)
            .finish_non_exhaustive()
    }
}

impl LatencyStore {
    /// `inner` with `delay` added to every request.
    pub fn new(inner: DynStore, delay: Duration) -> Self {
        Self { inner, delay }
    }
}

#[async_trait]
impl Store for LatencyStore {
    async fn get(&self, key: &str) -> StoreResult<Option<Object>> {
        tokio::time::sleep(self.delay).await;
        self.inner.get(key).await
    }

    async fn get_if_changed(&self, key: &str, etag: &ETag) -> StoreResult<Fetched> {
        tokio::time::sleep(self.delay).await;
        self.inner.get_if_changed(key, etag).await
    }

    async fn put_if_absent(&self, key: &str, data: Bytes) -> StoreResult<ETag> {
        tokio::time::sleep(self.delay).await;
        self.inner.put_if_absent(key, data).await
    }

    async fn put_if_match(&self, key: &str, data: Bytes, etag: &ETag) -> StoreResult<ETag> {
        tokio::time::sleep(self.delay).await;
        self.inner.put_if_match(key, data, etag).await
    }

    async fn delete(&self, key: &str) -> StoreResult<()> {
        tokio::time::sleep(self.delay).await;
        self.inner.delete(key).await
    }

    async fn list(&self, prefix: &str) -> StoreResult<Vec<String>> {
        tokio::time::sleep(self.delay).await;
        self.inner.list(prefix).await
    }

    async fn list_after(&self, prefix: &str, after: &str, max: usize) -> StoreResult<Vec<String>> {
        tokio::time::sleep(self.delay).await;
        self.inner.list_after(prefix, after, max).await
    }

    async fn list_dirs(&self, prefix: &str, after: &str, max: usize) -> StoreResult<Vec<String>> {
        tokio::time::sleep(self.delay).await;
        self.inner.list_dirs(prefix, after, max).await
    }

    async fn list_files(&self, prefix: &str) -> StoreResult<Vec<Listed>> {
        tokio::time::sleep(self.delay).await;
        self.inner.list_files(prefix).await
    }

    async fn delete_folders(&self, prefix: &str, deleted: &[String]) -> StoreResult<()> {
        tokio::time::sleep(self.delay).await;
        self.inner.delete_folders(prefix, deleted).await
    }

    fn key_write_interval(&self) -> Duration {
        self.inner.key_write_interval()
    }

    fn write_wait(&self, key: &str) -> Duration {
        self.inner.write_wait(key)
    }

    fn describe(&self) -> String {
        format!(
            "{} (+{} ms emulated latency per request)",
            self.inner.describe(),
            self.delay.as_millis()
        )
    }
}
