//! The S3 backend: one bucket, one optional key prefix, conditional writes.
//!
//! Opened from `s3://BUCKET[/PREFIX]` via [`super::open`]. Keys passed to the [`Store`]
//! methods are relative to `PREFIX/`; [`Store::list`] returns them relative to it too.
//!
//! # Configuration
//!
//! The usual AWS way ([`aws_config::defaults`]): credentials and region from the environment,
//! the shared config files, SSO, web identity or instance metadata. With no region configured
//! the store uses `us-east-1`. When `AWS_ENDPOINT_URL_S3` or `AWS_ENDPOINT_URL` is set
//! (LocalStack, SeaweedFS) the client uses that endpoint with path-style addressing.
//! Timeouts: 3 s to connect, 30 s per request attempt (and 30 s to read a body).
//!
//! # Startup probe
//!
//! [`S3Store::open`] fails once, clearly, with [`StoreError::Other`] when:
//! * no credentials can be loaded (no provider, or the provider fails);
//! * `ListObjectsV2` under the prefix (max 1 key) answers 404 (the bucket does not exist),
//!   403 (credentials invalid or not allowed), 301/400 (the bucket lives in another region),
//!   or the endpoint is unreachable. (A list under the prefix rather than `HeadBucket`, so an
//!   IAM policy can restrict `s3:ListBucket` to the prefix.)
//! * the server ignores conditional writes: it writes `{prefix}.narad-probe/{uuid}` with
//!   `If-None-Match: *` twice (the second must fail with 412/409), then with `If-Match` and a
//!   wrong ETag (must fail with 412/409), then with `If-Match` on a key that does not exist
//!   (404 or 412: which one is remembered, see below; it must not create the key), then
//!   deletes the probe object. Cost: one LIST, four PUTs, one DELETE.
//!
//! # Contract
//!
//! * `get` is `GetObject`; a missing key (404 `NoSuchKey`) is `Ok(None)`.
//! * `put_if_absent` is `PutObject` with `If-None-Match: *`.
//! * `put_if_match` is `PutObject` with `If-Match: <etag>`.
//! * `delete` is `DeleteObject` (deleting a missing key succeeds, as on S3).
//! * `list` is `ListObjectsV2`, all pages, keys relative to the store prefix, sorted.
//! * ETags are used verbatim as S3 returns them, quotes included (`etag_of` is the one
//!   place that reads them), so the ETag from a put equals the ETag a later get returns for
//!   the same version, and the caller passes that string back to `If-Match` unchanged.
//!
//! # Error mapping (`map_err`, the only place that classifies errors)
//!
//! | what S3 answered                                          | [`StoreError`]   |
//! |-----------------------------------------------------------|------------------|
//! | 412 `PreconditionFailed`                                  | `Conflict`       |
//! | 412 to `put_if_match` on a server that answers a missing key so, then 404 to `HeadObject` | `NotFound` |
//! | 409 (`ConditionalRequestConflict`, `OperationAborted`)    | `Conflict`       |
//! | 404 `NoSuchKey` / `NotFound` (`put_if_match` on a missing key; `get` turns it into `None`, `delete` into `Ok`) | `NotFound` |
//! | 404 `NoSuchBucket`                                        | `Other`          |
//! | 501 `NotImplemented` (permanent: the server lacks a feature, e.g. conditional writes) | `Other` |
//! | other 5xx (500 `InternalError`, 503 `SlowDown`, ...), 429, throttling codes, 400 `RequestTimeout` | `Unavailable` |
//! | timeout, dispatch/connection failure, unreadable or lost response, body read error | `Unavailable` |
//! | request that could not be built, invalid endpoint, anything else (403, 400, ...) | `Other` |
//!
//! Some S3-compatible servers (SeaweedFS) answer `If-Match` on a missing key with 412
//! `PreconditionFailed`, the same answer, body and all, as a stale ETag, where AWS and
//! LocalStack answer 404 `NoSuchKey`. The startup probe learns which (`MissingOnMatch`: one
//! `If-Match` PUT of a key that does not exist). On a server of the 412 kind, a 412 from
//! `put_if_match` is followed by one `HeadObject`: 404 makes it `NotFound`, anything else
//! `Conflict` (the PUT wrote nothing either way, so a failed HEAD cannot make it wrong). On AWS
//! no extra request is ever made.
//!
//! # Retries
//!
//! The SDK's own retries are disabled (`max_attempts(1)`): a conditional PUT whose outcome is
//! ambiguous (timeout, 5xx, lost response) must reach the caller as `Unavailable`, because a
//! blind retry could report its own successful first write as a `Conflict`. The idempotent
//! operations (`get`, `list`, `delete`) are retried here, up to [`SAFE_RETRIES`] times on
//! `Unavailable`, with full-jitter exponential backoff. Conditional puts are never retried.

