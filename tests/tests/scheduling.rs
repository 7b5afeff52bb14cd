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
