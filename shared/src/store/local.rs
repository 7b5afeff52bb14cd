//! A store whose futures are not `Send`: what a single-threaded runtime offers, such as a
//! Cloudflare Worker on `wasm32`, where an R2 binding's every call is a JavaScript promise.
//!
//! The core runs on [`Store`], whose futures are `Send` so that `narad serve` can run
//! commits on any thread of tokio's pool. A backend that cannot promise that implements
//! [`LocalStore`] instead (`#[async_trait(?Send)]`, the pattern object_store's wasm
//! backends and workers-rs use), and [`Local`] makes it a [`Store`]: each of its futures is
//! wrapped in a [`SendWrapper`], which is `Send` and panics if it is ever polled or dropped
//! on a thread other than the one that made it. On `wasm32-unknown-unknown` there is one
//! thread, so that never happens; on a native multi-threaded runtime it would, and a
//! `Local` store is for single-threaded runtimes only (a current-thread tokio runtime in
//! the tests below).

use async_trait::async_trait;
use bytes::Bytes;
use send_wrapper::SendWrapper;

use super::{ETag, Fetched, Listed, Object, Store, StoreResult};

/// The storage contract of [`Store`], with futures that need not be `Send`. Every method
/// means what [`Store`]'s of the same name means; none has a default, since each is one
/// request of the backend (a conditional GET, a listing from a key, a delimited listing).
#[async_trait(?Send)]
pub trait LocalStore: 'static {
    /// [`Store::get`].
    async fn get(&self, key: &str) -> StoreResult<Option<Object>>;
    /// [`Store::get_if_changed`].
    async fn get_if_changed(&self, key: &str, etag: &ETag) -> StoreResult<Fetched>;
    /// [`Store::put_if_absent`].
    async fn put_if_absent(&self, key: &str, data: Bytes) -> StoreResult<ETag>;
    /// [`Store::put_if_match`].
    async fn put_if_match(&self, key: &str, data: Bytes, etag: &ETag) -> StoreResult<ETag>;
    /// [`Store::delete`].
    async fn delete(&self, key: &str) -> StoreResult<()>;
    /// [`Store::list`].
    async fn list(&self, prefix: &str) -> StoreResult<Vec<String>>;
    /// [`Store::list_after`].
    async fn list_after(&self, prefix: &str, after: &str, max: usize) -> StoreResult<Vec<String>>;
    /// [`Store::list_dirs`].
    async fn list_dirs(&self, prefix: &str, after: &str, max: usize) -> StoreResult<Vec<String>>;
    /// [`Store::list_files`].
    async fn list_files(&self, prefix: &str) -> StoreResult<Vec<Listed>>;
    /// [`Store::key_write_interval`].
    fn key_write_interval(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }
    /// [`Store::describe`].
    fn describe(&self) -> String;
}

/// A [`LocalStore`] as a [`Store`], for single-threaded runtimes (see the module
/// documentation).
pub struct Local<S>(SendWrapper<S>);

impl<S: LocalStore> Local<S> {
    /// Wraps `store`, on the thread that will use it.
    pub fn new(store: S) -> Self {
        Self(SendWrapper::new(store))
    }
}

impl<S> std::fmt::Debug for Local<S> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Local")
    }
}

#[async_trait]
impl<S: LocalStore> Store for Local<S> {
    async fn get(&self, key: &str) -> StoreResult<Option<Object>> {
        SendWrapper::new(self.0.get(key)).await
    }

    async fn get_if_changed(&self, key: &str, etag: &ETag) -> StoreResult<Fetched> {
        SendWrapper::new(self.0.get_if_changed(key, etag)).await
    }

    async fn put_if_absent(&self, key: &str, data: Bytes) -> StoreResult<ETag> {
        SendWrapper::new(self.0.put_if_absent(key, data)).await
    }

    async fn put_if_match(&self, key: &str, data: Bytes, etag: &ETag) -> StoreResult<ETag> {
        SendWrapper::new(self.0.put_if_match(key, data, etag)).await
    }

    async fn delete(&self, key: &str) -> StoreResult<()> {
        SendWrapper::new(self.0.delete(key)).await
    }

    async fn list(&self, prefix: &str) -> StoreResult<Vec<String>> {
        SendWrapper::new(self.0.list(prefix)).await
    }

    async fn list_after(&self, prefix: &str, after: &str, max: usize) -> StoreResult<Vec<String>> {
        SendWrapper::new(self.0.list_after(prefix, after, max)).await
    }

    async fn list_dirs(&self, prefix: &str, after: &str, max: usize) -> StoreResult<Vec<String>> {
        SendWrapper::new(self.0.list_dirs(prefix, after, max)).await
    }

    async fn list_files(&self, prefix: &str) -> StoreResult<Vec<Listed>> {
        SendWrapper::new(self.0.list_files(prefix)).await
    }

    fn key_write_interval(&self) -> std::time::Duration {
        self.0.key_write_interval()
    }

    fn describe(&self) -> String {
        self.0.describe()
    }
}

#[cfg(test)]
mod tests {
    use std::rc::Rc;
    use std::sync::Arc;

    use super::*;
    use crate::store::memory::MemoryStore;
    use crate::store::DynStore;

    /// A store that is neither `Send` nor `Sync` (its handle is an `Rc`), over memory.
    struct RcStore(Rc<MemoryStore>);

    #[async_trait(?Send)]
    impl LocalStore for RcStore {
        async fn get(&self, key: &str) -> StoreResult<Option<Object>> {
            self.0.get(key).await
        }
        async fn get_if_changed(&self, key: &str, etag: &ETag) -> StoreResult<Fetched> {
            self.0.get_if_changed(key, etag).await
        }
        async fn put_if_absent(&self, key: &str, data: Bytes) -> StoreResult<ETag> {
            self.0.put_if_absent(key, data).await
        }
        async fn put_if_match(&self, key: &str, data: Bytes, etag: &ETag) -> StoreResult<ETag> {
            self.0.put_if_match(key, data, etag).await
        }
        async fn delete(&self, key: &str) -> StoreResult<()> {
            self.0.delete(key).await
        }
        async fn list(&self, prefix: &str) -> StoreResult<Vec<String>> {
            self.0.list(prefix).await
        }
        async fn list_after(&self, p: &str, after: &str, max: usize) -> StoreResult<Vec<String>> {
            self.0.list_after(p, after, max).await
        }
        async fn list_dirs(&self, p: &str, after: &str, max: usize) -> StoreResult<Vec<String>> {
            self.0.list_dirs(p, after, max).await
        }
        async fn list_files(&self, prefix: &str) -> StoreResult<Vec<Listed>> {
            self.0.list_files(prefix).await
        }
        fn describe(&self) -> String {
            "rc".into()
        }
    }

    #[tokio::test]
    async fn a_store_without_send_futures_passes_the_conformance_suite() {
        let store: DynStore = Arc::new(Local::new(RcStore(Rc::new(MemoryStore::new()))));
        crate::store::testing::conformance::run_all(store, "local").await;
    }
}
