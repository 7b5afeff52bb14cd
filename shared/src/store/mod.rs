//! The object-store contract every Narad backend implements.
//!
//! Narad keeps all of its state in a flat key space of immutable or
//! conditionally replaced objects. A backend offers these operations:
//!
//! * [`Store::get`]: the bytes of an object and its ETag, or `None` when it is absent.
//! * [`Store::put_if_absent`]: create an object only if no object has that key
//!   (`If-None-Match: *`). Fails with [`StoreError::Conflict`] if it exists.
//! * [`Store::put_if_match`]: replace an object only if its current ETag equals the
//!   given one (`If-Match`). Fails with [`StoreError::Conflict`] if the object changed
//!   and with [`StoreError::NotFound`] if it no longer exists.
//! * [`Store::get_if_changed`]: a conditional read (`If-None-Match`) that answers
//!   [`Fetched::Unchanged`] when the caller's ETag is still current.
//! * [`Store::delete`]: remove an object; deleting an absent object succeeds.
//! * [`Store::list`]: every key that starts with a prefix, in lexicographic order.
//! * [`Store::list_after`]: one page of those keys, after a given key.
//!
//! ETags are opaque strings compared for equality only. Identical content may get
//! the same ETag (as on S3), so callers that need to tell two writes of the same bytes
//! apart must put a version in the content (the manifest does).
//!
//! Errors are typed: a lost race is [`StoreError::Conflict`], never a string to match.
//! [`StoreError::Unavailable`] marks a transient failure (throttling, 5xx, timeouts)
//! that the caller may retry and that the HTTP edge reports as 503 with `Retry-After`.
//!
//! Every backend must pass `testing::conformance::run_all` (behind the `testing` feature).

pub mod file;
pub mod keyrate;
pub mod latency;
pub mod local;
pub mod memory;
pub mod metered;
pub mod paced;
#[cfg(feature = "s3")]
pub mod s3;
#[cfg(any(test, feature = "testing"))]
pub mod testing;

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;

/// The version tag a store gives an object's content (S3's ETag, quotes included): opaque,
/// only ever compared for equality and passed back to [`Store::put_if_match`] or
/// [`Store::get_if_changed`]. A type of its own so that it cannot be swapped with a key.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub struct ETag(String);

impl ETag {
    /// The tag a store answered.
    pub fn new(tag: impl Into<String>) -> Self {
        Self(tag.into())
    }

    /// The tag as the store spells it.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl std::fmt::Display for ETag {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// An object's content and the ETag the store gave that content.
#[derive(Debug, Clone)]
pub struct Object {
    /// The object's bytes.
    pub data: Bytes,
    /// The opaque version tag to pass to [`Store::put_if_match`].
    pub etag: ETag,
}

/// The answer to a conditional read ([`Store::get_if_changed`]).
#[derive(Debug, Clone)]
pub enum Fetched {
    /// The object still has the ETag the caller holds.
    Unchanged,
    /// The object does not exist.
    Missing,
    /// The object changed; here it is.
    Object(Object),
}

/// The underlying error of a failed store call: a message for logs, and the error that
/// caused it (an SDK or I/O error), kept as the [`std::error::Error::source`].
#[derive(Debug, Clone)]
pub struct Failure {
    message: String,
    source: Option<Arc<dyn std::error::Error + Send + Sync>>,
}

impl Failure {
    /// A failure caused by `source`.
    pub fn caused_by(
        message: impl Into<String>,
        source: impl std::error::Error + Send + Sync + 'static,
    ) -> Self {
        Self {
            message: message.into(),
            source: Some(Arc::new(source)),
        }
    }

