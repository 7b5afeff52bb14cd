//! Newer is not corrupt: a manifest or topic record written by a newer version of Narad
//! (a higher manifest format, a higher topic layout) is answered 503 `upgrade_required`
//! with `Retry-After`, counted in `/metrics`, and left byte for byte as it is by consume,
//! produce, ack, `narad gc` and `narad repair` (docs/upgrades.md).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use narad_shared::store::DynStore;
use narad_tests::{now_ms, Options, Server, TestClock};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

/// Rewrites the sealed JSON object at `key` with `field` set to `value`, checksum and all,
/// as a newer build would write it. Answers the bytes now stored.
async fn rewrite_as_newer(store: &DynStore, key: &str, field: &str, value: Value) -> bytes::Bytes {
    let o = store.get(key).await.unwrap().unwrap();
    let mut v: Value =
        serde_json::from_slice(narad_shared::stored::open_json(&o.data).unwrap()).unwrap();
    v[field] = value;
    let sealed = narad_shared::stored::seal_json(serde_json::to_vec(&v).unwrap());
    store
        .put_if_match(key, sealed.clone(), &o.etag)
        .await
        .unwrap();
    sealed
}

/// The response is 503 `upgrade_required` with a `Retry-After`.
async fn assert_upgrade_required(r: reqwest::Response, what: &str) {
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE, "{what}");
    assert!(
        r.headers().get("retry-after").is_some(),
        "{what}: no Retry-After"
    );
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "upgrade_required", "{what}: {v}");
}

/// Runs `narad ARGS --store URL`; answers (success, stdout, stderr).
async fn narad(url: &str, args: &[&str]) -> (bool, String, String) {
    let mut all = args.to_vec();
    all.extend(["--store", url]);
    narad_tests::run_narad(&all).await
}

