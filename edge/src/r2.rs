//! The R2 backend: a Worker's R2 bucket binding as a [`LocalStore`] (its futures are
//! JavaScript promises, not `Send`), made a `Store` by
//! [`narad_shared::store::local::Local`].
//!
//! Keys passed to the store are relative to its prefix (empty, or ending in one `/`), as on
//! the S3 store; listings answer them relative to it too.
//!
//! # Contract (docs of `narad_shared::store`, and the conformance suite)
//!
//! * `get` is `bucket.get(key)`; an absent key is `None`.
//! * `get_if_changed` is a `get` with `onlyIf.etagDoesNotMatch`: R2 answers an object
//!   without a body when the condition fails (the ETag is still current).
//! * `put_if_absent` is a `put` with `onlyIf.etagDoesNotMatch = "*"`; `put_if_match` one
//!   with `onlyIf.etagMatches`. A failed condition makes R2's `put` answer `null` (and
//!   store nothing), on a missing key as on a stale ETag alike, so a failed `put_if_match`
//!   costs one `head` more to answer `NotFound` for a missing key and `Conflict` otherwise.
//! * `delete` is `bucket.delete(key)`; deleting a missing key succeeds.
//! * Listings loop on `truncated` and the `cursor` (R2 "returns up to 1000 entries, but may
//!   return less"), never on the count, and end after [`MAX_PAGES`] pages at most.
//!
//! # ETags
//!
//! Narad's [`ETag`] is R2's `httpEtag`, quotes included, like S3's ETag headers: equal
//! bytes, equal tags (the MD5 of the body). R2's conditions want the tag **without** its
//! quotes (workerd throws "Conditional ETag should not be wrapped in quotes"), so
//! [`unquoted`] is the one place a tag is turned into a condition.
//!
//! # Errors
//!
//! R2 throws a JavaScript `Error` whose message ends in its code, `put: Unspecified error
//! (0)`. Codes 10058 (too many requests: 1 write per second per key), 10001 (internal
//! error), 10043 (unavailable) and 0 (unspecified) are [`StoreError::Unavailable`]; any
//! other error is [`StoreError::Other`]. A body that cannot be read is `Unavailable`.
//! Nothing is retried here: a conditional put whose outcome is unknown must reach the
//! caller as `Unavailable`.

use async_trait::async_trait;
use bytes::Bytes;
use narad_shared::store::local::LocalStore;
use narad_shared::store::{
    ETag, Fetched, Listed, Object, StoreError, StoreResult, MAX_LISTED_FILES,
};
use worker::{Bucket, Conditional, Objects};

/// Most entries one R2 listing may answer (its `limit`, at most 1000).
const PAGE: u32 = 1000;
/// Most pages one listing reads before it gives up: a million keys, well past what one
/// Worker invocation may ask R2 for (about a thousand subrequests).
const MAX_PAGES: usize = 1000;
/// R2's error codes that mark a transient failure (r2/api/error-codes).
const TRANSIENT_CODES: [u32; 4] = [10058, 10001, 10043, 0];

/// A [`LocalStore`] on an R2 bucket binding, below a key prefix.
#[derive(Debug, Clone)]
pub struct R2Store {
    bucket: Bucket,
    /// Empty, or the key prefix with exactly one trailing `/`.
    prefix: String,
    /// What the broker spaces writes of one key by ([`R2_WRITE_INTERVAL`] unless a local
    /// R2 that does not enforce the limit is told otherwise).
    write_interval: std::time::Duration,
}

/// R2: "maximum concurrent writes to the same object name: 1 per second" (429 beyond).
pub const R2_WRITE_INTERVAL: std::time::Duration = std::time::Duration::from_secs(1);

/// Where one listing request starts.
enum Start<'a> {
    /// At the prefix's first key, or after the full key given.
    After(Option<&'a str>),
    /// Where the page before it ended.
    Cursor(String),
}

impl R2Store {
    /// The store on `bucket` whose keys live below `prefix` (surrounding `/` ignored; empty:
    /// the whole bucket).
    pub fn new(bucket: Bucket, prefix: &str) -> Self {
        let prefix = prefix.trim_matches('/');
        let prefix = if prefix.is_empty() {
            String::new()
        } else {
            format!("{prefix}/")
        };
        Self {
            bucket,
            prefix,
            write_interval: R2_WRITE_INTERVAL,
        }
    }

    /// The same store, its writes of one key spaced by `interval` instead of R2's second:
    /// only for a local R2 (`wrangler dev`), which does not enforce the limit.
    pub fn with_write_interval(mut self, interval: std::time::Duration) -> Self {
        self.write_interval = interval;
        self
    }

    fn full_key(&self, key: &str) -> String {
        format!("{}{key}", self.prefix)
    }

    /// A full key relative to the store's prefix (`None` for a key outside it).
    fn relative(&self, full: &str) -> Option<String> {
        full.strip_prefix(&self.prefix).map(str::to_owned)
    }

