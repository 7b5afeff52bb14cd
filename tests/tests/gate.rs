//! The format gate (docs/upgrades.md): a build writes a newer format only once the
//! store's fleet record allows it; `narad upgrade finalize` raises the record and refuses
//! while a build that cannot read the new formats may still run (a live process record of
//! one, a recent manifest write without the gate's stamp, or, for the first raise, no
//! confirmation that builds before the gate are gone); a build older than the record
//! refuses to start, and one that learns of it while running stops serving.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use tokio::time::Instant;

use narad_shared::broker::Broker;
use narad_shared::config::BrokerOptions;
use narad_shared::error::BrokerError;
use narad_shared::store::DynStore;
use narad_shared::stored;
use narad_tests::{now_ms, Options, Server, TestClock};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

/// The newest fleet level this build runs at.
const NEWEST: u32 = narad_shared::formats::Level::NEWEST.0;

/// A process record lifetime short enough to watch renewals (one a second).
fn quick() -> Options {
    Options {
        broker: BrokerOptions {
            process_ttl: Duration::from_secs(3),
            poll_interval: Duration::from_millis(50),
            ..BrokerOptions::default()
        },
        ..Options::default()
    }
}

async fn server() -> Option<(Server, String)> {
    if narad_tests::skip_in_external_mode("a store of its own for the narad command") {
        return None;
    }
    let (url, dir) = narad_tests::test_store_url();
    let store = narad_shared::store::open(&url).await.unwrap();
    // At level 1, as a store that builds before the gate used (a new one starts at the
    // newest level).
    put_sealed(&store, "system/fleet.json", &json!({"level": 1})).await;
    let s = Server::start_on(store, dir, quick(), TestClock::manual(now_ms())).await;
    Some((s, url))
}

/// Runs `narad upgrade ARGS --store URL`; answers (success, the JSON it printed, stderr).
async fn upgrade(url: &str, args: &[&str]) -> (bool, Value, String) {
    let mut all = vec!["upgrade"];
    all.extend(args);
    all.extend(["--store", url]);
    let (ok, stdout, stderr) = narad_tests::run_narad(&all).await;
    let v =
        serde_json::from_str(stdout.trim()).unwrap_or_else(|e| panic!("{e}: {stdout} {stderr}"));
    (ok, v, stderr)
}

fn kinds(v: &Value) -> Vec<String> {
    let blockers = v
        .get("blockers")
        .or_else(|| v.pointer("/status/blockers"))
        .and_then(Value::as_array)
        .cloned()
        .unwrap_or_default();
    blockers
        .iter()
        .map(|b| b["kind"].as_str().unwrap().to_owned())
        .collect()
}

async fn put_sealed(store: &DynStore, key: &str, v: &Value) {
    let body = stored::seal_json(serde_json::to_vec(v).unwrap());
    match store.get(key).await.unwrap() {
        Some(o) => store.put_if_match(key, body, &o.etag).await.unwrap(),
        None => store.put_if_absent(key, body).await.unwrap(),
    };
}

/// The magic of the newest segment of `topic`'s partition 0.
async fn newest_magic(store: &DynStore, topic: &str) -> String {
    let mut keys = store
        .list(&format!("topics/{topic}/0/segments/"))
        .await
        .unwrap();
    keys.sort();
    let o = store.get(keys.last().unwrap()).await.unwrap().unwrap();
    String::from_utf8_lossy(&o.data[..4]).into_owned()
}