async fn server() -> Option<(Server, String)> {
    if narad_tests::skip_in_external_mode("a store of its own for the narad command") {
        return None;
    }
    let (url, dir) = narad_tests::test_store_url();
    let store = narad_shared::store::open(&url).await.unwrap();
    let s = Server::start_on(store, dir, Options::default(), TestClock::manual(now_ms())).await;
    Some((s, url))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_manifest_is_answered_upgrade_required_and_never_rewritten() {
    let Some((s, url)) = server().await else {
        return;
    };
    s.create_topic("up", json!({"partitions": 1})).await;
    for i in 0..3 {
        s.produce("up", format!("m{i}")).await;
    }
    let held = s.consume("up", "").await.unwrap();
    let handle = held["receipt_handle"].as_str().unwrap().to_owned();
    let key = "topics/up/0.manifest.json";
    let newer = rewrite_as_newer(&s.store, key, "format", json!(99)).await;

    assert_upgrade_required(s.consume_raw("up", "").await, "consume").await;
    let r = s
        .req(Method::POST, "/v1/topics/up/produce")
        .body("after")
        .send()
        .await
        .unwrap();
    assert_upgrade_required(r, "produce").await;
    assert_upgrade_required(s.ack_raw("up", &handle, "").await, "ack").await;
    assert_upgrade_required(
        s.req(Method::GET, "/v1/topics/up").send().await.unwrap(),
        "topic stats",
    )
    .await;

    // Everything the partition holds now (the refused produce may have left its segment).
    let objects = s.store.list("topics/up/").await.unwrap();
    let (ok, out, err) = narad(&url, &["gc", "--grace", "0s"]).await;
    assert!(ok, "gc must pass over it, not fail: {err}");
    let report: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(report["skipped_newer"], 1, "{report}");
    let (ok, out, err) = narad(&url, &["repair", "up"]).await;
    assert!(!ok, "repair must refuse a newer manifest: {out}");
    assert!(err.contains("newer version of Narad"), "{err}");
    let (ok, _, err) = narad(&url, &["repair", "--dry-run", "up"]).await;
    assert!(!ok && err.contains("manifest format 99"), "{err}");

    assert_eq!(
        s.store.get(key).await.unwrap().unwrap().data,
        newer,
        "the newer manifest is byte for byte unchanged"
    );
    assert_eq!(
        s.store.list("topics/up/").await.unwrap(),
        objects,
        "gc and repair deleted and wrote nothing of the partition"
    );
    let text = s.metrics().await;
    let seen = narad_tests::metric(&text, "narad_upgrade_required_total").unwrap();
    assert!(seen >= 4.0, "every refusal is counted: {seen}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_topic_layout_is_answered_upgrade_required_and_never_rewritten() {
    let Some((s, url)) = server().await else {
        return;
    };
    s.create_topic("lay", json!({})).await;
    s.produce("lay", "m").await;
    s.produce("lay", "n").await;
    let held = s.consume("lay", "").await.unwrap();
    let handle = held["receipt_handle"].as_str().unwrap().to_owned();
    let key = "topics/lay/topic.json";
    let newer = rewrite_as_newer(&s.store, key, "layout", json!(7)).await;
    // A fresh process (nothing cached) meets it on every route.
    let (store, dir) = (s.store.clone(), None);
    let fresh = Server::start_on(store, dir, Options::default(), TestClock::manual(now_ms())).await;
    assert_upgrade_required(fresh.consume_raw("lay", "").await, "consume").await;
    assert_upgrade_required(fresh.ack_raw("lay", &handle, "").await, "ack").await;
    let r = fresh
        .req(Method::POST, "/v1/topics/lay/produce")
        .body("x")
        .send()
        .await
        .unwrap();
    assert_upgrade_required(r, "produce").await;
    let r = fresh
        .req(Method::PATCH, "/v1/topics/lay")
        .body(r#"{"visibility_timeout_ms":60000}"#)
        .send()
        .await
        .unwrap();
    assert_upgrade_required(r, "patch").await;
    let r = fresh
        .req(Method::PUT, "/v1/topics/lay")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_upgrade_required(r, "create").await;
    let (ok, out, err) = narad(&url, &["gc", "--grace", "0s"]).await;
    assert!(ok, "{err}");
    let report: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(report["skipped_newer"], 1, "{report}");
    assert_eq!(report["leftovers_deleted"], 0, "{report}");
    let (ok, out, err) = narad(&url, &["repair", "lay"]).await;
    assert!(!ok && err.contains("topic layout 7"), "{out} {err}");
    assert_eq!(s.store.get(key).await.unwrap().unwrap().data, newer);
    assert!(s
        .store
        .get("topics/lay/0.manifest.json")
        .await
        .unwrap()
        .is_some());
}

/// Sets the version digit (the fourth magic byte) of the binary object at `key` to
/// `digit`, as a newer build's format would read; its checksums cover only the body, so
/// nothing else changes. Answers the bytes now stored.
async fn bump_magic(store: &DynStore, key: &str, digit: u8) -> bytes::Bytes {
    let o = store.get(key).await.unwrap().unwrap();
    let mut data = o.data.to_vec();
    data[3] = digit;
    let data = bytes::Bytes::from(data);
    store
        .put_if_match(key, data.clone(), &o.etag)
        .await
        .unwrap();
    data
}

/// Every object under `prefix` with its bytes.
async fn snapshot(store: &DynStore, prefix: &str) -> Vec<(String, bytes::Bytes)> {
    let mut out = Vec::new();
    for k in store.list(prefix).await.unwrap() {
        let data = store.get(&k).await.unwrap().unwrap().data;
        out.push((k, data));
    }
    out
}

/// A second process on `s`'s store, with nothing cached.
async fn fresh(s: &Server, clock: TestClock) -> Server {
    Server::start_on(s.store.clone(), None, Options::default(), clock).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newer_segments_are_answered_upgrade_required_and_never_rewritten() {
    let Some((s, url)) = server().await else {
        return;
    };
    s.create_topic("seg", json!({})).await;
    for i in 0..3 {
        s.produce("seg", format!("m{i}")).await;
    }
    let held = s.consume("seg", "").await.unwrap();
    let handle = held["receipt_handle"].as_str().unwrap().to_owned();
    let prefix = "topics/seg/0/segments/";
    for k in s.store.list(prefix).await.unwrap() {
        // `NSG5`: `NSG4` is the void marker (docs/design.md §6).
        bump_magic(&s.store, &k, b'5').await;
    }
    let newer = snapshot(&s.store, prefix).await;
    assert_eq!(newer.len(), 3);

    let other = fresh(&s, TestClock::manual(now_ms())).await;
    assert_upgrade_required(other.consume_raw("seg", "").await, "consume").await;
    // Produce and ack need no segment: they work, and write none of the newer ones.
    other.produce("seg", "after").await;
    assert_eq!(other.ack("seg", &handle, "").await, StatusCode::NO_CONTENT);
    let (ok, out, err) = narad(&url, &["gc", "--grace", "0s"]).await;
    assert!(ok, "{err}");
    let (ok, out2, err) = narad(&url, &["repair", "seg"]).await;
    assert!(
        ok,
        "a healthy manifest naming newer segments is healthy: {out2} {err}"
    );
    for (k, data) in &newer {
        assert_eq!(
            s.store.get(k).await.unwrap().map(|o| o.data).as_ref(),
            Some(data),
            "{k} changed or went ({out})"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn newer_index_objects_and_key_chunks_are_answered_upgrade_required_and_never_rewritten() {
    let Some((s, url)) = server().await else {
        return;
    };
    // The gc command runs on the real clock: so does this partition, or retention would
    // expire what it holds.
    let clock = TestClock::manual(now_ms());
    let s = fresh(&s, clock.clone()).await;
    s.create_topic("deep", json!({"dedup_window_ms": 86_400_000}))
        .await;
    // More segments than a manifest keeps (some fold into index objects) and more keys
    // than it keeps (some spill into a key chunk).
    for i in 0..140 {
        s.produce_idem("deep", &format!("key-{i}"), &format!("m{i}"))
            .await;
    }
    let held = s.consume("deep", "").await.unwrap();
    let handle = held["receipt_handle"].as_str().unwrap().to_owned();
    let indexes = s.store.list("topics/deep/0/indexes/").await.unwrap();
    let chunks = s.store.list("topics/deep/0/dedup/").await.unwrap();
    assert!(
        !indexes.is_empty() && !chunks.is_empty(),
        "{indexes:?} {chunks:?}"
    );
    for k in indexes.iter().chain(&chunks) {
        bump_magic(&s.store, k, b'2').await;
    }
    let newer = snapshot(&s.store, "topics/deep/0/indexes/").await;
    let newer_chunks = snapshot(&s.store, "topics/deep/0/dedup/").await;

    let other = fresh(&s, clock.clone()).await;
    // Offset 1 sits in a segment only an index object names.
    assert_upgrade_required(other.consume_raw("deep", "").await, "consume").await;
    // An ack reads neither: it settles offset 0, and writes none of them.
    assert_eq!(other.ack("deep", &handle, "").await, StatusCode::NO_CONTENT);
    // A produce with a key must look in the chunks: a newer one cannot be looked in.
    let r = other
        .req(Method::POST, "/v1/topics/deep/produce")
        .header("Idempotency-Key", "key-0")
        .body("again")
        .send()
        .await
        .unwrap();
    assert_upgrade_required(r, "produce with a spilled key").await;
    let (ok, out, err) = narad(&url, &["gc", "--grace", "0s"]).await;
    assert!(ok, "{err}");
    let report: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(report["skipped_newer"], 1, "{report}");
    let (ok, out, err) = narad(&url, &["repair", "deep"]).await;
    assert!(ok, "{out} {err}");
    assert_eq!(snapshot(&s.store, "topics/deep/0/indexes/").await, newer);
    assert_eq!(
        snapshot(&s.store, "topics/deep/0/dedup/").await,
        newer_chunks
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_newer_receipt_key_or_handle_is_upgrade_required() {
    let Some((s, url)) = server().await else {
        return;
    };
    s.create_topic("h", json!({})).await;
    s.produce("h", "m").await;
    // A handle a newer build signed, in a newer handle version.
    assert_upgrade_required(s.ack_raw("h", "v3.e30.AAAA", "").await, "ack").await;
    // The generated receipt key in a newer format: a process on it serves nothing.
    let key = narad_shared::stored::keys::RECEIPT_KEY;
    // Test servers are configured with keys: generate the shared one as a process without.
    narad_shared::stored::shared_key(&*s.store, &narad_shared::clock::RandomIds)
        .await
        .unwrap();
    let newer = rewrite_as_newer(&s.store, key, "format", json!(2)).await;
    let unkeyed = Options {
        receipt_keys: Vec::new(),
        ..Options::default()
    };
    let other = Server::start_on(s.store.clone(), None, unkeyed, TestClock::manual(now_ms())).await;
    assert_upgrade_required(other.consume_raw("h", "").await, "consume").await;
    let r = other
        .req(Method::POST, "/v1/topics/h/produce")
        .body("x")
        .send()
        .await
        .unwrap();
    assert_upgrade_required(r, "produce").await;
    let held = s.consume("h", "").await.unwrap();
    let handle = held["receipt_handle"].as_str().unwrap();
    assert_upgrade_required(other.ack_raw("h", handle, "").await, "ack").await;
    assert_upgrade_required(
        other.req(Method::GET, "/v1/topics").send().await.unwrap(),
        "list topics",
    )
    .await;
    // The tools without a configured key refuse too, and write nothing.
    let (ok, _, err) = narad(&url, &["gc", "--grace", "0s"]).await;
    assert!(!ok && err.contains("receipt key format 2"), "{err}");
    let (ok, _, err) = narad(&url, &["repair", "h"]).await;
    assert!(!ok && err.contains("receipt key format 2"), "{err}");
    assert_eq!(s.store.get(key).await.unwrap().unwrap().data, newer);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn settings_a_newer_build_added_survive_a_patch_made_here() {
    let Some((s, _)) = server().await else {
        return;
    };
    s.create_topic("set", json!({})).await;
    let key = "topics/set/topic.json";
    let o = s.store.get(key).await.unwrap().unwrap();
    let mut v: Value =
        serde_json::from_slice(narad_shared::stored::open_json(&o.data).unwrap()).unwrap();
    v["settings"]["max_message_bytes"] = json!(512);
    v["owner"] = json!({"team": "payments"});
    let sealed = narad_shared::stored::seal_json(serde_json::to_vec(&v).unwrap());
    s.store.put_if_match(key, sealed, &o.etag).await.unwrap();

    let other = fresh(&s, TestClock::manual(now_ms())).await;
    let r = other
        .req(Method::PATCH, "/v1/topics/set")
        .body(r#"{"visibility_timeout_ms":60000}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let after: Value = serde_json::from_slice(
        narad_shared::stored::open_json(&s.store.get(key).await.unwrap().unwrap().data).unwrap(),
    )
    .unwrap();
    assert_eq!(after["settings"]["visibility_timeout_ms"], 60000);
    assert_eq!(after["settings"]["max_message_bytes"], 512, "{after}");
    assert_eq!(after["owner"]["team"], "payments", "{after}");
    // A create asking for what it has is still the same topic.
    let r = other
        .req(Method::PUT, "/v1/topics/set")
        .body(r#"{"visibility_timeout_ms":60000}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
}