    /// The message (never includes the source's own text).
    pub fn message(&self) -> &str {
        &self.message
    }
}

impl std::fmt::Display for Failure {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for Failure {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        self.source
            .as_deref()
            .map(|e| e as &(dyn std::error::Error + 'static))
    }
}

impl From<String> for Failure {
    fn from(message: String) -> Self {
        Self {
            message,
            source: None,
        }
    }
}

impl From<&str> for Failure {
    fn from(message: &str) -> Self {
        message.to_owned().into()
    }
}

/// What can go wrong talking to a store.
#[derive(Debug, Clone, thiserror::Error)]
pub enum StoreError {
    /// A conditional write lost: the object exists (`put_if_absent`) or changed (`put_if_match`).
    #[error("conditional write conflict")]
    Conflict,
    /// The object a conditional replace named does not exist.
    #[error("object not found")]
    NotFound,
    /// A transient failure worth retrying later (throttling, 5xx, timeout, lost response).
    /// The request may or may not have been applied.
    #[error("storage temporarily unavailable: {0}")]
    Unavailable(#[source] Failure),
    /// A permanent failure (permissions, misconfiguration).
    #[error("storage error: {0}")]
    Other(#[source] Failure),
    /// The stored object fails the store's own integrity check (a body checksum that
    /// does not match, read after read): its bytes are damaged, so retrying cannot help.
    #[error("corrupt stored object: {0}")]
    Corrupt(#[source] Failure),
}

impl StoreError {
    /// A permanent failure described by `message`.
    pub fn other(message: impl Into<String>) -> Self {
        Self::Other(Failure::from(message.into()))
    }

    /// A transient failure described by `message`.
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::Unavailable(Failure::from(message.into()))
    }
}

/// Result of a store call.
pub type StoreResult<T> = Result<T, StoreError>;

/// A shared handle to any store.
pub type DynStore = Arc<dyn Store>;

/// The storage contract. See the module documentation for the exact semantics.
#[async_trait]
pub trait Store: Send + Sync + 'static {
    /// Reads an object. `Ok(None)` when it does not exist.
    async fn get(&self, key: &str) -> StoreResult<Option<Object>>;

    /// Reads `key` unless its ETag is still `etag` (`If-None-Match`): the cheap way to
    /// check that a cached copy is current. The default reads the whole object.
    async fn get_if_changed(&self, key: &str, etag: &ETag) -> StoreResult<Fetched> {
        Ok(match self.get(key).await? {
            None => Fetched::Missing,
            Some(o) if o.etag == *etag => Fetched::Unchanged,
            Some(o) => Fetched::Object(o),
        })
    }

    /// Creates `key` with `data` unless it exists. Returns the new ETag.
    /// Errors: [`StoreError::Conflict`] when the key already exists.
    async fn put_if_absent(&self, key: &str, data: Bytes) -> StoreResult<ETag>;

    /// Replaces `key` with `data` if its ETag is still `etag`. Returns the new ETag.
    /// Errors: [`StoreError::Conflict`] when the ETag differs, [`StoreError::NotFound`]
    /// when the object does not exist.
    async fn put_if_match(&self, key: &str, data: Bytes, etag: &ETag) -> StoreResult<ETag>;

    /// Deletes `key`. Deleting a missing key is not an error.
    async fn delete(&self, key: &str) -> StoreResult<()>;

    /// Every key starting with `prefix`, sorted.
    async fn list(&self, prefix: &str) -> StoreResult<Vec<String>>;

    /// At most `max` keys starting with `prefix` that sort after `prefix` + `after`, in
    /// order: one page of a strongly consistent listing (`ListObjectsV2` with
    /// `StartAfter`), so its cost does not grow with the keys before `after`. The default
    /// filters [`Store::list`].
    async fn list_after(&self, prefix: &str, after: &str, max: usize) -> StoreResult<Vec<String>> {
        let from = format!("{prefix}{after}");
        let mut keys = self.list(prefix).await?;
        keys.retain(|k| *k > from);
        keys.truncate(max);
        Ok(keys)
    }

    /// The names directly under `prefix` (which ends with `/`) that have keys below them:
    /// each distinct next key segment followed by a `/`, strictly after the name `after`
    /// (empty: from the start), at most `max`, in key order (a name compares as if followed
    /// by `/`). One page of a delimited listing (`ListObjectsV2` with `Delimiter=/`), so
    /// its cost does not grow with the objects below each name. The default derives it
    /// from [`Store::list`].
    ///
    /// A name whose keys have all been deleted may still be listed for a while (SeaweedFS
    /// keeps the empty folder until its cleanup runs, minutes later) unless the deleter
    /// also called [`Store::delete_folders`].
    async fn list_dirs(&self, prefix: &str, after: &str, max: usize) -> StoreResult<Vec<String>> {
        let names = self
            .list(prefix)
            .await?
            .iter()
            .filter_map(|k| k.strip_prefix(prefix)?.split_once('/'))
            .map(|(d, _)| d.to_owned())
            .collect();
        Ok(dir_page(names, after, max))
    }

    /// The objects directly under `prefix` (which ends with `/`), with their ETags, in key
    /// order: keys with no further `/` after the prefix, at most [`MAX_LISTED_FILES`]. One
    /// page of a delimited listing (`ListObjectsV2` with `Delimiter=/`): one request however
    /// many objects lie deeper, and the ETags equal what [`Store::get`] answers, so a
    /// caller can tell which cached objects changed without reading them (the idle
    /// watch, `broker/watch.rs`). The default derives it from [`Store::list`] and
    /// [`Store::get`].
    async fn list_files(&self, prefix: &str) -> StoreResult<Vec<Listed>> {
        let mut out = Vec::new();
        for key in self.list(prefix).await? {
            let direct = key.strip_prefix(prefix).is_some_and(|r| !r.contains('/'));
            if !direct || out.len() >= MAX_LISTED_FILES {
                continue;
            }
            if let Some(o) = self.get(&key).await? {
                out.push(Listed { key, etag: o.etag });
            }
        }
        Ok(out)
    }

    /// Forgets the folders below `prefix` (which ends with `/`, and counts as one) that the
    /// keys in `deleted` lived in, once those keys are deleted, so that [`Store::list_dirs`]
    /// stops naming them. A folder that still holds a key is left alone. Folders are implicit
    /// on S3 and the file store removes empty directories itself, so the default does nothing;
    /// the S3 store deletes each folder's own key (`folder/`), deepest first, for SeaweedFS,
    /// whose gateway keeps an emptied folder listed for minutes otherwise (on S3 such a
    /// DELETE of a missing key is free and harmless).
    async fn delete_folders(&self, prefix: &str, deleted: &[String]) -> StoreResult<()> {
        let _ = (prefix, deleted);
        Ok(())
    }

    /// How long the store needs between two writes of one key: zero for S3 and the
    /// file store, one second for Cloudflare R2 (beyond it, 429). The committer spaces
    /// its commits of one object by this (docs/design.md §6, "Pacing").
    fn key_write_interval(&self) -> std::time::Duration {
        std::time::Duration::ZERO
    }

    /// How long a write of `key` issued now would wait for its turn: zero unless the
    /// store paces writes per key (`store/paced.rs`). The committer waits this out before
    /// it takes a batch, so that what arrives meanwhile rides in the batch.
    fn write_wait(&self, key: &str) -> std::time::Duration {
        let _ = key;
        std::time::Duration::ZERO
    }

    /// A short description for logs and startup messages (never contains secrets).
    fn describe(&self) -> String;
}

/// The folders `keys` lie in, from `prefix` itself (which ends with `/`) down, each ending
/// with `/`, deepest first (so each is empty when its turn comes), without repeats. Keys
/// outside `prefix` are ignored.
pub fn folders_below(prefix: &str, keys: &[String]) -> Vec<String> {
    let mut folders = std::collections::BTreeSet::new();
    for key in keys {
        let Some(rest) = key.strip_prefix(prefix) else {
            continue;
        };
        folders.insert(prefix.to_owned());
        let mut end = 0;
        while let Some(slash) = rest[end..].find('/') {
            end += slash + 1;
            folders.insert(format!("{prefix}{}", &rest[..end]));
        }
    }
    let mut out: Vec<String> = folders.into_iter().collect();
    // Deepest first; within one depth, in key order.
    out.sort_by(|a, b| {
        let depth = |s: &str| s.matches('/').count();
        depth(b).cmp(&depth(a)).then_with(|| a.cmp(b))
    });
    out
}

/// Most objects one [`Store::list_files`] answers (one S3 listing page, which also
/// counts the sub-prefixes beside them: callers keep both together under 1000).
pub const MAX_LISTED_FILES: usize = 1000;

/// One object of a [`Store::list_files`] listing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Listed {
    /// The key, relative to the store's root.
    pub key: String,
    /// Its ETag, as [`Store::get`] would answer it.
    pub etag: ETag,
}

/// One page of directory names as [`Store::list_dirs`] returns it, from `names` in any
/// order, with duplicates.
pub(crate) fn dir_page(mut names: Vec<String>, after: &str, max: usize) -> Vec<String> {
    let key = |n: &str| format!("{n}/");
    names.sort_by_key(|n| key(n));
    names.dedup();
    if !after.is_empty() {
        let from = key(after);
        names.retain(|n| key(n) > from);
    }
    names.truncate(max);
    names
}

/// Opens a store from a URL: `file://PATH`, `memory://` or `s3://BUCKET[/PREFIX]`.
///
/// Errors: [`StoreError::Other`] for an unknown scheme or a backend that fails its
/// startup probe (missing bucket, missing credentials, no conditional writes).
pub async fn open(url: &str) -> StoreResult<DynStore> {
    if let Some(path) = url.strip_prefix("file://") {
        let store = file::FileStore::open(path).await?;
        Ok(Arc::new(store))
    } else if url == "memory://" || url == "memory" {
        Ok(Arc::new(memory::MemoryStore::new()))
    } else if let Some(rest) = url.strip_prefix("s3://") {
        open_s3(rest).await
    } else {
        Err(StoreError::other(format!(
            "unknown store URL {url:?}: expected file://PATH, memory:// or s3://BUCKET[/PREFIX]"
        )))
    }
}

#[cfg(feature = "s3")]
async fn open_s3(rest: &str) -> StoreResult<DynStore> {
    Ok(Arc::new(s3::S3Store::open(rest).await?))
}

/// A build without the S3 backend (a wasm32 core) refuses `s3://` URLs.
#[cfg(not(feature = "s3"))]
async fn open_s3(_: &str) -> StoreResult<DynStore> {
    Err(StoreError::other(
        "this build has no S3 backend (narad-shared's `s3` feature)",
    ))
}

/// How a local store is made to behave like a remote one, for benchmarks and tests only
/// (never in production): each part is off when zero.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Emulation {
    /// Added to every request (`NARAD_STORE_LATENCY_MS`: S3's round trip on loopback).
    pub latency: std::time::Duration,
    /// A second write of one key within this is refused (`NARAD_STORE_KEY_WRITE_INTERVAL_MS`:
    /// R2's one write per second per key).
    pub key_write_interval: std::time::Duration,
}

/// [`open`], behaving as `emulation` says.
pub async fn open_emulated(url: &str, emulation: Emulation) -> StoreResult<DynStore> {
    let mut store = open(url).await?;
    if !emulation.key_write_interval.is_zero() {
        store = Arc::new(keyrate::KeyRateStore::new(
            store,
            emulation.key_write_interval,
        ));
    }
    if !emulation.latency.is_zero() {
        store = Arc::new(latency::LatencyStore::new(store, emulation.latency));
    }
    Ok(store)
}

/// The ETag a content-addressed backend gives `data`: hex SHA-256, like S3's MD5 ETags
/// it is equal for equal bytes.
pub(crate) fn content_etag(data: &[u8]) -> ETag {
    use sha2::{Digest, Sha256};
    use std::fmt::Write;
    let digest = Sha256::digest(data);
    let mut out = String::with_capacity(32);
    for b in &digest[..16] {
        let _ = write!(out, "{b:02x}");
    }
    ETag(out)
}

#[cfg(test)]
mod tests {
    use super::folders_below;

    #[test]
    fn folders_come_deepest_first_from_the_prefix_down() {
        let keys: Vec<String> = [
            "topics/t/topic.json",
            "topics/t/0.manifest.json",
            "topics/t/0/segments/s1",
            "topics/t/0/segments/s2",
            "topics/t/1/indexes/i",
            "elsewhere/x",
        ]
        .iter()
        .map(|k| k.to_string())
        .collect();
        assert_eq!(
            folders_below("topics/t/", &keys),
            vec![
                "topics/t/0/segments/",
                "topics/t/1/indexes/",
                "topics/t/0/",
                "topics/t/1/",
                "topics/t/",
            ]
        );
        assert!(folders_below("topics/t/", &[]).is_empty());
        assert!(folders_below("topics/t/", &["topics/u/x".to_string()]).is_empty());
    }
}
