//! A least-recently-used cache of immutable decoded objects (segments, index objects),
//! bounded in bytes rather than entries, so a few large segments cannot crowd memory and
//! many small ones cannot crowd each other out. Objects are immutable, so a cached copy
//! never goes stale.

use std::sync::{Arc, Mutex, MutexGuard};

use crate::formats::{Newer, Unreadable};
use crate::store::{Store, StoreError};

/// Why [`Cache::read_through`] found no value.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// The store failed.
    #[error(transparent)]
    Store(#[from] StoreError),
    /// The stored object does not decode.
    #[error("corrupt stored object {key}: {detail}")]
    Corrupt {
        /// Its key.
        key: String,
        /// What is wrong.
        detail: String,
    },
    /// A newer version of Narad wrote the stored object.
    #[error("{key} was written by a newer version of Narad: {newer}")]
    Newer {
        /// Its key.
        key: String,
        /// Which version, and the newest this build knows.
        newer: Newer,
    },
}

/// How much memory a cached value takes, roughly.
pub(crate) trait Weigh {
    /// Approximate size in bytes.
    fn weight(&self) -> usize;
}

struct Inner<V> {
    lru: lru::LruCache<String, Arc<V>>,
    bytes: usize,
}

/// A byte-bounded LRU cache keyed by object key.
pub(crate) struct Cache<V: Weigh> {
    cap_bytes: usize,
    inner: Mutex<Inner<V>>,
}

impl<V: Weigh> Cache<V> {
    /// A cache holding up to about `cap_bytes` of values (one value larger than that is
    /// not kept).
    pub(crate) fn new(cap_bytes: usize) -> Self {
        Self {
            cap_bytes,
            inner: Mutex::new(Inner {
                lru: lru::LruCache::unbounded(),
                bytes: 0,
            }),
        }
    }

    fn lock(&self) -> MutexGuard<'_, Inner<V>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The value stored under `key`, if cached.
    pub(crate) fn get(&self, key: &str) -> Option<Arc<V>> {
        self.lock().lru.get(key).cloned()
    }

    /// True if `key` is cached (without touching its recency).
    pub(crate) fn contains(&self, key: &str) -> bool {
        self.lock().lru.contains(key)
    }

    /// Caches `value` under `key`, evicting the least recently used beyond the bound.
    pub(crate) fn put(&self, key: String, value: Arc<V>) {
        let w = value.weight();
        if w > self.cap_bytes {
            return;
        }
        let mut inner = self.lock();
        if let Some(old) = inner.lru.put(key, value) {
            inner.bytes -= old.weight();
        }
        inner.bytes += w;
        while inner.bytes > self.cap_bytes {
            match inner.lru.pop_lru() {
                Some((_, v)) => inner.bytes -= v.weight(),
                None => break,
            }
        }
    }

    /// The value of the object at `key`: cached, or read from `store`, decoded with
    /// `decode` and cached. `None` if the object does not exist.
    ///
    /// Errors: [`ReadError`].
    pub(crate) async fn read_through(
        &self,
        store: &dyn Store,
        key: &str,
        decode: impl FnOnce(&[u8]) -> Result<V, Unreadable>,
    ) -> Result<Option<Arc<V>>, ReadError> {
        if let Some(v) = self.get(key) {
            return Ok(Some(v));
        }
        let Some(obj) = store.get(key).await? else {
            return Ok(None);
        };
        let key = key.to_owned();
        let v = decode(&obj.data).map_err(|e| match e {
            Unreadable::Corrupt(detail) => ReadError::Corrupt {
                key: key.clone(),
                detail,
            },
            Unreadable::Newer(newer) => ReadError::Newer {
                key: key.clone(),
                newer,
            },
        })?;
        let v = Arc::new(v);
        self.put(key, v.clone());
        Ok(Some(v))
    }

    #[cfg(test)]
    /// Bytes held now.
    pub(crate) fn bytes(&self) -> usize {
        self.lock().bytes
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    struct Blob(usize);
    impl Weigh for Blob {
        fn weight(&self) -> usize {
            self.0
        }
    }

    #[test]
    fn evicts_least_recently_used_beyond_the_byte_bound() {
        let c = Cache::new(100);
        c.put("a".into(), Arc::new(Blob(40)));
        c.put("b".into(), Arc::new(Blob(40)));
        assert!(c.get("a").is_some());
        c.put("c".into(), Arc::new(Blob(40)));
        assert!(c.get("b").is_none(), "b was least recently used");
        assert!(c.get("a").is_some() && c.get("c").is_some());
        assert_eq!(c.bytes(), 80);
        c.put("huge".into(), Arc::new(Blob(101)));
        assert!(c.get("huge").is_none());
        c.put("a".into(), Arc::new(Blob(10)));
        assert_eq!(c.bytes(), 50);
    }
}
