//! The store of a Worker under test, over its test hooks (`edge/src/hooks.rs`): a local R2
//! is reachable only through the Worker, so tests that look at stored objects reach them
//! through `/_test/store/…`. `NARAD_TEST_STORE=worker+http://HOST:PORT` selects it.

use async_trait::async_trait;
use bytes::Bytes;
use narad_shared::store::{
    DynStore, ETag, Fetched, Listed, Object, Store, StoreError, StoreResult,
};
use reqwest::StatusCode;

/// The URL scheme that names a Worker's store.
pub const SCHEME: &str = "worker+";

/// A Worker's store, at `base` (`http://HOST:PORT`).
#[derive(Debug)]
pub struct WorkerStore {
    base: String,
    http: reqwest::Client,
}

/// The store `url` names: a Worker's (`worker+http://…`), or what `store::open` opens.
pub async fn open(url: &str) -> DynStore {
    match url.strip_prefix(SCHEME) {
        Some(base) => std::sync::Arc::new(WorkerStore {
            base: base.trim_end_matches('/').to_owned(),
            http: reqwest::Client::new(),
        }),
        None => narad_shared::store::open(url)
            .await
            .unwrap_or_else(|e| panic!("open {url}: {e}")),
    }
}

fn failed(e: impl std::fmt::Display) -> StoreError {
    StoreError::unavailable(e.to_string())
}

impl WorkerStore {
    fn url(&self, op: &str, query: &[(&str, &str)]) -> String {
        let q = serde_urlencoded_pairs(query);
        format!("{}/_test/store/{op}?{q}", self.base)
    }

    async fn list_of<T: serde::de::DeserializeOwned>(
        &self,
        op: &str,
        query: &[(&str, &str)],
    ) -> StoreResult<T> {
        let r = self
            .http
            .get(self.url(op, query))
            .send()
            .await
            .map_err(failed)?;
        if r.status() != StatusCode::OK {
            return Err(failed(format!("{op}: {}", r.status())));
        }
        r.json().await.map_err(failed)
    }

    /// The ETag a write answered.
    fn etag_of(r: &reqwest::Response) -> StoreResult<ETag> {
        r.headers()
            .get("etag")
            .and_then(|v| v.to_str().ok())
            .map(ETag::new)
            .ok_or_else(|| failed("no ETag"))
    }

    async fn put(&self, key: &str, data: Bytes, cond: (&str, &str)) -> StoreResult<ETag> {
        let r = self
            .http
            .put(self.url("object", &[("key", key)]))
            .header(cond.0, cond.1)
            .body(data)
            .send()
            .await
            .map_err(failed)?;
        match r.status() {
            StatusCode::OK => Self::etag_of(&r),
            StatusCode::PRECONDITION_FAILED => Err(StoreError::Conflict),
            StatusCode::NOT_FOUND => Err(StoreError::NotFound),
            s => Err(failed(format!("put {key}: {s}"))),
        }
    }
}

/// `k=v&…`, percent-encoded.
fn serde_urlencoded_pairs(query: &[(&str, &str)]) -> String {
    let mut u = reqwest::Url::parse("http://x/").unwrap_or_else(|_| unreachable!());
    u.query_pairs_mut().extend_pairs(query);
    u.query().unwrap_or("").to_owned()
}

#[async_trait]
impl Store for WorkerStore {
    async fn get(&self, key: &str) -> StoreResult<Option<Object>> {
        match self.get_if_changed(key, &ETag::new("")).await? {
            Fetched::Object(o) => Ok(Some(o)),
            Fetched::Missing => Ok(None),
            Fetched::Unchanged => Err(failed("304 to an unconditional read")),
        }
    }

    async fn get_if_changed(&self, key: &str, etag: &ETag) -> StoreResult<Fetched> {
        let mut req = self.http.get(self.url("object", &[("key", key)]));
        if !etag.as_str().is_empty() {
            req = req.header("if-none-match", etag.as_str());
        }
        let r = req.send().await.map_err(failed)?;
        match r.status() {
            StatusCode::OK => {
                let etag = Self::etag_of(&r)?;
                let data = r.bytes().await.map_err(failed)?;
                Ok(Fetched::Object(Object { data, etag }))
            }
            StatusCode::NOT_MODIFIED => Ok(Fetched::Unchanged),
            StatusCode::NOT_FOUND => Ok(Fetched::Missing),
            s => Err(failed(format!("get {key}: {s}"))),
        }
    }

    async fn put_if_absent(&self, key: &str, data: Bytes) -> StoreResult<ETag> {
        self.put(key, data, ("if-none-match", "*")).await
    }

    async fn put_if_match(&self, key: &str, data: Bytes, etag: &ETag) -> StoreResult<ETag> {
        self.put(key, data, ("if-match", etag.as_str())).await
    }

    async fn delete(&self, key: &str) -> StoreResult<()> {
        let r = self
            .http
            .delete(self.url("object", &[("key", key)]))
            .send()
            .await
            .map_err(failed)?;
        match r.status() {
            StatusCode::NO_CONTENT => Ok(()),
            s => Err(failed(format!("delete {key}: {s}"))),
        }
    }

    async fn list(&self, prefix: &str) -> StoreResult<Vec<String>> {
        self.list_of("keys", &[("prefix", prefix)]).await
    }

    async fn list_after(&self, prefix: &str, after: &str, max: usize) -> StoreResult<Vec<String>> {
        let max = max.to_string();
        self.list_of(
            "after",
            &[("prefix", prefix), ("after", after), ("max", &max)],
        )
        .await
    }

    async fn list_dirs(&self, prefix: &str, after: &str, max: usize) -> StoreResult<Vec<String>> {
        let max = max.to_string();
        self.list_of(
            "dirs",
            &[("prefix", prefix), ("after", after), ("max", &max)],
        )
        .await
    }

    async fn list_files(&self, prefix: &str) -> StoreResult<Vec<Listed>> {
        let files: Vec<(String, String)> = self.list_of("files", &[("prefix", prefix)]).await?;
        Ok(files
            .into_iter()
            .map(|(key, etag)| Listed {
                key,
                etag: ETag::new(etag),
            })
            .collect())
    }

    fn describe(&self) -> String {
        format!("a Worker's store at {}", self.base)
    }
}
