//! A rolling deploy, with real builds: `narad serve` of main at commit c3661c8 (the build
//! before the format gate, built once by `tests/previous-build.sh`) and of this build.
//!
//! * The current build on a store the previous build wrote (and left mid-flight): every
//!   unsettled message is delivered once its lease lapses, settled ones are not, the
//!   previous build's receipt handles are answered 204 or 410, its idempotency keys dedupe.
//! * Both builds serving one store at once under producers and consumers: nothing
//!   acknowledged is lost, no message is leased twice, the previous build repairs nothing
//!   (it logs no corrupt manifest), and the gate keeps this build's newer formats
//!   unwritten; `narad upgrade finalize` refuses while the previous build writes, and
//!   raises the level once it is gone, after which this build writes them.
//!
//! Both run on the file store (one directory, several processes), so the test depends on
//! no other service; the formats are the same on every store.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::{HashMap, HashSet};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use tokio::time::Instant;

use narad_tests::{collect_log, free_port, previous_build, Process, PASS, PREVIOUS_COMMIT, USER};
use reqwest::StatusCode;
use serde_json::Value;

type Log = Arc<Mutex<Vec<String>>>;

struct Fleet {
    http: reqwest::Client,
    url: String,
    dir: tempfile::TempDir,
}

impl Fleet {
    fn new() -> Self {
        let dir = tempfile::tempdir().unwrap();
        Self {
            http: reqwest::Client::new(),
            url: format!("file://{}", dir.path().display()),
            dir,
        }
    }

    async fn previous(&self) -> (Process, Log) {
        let bin = tokio::task::spawn_blocking(|| previous_build(PREVIOUS_COMMIT))
            .await
            .unwrap();
        let (p, log) = Process::start_binary(&bin, &self.url, free_port(), &[]).await;
        (p, collect_log(log))
    }

    async fn current(&self) -> (Process, Log) {
        let env = [("NARAD_PROCESS_RECORD_TTL_MS", "3000")];
        let (p, log) = Process::start_logged(&self.url, free_port(), &env).await;
        (p, collect_log(log))
    }

    fn req(&self, method: reqwest::Method, base: &str, path: &str) -> reqwest::RequestBuilder {
        self.http
            .request(method, format!("{base}{path}"))
            .basic_auth(USER, Some(PASS))
    }

    /// A produce without an idempotency key (its segment is combinable when it combines);
    /// answers 201.
    async fn produce_keyless(&self, base: &str, topic: &str, body: &str) {
        let r = self
            .req(
                reqwest::Method::POST,
                base,
                &format!("/v1/topics/{topic}/produce"),
            )
            .body(body.to_owned())
            .send()
            .await
            .unwrap();
        assert_eq!(
            r.status(),
            StatusCode::CREATED,
            "keyless produce via {base}"
        );
    }

    async fn produce(&self, base: &str, topic: &str, key: &str, body: String) -> (u64, u64) {
        let r = self
            .req(
                reqwest::Method::POST,
                base,
                &format!("/v1/topics/{topic}/produce"),
            )
            .header("Idempotency-Key", key)
            .body(body)
            .send()
            .await
            .unwrap();
        let status = r.status();
        let v: Value = r.json().await.unwrap();
        assert!(status.is_success(), "produce via {base}: {status} {v}");
        (
            v["partition"].as_u64().unwrap(),
            v["offset"].as_u64().unwrap(),
        )
    }

    /// One message, or `None` (204).
    async fn consume(&self, base: &str, topic: &str) -> Option<Value> {
        let r = self
            .req(
                reqwest::Method::GET,
                base,
                &format!("/v1/topics/{topic}/consume"),
            )
            .send()
            .await
            .unwrap();
        match r.status() {
            StatusCode::OK => Some(r.json().await.unwrap()),
            StatusCode::NO_CONTENT => None,
            s => panic!("consume via {base}: {s} {}", r.text().await.unwrap()),
        }
    }

    async fn ack(&self, base: &str, topic: &str, handle: &str) -> StatusCode {
        self.req(
            reqwest::Method::POST,
            base,
            &format!("/v1/topics/{topic}/ack"),
        )
        .query(&[("receipt_handle", handle)])
        .send()
        .await
        .unwrap()
        .status()
    }