use std::future::Future;
use std::time::Duration;

use async_trait::async_trait;
use aws_config::meta::region::RegionProviderChain;
use aws_config::BehaviorVersion;
use aws_sdk_s3::config::retry::RetryConfig;
use aws_sdk_s3::config::timeout::TimeoutConfig;
use aws_sdk_s3::config::{ProvideCredentials, Region};
use aws_sdk_s3::error::DisplayErrorContext;
use aws_sdk_s3::operation::list_objects_v2::ListObjectsV2Output;
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::Client;
use bytes::Bytes;
use rand::Rng;

mod errors;
mod location;
mod probe;

use errors::{etag_of, map_err};
use location::{parse_location, strip_userinfo};
use probe::MissingOnMatch;

use super::{ETag, Failure, Fetched, Listed, Object, Store, StoreError, StoreResult};

/// Retries of an idempotent operation (`get`, `list`, `delete`) after an `Unavailable` error.
pub const SAFE_RETRIES: u32 = 3;
/// Base delay of the retry backoff; attempt `n` sleeps a random time in `[0, BASE * 2^n]`.
const RETRY_BASE: Duration = Duration::from_millis(50);
/// Time allowed to establish a connection.
const CONNECT_TIMEOUT: Duration = Duration::from_secs(3);
/// Time allowed for one request attempt, and separately for reading a response body.
const ATTEMPT_TIMEOUT: Duration = Duration::from_secs(30);
/// Folder keys [`Store::delete_folders`] deletes at once.
const FOLDER_DELETES_AT_ONCE: usize = 16;

/// A [`Store`] on an S3 bucket (or any S3-compatible server with conditional writes).
#[derive(Debug, Clone)]
pub struct S3Store {
    client: Client,
    bucket: String,
    /// Empty, or the key prefix with exactly one trailing `/`.
    prefix: String,
    /// For [`Store::describe`]: the endpoint without any userinfo.
    endpoint: Option<String>,
    region: String,
    /// How this server answers `If-Match` on a missing key (learned by the probe).
    missing_on_match: MissingOnMatch,
}

/// The condition of one `PutObject`.
#[derive(Debug, Clone, Copy)]
enum Condition<'a> {
    /// `If-None-Match: *`.
    Absent,
    /// `If-Match: <etag>`.
    Matches(&'a ETag),
}

impl S3Store {
    /// Opens `BUCKET[/PREFIX]` (the part of an `s3://` URL after the scheme), then probes the
    /// bucket, the credentials and conditional-write support.
    ///
    /// Errors: [`StoreError::Other`] naming the problem (see the module documentation).
    pub async fn open(rest: &str) -> StoreResult<S3Store> {
        let (bucket, prefix) = parse_location(rest)?;
        let endpoint = std::env::var("AWS_ENDPOINT_URL_S3")
            .ok()
            .or_else(|| std::env::var("AWS_ENDPOINT_URL").ok())
            .filter(|e| !e.trim().is_empty());

        let region_chain =
            RegionProviderChain::default_provider().or_else(Region::from_static("us-east-1"));
        let sdk = aws_config::defaults(BehaviorVersion::latest())
            .region(region_chain)
            .load()
            .await;
        let region = sdk
            .region()
            .map(|r| r.to_string())
            .unwrap_or_else(|| "us-east-1".to_string());

        // Credentials first: without them every later step fails with a vague dispatch error.
        let Some(creds) = sdk.credentials_provider() else {
            return Err(StoreError::other(
                "S3 store: no AWS credentials provider is configured (set AWS_ACCESS_KEY_ID and \
                 AWS_SECRET_ACCESS_KEY, or AWS_PROFILE)"
                    .to_string(),
            ));
        };
        if let Err(e) = creds.provide_credentials().await {
            return Err(StoreError::other(format!(
                "S3 store: could not load AWS credentials ({e}): set AWS_ACCESS_KEY_ID and \
                 AWS_SECRET_ACCESS_KEY, or AWS_PROFILE"
            )));
        }

        let mut conf = aws_sdk_s3::config::Builder::from(&sdk)
            .retry_config(RetryConfig::standard().with_max_attempts(1))
            .timeout_config(
                TimeoutConfig::builder()
                    .connect_timeout(CONNECT_TIMEOUT)
                    .operation_attempt_timeout(ATTEMPT_TIMEOUT)
                    .build(),
            );
        let endpoint_configured = endpoint.is_some() || sdk.endpoint_url().is_some();
        if let Some(url) = &endpoint {
            conf = conf.endpoint_url(url.trim());
        }
        if endpoint_configured {
            conf = conf.force_path_style(true);
        }
        let store = S3Store {
            client: Client::from_conf(conf.build()),
            bucket,
            prefix,
            endpoint: endpoint
                .or_else(|| sdk.endpoint_url().map(str::to_string))
                .map(|e| strip_userinfo(&e)),
            region,
            missing_on_match: MissingOnMatch::NotFound,
        };
        let mut store = store;
        store.missing_on_match = store.probe().await?;
        Ok(store)
    }

