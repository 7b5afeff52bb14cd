//! What a store like Cloudflare R2 asks of Narad's writes (docs/design.md §6, "Pacing"):
//! ETags that are the MD5 of the body, so a write must never carry bytes its key held
//! before, and one write per second per key.
#![allow(clippy::unwrap_used, clippy::expect_used, clippy::panic)]

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use narad_shared::store::{DynStore, ETag, Fetched, Listed, Object, Store, StoreResult};
use narad_tests::{test_store, Options, Server, TestClock};
use reqwest::StatusCode;
use serde_json::json;

/// Records the bytes of every write that landed, by key.
struct Recorder {
    inner: DynStore,
    writes: Mutex<HashMap<String, Vec<Bytes>>>,
}

impl std::fmt::Debug for Recorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Recorder")
    }
}

impl Recorder {
    fn keep(&self, key: &str, data: Bytes, r: &StoreResult<ETag>) {
        if r.is_ok() {
            let mut w = self.writes.lock().unwrap();
            w.entry(key.to_owned()).or_default().push(data);
        }
    }
}

#[async_trait]
impl Store for Recorder {
    async fn get(&self, key: &str) -> StoreResult<Option<Object>> {
        self.inner.get(key).await
    }
    async fn get_if_changed(&self, key: &str, etag: &ETag) -> StoreResult<Fetched> {
        self.inner.get_if_changed(key, etag).await
    }
    async fn put_if_absent(&self, key: &str, data: Bytes) -> StoreResult<ETag> {
        let r = self.inner.put_if_absent(key, data.clone()).await;
        self.keep(key, data, &r);
        r
    }
    async fn put_if_match(&self, key: &str, data: Bytes, etag: &ETag) -> StoreResult<ETag> {
        let r = self.inner.put_if_match(key, data.clone(), etag).await;
        self.keep(key, data, &r);
        r
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
        "recorder".into()
    }
}

/// A manifest or a subscription's ledger: the objects a commit rewrites in place.
fn committed_in_place(key: &str) -> bool {
    key.ends_with("manifest.json") || (key.contains("/subs/") && key.ends_with(".json"))
}

/// R2's ETag is the MD5 of the body (the file store's is a digest of it too): were a
/// manifest ever written with bytes it held before, a conditional write made against the
/// older state could land on the newer one. Every write of a manifest or a ledger carries
/// bytes that key never held, whatever the operation: produce, consume, extend, nack, ack,
/// a stale ack, a subscription's consume and ack, an idle sweep.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_manifest_or_ledger_is_never_written_with_bytes_it_held_before() {
    let (inner, dir) = test_store().await;
    let rec = Arc::new(Recorder {
        inner,
        writes: Mutex::new(HashMap::new()),
    });
    let clock = TestClock::manual(narad_shared::clock::Clock::now_ms(
        &narad_shared::clock::SystemClock,
    ));
    let s = Server::start_on(rec.clone(), dir, Options::default(), clock.clone()).await;
    s.create_topic(
        "etag",
        json!({"partitions": 1, "visibility_timeout_ms": 5000}),
    )
    .await;
    let r = s
        .req(reqwest::Method::PUT, "/v1/topics/etag/subscriptions/audit")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert!(r.status().is_success(), "{}", r.status());
    for round in 0..3 {
        for i in 0..4 {
            s.produce("etag", format!("r{round}-m{i}")).await;
        }
        let handle = |m: &serde_json::Value| m["receipt_handle"].as_str().unwrap().to_owned();
        let a = s.consume("etag", "").await.unwrap();
        assert_eq!(
            s.ack("etag", &handle(&a), "&extend=true").await,
            StatusCode::NO_CONTENT
        );
        assert_eq!(
            s.ack("etag", &handle(&a), "&extend=0").await,
            StatusCode::NO_CONTENT
        );
        // The nacked message comes back: settle it and the rest.
        while let Some(m) = s.consume("etag", "").await {
            assert_eq!(s.ack("etag", &handle(&m), "").await, StatusCode::NO_CONTENT);
        }
        // A stale handle changes nothing (410).
        assert_eq!(s.ack("etag", &handle(&a), "").await, StatusCode::GONE);
        while let Some(m) = s.consume("etag", "subscription=audit").await {
            assert_eq!(s.ack("etag", &handle(&m), "").await, StatusCode::NO_CONTENT);
        }
        clock.advance(6000);
    }
    let writes = rec.writes.lock().unwrap();
    let mut manifests = 0;
    let mut ledgers = 0;
    for (key, bodies) in writes.iter().filter(|(k, _)| committed_in_place(k)) {
        if key.ends_with("manifest.json") {
            manifests = manifests.max(bodies.len());
        } else {
            ledgers = ledgers.max(bodies.len());
        }
        for (i, b) in bodies.iter().enumerate() {
            if let Some(j) = bodies[..i].iter().position(|earlier| earlier == b) {
                panic!("{key}: write {i} carries the bytes of write {j}");
            }
        }
    }
    // The check saw what it is about: many commits of one manifest and of one ledger.
    assert!(manifests >= 20, "{manifests} writes of the manifest");
    assert!(ledgers >= 10, "{ledgers} writes of the ledger");
}

/// The same server on a store that refuses a second write of one key within 200 ms, as R2
/// does within a second (`store/keyrate.rs`): the broker paces its writes
/// (`store/paced.rs`), so clients never see the refusal, and nothing is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn behind_a_per_key_write_limit_every_request_succeeds_and_nothing_is_refused() {
    let (inner, dir) = test_store().await;
    let limited = Arc::new(narad_shared::store::keyrate::KeyRateStore::new(
        inner,
        Duration::from_millis(200),
    ));
    let clock = TestClock::manual(narad_shared::clock::Clock::now_ms(
        &narad_shared::clock::SystemClock,
    ));
    let s = Server::start_on(limited.clone(), dir, Options::default(), clock).await;
    s.create_topic("limited", json!({"partitions": 1})).await;
    let mut produces = Vec::new();
    for i in 0..16 {
        let req = s
            .req(reqwest::Method::POST, "/v1/topics/limited/produce")
            .body(format!("m{i}"));
        produces.push(tokio::spawn(
            async move { req.send().await.unwrap().status() },
        ));
    }
    for p in produces {
        assert_eq!(p.await.unwrap(), StatusCode::CREATED);
    }
    let mut seen = 0;
    while let Some(m) = s.consume("limited", "").await {
        let h = m["receipt_handle"].as_str().unwrap().to_owned();
        assert_eq!(s.ack("limited", &h, "").await, StatusCode::NO_CONTENT);
        seen += 1;
    }
    assert_eq!(seen, 16);
    assert_eq!(limited.refused(), 0, "a paced broker is never refused");
}
