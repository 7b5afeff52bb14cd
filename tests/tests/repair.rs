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

/// A producer that retries after a repair gets its message's new offset, not a second
/// copy: the rebuilt manifest remembers the checkpoint's keys where their messages moved,
/// and reads the keys of messages committed after the checkpoint from their segments. A
/// delayed message that moves keeps its delay.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_rebuilt_partition_remembers_idempotency_keys_and_delays() {
    let s = Server::start().await;
    s.create_topic("idem", json!({"dedup_window_ms": 3_600_000}))
        .await;
    // Write 1 leaves the first checkpoint, which remembers "early"; writes 2..=21 the
    // second (at 17), which holds the delay of "delayed"; "late-*" come after it.
    s.produce_idem("idem", "early", "e").await;
    s.produce_q("idem", "delay=1h", "delayed").await;
    for i in 0..19 {
        s.produce("idem", format!("m{i}")).await;
    }
    for k in ["late-a", "late-b"] {
        s.produce_idem("idem", k, k).await;
    }
    damage(&s.store, "topics/idem/0.manifest.json").await;
    s.produce("idem", "after").await;
    // Retries: each answers where its message is now, and appends nothing.
    let before = s.topic("idem").await["partitions"][0]["next_offset"].clone();
    let early = s.produce_idem("idem", "early", "e").await.1;
    let late_a = s.produce_idem("idem", "late-a", "late-a").await.1;
    let late_b = s.produce_idem("idem", "late-b", "late-b").await.1;
    assert_eq!(
        s.topic("idem").await["partitions"][0]["next_offset"],
        before,
        "no retry appended"
    );
    let mut got = drain(&s, "idem").await;
    assert_eq!(got["e"], early, "the retry names the message's new offset");
    assert_eq!(got["late-a"], late_a);
    assert_eq!(got["late-b"], late_b);
    assert!(!got.contains_key("delayed"), "its delay moved with it");
    s.clock.advance(3_600_000);
    got.extend(drain(&s, "idem").await);
    assert!(got.contains_key("delayed"), "and ends when it did");
    assert_eq!(got.len(), 24, "each message once: {got:?}");
    // No header of the broker's own reaches a consumer.
    let r = s
        .consume_raw("idem", &format!("partition=0&offset={early}"))
        .await;
    let v: Value = r.json().await.unwrap();
    assert!(v.get("headers").is_none(), "{v}");
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
    // The narad command runs on the wall clock, so the server does too: a fixed start
    // would fall out of retention as the calendar passes it.
    let now = narad_tests::now_ms();
    let s = Server::start_on(
        store.clone(),
        dir,
        Options::default(),
        TestClock::manual(now),
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

/// A store that tears writes the way LocalStack does when the writing process dies: the
/// object keeps the first half of the new body and the writer gets a 500. A torn manifest
/// is then, on every other read, reported damaged by the store itself (the SDK's response
/// checksum failing) instead of returned. Seeded; on while `on` is set.
struct TornStore {
    inner: DynStore,
    rng: std::sync::Mutex<rand::rngs::StdRng>,
    on: std::sync::atomic::AtomicBool,
    torn: std::sync::atomic::AtomicU64,
    /// Torn manifests (key, ETag) and reads of them so far.
    torn_manifests: std::sync::Mutex<HashMap<(String, narad_shared::store::ETag), u64>>,
}

impl TornStore {
    /// Whether to tear this write of `key`: manifests 1 in 15, segments and index
    /// objects 1 in 30.
    fn tear(&self, key: &str) -> bool {
        use rand::Rng;
        use std::sync::atomic::Ordering::SeqCst;
        let p = if key.ends_with("manifest.json") {
            1.0 / 15.0
        } else if key.contains("/segments/") || key.contains("/indexes/") {
            1.0 / 30.0
        } else {
            return false;
        };
        let hit = self.on.load(SeqCst) && self.rng.lock().unwrap().gen_bool(p);
        if hit {
            self.torn.fetch_add(1, SeqCst);
        }
        hit
    }
}

fn half(data: &bytes::Bytes) -> bytes::Bytes {
    data.slice(..data.len() / 2)
}

fn torn() -> narad_shared::store::StoreError {
    narad_shared::store::StoreError::unavailable("injected: write torn, 500")
}

#[async_trait::async_trait]
impl narad_shared::store::Store for TornStore {
    async fn get(
        &self,
        key: &str,
    ) -> narad_shared::store::StoreResult<Option<narad_shared::store::Object>> {
        let got = self.inner.get(key).await?;
        if let Some(o) = &got {
            let mut torn = self.torn_manifests.lock().unwrap();
            if let Some(reads) = torn.get_mut(&(key.to_owned(), o.etag.clone())) {
                *reads += 1;
                if *reads % 2 == 1 {
                    return Err(narad_shared::store::StoreError::Corrupt(
                        "injected: body checksum mismatch".into(),
                    ));
                }
            }
        }
        Ok(got)
    }
    async fn get_if_changed(
        &self,
        key: &str,
        etag: &narad_shared::store::ETag,
    ) -> narad_shared::store::StoreResult<narad_shared::store::Fetched> {
        self.inner.get_if_changed(key, etag).await
    }
    async fn put_if_absent(
        &self,
        key: &str,
        data: bytes::Bytes,
    ) -> narad_shared::store::StoreResult<narad_shared::store::ETag> {
        if self.tear(key) {
            self.inner.put_if_absent(key, half(&data)).await?;
            return Err(torn());
        }
        self.inner.put_if_absent(key, data).await
    }
    async fn put_if_match(
        &self,
        key: &str,
        data: bytes::Bytes,
        etag: &narad_shared::store::ETag,
    ) -> narad_shared::store::StoreResult<narad_shared::store::ETag> {
        if self.tear(key) {
            let etag = self.inner.put_if_match(key, half(&data), etag).await?;
            if key.ends_with("manifest.json") {
                let mut torn = self.torn_manifests.lock().unwrap();
                torn.insert((key.to_owned(), etag), 0);
            }
            return Err(torn());
        }
        self.inner.put_if_match(key, data, etag).await
    }
    async fn delete(&self, key: &str) -> narad_shared::store::StoreResult<()> {
        self.inner.delete(key).await
    }
    async fn list(&self, prefix: &str) -> narad_shared::store::StoreResult<Vec<String>> {
        self.inner.list(prefix).await
    }
    async fn list_files(
        &self,
        prefix: &str,
    ) -> narad_shared::store::StoreResult<Vec<narad_shared::store::Listed>> {
        self.inner.list_files(prefix).await
    }
    fn describe(&self) -> String {
        "torn".into()
    }
}

/// Seeded: producers (with idempotency keys, retried until they succeed) and a consumer
/// that acks, nacks or drops what it gets, on a store that tears manifest, segment and
/// index writes. Every torn manifest is repaired by the broker itself, and across all of
/// it: every acknowledged produce is delivered, no offset holds two payloads, no offset
/// has two live leases, and an acked handle gets 410 when used again.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn torn_writes_are_repaired_and_every_invariant_holds() {
    use rand::{Rng, SeedableRng};
    use std::sync::atomic::Ordering::SeqCst;
    if narad_tests::skip_in_external_mode("a store of its own that tears writes") {
        return;
    }
    const VT: u64 = 3000;
    let (inner, dir) = narad_tests::test_store().await;
    let seed = std::env::var("NARAD_TORN_SEED")
        .ok()
        .and_then(|s| s.parse().ok())
        .unwrap_or(7);
    let store = std::sync::Arc::new(TornStore {
        inner,
        rng: std::sync::Mutex::new(rand::rngs::StdRng::seed_from_u64(seed)),
        on: std::sync::atomic::AtomicBool::new(false),
        torn: std::sync::atomic::AtomicU64::new(0),
        torn_manifests: std::sync::Mutex::new(HashMap::new()),
    });
    let s = Server::start_on(
        store.clone(),
        dir,
        Options::default(),
        TestClock::manual(T0),
    )
    .await;
    s.create_topic("t", json!({"partitions": 2, "visibility_timeout_ms": VT}))
        .await;
    store.on.store(true, SeqCst);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut acked_produce: HashSet<String> = HashSet::new();
    let mut payload_at: HashMap<(u64, u64), String> = HashMap::new();
    let mut delivered: HashSet<String> = HashSet::new();
    // Offset → (handle, lease deadline) of its newest delivery not known to be over.
    let mut live: HashMap<(u64, u64), (String, u64)> = HashMap::new();
    let mut spent: Vec<String> = Vec::new();
    let mut now = T0;
    let consume = |v: Value,
                   now: u64,
                   payload_at: &mut HashMap<(u64, u64), String>,
                   delivered: &mut HashSet<String>,
                   live: &mut HashMap<(u64, u64), (String, u64)>| {
        let mut out = Vec::new();
        for m in v["messages"].as_array().unwrap() {
            let at = (
                m["partition"].as_u64().unwrap(),
                m["offset"].as_u64().unwrap(),
            );
            let p = m["payload"].as_str().unwrap().to_owned();
            if let Some(prev) = payload_at.insert(at, p.clone()) {
                assert_eq!(prev, p, "seed {seed}: offset {at:?} held two payloads");
            }
            if let Some((_, deadline)) = live.get(&at) {
                assert!(*deadline <= now, "seed {seed}: two live leases on {at:?}");
            }
            live.insert(at, (handle(m), now + VT));
            delivered.insert(p);
            out.push((at, handle(m)));
        }
        out
    };
    for step in 0..240u64 {
        let payload = format!("p{step}");
        for attempt in 0.. {
            let r = s
                .req(Method::POST, "/v1/topics/t/produce")
                .header("Idempotency-Key", format!("k{step}"))
                .body(payload.clone())
                .send()
                .await
                .unwrap();
            if r.status() == StatusCode::CREATED {
                acked_produce.insert(payload.clone());
                break;
            }
            assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE, "seed {seed}");
            assert!(attempt < 50, "seed {seed}: {payload} never produced");
        }
        let r = s.consume_raw("t", "max=3").await;
        if r.status() == StatusCode::OK {
            let v: Value = r.json().await.unwrap();
            for (at, h) in consume(v, now, &mut payload_at, &mut delivered, &mut live) {
                let roll: f64 = rng.gen();
                if roll < 0.1 {
                    continue; // dropped: it lapses
                }
                let extra = if roll < 0.2 { "&extend=0" } else { "" };
                let st = s.ack("t", &h, extra).await;
                if st == StatusCode::NO_CONTENT {
                    live.remove(&at);
                    if extra.is_empty() {
                        spent.push(h);
                    }
                }
            }
        } else {
            assert!(
                [StatusCode::NO_CONTENT, StatusCode::SERVICE_UNAVAILABLE].contains(&r.status()),
                "seed {seed}: consume answered {}",
                r.status()
            );
        }
        now += 500;
        s.clock.set(now);
    }
    // Faults off: a spent handle stays spent, and a drain delivers every acknowledged
    // produce (at least once, across repairs).
    store.on.store(false, SeqCst);
    for h in spent.iter().rev().take(20) {
        assert_eq!(
            s.ack("t", h, "").await,
            StatusCode::GONE,
            "seed {seed}: spent handle"
        );
    }
    now += 10 * VT;
    s.clock.set(now);
    while let Some(v) = s.consume("t", "max=100").await {
        for (_, h) in consume(v, now, &mut payload_at, &mut delivered, &mut live) {
            assert_eq!(s.ack("t", &h, "").await, StatusCode::NO_CONTENT);
        }
    }
    let lost: Vec<&String> = acked_produce
        .iter()
        .filter(|p| !delivered.contains(*p))
        .collect();
    assert!(
        lost.is_empty(),
        "seed {seed}: acknowledged and lost: {lost:?}"
    );
    let topic = s.topic("t").await;
    let repaired = topic["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|p| p["version"].as_u64().unwrap() >= narad_shared::stored::VERSION_JUMP)
        .count();
    let damaged_reads: u64 = store
        .torn_manifests
        .lock()
        .unwrap()
        .values()
        .map(|r| r.div_ceil(2))
        .sum();
    println!(
        "seed {seed}: {} writes torn, {damaged_reads} manifest reads reported damaged by the store, \
         {repaired} partitions repaired, {} produces",
        store.torn.load(SeqCst),
        acked_produce.len()
    );
    assert!(
        damaged_reads > 0,
        "seed {seed}: the store must report damage too"
    );
    assert!(repaired > 0, "seed {seed}: the test must exercise repairs");
}