    /// One conditional `PutObject`, its answer classified by status alone.
    async fn put_once(&self, key: &str, data: Bytes, cond: Condition<'_>) -> StoreResult<ETag> {
        let full = self.full_key(key);
        let (op, req) = match cond {
            Condition::Absent => (
                "PutObject(If-None-Match)",
                self.client.put_object().if_none_match("*"),
            ),
            Condition::Matches(etag) => (
                "PutObject(If-Match)",
                self.client.put_object().if_match(etag.as_str()),
            ),
        };
        let out = req
            .bucket(&self.bucket)
            .key(&full)
            .body(ByteStream::from(data))
            .send()
            .await
            .map_err(|err| map_err(op, &full, err))?;
        etag_of("PutObject", &full, out.e_tag())
    }

    /// Whether `key` exists, by `HeadObject` (retried like a GET). Used only to tell a 412
    /// on a missing key from a stale ETag, on servers that answer both alike.
    async fn exists(&self, key: &str) -> StoreResult<bool> {
        let full = self.full_key(key);
        retry_safe(|| async {
            match self
                .client
                .head_object()
                .bucket(&self.bucket)
                .key(&full)
                .send()
                .await
            {
                Ok(_) => Ok(true),
                Err(err) => match map_err("HeadObject", &full, err) {
                    StoreError::NotFound => Ok(false),
                    other => Err(other),
                },
            }
        })
        .await
    }

    fn full_key(&self, key: &str) -> String {
        format!("{}{}", self.prefix, key)
    }

    async fn get_once(&self, key: &str, if_none_match: Option<&str>) -> StoreResult<Fetched> {
        let full = self.full_key(key);
        let out = match self
            .client
            .get_object()
            .bucket(&self.bucket)
            .key(&full)
            .set_if_none_match(if_none_match.map(str::to_owned))
            .send()
            .await
        {
            Ok(out) => out,
            Err(err) => {
                // 304 Not Modified arrives as an error; it only answers If-None-Match.
                if err.raw_response().map(|r| r.status().as_u16()) == Some(304) {
                    return Ok(Fetched::Unchanged);
                }
                return match map_err("GetObject", &full, err) {
                    StoreError::NotFound => Ok(Fetched::Missing),
                    other => Err(other),
                };
            }
        };
        let etag = etag_of("GetObject", &full, out.e_tag())?;
        let body = tokio::time::timeout(ATTEMPT_TIMEOUT, out.body.collect())
            .await
            .map_err(|_| {
                StoreError::unavailable(format!("GetObject {full}: timed out reading the body"))
            })?
            .map_err(|e| {
                let what = format!(
                    "GetObject {full}: reading the body failed: {}",
                    DisplayErrorContext(&e)
                );
                StoreError::Unavailable(Failure::caused_by(what, e))
            })?;
        Ok(Fetched::Object(Object {
            data: body.into_bytes(),
            etag,
        }))
    }

    async fn delete_once(&self, key: &str) -> StoreResult<()> {
        let full = self.full_key(key);
        match self
            .client
            .delete_object()
            .bucket(&self.bucket)
            .key(&full)
            .send()
            .await
        {
            Ok(_) => Ok(()),
            Err(err) => match map_err("DeleteObject", &full, err) {
                StoreError::NotFound => Ok(()),
                other => Err(other),
            },
        }
    }

