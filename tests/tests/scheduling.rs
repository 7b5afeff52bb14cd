//! When a message may be delivered: delayed produces (`delay=`, `"delay_ms"`) and per-key
//! ordering (`"ordering": "key"`). Time moves only through the injected clock, except in
//! the concurrent ordering test, which runs on real time with short visibility timeouts.
//!
//! The rules are unit-tested without I/O in `shared/src/partition/` (`lease.rs`,
//! `produce.rs`, `batch.rs`); these tests hold the HTTP contract to them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use narad_tests::Server;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

fn handle(m: &Value) -> String {
    m["receipt_handle"].as_str().unwrap().to_owned()
}

async fn partition0(s: &Server, topic: &str) -> Value {
    s.topic(topic).await["partitions"][0].clone()
}

async fn batch(s: &Server, topic: &str, body: Value) -> reqwest::Response {
    s.req(Method::POST, &format!("/v1/topics/{topic}/produce-batch"))
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

/// A delayed message gets its offset at once, counts as delayed (not available), and is
/// not delivered before its time; other messages go past it meanwhile.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_message_gets_its_offset_at_once_and_is_delivered_after_its_time() {
    let s = Server::start().await;
    s.create_topic("later", json!({})).await;
    assert_eq!(s.produce_q("later", "delay=30s", "in 30 s").await, (0, 0));
    s.produce("later", "now").await;
    let r = batch(
        &s,
        "later",
        json!({"messages": [{"payload": "in 2 s", "delay_ms": 2000}, {"payload": "now too"}]}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::OK);
    let p = partition0(&s, "later").await;
    assert_eq!(
        (p["delayed"].as_u64(), p["available"].as_u64()),
        (Some(2), Some(2))
    );

    let got = s.consume("later", "max=10").await.unwrap();
    let payloads: Vec<&str> = got["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(|m| m["payload"].as_str().unwrap())
        .collect();
    assert_eq!(payloads, ["now", "now too"]);
    s.clock.advance(1999);
    assert!(s.consume("later", "").await.is_none(), "2 s are not over");
    // Delays are rounded up to a fiftieth of themselves (at least 100 ms), never down.
    s.clock.advance(101);
    let m = s.consume("later", "").await.unwrap();
    assert_eq!(
        (m["payload"].as_str(), m["offset"].as_u64()),
        (Some("in 2 s"), Some(2))
    );
    assert_eq!(m["delivery_count"], 1);
    s.clock.advance(27_899);
    assert!(s.consume("later", "").await.is_none(), "30 s are not over");
    s.clock.advance(601);
    let m = s.consume("later", "").await.unwrap();
    assert_eq!(
        (m["payload"].as_str(), m["offset"].as_u64()),
        (Some("in 30 s"), Some(0))
    );
    assert_eq!(partition0(&s, "later").await["delayed"], 0);
}

/// Delays outside 0–12 h, or not a duration, are refused with a 400 naming the problem.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn delays_beyond_twelve_hours_or_malformed_are_refused() {
    let s = Server::start().await;
    s.create_topic("d", json!({})).await;
    for bad in ["13h", "soon", "-1s", "43200001ms"] {
        let r = s
            .req(Method::POST, &format!("/v1/topics/d/produce?delay={bad}"))
            .body("x")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "delay={bad}");
        let v: Value = r.json().await.unwrap();
        assert!(
            v["error"]["message"].as_str().unwrap().contains("delay"),
            "{v}"
        );
    }
    let r = batch(
        &s,
        "d",
        json!({"messages": [{"payload": 1, "delay_ms": 43_200_001u64}]}),
    )
    .await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    // 12 h exactly and 0 are fine; 0 is no delay at all.
    s.produce_q("d", "delay=12h", "x").await;
    s.produce_q("d", "delay=0", "y").await;
    let m = s.consume("d", "").await.unwrap();
    assert_eq!(m["payload"], "y");
}

/// A delayed message is unsettled: it holds the frontier, so acks above it fill the
/// acked-ahead window. With the window full only the frontier may be delivered, and it is
/// not due: consumes get nothing until it is, and then everything drains. A stall bounded
/// by the delay, never a deadlock.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delayed_frontier_behind_a_full_acked_ahead_window_stalls_only_until_due() {
    let s = Server::start().await;
    s.create_topic("w", json!({"max_acked_ahead_per_partition": 2}))
        .await;
    s.produce_q("w", "delay=10s", "late").await;
    for i in 1..=5 {
        s.produce("w", format!("m{i}")).await;
    }
    for _ in 0..2 {
        let m = s.consume("w", "").await.unwrap();
        assert_eq!(s.ack("w", &handle(&m), "").await, StatusCode::NO_CONTENT);
    }
    let p = partition0(&s, "w").await;
    assert_eq!(
        (p["frontier"].as_u64(), p["acked_ahead"].as_u64()),
        (Some(0), Some(2))
    );
    assert!(
        s.consume("w", "").await.is_none(),
        "window full, frontier delayed: nothing may go out"
    );
    s.clock.advance(10_200);
    let m = s.consume("w", "").await.unwrap();
    assert_eq!(m["payload"], "late");
    assert_eq!(s.ack("w", &handle(&m), "").await, StatusCode::NO_CONTENT);
    assert_eq!(partition0(&s, "w").await["frontier"], 3);
    while let Some(m) = s.consume("w", "").await {
        assert_eq!(s.ack("w", &handle(&m), "").await, StatusCode::NO_CONTENT);
    }
    let p = partition0(&s, "w").await;
    assert_eq!(
        (p["frontier"].as_u64(), p["next_offset"].as_u64()),
        (Some(6), Some(6))
    );
}

