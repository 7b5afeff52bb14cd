//! A corrupt manifest does not keep a partition down: the next commit that finds it
//! corrupt (twice, a moment apart) rebuilds it from the newest checkpoint and the segment
//! objects, and `narad repair [--dry-run]` does the same on demand. Nothing acknowledged is
//! lost, unsettled messages come again at fresh offsets, and no offset names two payloads
//! (docs/design.md §7).
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, HashSet};

use narad_shared::store::DynStore;
use narad_tests::{Options, Server, TestClock, T0};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

fn handle(m: &Value) -> String {
    m["receipt_handle"].as_str().unwrap().to_owned()
}

/// Overwrites `key` with bytes that are not a manifest, behind every broker's back (what
/// an interrupted write leaves on a store that shows half-written objects).
async fn damage(store: &DynStore, key: &str) {
    let o = store.get(key).await.unwrap().unwrap();
    let garbage = bytes::Bytes::from_static(b"{\"format\":4,\"version\":9,\"incarn");
    store.put_if_match(key, garbage, &o.etag).await.unwrap();
}

/// Produces 40 messages (so checkpoints exist), acks 10 and holds 5; answers the payloads
/// acked and the handles held.
async fn history(s: &Server, topic: &str) -> (HashSet<String>, Vec<String>) {
    s.create_topic(topic, json!({"visibility_timeout_ms": 600_000}))
        .await;
    for i in 0..40 {
        s.produce(topic, format!("m{i}")).await;
    }
    let mut acked = HashSet::new();
    for _ in 0..10 {
        let m = s.consume(topic, "").await.unwrap();
        assert_eq!(s.ack(topic, &handle(&m), "").await, StatusCode::NO_CONTENT);
        acked.insert(m["payload"].as_str().unwrap().to_owned());
    }
    let mut held = Vec::new();
    for _ in 0..5 {
        held.push(handle(&s.consume(topic, "").await.unwrap()));
    }
    (acked, held)
}

/// Consumes and acks until nothing is left; payload → offset.
async fn drain(s: &Server, topic: &str) -> HashMap<String, u64> {
    let mut got = HashMap::new();
    while let Some(v) = s.consume(topic, "max=100").await {
        for m in v["messages"].as_array().unwrap() {
            let p = m["payload"].as_str().unwrap().to_owned();
            assert!(got.insert(p, m["offset"].as_u64().unwrap()).is_none());
            assert_eq!(s.ack(topic, &handle(m), "").await, StatusCode::NO_CONTENT);
        }
    }
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_corrupt_manifest_is_rebuilt_by_the_next_commit_and_nothing_acknowledged_is_lost() {
    let s = Server::start().await;
    let (acked, held) = history(&s, "r").await;
    damage(&s.store, "topics/r/0.manifest.json").await;
    // A read says so (and the log names the object)...
    let r = s.req(Method::GET, "/v1/topics/r").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "partition_corrupt");
    // ...and the next commit repairs it by itself.
    s.produce("r", "after").await;
    let got = drain(&s, "r").await;
    for i in 0..40 {
        let p = format!("m{i}");
        assert!(
            acked.contains(&p) || got.contains_key(&p),
            "{p} was never acked and is not delivered again"
        );
    }
    assert!(got.contains_key("after"));
    assert!(
        got.values().all(|&o| o > 40),
        "fresh offsets, above every one handed out before: {got:?}"
    );
    for h in held {
        assert_eq!(s.ack("r", &h, "").await, StatusCode::GONE, "a stale handle");
    }
    let r = s.consume_raw("r", "partition=0&offset=3").await;
    assert_eq!(r.status(), StatusCode::GONE, "old offsets are retired");
    let p = &s.topic("r").await["partitions"][0];
    assert_eq!(p["frontier"], p["next_offset"], "{p}");
}

/// `narad repair --dry-run` says what it would do and changes nothing; `narad repair`
/// does it; a healthy partition is left alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn narad_repair_reports_then_rebuilds_a_corrupt_partition() {
    if narad_tests::skip_in_external_mode("a store of its own for the narad command") {
        return;
    }
    let (url, dir) = narad_tests::test_store_url();
    let store = narad_shared::store::open(&url).await.unwrap();
    let s = Server::start_on(
        store.clone(),
        dir,
        Options::default(),
        TestClock::manual(T0),
    )
    .await;
    let (acked, _) = history(&s, "cli").await;
    let key = "topics/cli/0.manifest.json";
    damage(&store, key).await;
    let run = |dry: bool| {
        let mut cmd = tokio::process::Command::new(narad_tests::narad_binary());
        cmd.arg("repair").arg("--store").arg(&url);
        if dry {
            cmd.arg("--dry-run");
        }
        cmd.args(["cli", "0"]).env("NARAD_LOG", "warn");
        async move {
            let out = cmd.output().await.unwrap();
            assert!(
                out.status.success(),
                "{}",
                String::from_utf8_lossy(&out.stderr)
            );
            let line = String::from_utf8(out.stdout).unwrap();
            serde_json::from_str::<Value>(line.trim()).unwrap()
        }
    };
    let before = store.get(key).await.unwrap().unwrap().etag;
    let dry = run(true).await;
    assert_eq!(dry["state"], "corrupt", "{dry}");
    assert_eq!(dry["object"], key);
    let report = &dry["report"];
    assert!(report["checkpoint_version"].as_u64().unwrap() > 0, "{dry}");
    assert_eq!(report["retired"][1], report["offsets"][0]);
    assert_eq!(
        store.get(key).await.unwrap().unwrap().etag,
        before,
        "a dry run changes nothing"
    );
    let done = run(false).await;
    assert_eq!(done["state"], "repaired", "{done}");
    assert_eq!(run(false).await["state"], "healthy");
    let got = drain(&s, "cli").await;
    let lost: Vec<String> = (0..40)
        .map(|i| format!("m{i}"))
        .filter(|p| !acked.contains(p) && !got.contains_key(p))
        .collect();
    assert!(lost.is_empty(), "lost: {lost:?}");
}
