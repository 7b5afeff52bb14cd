//! Group commit: no caller is answered before the commit that carries its operation has
//! landed, a failed commit answers every caller with an error, and concurrent operations
//! share commits.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use narad_shared::store::{DynStore, ETag, Fetched, Object, Store, StoreError, StoreResult};
use narad_tests::{test_store, Options, Server, TestClock, T0};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::sync::watch;

/// Holds every manifest write until the gate opens; can fail them instead.
struct GateStore {
    inner: DynStore,
    open: watch::Sender<bool>,
    fail: AtomicBool,
    landed: AtomicU64,
}

impl GateStore {
    async fn wait_open(&self, key: &str) {
        if !key.ends_with("manifest.json") {
            return;
        }
        let mut rx = self.open.subscribe();
        while !*rx.borrow_and_update() {
            if rx.changed().await.is_err() {
                return;
            }
        }
    }

    fn outcome(&self, key: &str, r: StoreResult<ETag>) -> StoreResult<ETag> {
        if key.ends_with("manifest.json") && r.is_ok() {
            self.landed.fetch_add(1, Ordering::SeqCst);
        }
        r
    }
}

#[async_trait]
impl Store for GateStore {
    async fn get(&self, key: &str) -> StoreResult<Option<Object>> {
        self.inner.get(key).await
    }
    async fn get_if_changed(&self, key: &str, etag: &ETag) -> StoreResult<Fetched> {
        self.inner.get_if_changed(key, etag).await
    }
    async fn put_if_absent(&self, key: &str, data: Bytes) -> StoreResult<ETag> {
        self.wait_open(key).await;
        if key.ends_with("manifest.json") && self.fail.load(Ordering::SeqCst) {
            return Err(StoreError::Other("injected failure".into()));
        }
        let r = self.inner.put_if_absent(key, data).await;
        self.outcome(key, r)
    }
    async fn put_if_match(&self, key: &str, data: Bytes, etag: &ETag) -> StoreResult<ETag> {
        self.wait_open(key).await;
        if key.ends_with("manifest.json") && self.fail.load(Ordering::SeqCst) {
            return Err(StoreError::Other("injected failure".into()));
        }
        let r = self.inner.put_if_match(key, data, etag).await;
        self.outcome(key, r)
    }
    async fn delete(&self, key: &str) -> StoreResult<()> {
        self.inner.delete(key).await
    }
    async fn list(&self, prefix: &str) -> StoreResult<Vec<String>> {
        self.inner.list(prefix).await
    }
    fn describe(&self) -> String {
        "gate".into()
    }
}

async fn gated() -> (Server, Arc<GateStore>) {
    let (inner, dir) = test_store().await;
    let (open, _) = watch::channel(true);
    let gate = Arc::new(GateStore {
        inner,
        open,
        fail: AtomicBool::new(false),
        landed: AtomicU64::new(0),
    });
    let s = Server::start_on(gate.clone(), dir, Options::default(), TestClock::manual(T0)).await;
    (s, gate)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn produces_are_answered_only_after_their_commit_lands() {
    let (s, gate) = gated().await;
    s.create_topic("g", json!({})).await;
    gate.open.send_replace(false);
    let mut pending = Vec::new();
    for i in 0..20 {
        let req = s
            .req(reqwest::Method::POST, "/v1/topics/g/produce")
            .body(format!("{{\"i\":{i}}}"));
        pending.push(tokio::spawn(async move { req.send().await.unwrap() }));
    }
    tokio::time::sleep(Duration::from_millis(400)).await;
    assert!(
        pending.iter().all(|t| !t.is_finished()),
        "a produce was answered before its commit landed"
    );
    assert_eq!(gate.landed.load(Ordering::SeqCst), 0);
    gate.open.send_replace(true);
    let mut offsets = Vec::new();
    for t in pending {
        let r = t.await.unwrap();
        assert_eq!(r.status(), StatusCode::CREATED);
        let v: Value = r.json().await.unwrap();
        offsets.push(v["offset"].as_u64().unwrap());
    }
    offsets.sort();
    assert_eq!(
        offsets,
        (0..20).collect::<Vec<u64>>(),
        "every produce got its own offset"
    );
    let commits = gate.landed.load(Ordering::SeqCst);
    assert!(
        commits < 20,
        "20 concurrent produces should share commits, took {commits}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn acks_and_consumes_wait_for_their_commit_too() {
    let (s, gate) = gated().await;
    s.create_topic("g", json!({})).await;
    s.produce("g", "x").await;
    gate.open.send_replace(false);
    let req = s.req(reqwest::Method::GET, "/v1/topics/g/consume");
    let consume = tokio::spawn(async move { req.send().await.unwrap() });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !consume.is_finished(),
        "a consume was answered before its lease was committed"
    );
    gate.open.send_replace(true);
    let m: Value = consume.await.unwrap().json().await.unwrap();
    let handle = m["receipt_handle"].as_str().unwrap().to_owned();

    gate.open.send_replace(false);
    let q = narad_tests::serde_urlencoded_pair("receipt_handle", &handle);
    let req = s.req(reqwest::Method::POST, &format!("/v1/topics/g/ack?{q}"));
    let ack = tokio::spawn(async move { req.send().await.unwrap() });
    tokio::time::sleep(Duration::from_millis(300)).await;
    assert!(
        !ack.is_finished(),
        "an ack was answered before it was committed"
    );
    gate.open.send_replace(true);
    assert_eq!(ack.await.unwrap().status(), StatusCode::NO_CONTENT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_failed_commit_answers_every_caller_with_an_error() {
    let (s, gate) = gated().await;
    s.create_topic("g", json!({})).await;
    gate.fail.store(true, Ordering::SeqCst);
    let mut tasks = Vec::new();
    for i in 0..5 {
        let req = s
            .req(reqwest::Method::POST, "/v1/topics/g/produce")
            .body(format!("m{i}"));
        tasks.push(tokio::spawn(
            async move { req.send().await.unwrap().status() },
        ));
    }
    for t in tasks {
        let st = t.await.unwrap();
        assert!(
            st.is_server_error(),
            "a produce whose commit failed must not get 2xx, got {st}"
        );
    }
    gate.fail.store(false, Ordering::SeqCst);
    assert!(
        s.consume("g", "").await.is_none(),
        "nothing from the failed commit is visible"
    );
    assert_eq!(s.topic("g").await["partitions"][0]["next_offset"], 0);
    s.produce("g", "after").await;
    assert_eq!(s.consume("g", "").await.unwrap()["payload"], "after");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn metrics_report_storage_requests_and_commits() {
    if narad_tests::skip_in_external_mode("a fresh server process (exact per-process counters)") {
        return;
    }
    let s = Server::start().await;
    s.create_topic("m", json!({})).await;
    s.produce("m", "x").await;
    let r = s.http.get(s.url("/metrics")).send().await.unwrap();
    assert_eq!(
        r.status(),
        StatusCode::UNAUTHORIZED,
        "metrics need credentials"
    );
    let r = s
        .req(reqwest::Method::GET, "/metrics")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let text = r.text().await.unwrap();
    for needle in [
        "narad_storage_requests_total{op=\"put_if_absent\",outcome=\"ok\"}",
        "narad_commits_total 1",
        "narad_operations_per_commit",
        "narad_conflicts_total",
        "narad_long_poll_waiters 0",
    ] {
        assert!(text.contains(needle), "missing {needle} in:\n{text}");
    }
}