/// `"ordering": "key"`: a message waits while an earlier one with its key is unsettled
/// (in flight, or given back), other keys and keyless messages go past it; the setting
/// can be changed, and a bad value is a 400.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn per_key_ordering_holds_each_key_to_one_unsettled_message_at_a_time() {
    let s = Server::start().await;
    let t = s.create_topic("o", json!({"ordering": "key"})).await;
    assert_eq!(t["settings"]["ordering"], "key", "{t}");
    for (key, body) in [
        ("a", "a1"),
        ("a", "a2"),
        ("b", "b1"),
        ("", "x"),
        ("b", "b2"),
    ] {
        let q = if key.is_empty() {
            String::new()
        } else {
            format!("key={key}")
        };
        s.produce_q("o", &q, body).await;
    }
    let payloads = |v: &Value| -> Vec<String> {
        v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| m["payload"].as_str().unwrap().to_owned())
            .collect()
    };
    let first = s.consume("o", "max=10").await.unwrap();
    assert_eq!(payloads(&first), ["a1", "b1", "x"]);
    assert!(s.consume("o", "max=10").await.is_none(), "a2 and b2 wait");
    let by = |p: &str| {
        first["messages"]
            .as_array()
            .unwrap()
            .iter()
            .find(|m| m["payload"] == p)
            .map(handle)
            .unwrap()
    };
    // Given back, a1 is still before a2: it comes again, a2 still waits.
    assert_eq!(
        s.ack("o", &by("a1"), "&extend=0").await,
        StatusCode::NO_CONTENT
    );
    let again = s.consume("o", "max=10").await.unwrap();
    assert_eq!(payloads(&again), ["a1"]);
    assert_eq!(
        s.ack("o", &handle(&again["messages"][0]), "").await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(s.ack("o", &by("b1"), "").await, StatusCode::NO_CONTENT);
    let next = s.consume("o", "max=10").await.unwrap();
    assert_eq!(payloads(&next), ["a2", "b2"]);
    // A lapsed lease holds its key too, until the message is delivered again.
    s.produce_q("o", "key=a", "a3").await;
    s.clock.advance(30_000);
    let lapsed = s.consume("o", "max=10").await.unwrap();
    assert_eq!(payloads(&lapsed), ["a2", "x", "b2"], "a3 waits behind a2");

    let r = s
        .req(Method::PATCH, "/v1/topics/o")
        .body(json!({"ordering": "none"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    // Other processes (Lambda instances) see settings within the topic cache's 1 s.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    assert_eq!(payloads(&s.consume("o", "max=10").await.unwrap()), ["a3"]);
    let r = s
        .req(Method::PATCH, "/v1/topics/o")
        .body(json!({"ordering": "fifo"}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
}

/// True for a 503 `busy` (a conditional write lost its races: nothing was written).
async fn is_busy(r: reqwest::Response) -> bool {
    let st = r.status();
    let v: Value = r.json().await.unwrap_or_default();
    st == StatusCode::SERVICE_UNAVAILABLE && v["error"]["code"] == "busy"
}

/// What one consumer saw, stamped with a global sequence number.
#[derive(Debug, Clone, Copy)]
enum Event {
    /// A delivery of (key, i), stamped when its response arrived.
    Delivered(usize, usize, u64),
    /// A successful ack of (key, i), stamped before the request was sent.
    Acked(usize, usize, u64),
}

/// 20 keys × 50 messages on one partition, 8 concurrent consumers that nack about one
/// message in ten and drop (let lapse) about one in twenty, while the clock runs fast.
/// Every message is acked exactly once, and per key: in order, and never delivered before
/// every earlier message of its key was acked (each ack request went out before the later
/// delivery arrived).
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn per_key_ordering_under_concurrent_consumers_with_nacks_and_lapses() {
    use rand::{Rng, SeedableRng};
    use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering::SeqCst};
    use std::sync::{Arc, Mutex};

    const KEYS: usize = 20;
    const PER_KEY: usize = 50;
    let s = Arc::new(Server::start().await);
    s.create_topic(
        "orders",
        json!({"ordering": "key", "visibility_timeout_ms": 5000}),
    )
    .await;
    let all: Vec<Value> = (0..PER_KEY)
        .flat_map(|i| {
            (0..KEYS).map(move |k| json!({"payload": {"k": k, "i": i}, "key": format!("k{k}")}))
        })
        .collect();
    for chunk in all.chunks(100) {
        let r = batch(&s, "orders", json!({ "messages": chunk })).await;
        assert_eq!(r.status(), StatusCode::OK);
    }
    let seq = Arc::new(AtomicU64::new(0));
    let acked = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicBool::new(false));
    let events = Arc::new(Mutex::new(Vec::new()));
    // Dropped messages come back once the clock passes their lease: 1 s of broker time
    // every 50 ms.
    let ticker = {
        let (s, done) = (s.clone(), done.clone());
        tokio::spawn(async move {
            while !done.load(SeqCst) {
                tokio::time::sleep(std::time::Duration::from_millis(50)).await;
                s.clock.advance(1000);
            }
        })
    };
    let mut consumers = Vec::new();
    for c in 0..8u64 {
        let (s, seq, acked, done, events) = (
            s.clone(),
            seq.clone(),
            acked.clone(),
            done.clone(),
            events.clone(),
        );
        consumers.push(tokio::spawn(async move {
            let mut rng = rand::rngs::StdRng::seed_from_u64(c);
            let mut mine = Vec::new();
            while !done.load(SeqCst) {
                let max = rng.gen_range(1..=3);
                let r = s.consume_raw("orders", &format!("max={max}")).await;
                if r.status() != StatusCode::OK {
                    // 204, or 503 busy: consumers racing on one manifest (separate Lambda
                    // instances) retry, as a client does after Retry-After.
                    let st = r.status();
                    assert!(st == StatusCode::NO_CONTENT || is_busy(r).await, "{st}");
                    tokio::time::sleep(std::time::Duration::from_millis(5)).await;
                    continue;
                }
                let got: Value = r.json().await.unwrap();
                let at = seq.fetch_add(1, SeqCst);
                for m in got["messages"].as_array().unwrap() {
                    let (k, i) = (
                        m["payload"]["k"].as_u64().unwrap() as usize,
                        m["payload"]["i"].as_u64().unwrap() as usize,
                    );
                    mine.push(Event::Delivered(k, i, at));
                    let roll: f64 = rng.gen();
                    if roll < 0.05 {
                        continue; // dropped: the lease lapses
                    }
                    let extra = if roll < 0.15 { "&extend=0" } else { "" };
                    let (mut sent, mut r);
                    loop {
                        // A busy answer wrote nothing: the same request again.
                        sent = seq.fetch_add(1, SeqCst);
                        r = s.ack_raw("orders", &handle(m), extra).await;
                        if r.status() != StatusCode::SERVICE_UNAVAILABLE {
                            break;
                        }
                        assert!(is_busy(r).await);
                    }
                    let st = r.status();
                    if extra.is_empty() && st == StatusCode::NO_CONTENT {
                        mine.push(Event::Acked(k, i, sent));
                        if acked.fetch_add(1, SeqCst) + 1 == KEYS * PER_KEY {
                            done.store(true, SeqCst);
                        }
                    } else {
                        assert!(
                            st == StatusCode::NO_CONTENT || st == StatusCode::GONE,
                            "ack answered {st}"
                        );
                    }
                }
            }
            events.lock().unwrap().extend(mine);
        }));
    }
    let all_done = async {
        for c in consumers {
            c.await.unwrap();
        }
    };
    tokio::time::timeout(std::time::Duration::from_secs(240), all_done)
        .await
        .unwrap_or_else(|_| panic!("not all acked: {} of 1000", acked.load(SeqCst)));
    done.store(true, SeqCst);
    ticker.await.unwrap();

    let events = std::mem::take(&mut *events.lock().unwrap());
    let mut acks: Vec<Vec<u64>> = vec![vec![u64::MAX; PER_KEY]; KEYS];
    for e in events.iter() {
        if let Event::Acked(k, i, at) = *e {
            assert_eq!(acks[k][i], u64::MAX, "k{k} #{i} acked twice");
            acks[k][i] = at;
        }
    }
    for (k, row) in acks.iter().enumerate() {
        assert!(row.iter().all(|&a| a != u64::MAX), "k{k}: not all acked");
        assert!(
            row.windows(2).all(|w| w[0] < w[1]),
            "k{k} acked out of order"
        );
    }
    for e in events.iter() {
        if let Event::Delivered(k, i, at) = *e {
            if let Some(j) = (0..i).find(|&j| acks[k][j] > at) {
                panic!("k{k} #{i} delivered before #{j} was acked");
            }
        }
    }
    let p = partition0(&s, "orders").await;
    assert_eq!(p["frontier"], 1000, "{p}");
}
