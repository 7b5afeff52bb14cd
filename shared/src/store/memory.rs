//! An in-memory [`Store`]: the reference backend for tests. Nothing survives the process.
//!
//! ETags are content hashes, so rewriting identical bytes gives the same ETag, exactly
//! the ABA hazard S3 has; the manifest's version guards against it.

use std::collections::BTreeMap;

use async_trait::async_trait;
use bytes::Bytes;
use tokio::sync::Mutex;

use super::{content_etag, ETag, Listed, Object, Store, StoreError, StoreResult};

/// A map behind one lock; every operation is atomic.
#[derive(Debug, Default)]
pub struct MemoryStore {
    objects: Mutex<BTreeMap<String, Object>>,
}

impl MemoryStore {
    /// An empty store.
    pub fn new() -> Self {
        Self::default()
    }
}

#[async_trait]
impl Store for MemoryStore {
    async fn get(&self, key: &str) -> StoreResult<Option<Object>> {
        Ok(self.objects.lock().await.get(key).cloned())
    }

    async fn put_if_absent(&self, key: &str, data: Bytes) -> StoreResult<ETag> {
        let mut map = self.objects.lock().await;
        if map.contains_key(key) {
            return Err(StoreError::Conflict);
        }
        let etag = content_etag(&data);
        map.insert(
            key.to_owned(),
            Object {
                data,
                etag: etag.clone(),
            },
        );
        Ok(etag)
    }

    async fn put_if_match(&self, key: &str, data: Bytes, etag: &ETag) -> StoreResult<ETag> {
        let mut map = self.objects.lock().await;
        match map.get_mut(key) {
            None => Err(StoreError::NotFound),
            Some(cur) if cur.etag != *etag => Err(StoreError::Conflict),
            Some(cur) => {
                let new = content_etag(&data);
                *cur = Object {
                    data,
                    etag: new.clone(),
                };
                Ok(new)
            }
        }
    }

    async fn delete(&self, key: &str) -> StoreResult<()> {
        self.objects.lock().await.remove(key);
        Ok(())
    }

    async fn list(&self, prefix: &str) -> StoreResult<Vec<String>> {
        let map = self.objects.lock().await;
        Ok(map
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .map(|(k, _)| k.clone())
            .collect())
    }

    async fn list_after(&self, prefix: &str, after: &str, max: usize) -> StoreResult<Vec<String>> {
        use std::ops::Bound;
        let map = self.objects.lock().await;
        let from = format!("{prefix}{after}");
        Ok(map
            .range((Bound::Excluded(from), Bound::Unbounded))
            .take_while(|(k, _)| k.starts_with(prefix))
            .take(max)
            .map(|(k, _)| k.clone())
            .collect())
    }

    async fn list_files(&self, prefix: &str) -> StoreResult<Vec<Listed>> {
        let map = self.objects.lock().await;
        Ok(map
            .range(prefix.to_owned()..)
            .take_while(|(k, _)| k.starts_with(prefix))
            .filter(|(k, _)| !k[prefix.len()..].contains('/'))
            .take(super::MAX_LISTED_FILES)
            .map(|(k, o)| Listed {
                key: k.clone(),
                etag: o.etag.clone(),
            })
            .collect())
    }

    fn describe(&self) -> String {
        "memory://".to_owned()
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    #[tokio::test(flavor = "multi_thread", worker_threads = 4)]
    async fn conformance() {
        let store = Arc::new(super::MemoryStore::new());
        crate::store::testing::conformance::run_all(store, "t").await;
    }
}