/// A payload that compresses well.
fn order(i: u32) -> String {
    let item = r#"{"sku":"SKU-000123","qty":1,"price_cents":1999,"warehouse":"eu-west"}"#;
    format!(
        r#"{{"order":{i},"customer":"c-42","items":[{}]}}"#,
        [item; 12].join(",")
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn formats_wait_for_finalize_and_finalize_waits_for_the_fleet() {
    let Some((s, url)) = server().await else {
        return;
    };
    s.create_topic("g", json!({})).await;
    // A store of builds before the gate has topics and no fleet record.
    s.store.delete("system/fleet.json").await.unwrap();
    s.produce("g", order(0)).await;
    // Level 1: what every build reads, however well it would compress.
    assert_eq!(newest_magic(&s.store, "g").await, "NSG1");
    let manifest = "topics/g/0.manifest.json";
    let stored = |store: DynStore| async move {
        let o = store.get(manifest).await.unwrap().unwrap();
        serde_json::from_slice::<Value>(stored::open_json(&o.data).unwrap()).unwrap()
    };
    let last = stored(s.store.clone()).await["recent_writes"][0].clone();
    assert!(
        last.as_str()
            .unwrap()
            .starts_with(&format!("g{}-", narad_shared::formats::Level::NEWEST)),
        "writes carry the stamp: {last}"
    );

    let (ok, st, _) = upgrade(&url, &["status"]).await;
    assert!(ok);
    assert_eq!(
        (st["level"].as_u64(), st["this_build"].as_u64()),
        (Some(1), Some(u64::from(NEWEST)))
    );
    assert_eq!(st["processes"].as_array().unwrap().len(), 1, "{st}");
    assert_eq!(kinds(&st), ["unconfirmed"], "{st}");

    // A live process of a build that reads only level 1.
    let old = "system/processes/older.json";
    let now = now_ms();
    put_sealed(
        &s.store,
        old,
        &json!({"build": "narad 0.0.9", "newest": 1, "level": 1, "host": "h", "pid": 1,
                "started_ms": now, "renewed_ms": now, "expires_ms": now + 60_000}),
    )
    .await;
    let (ok, out, err) = upgrade(&url, &["finalize", "--confirm-old-builds-stopped"]).await;
    assert!(!ok && err.contains("level 1"), "{out} {err}");
    assert_eq!(kinds(&out), ["process"], "{out}");
    s.store.delete(old).await.unwrap();

    // A build before the gate wrote the manifest just now: no stamp.
    let mut m = stored(s.store.clone()).await;
    m["recent_writes"]
        .as_array_mut()
        .unwrap()
        .push(json!(uuid::Uuid::now_v7().simple().to_string()));
    put_sealed(&s.store, manifest, &m).await;
    let (ok, out, _) = upgrade(&url, &["finalize", "--confirm-old-builds-stopped"]).await;
    assert!(!ok);
    assert_eq!(kinds(&out), ["recent_write"], "{out}");
    tokio::time::sleep(Duration::from_millis(1100)).await;
    // Out of the window now; still, the first raise needs the operator's word.
    let (ok, out, _) = upgrade(&url, &["finalize", "--window", "1s"]).await;
    assert!(!ok);
    assert_eq!(kinds(&out), ["unconfirmed"], "{out}");
    let fleet = s.store.get("system/fleet.json").await.unwrap();
    let level_of = |o: &narad_shared::store::Object| {
        let v: Value = serde_json::from_slice(stored::open_json(&o.data).unwrap()).unwrap();
        v["level"].as_u64()
    };
    assert_eq!(
        fleet.as_ref().and_then(level_of).unwrap_or(1),
        1,
        "refused raises leave it"
    );
    // Still level 1 on the running server.
    s.produce("g", order(1)).await;
    assert_eq!(newest_magic(&s.store, "g").await, "NSG1");

    let (ok, out, err) = upgrade(
        &url,
        &["finalize", "--window", "1s", "--confirm-old-builds-stopped"],
    )
    .await;
    assert!(ok, "{out} {err}");
    assert_eq!(out, json!({"outcome": "raised", "level": NEWEST}));
    // The running server learns it at its next renewal (every second here).
    let deadline = Instant::now() + Duration::from_secs(10);
    let mut i = 2;
    loop {
        s.produce("g", order(i)).await;
        i += 1;
        if newest_magic(&s.store, "g").await == "NSG3" {
            break;
        }
        assert!(Instant::now() < deadline, "never wrote the level-2 format");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // Every message reads back, compressed or not.
    for _ in 0..i {
        let m = s.consume("g", "").await.expect("a message");
        assert!(m["payload"]["order"].is_u64(), "{m}");
        let h = m["receipt_handle"].as_str().unwrap().to_owned();
        assert_eq!(s.ack("g", &h, "").await, StatusCode::NO_CONTENT);
    }
    let (ok, st, _) = upgrade(&url, &["status"]).await;
    assert!(ok);
    assert_eq!(st["level"], NEWEST);
    assert!(kinds(&st).is_empty(), "{st}");
    let (ok, out, _) = upgrade(&url, &["finalize"]).await;
    assert!(ok && out["level"] == NEWEST, "{out}");
    // A process of this build started now writes its newest level at once.
    let other = Server::start_on(s.store.clone(), None, quick(), TestClock::manual(now_ms())).await;
    other.produce("g", order(99)).await;
    assert_eq!(newest_magic(&s.store, "g").await, "NSG3");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_build_older_than_the_fleet_refuses_to_start_and_stops_serving() {
    let Some((s, url)) = server().await else {
        return;
    };
    s.create_topic("old", json!({})).await;
    s.produce("old", "m").await;
    let start = || {
        Broker::new(
            s.store.clone(),
            std::sync::Arc::new(TestClock::manual(now_ms())),
            std::sync::Arc::new(narad_shared::clock::RandomIds),
            Vec::new(),
            BrokerOptions::default(),
        )
    };
    // A raise to a level this build does not read, under way: no new process joins.
    let now = now_ms();
    let fleet = "system/fleet.json";
    put_sealed(
        &s.store,
        fleet,
        &json!({"level": NEWEST, "raising": {"to": NEWEST + 1, "id": "x", "until_ms": now + 60_000}}),
    )
    .await;
    match start().await {
        Err(e @ BrokerError::UpgradeRequired { .. }) => {
            assert!(
                e.to_string()
                    .contains(&format!("fleet level being raised to {}", NEWEST + 1)),
                "{e}"
            )
        }
        other => panic!("{:?}", other.map(|_| ())),
    }
    // The running one carries on: its record was there before the raise began.
    s.produce("old", "still").await;
    // The raise lands: a new process refuses, and `narad serve` says why.
    put_sealed(&s.store, fleet, &json!({"level": NEWEST + 1})).await;
    assert!(matches!(
        start().await,
        Err(BrokerError::UpgradeRequired { .. })
    ));
    let out = tokio::process::Command::new(narad_tests::narad_binary())
        .args(["serve", "--listen", "127.0.0.1:0", "--store", &url])
        .env("NARAD_AUTH", "u:p")
        .output();
    let out = tokio::time::timeout(Duration::from_secs(20), out)
        .await
        .expect("narad serve must refuse, not serve")
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        !out.status.success() && err.contains(&format!("fleet level {}", NEWEST + 1)),
        "{err}"
    );
    // The running process stops serving at its next renewal.
    let deadline = Instant::now() + Duration::from_secs(10);
    loop {
        let r = s
            .req(Method::POST, "/v1/topics/old/produce")
            .body("x")
            .send()
            .await
            .unwrap();
        if r.status() == StatusCode::SERVICE_UNAVAILABLE {
            let v: Value = r.json().await.unwrap();
            assert_eq!(v["error"]["code"], "upgrade_required", "{v}");
            break;
        }
        assert_eq!(r.status(), StatusCode::CREATED);
        assert!(
            Instant::now() < deadline,
            "kept serving past a raise beyond it"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // `narad upgrade` of this build will not raise past what it reads.
    let to = (NEWEST + 2).to_string();
    let (ok, out, _) = upgrade(&url, &["status", "--to", &to]).await;
    assert!(ok);
    assert_eq!(out["level"], NEWEST + 1);
    // (the stopped process, which reads only its own newest level, still runs and
    // still counts)
    assert_eq!(kinds(&out)[0], "beyond_this_build", "{out}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_deletes_process_records_long_expired() {
    let Some((s, url)) = server().await else {
        return;
    };
    let now = now_ms();
    let gone = "system/processes/gone.json";
    put_sealed(
        &s.store,
        gone,
        &json!({"build": "narad 0.1.0", "newest": 2, "level": 1, "host": "h", "pid": 1,
                "started_ms": 0, "renewed_ms": 0, "expires_ms": now - 7_200_000}),
    )
    .await;
    let (ok, out, err) = narad_tests::run_narad(&["gc", "--store", &url]).await;
    assert!(ok, "{err}");
    let report: Value = serde_json::from_str(out.trim()).unwrap();
    assert_eq!(report["process_records_deleted"], 1, "{report}");
    assert!(s.store.get(gone).await.unwrap().is_none());
    // The live ones (the test server's, and the gc's own, deleted as it ends) stay.
    let live = s.store.list("system/processes/").await.unwrap();
    assert!(!live.is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_record_is_renewed_after_a_lost_answer_or_a_delete() {
    let Some((s, _)) = server().await else {
        return;
    };
    let keys = s.store.list("system/processes/").await.unwrap();
    assert_eq!(keys.len(), 1, "{keys:?}");
    let key = &keys[0];
    let renewed = |store: DynStore| async move {
        let o = store.get(key).await.unwrap()?;
        let v: Value = serde_json::from_slice(stored::open_json(&o.data).unwrap()).unwrap();
        v["renewed_ms"].as_u64()
    };
    // Its ETag changes under it, as when the answer to its last write was lost.
    let o = s.store.get(key).await.unwrap().unwrap();
    let mut v: Value = serde_json::from_slice(stored::open_json(&o.data).unwrap()).unwrap();
    v["renewed_ms"] = json!(1);
    put_sealed(&s.store, key, &v).await;
    let before = 1;
    let deadline = Instant::now() + Duration::from_secs(5);
    while renewed(s.store.clone()).await.unwrap() == before {
        assert!(Instant::now() < deadline, "not renewed over a changed ETag");
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    // Deleted (as gc deletes an expired one): written afresh.
    s.store.delete(key).await.unwrap();
    while renewed(s.store.clone()).await.is_none() {
        assert!(
            Instant::now() < deadline,
            "not written again after a delete"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_new_store_starts_at_the_newest_level_and_one_with_topics_at_level_one() {
    let join = |store: DynStore| async move {
        Broker::new(
            store,
            std::sync::Arc::new(TestClock::manual(now_ms())),
            std::sync::Arc::new(narad_shared::clock::RandomIds),
            Vec::new(),
            BrokerOptions::default(),
        )
        .await
        .unwrap()
    };
    let fresh = narad_shared::store::open("memory://").await.unwrap();
    let b = join(fresh.clone()).await;
    assert_eq!(b.fleet_level(), narad_shared::formats::Level::NEWEST);
    let o = fresh.get("system/fleet.json").await.unwrap().unwrap();
    let v: Value = serde_json::from_slice(stored::open_json(&o.data).unwrap()).unwrap();
    assert_eq!(v["level"], narad_shared::formats::Level::NEWEST.0);
    // A second process finds the record.
    assert_eq!(
        join(fresh).await.fleet_level(),
        narad_shared::formats::Level::NEWEST
    );

    // Topics and no record: builds before the gate may be serving it.
    let old = narad_shared::store::open("memory://").await.unwrap();
    old.put_if_absent("topics/t/topic.json", bytes::Bytes::from_static(b"{}"))
        .await
        .unwrap();
    let b = join(old.clone()).await;
    assert_eq!(b.fleet_level(), narad_shared::formats::Level::BEFORE_GATE);
    assert!(old.get("system/fleet.json").await.unwrap().is_none());
}