    /// Runs this build's `narad upgrade ARGS`; (success, JSON printed).
    async fn upgrade(&self, args: &[&str]) -> (bool, Value) {
        let mut all = vec!["upgrade"];
        all.extend(args);
        all.extend(["--store", &self.url]);
        let (ok, out, err) = narad_tests::run_narad(&all).await;
        let v = serde_json::from_str(out.trim()).unwrap_or_else(|e| panic!("{e}: {out} {err}"));
        (ok, v)
    }

    /// How many combinable segments in the store carry an incarnation tag (level 4).
    fn tagged_segments(&self) -> usize {
        files(self.dir.path().join("topics"))
            .iter()
            .filter(|f| f.parent().is_some_and(|p| p.ends_with("segments")))
            .filter_map(|f| f.file_name()?.to_str().map(str::to_owned))
            .filter(|name| {
                narad_shared::stored::Combinable::parse(name).is_some_and(|c| c.tag.is_some())
            })
            .count()
    }

    /// The version magic of every segment in the store.
    fn segment_magics(&self) -> HashMap<String, usize> {
        let mut out = HashMap::new();
        for f in files(self.dir.path().join("topics")) {
            if f.parent().is_some_and(|p| p.ends_with("segments")) {
                let data = std::fs::read(&f).unwrap();
                // Intents (level 3) are empty objects beside the segments.
                let magic = data
                    .get(..4)
                    .map_or("intent".into(), String::from_utf8_lossy);
                *out.entry(magic.into_owned()).or_default() += 1;
            }
        }
        out
    }

    /// The format of every manifest in the store.
    fn manifest_formats(&self) -> HashSet<u64> {
        files(self.dir.path().join("topics"))
            .into_iter()
            .filter(|f| f.to_string_lossy().ends_with("manifest.json"))
            .map(|f| {
                let data = std::fs::read(&f).unwrap();
                let json = narad_shared::stored::open_json(&data).unwrap();
                serde_json::from_slice::<Value>(json).unwrap()["format"]
                    .as_u64()
                    .unwrap()
            })
            .collect()
    }
}

fn files(dir: PathBuf) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(&dir) else {
        return out;
    };
    for e in entries {
        let p = e.unwrap().path();
        if p.is_dir() {
            out.extend(files(p));
        } else {
            out.push(p);
        }
    }
    out
}