    /// Reads the pages of one listing under the full prefix `full` (grouped by `/` when
    /// `delimited`), from `start`, `limit` entries a page, giving each to `take` until it
    /// answers that it has enough or the listing ends.
    ///
    /// Errors: R2's, or [`StoreError::Other`] when a truncated page has no cursor or the
    /// listing does not end within [`MAX_PAGES`] pages.
    async fn walk(
        &self,
        full: &str,
        (start, delimited, limit): (Option<&str>, bool, u32),
        mut take: impl FnMut(&Objects) -> bool,
    ) -> StoreResult<()> {
        let mut from = Start::After(start);
        for _ in 0..MAX_PAGES {
            let mut list = self.bucket.list().prefix(full).limit(limit.clamp(1, PAGE));
            if delimited {
                list = list.delimiter("/");
            }
            list = match from {
                Start::After(Some(after)) => list.start_after(after),
                Start::After(None) => list,
                Start::Cursor(cursor) => list.cursor(cursor),
            };
            let page = list.execute().await.map_err(|e| map_err("list", full, e))?;
            if take(&page) || !page.truncated() {
                return Ok(());
            }
            let Some(cursor) = page.cursor() else {
                return Err(StoreError::other(format!(
                    "R2 list {full}: a truncated page without a cursor"
                )));
            };
            from = Start::Cursor(cursor);
        }
        Err(StoreError::other(format!(
            "R2 list {full}: the listing did not end within {MAX_PAGES} pages"
        )))
    }
}

#[async_trait(?Send)]
impl LocalStore for R2Store {
    async fn get(&self, key: &str) -> StoreResult<Option<Object>> {
        let full = self.full_key(key);
        let got = self.bucket.get(full.as_str()).execute().await;
        match got.map_err(|e| map_err("get", &full, e))? {
            None => Ok(None),
            Some(o) => Ok(Some(read("get", &full, &o).await?)),
        }
    }

    async fn get_if_changed(&self, key: &str, etag: &ETag) -> StoreResult<Fetched> {
        let full = self.full_key(key);
        let condition = Conditional {
            etag_does_not_match: Some(unquoted(etag).to_owned()),
            ..Conditional::default()
        };
        let got = self.bucket.get(full.as_str()).only_if(condition).execute();
        match got.await.map_err(|e| map_err("get", &full, e))? {
            None => Ok(Fetched::Missing),
            // The condition failed: R2 answers the object's metadata without its body.
            Some(o) if o.body().is_none() => Ok(Fetched::Unchanged),
            Some(o) => Ok(Fetched::Object(read("get", &full, &o).await?)),
        }
    }

    async fn put_if_absent(&self, key: &str, data: Bytes) -> StoreResult<ETag> {
        let full = self.full_key(key);
        let condition = Conditional {
            etag_does_not_match: Some("*".to_owned()),
            ..Conditional::default()
        };
        let put = self
            .bucket
            .put(full.as_str(), data.to_vec())
            .only_if(condition);
        match put.execute().await.map_err(|e| map_err("put", &full, e))? {
            None => Err(StoreError::Conflict),
            Some(o) => etag_of("put", &full, &o),
        }
    }

    async fn put_if_match(&self, key: &str, data: Bytes, etag: &ETag) -> StoreResult<ETag> {
        let full = self.full_key(key);
        let condition = Conditional {
            etag_matches: Some(unquoted(etag).to_owned()),
            ..Conditional::default()
        };
        let put = self
            .bucket
            .put(full.as_str(), data.to_vec())
            .only_if(condition);
        match put.execute().await.map_err(|e| map_err("put", &full, e))? {
            Some(o) => etag_of("put", &full, &o),
            // Missing or changed: R2 answers both alike, and wrote nothing either way.
            None => match self.bucket.head(full.as_str()).await {
                Ok(None) => Err(StoreError::NotFound),
                Ok(Some(_)) | Err(_) => Err(StoreError::Conflict),
            },
        }
    }

    async fn delete(&self, key: &str) -> StoreResult<()> {
        let full = self.full_key(key);
        let deleted = self.bucket.delete(full.as_str()).await;
        deleted.map_err(|e| map_err("delete", &full, e))
    }

    async fn list(&self, prefix: &str) -> StoreResult<Vec<String>> {
        let full = self.full_key(prefix);
        let mut keys = Vec::new();
        self.walk(&full, (None, false, PAGE), |page| {
            keys.extend(
                page.objects()
                    .iter()
                    .filter_map(|o| self.relative(&o.key())),
            );
            false
        })
        .await?;
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    async fn list_after(&self, prefix: &str, after: &str, max: usize) -> StoreResult<Vec<String>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let full = self.full_key(prefix);
        let start = self.full_key(&format!("{prefix}{after}"));
        let limit = u32::try_from(max).unwrap_or(PAGE);
        let mut keys = Vec::new();
        self.walk(&full, (Some(&start), false, limit), |page| {
            keys.extend(
                page.objects()
                    .iter()
                    .filter_map(|o| self.relative(&o.key())),
            );
            keys.len() >= max
        })
        .await?;
        keys.sort();
        keys.dedup();
        keys.truncate(max);
        Ok(keys)
    }