    /// One page of a listing: full keys and the continuation token, if more pages follow.
    async fn list_page(
        &self,
        full_prefix: &str,
        token: Option<String>,
    ) -> StoreResult<(Vec<String>, Option<String>)> {
        let out = self
            .client
            .list_objects_v2()
            .bucket(&self.bucket)
            .prefix(full_prefix)
            .set_continuation_token(token)
            .send()
            .await
            .map_err(|err| map_err("ListObjectsV2", full_prefix, err))?;
        let keys = out
            .contents()
            .iter()
            .filter_map(|o| o.key().map(str::to_string))
            .collect();
        let next = if out.is_truncated().unwrap_or(false) {
            out.next_continuation_token().map(str::to_string)
        } else {
            None
        };
        Ok((keys, next))
    }

    /// One `ListObjectsV2` page under `prefix`: at most `max` (≤ 1000) entries, starting
    /// after the full key `start_after`, grouped by `delimiter` when given.
    async fn list_one_page(
        &self,
        prefix: &str,
        start_after: Option<String>,
        delimiter: Option<&str>,
        max: usize,
    ) -> StoreResult<ListObjectsV2Output> {
        let full_prefix = self.full_key(prefix);
        let max_keys = i32::try_from(max.clamp(1, 1000)).unwrap_or(1000);
        retry_safe(|| async {
            self.client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(&full_prefix)
                .set_delimiter(delimiter.map(str::to_owned))
                .set_start_after(start_after.clone())
                .max_keys(max_keys)
                .send()
                .await
                .map_err(|err| map_err("ListObjectsV2", &full_prefix, err))
        })
        .await
    }
}

#[async_trait]
impl Store for S3Store {
    async fn get(&self, key: &str) -> StoreResult<Option<Object>> {
        match corrupt_if_still_mismatched(retry_safe(|| self.get_once(key, None)).await)? {
            Fetched::Object(o) => Ok(Some(o)),
            Fetched::Missing | Fetched::Unchanged => Ok(None),
        }
    }

    /// `GetObject` with `If-None-Match: <etag>`: a 304 costs no body transfer.
    async fn get_if_changed(&self, key: &str, etag: &ETag) -> StoreResult<Fetched> {
        corrupt_if_still_mismatched(retry_safe(|| self.get_once(key, Some(etag.as_str()))).await)
    }

    async fn put_if_absent(&self, key: &str, data: Bytes) -> StoreResult<ETag> {
        self.put_once(key, data, Condition::Absent).await
    }

    /// On a server that answers `If-Match` on a missing key with 412 (SeaweedFS), a 412 costs
    /// one `HeadObject` more, to answer [`StoreError::NotFound`] when the key is missing.
    async fn put_if_match(&self, key: &str, data: Bytes, etag: &ETag) -> StoreResult<ETag> {
        let r = self.put_once(key, data, Condition::Matches(etag)).await;
        match (r, self.missing_on_match) {
            (Err(StoreError::Conflict), MissingOnMatch::PreconditionFailed) => {
                match self.exists(key).await {
                    Ok(false) => Err(StoreError::NotFound),
                    // Present, or unknown: the PUT wrote nothing either way.
                    Ok(true) | Err(_) => Err(StoreError::Conflict),
                }
            }
            (r, _) => r,
        }
    }

    async fn delete(&self, key: &str) -> StoreResult<()> {
        retry_safe(|| self.delete_once(key)).await
    }

    async fn list(&self, prefix: &str) -> StoreResult<Vec<String>> {
        let full_prefix = self.full_key(prefix);
        let mut keys = Vec::new();
        let mut token = None;
        loop {
            let t = token.clone();
            let (page, next) = retry_safe(|| self.list_page(&full_prefix, t.clone())).await?;
            keys.extend(
                page.into_iter()
                    .filter_map(|k| k.strip_prefix(&self.prefix).map(str::to_string)),
            );
            match next {
                Some(n) => token = Some(n),
                None => break,
            }
        }
        keys.sort();
        keys.dedup();
        Ok(keys)
    }

