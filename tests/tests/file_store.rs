//! The embedded file store as `narad serve` leaves it: private to its owner (the receipt
//! key and every payload live there), and no topic name that passes validation can reach
//! the store's own bookkeeping files.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use narad_tests::{free_port, Process, PASS, USER};
use reqwest::StatusCode;

#[cfg(unix)]
fn modes(dir: &std::path::Path, out: &mut Vec<(String, u32, bool)>) {
    use std::os::unix::fs::PermissionsExt;
    for e in std::fs::read_dir(dir).unwrap() {
        let e = e.unwrap();
        let meta = e.metadata().unwrap();
        let mode = meta.permissions().mode() & 0o777;
        out.push((e.path().display().to_string(), mode, meta.is_dir()));
        if meta.is_dir() {
            modes(&e.path(), out);
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn files_are_private_and_reserved_names_are_refused() {
    if narad_tests::skip_in_external_mode("a narad serve process of its own") {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path().join("data");
    let url = format!("file://{}", root.display());
    // Without NARAD_RECEIPT_KEY the key is generated and kept in the store.
    let p = Process::start(&url, free_port(), &[]).await;
    let http = reqwest::Client::new();
    let put = |name: &str| {
        http.put(format!("{}/v1/topics/{name}", p.base))
            .basic_auth(USER, Some(PASS))
            .body("{}")
            .send()
    };
    assert_eq!(put("orders").await.unwrap().status(), StatusCode::CREATED);
    let r = http
        .post(format!("{}/v1/topics/orders/produce", p.base))
        .basic_auth(USER, Some(PASS))
        .body("secret")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    for name in [".tmp", ".tmp-1", ".lock", ".hidden"] {
        let r = put(name).await.unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{name}");
        let v: serde_json::Value = r.json().await.unwrap();
        assert_eq!(v["error"]["code"], "invalid_topic_name", "{name}");
    }
    p.kill().await;

    #[cfg(unix)]
    {
        use std::os::unix::fs::PermissionsExt;
        let root_mode = std::fs::metadata(&root).unwrap().permissions().mode() & 0o777;
        assert_eq!(root_mode, 0o700, "the store's root");
        let mut all = Vec::new();
        modes(&root, &mut all);
        assert!(
            all.iter().any(|(p, _, _)| p.ends_with("receipt-key.json")),
            "{all:?}"
        );
        for (path, mode, is_dir) in &all {
            let want = if *is_dir { 0o700 } else { 0o600 };
            assert_eq!(*mode, want, "{path} is {mode:o}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_manifest_is_reported_as_corrupt_not_unavailable() {
    use narad_tests::Server;
    use reqwest::Method;
    let s = Server::start_local_with(narad_tests::Options::default()).await;
    s.create_topic("c", serde_json::json!({})).await;
    s.produce("c", "x").await;
    // Damage the manifest behind the broker's back: one digit, so it still parses as JSON
    // (only its own checksum can tell).
    let key = "topics/c/0.manifest.json";
    let o = s.store.get(key).await.unwrap().unwrap();
    let text = String::from_utf8(o.data.to_vec()).unwrap();
    assert!(text.contains("\"next_offset\":1,"), "{text}");
    let damaged = text.replace("\"next_offset\":1,", "\"next_offset\":7,");
    s.store
        .put_if_match(key, bytes::Bytes::from(damaged), &o.etag)
        .await
        .unwrap();
    // A read reports it (a commit would rebuild it: tests/tests/repair.rs).
    let r = s.req(Method::GET, "/v1/topics/c").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert_eq!(r.headers()["retry-after"], "30");
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "partition_corrupt");
    assert!(
        !v.to_string().contains("manifest.json"),
        "the key goes to the log, not to the client: {v}"
    );
    let metrics = s.metrics().await;
    let seen = narad_tests::metric(&metrics, "narad_corrupt_objects_total").unwrap();
    assert!(seen >= 1.0, "{metrics}");
}
