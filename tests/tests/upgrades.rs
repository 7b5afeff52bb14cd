//! Newer is not corrupt: a manifest or topic record written by a newer version of Narad
//! (a higher manifest format, a higher topic layout) is answered 503 `upgrade_required`
//! with `Retry-After`, counted in `/metrics`, and left byte for byte as it is by consume,
//! produce, ack, `narad gc` and `narad repair` (docs/upgrades.md).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use narad_shared::store::DynStore;
use narad_tests::{Options, Server, TestClock, T0};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

/// Rewrites the sealed JSON object at `key` with `field` set to `value`, checksum and all,
/// as a newer build would write it. Answers the bytes now stored.
async fn rewrite_as_newer(store: &DynStore, key: &str, field: &str, value: Value) -> bytes::Bytes {
    let o = store.get(key).await.unwrap().unwrap();
    let mut v: Value =
        serde_json::from_slice(narad_shared::cas::open_json(&o.data).unwrap()).unwrap();
    v[field] = value;
    let sealed = narad_shared::cas::seal_json(serde_json::to_vec(&v).unwrap());
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
    let out = tokio::process::Command::new(narad_tests::narad_binary())
        .args(args)
        .arg("--store")
        .arg(url)
        .env("NARAD_LOG", "warn")
        .output()
        .await
        .unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

async fn server() -> Option<(Server, String)> {
    if narad_tests::skip_in_external_mode("a store of its own for the narad command") {
        return None;
    }
    let (url, dir) = narad_tests::test_store_url();
    let store = narad_shared::store::open(&url).await.unwrap();
    let s = Server::start_on(store, dir, Options::default(), TestClock::manual(T0)).await;
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
    let text = s
        .req(Method::GET, "/metrics")
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
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
    let key = "topics/lay/topic.json";
    let newer = rewrite_as_newer(&s.store, key, "layout", json!(7)).await;
    // A fresh process (nothing cached) meets it on every route.
    let (store, dir) = (s.store.clone(), None);
    let fresh = Server::start_on(store, dir, Options::default(), TestClock::manual(T0)).await;
    assert_upgrade_required(fresh.consume_raw("lay", "").await, "consume").await;
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
    assert_eq!(s.store.get(key).await.unwrap().unwrap().data, newer);
    assert!(s
        .store
        .get("topics/lay/0.manifest.json")
        .await
        .unwrap()
        .is_some());
}