    async fn list_after(&self, prefix: &str, after: &str, max: usize) -> StoreResult<Vec<String>> {
        let start = self.full_key(&format!("{prefix}{after}"));
        let page = self.list_one_page(prefix, Some(start), None, max).await?;
        let mut keys: Vec<String> = page
            .contents()
            .iter()
            .filter_map(|o| o.key())
            .filter_map(|k| k.strip_prefix(&self.prefix).map(str::to_string))
            .collect();
        keys.sort();
        keys.truncate(max);
        Ok(keys)
    }

    async fn list_dirs(&self, prefix: &str, after: &str, max: usize) -> StoreResult<Vec<String>> {
        // Past every key below `after/` (keys are UTF-8; no character sorts after this one).
        let start =
            (!after.is_empty()).then(|| self.full_key(&format!("{prefix}{after}/{}", char::MAX)));
        let page = self.list_one_page(prefix, start, Some("/"), max).await?;
        let full_prefix = self.full_key(prefix);
        let names = page
            .common_prefixes()
            .iter()
            .filter_map(|p| p.prefix())
            .filter_map(|p| p.strip_prefix(&full_prefix))
            .map(|p| p.trim_end_matches('/').to_owned())
            .collect();
        Ok(crate::store::dir_page(names, after, max))
    }

    async fn list_files(&self, prefix: &str) -> StoreResult<Vec<Listed>> {
        let page = self
            .list_one_page(prefix, None, Some("/"), super::MAX_LISTED_FILES)
            .await?;
        let mut out: Vec<Listed> = page
            .contents()
            .iter()
            .filter_map(|o| Some((o.key()?, o.e_tag()?)))
            .filter_map(|(k, e)| {
                Some(Listed {
                    key: k.strip_prefix(&self.prefix)?.to_owned(),
                    etag: ETag::new(e),
                })
            })
            .collect();
        out.sort_by(|a, b| a.key.cmp(&b.key));
        Ok(out)
    }

    /// One `DeleteObject` per folder key (`folder/`), deepest first; those of one depth at
    /// once (at most [`FOLDER_DELETES_AT_ONCE`]). SeaweedFS removes an empty folder so and
    /// keeps one that holds anything; on S3 each is a DELETE of a missing key.
    async fn delete_folders(&self, prefix: &str, deleted: &[String]) -> StoreResult<()> {
        let folders = super::folders_below(prefix, deleted);
        let mut rest = &folders[..];
        while let Some(first) = rest.first() {
            let depth = first.matches('/').count();
            let n = rest
                .iter()
                .take_while(|f| f.matches('/').count() == depth)
                .count();
            let (level, next) = rest.split_at(n);
            for chunk in level.chunks(FOLDER_DELETES_AT_ONCE) {
                let mut deletes = Vec::with_capacity(chunk.len());
                for folder in chunk {
                    deletes.push(self.delete(folder));
                }
                futures::future::try_join_all(deletes).await?;
            }
            rest = next;
        }
        Ok(())
    }

    fn describe(&self) -> String {
        let endpoint = self.endpoint.as_deref().unwrap_or("AWS default");
        format!(
            "s3://{}/{} (endpoint {endpoint}, region {})",
            self.bucket, self.prefix, self.region
        )
    }
}

/// A body checksum mismatch that survived every retry is damage, not a glitch on the wire:
/// [`StoreError::Corrupt`].
fn corrupt_if_still_mismatched<T>(r: StoreResult<T>) -> StoreResult<T> {
    match r {
        Err(e) if errors::is_checksum_mismatch(&e) => match e {
            StoreError::Unavailable(f) => Err(StoreError::Corrupt(f)),
            other => Err(other),
        },
        other => other,
    }
}

/// Runs an idempotent operation, retrying up to [`SAFE_RETRIES`] times on `Unavailable`
/// with full-jitter exponential backoff.
async fn retry_safe<T, F, Fut>(mut op: F) -> StoreResult<T>
where
    F: FnMut() -> Fut,
    Fut: Future<Output = StoreResult<T>>,
{
    let mut attempt = 0u32;
    loop {
        match op().await {
            Err(StoreError::Unavailable(why)) if attempt < SAFE_RETRIES => {
                let cap = RETRY_BASE.as_millis() as u64 * (1u64 << attempt);
                let wait = rand::thread_rng().gen_range(0..=cap);
                tracing::debug!(attempt, wait_ms = wait, "S3 unavailable, retrying: {why}");
                tokio::time::sleep(Duration::from_millis(wait)).await;
                attempt += 1;
            }
            other => return other,
        }
    }
}