    async fn list_dirs(&self, prefix: &str, after: &str, max: usize) -> StoreResult<Vec<String>> {
        if max == 0 {
            return Ok(Vec::new());
        }
        let full = self.full_key(prefix);
        // Past every key below `after/` (keys are UTF-8; no character sorts after this one).
        let start =
            (!after.is_empty()).then(|| self.full_key(&format!("{prefix}{after}/{}", char::MAX)));
        let mut names = Vec::new();
        self.walk(&full, (start.as_deref(), true, PAGE), |page| {
            let dirs = page.delimited_prefixes();
            names.extend(
                dirs.iter()
                    .filter_map(|p| p.strip_prefix(&full))
                    .map(|p| p.trim_end_matches('/').to_owned())
                    .filter(|p| !p.is_empty()),
            );
            names.len() >= max
        })
        .await?;
        Ok(dir_page(names, after, max))
    }

    async fn list_files(&self, prefix: &str) -> StoreResult<Vec<Listed>> {
        let full = self.full_key(prefix);
        let mut out = Vec::new();
        let mut failed = None;
        self.walk(&full, (None, true, PAGE), |page| {
            for o in page.objects() {
                let key = o.key();
                let direct = key.strip_prefix(&full).is_some_and(|r| !r.contains('/'));
                let Some(relative) = self.relative(&key).filter(|_| direct) else {
                    continue;
                };
                match etag_of("list", &key, &o) {
                    Ok(etag) => out.push(Listed {
                        key: relative,
                        etag,
                    }),
                    Err(e) => failed = Some(e),
                }
            }
            failed.is_some() || out.len() >= MAX_LISTED_FILES
        })
        .await?;
        if let Some(e) = failed {
            return Err(e);
        }
        out.sort_by(|a, b| a.key.cmp(&b.key));
        out.truncate(MAX_LISTED_FILES);
        Ok(out)
    }

    fn key_write_interval(&self) -> std::time::Duration {
        self.write_interval
    }

    fn describe(&self) -> String {
        format!("r2 (key prefix {:?})", self.prefix)
    }
}

/// The ETag as an R2 condition wants it: without the quotes of `httpEtag`.
fn unquoted(etag: &ETag) -> &str {
    etag.as_str().trim_matches('"')
}

/// The one place an R2 object's ETag is read: its `httpEtag`, quotes included.
fn etag_of(op: &str, key: &str, o: &worker::Object) -> StoreResult<ETag> {
    let etag = o.http_etag();
    if etag.is_empty() {
        return Err(StoreError::other(format!("R2 {op} {key}: no ETag")));
    }
    Ok(ETag::new(etag))
}

/// An object R2 answered with its body: its bytes and ETag.
///
/// Errors: [`StoreError::Unavailable`] when the body cannot be read, [`StoreError::Other`]
/// when there is none.
async fn read(op: &str, key: &str, o: &worker::Object) -> StoreResult<Object> {
    let etag = etag_of(op, key, o)?;
    let Some(body) = o.body() else {
        return Err(StoreError::other(format!(
            "R2 {op} {key}: an object without a body"
        )));
    };
    let data = body.bytes().await.map_err(|e| {
        StoreError::unavailable(format!("R2 {op} {key}: reading the body failed: {e}"))
    })?;
    Ok(Object {
        data: Bytes::from(data),
        etag,
    })
}

/// Classifies an error R2 threw (see the module documentation).
fn map_err(op: &str, key: &str, err: worker::Error) -> StoreError {
    let message = format!("R2 {op} {key}: {err}");
    match code_of(&err) {
        Some(code) if TRANSIENT_CODES.contains(&code) => StoreError::unavailable(message),
        _ => StoreError::other(message),
    }
}

/// R2's error code: the error's `code` when it is a number, else the number in parentheses
/// that ends its message (`put: Unspecified error (0)`).
fn code_of(err: &worker::Error) -> Option<u32> {
    let (message, code) = match err {
        worker::Error::UnknownJsError { message, code, .. } => (message.as_str(), code.as_deref()),
        worker::Error::JsError(message) => (message.as_str(), None),
        _ => return None,
    };
    if let Some(n) = code.and_then(|c| c.trim().parse().ok()) {
        return Some(n);
    }
    let inner = message.trim_end().strip_suffix(')')?;
    let digits = &inner[inner.rfind('(')? + 1..];
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// One page of directory names as `list_dirs` answers it, from `names` in any order, with
/// duplicates: sorted as if each were followed by `/`, after `after`, at most `max`. (The
/// same as narad-shared's `store::dir_page`, which is private to that crate.)
fn dir_page(mut names: Vec<String>, after: &str, max: usize) -> Vec<String> {
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