/// A payload that this build would compress at level 2.
fn order(n: u64) -> String {
    let item = r#"{"sku":"SKU-000123","qty":1,"price_cents":1999,"warehouse":"eu-west"}"#;
    format!(r#"{{"n":{n},"items":[{}]}}"#, [item; 10].join(","))
}

fn assert_no_repair(who: &str, log: &Log) {
    let lines = log.lock().unwrap();
    let bad: Vec<&String> = lines
        .iter()
        .filter(|l| l.contains("corrupt") || l.contains("rebuilt") || l.contains("ERROR"))
        .collect();
    assert!(bad.is_empty(), "{who} logged: {bad:#?}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_current_build_carries_on_from_a_store_the_previous_build_left() {
    if narad_tests::skip_in_external_mode("narad serve processes of its own") {
        return;
    }
    let f = Fleet::new();
    let (old, old_log) = f.previous().await;
    let r = f
        .req(reqwest::Method::PUT, &old.base, "/v1/topics/left")
        .body(r#"{"partitions":2,"visibility_timeout_ms":4000}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    // Ten messages with keys; one delayed (manifest format 5), one with a header (NSG2).
    let mut offsets = HashMap::new();
    for i in 0..10u64 {
        let key = format!("k{i}");
        let at = f.produce(&old.base, "left", &key, order(i)).await;
        offsets.insert(key, at);
    }
    let r = f
        .req(
            reqwest::Method::POST,
            &old.base,
            "/v1/topics/left/produce?partition=0&delay=1s",
        )
        .header("Narad-Header-Trace", "t-1")
        .body(order(10))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let delayed: Value = r.json().await.unwrap();
    // Four consumed: two acked, two left leased (handles kept).
    let mut acked = HashSet::new();
    let mut held = Vec::new();
    for i in 0..4 {
        let m = f.consume(&old.base, "left").await.expect("a message");
        let at = (
            m["partition"].as_u64().unwrap(),
            m["offset"].as_u64().unwrap(),
        );
        let h = m["receipt_handle"].as_str().unwrap().to_owned();
        if i % 2 == 0 {
            assert_eq!(f.ack(&old.base, "left", &h).await, StatusCode::NO_CONTENT);
            acked.insert(at);
            held.push((at, h, true));
        } else {
            held.push((at, h, false));
        }
    }
    assert!(
        f.manifest_formats().contains(&5),
        "{:?}",
        f.manifest_formats()
    );
    assert!(
        f.segment_magics().contains_key("NSG2"),
        "{:?}",
        f.segment_magics()
    );
    old.kill().await;

    let (cur, cur_log) = f.current().await;
    // The previous build's handles: a live lease acks (204), a spent one is 410; the last
    // lease is left to lapse.
    let (lapsing, _, _) = held.pop().unwrap();
    for (at, h, spent) in &held {
        let want = if *spent {
            StatusCode::GONE
        } else {
            StatusCode::NO_CONTENT
        };
        assert_eq!(f.ack(&cur.base, "left", h).await, want, "{at:?}");
        acked.insert(*at);
    }
    assert!(!acked.contains(&lapsing));
    // Its idempotency keys still dedupe: the same offset, no second copy.
    for (key, at) in &offsets {
        assert_eq!(
            f.produce(&cur.base, "left", key, "again".into()).await,
            *at,
            "{key}"
        );
    }
    // Every unsettled message, the delayed one included, is delivered once; settled ones
    // are not.
    let mut want: HashSet<(u64, u64)> = offsets.values().copied().collect();
    want.insert((0, delayed["offset"].as_u64().unwrap()));
    want.retain(|at| !acked.contains(at));
    let mut got = HashSet::new();
    let deadline = Instant::now() + Duration::from_secs(20);
    while got.len() < want.len() && Instant::now() < deadline {
        match f.consume(&cur.base, "left").await {
            Some(m) => {
                let at = (
                    m["partition"].as_u64().unwrap(),
                    m["offset"].as_u64().unwrap(),
                );
                assert!(got.insert(at), "{at:?} delivered twice");
                assert!(m["payload"]["n"].is_u64(), "{m}");
                let h = m["receipt_handle"].as_str().unwrap();
                assert_eq!(f.ack(&cur.base, "left", h).await, StatusCode::NO_CONTENT);
            }
            None => tokio::time::sleep(Duration::from_millis(200)).await,
        }
    }
    assert_eq!(got, want);
    assert_no_repair("the previous build", &old_log);
    assert_no_repair("this build", &cur_log);
    cur.kill().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn both_builds_serve_one_store_and_the_gate_holds_until_finalize() {
    if narad_tests::skip_in_external_mode("narad serve processes of its own") {
        return;
    }
    const PER_PRODUCER: u64 = 60;
    let f = Arc::new(Fleet::new());
    // A deployment of the previous build, with a topic: the store is not new, so this
    // build joins it at level 1 (a new store would start at the newest level).
    let (old, old_log) = f.previous().await;
    let r = f
        .req(reqwest::Method::PUT, &old.base, "/v1/topics/mixed")
        .body(r#"{"partitions":2,"visibility_timeout_ms":60000}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = f
        .req(reqwest::Method::PUT, &old.base, "/v1/topics/other")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let (cur, cur_log) = f.current().await;
    let bases = Arc::new([old.base.clone(), cur.base.clone()]);

    // Two producers per build, and four consumers that consume through one build and ack
    // through the other, all at once.
    let produced: Arc<Mutex<HashMap<(u64, u64), u64>>> = Arc::default();
    let mut tasks = Vec::new();
    for w in 0..4u64 {
        let (f, bases, produced) = (f.clone(), bases.clone(), produced.clone());
        tasks.push(tokio::spawn(async move {
            for i in 0..PER_PRODUCER {
                let n = w * 1000 + i;
                let base = &bases[(w % 2) as usize];
                let at = f.produce(base, "mixed", &format!("m{n}"), order(n)).await;
                assert!(
                    produced.lock().unwrap().insert(at, n).is_none(),
                    "{at:?} twice"
                );
            }
        }));
    }
    let delivered: Arc<Mutex<HashMap<(u64, u64), u64>>> = Arc::default();
    let total = 4 * PER_PRODUCER as usize;
    for c in 0..4usize {
        let (f, bases, delivered) = (f.clone(), bases.clone(), delivered.clone());
        tasks.push(tokio::spawn(async move {
            let deadline = Instant::now() + Duration::from_secs(90);
            while delivered.lock().unwrap().len() < total && Instant::now() < deadline {
                let Some(m) = f.consume(&bases[c % 2], "mixed").await else {
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                };
                let at = (
                    m["partition"].as_u64().unwrap(),
                    m["offset"].as_u64().unwrap(),
                );
                let n = m["payload"]["n"].as_u64().unwrap();
                // Long leases and no nacks: a second delivery means two live leases.
                let before = delivered.lock().unwrap().insert(at, n);
                assert!(before.is_none(), "{at:?} leased twice");
                let h = m["receipt_handle"].as_str().unwrap();
                assert_eq!(
                    f.ack(&bases[(c + 1) % 2], "mixed", h).await,
                    StatusCode::NO_CONTENT
                );
            }
        }));
    }
    // While both run: the previous build's writes carry no stamp, so no raise.
    tokio::time::sleep(Duration::from_secs(2)).await;
    let (ok, out) = f
        .upgrade(&["finalize", "--confirm-old-builds-stopped"])
        .await;
    assert!(!ok, "{out}");
    let blockers = out["status"]["blockers"].as_array().unwrap();
    assert!(
        blockers
            .iter()
            .any(|b| b["kind"] == "recent_write" && b["stamp"].is_null()),
        "{out}"
    );
    for t in tasks {
        t.await.unwrap();
    }
    let produced = produced.lock().unwrap().clone();
    let delivered = delivered.lock().unwrap().clone();
    assert_eq!(produced.len(), total);
    assert_eq!(
        delivered, produced,
        "every produced message delivered once, as produced"
    );
    // The gate held: nothing this build would write only at level 2, 3 or 4 (a keyless
    // produce that combines, as the mixed topic's did, would write a tagged combinable id
    // at level 4).
    f.produce_keyless(&cur.base, "other", "keyless").await;
    let magics = f.segment_magics();
    assert!(!magics.contains_key("NSG3"), "{magics:?}");
    assert_eq!(f.tagged_segments(), 0, "tagged combinable ids are level 4");
    assert!(f.manifest_formats().iter().all(|v| *v <= 5));
    assert_no_repair("the previous build", &old_log);

    // The previous build leaves; once its last write is out of the window, the operator
    // confirms and the level rises; this build then writes the newer formats.
    old.kill().await;
    tokio::time::sleep(Duration::from_millis(1500)).await;
    let (ok, out) = f
        .upgrade(&["finalize", "--window", "1s", "--confirm-old-builds-stopped"])
        .await;
    assert!(ok, "{out}");
    assert_eq!(out["level"], narad_shared::formats::Level::NEWEST.0);
    // Combinable ids are written only where processes combine: a second process of this
    // build produces to the same partition at the same moments. They race only when their
    // requests meet; on a loaded machine (a CI run on SeaweedFS once took longer than
    // 10 s) that can take a while, so the loop allows 30 s and ends when they have.
    let (cur2, _cur2_log) = f.current().await;
    let deadline = Instant::now() + Duration::from_secs(30);
    let mut n = 100_000;
    while !f.segment_magics().contains_key("NSG3") || f.tagged_segments() == 0 {
        assert!(
            Instant::now() < deadline,
            "NSG3 or tagged ids never written"
        );
        f.produce(&cur.base, "mixed", &format!("m{n}"), order(n))
            .await;
        tokio::join!(
            f.produce_keyless(&cur.base, "other", "keyless"),
            f.produce_keyless(&cur2.base, "other", "keyless"),
        );
        n += 1;
        tokio::time::sleep(Duration::from_millis(300)).await;
    }
    cur2.kill().await;
    // And reads all of it back.
    let mut left = n - 100_000;
    while left > 0 {
        let m = f.consume(&cur.base, "mixed").await.expect("a message");
        assert!(m["payload"]["n"].as_u64().unwrap() >= 100_000, "{m}");
        let h = m["receipt_handle"].as_str().unwrap();
        assert_eq!(f.ack(&cur.base, "mixed", h).await, StatusCode::NO_CONTENT);
        left -= 1;
    }
    assert_no_repair("this build", &cur_log);
    cur.kill().await;
}
