//! Dead letters: a message delivered `max_deliveries` times without an ack moves to the
//! dead-letter topic instead of blocking the frontier forever, and is never dropped.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use narad_tests::Server;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

fn handle(m: &Value) -> String {
    m["receipt_handle"].as_str().unwrap().to_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn poison_messages_move_to_the_dead_letter_topic() {
    let s = Server::start().await;
    s.create_topic("orders-dlq", json!({})).await;
    s.create_topic(
        "orders",
        json!({"max_deliveries": 2, "dead_letter_topic": "orders-dlq", "visibility_timeout_ms": 1000}),
    )
    .await;
    s.produce_q("orders", "key=poison", r#"{"bad":true}"#).await;
    s.produce("orders", "good").await;

    // Delivery 1: nacked. Delivery 2: the lease lapses.
    let m = s.consume("orders", "").await.unwrap();
    assert_eq!(m["offset"], 0);
    assert_eq!(
        s.ack("orders", &handle(&m), "&extend=0").await,
        StatusCode::NO_CONTENT
    );
    let m = s.consume("orders", "").await.unwrap();
    assert_eq!(
        (m["offset"].as_u64(), m["delivery_count"].as_u64()),
        (Some(0), Some(2))
    );
    s.clock.advance(1000);
    // Third time: it goes to the dead-letter topic, and the consumer gets the next message.
    let next = s.consume("orders", "").await.unwrap();
    assert_eq!(next["payload"], "good");
    assert_eq!(
        s.ack("orders", &handle(&next), "").await,
        StatusCode::NO_CONTENT
    );
    let t = s.topic("orders").await;
    assert_eq!(
        t["partitions"][0]["frontier"], 2,
        "the poison message no longer blocks the frontier"
    );
    let dead = s.consume("orders-dlq", "").await.unwrap();
    assert_eq!(dead["payload"], json!({"bad": true}));
    assert_eq!(dead["key"], "poison");
    assert_eq!(dead["delivery_count"], 1);
    // Where it came from travels with it, as headers.
    let h = &dead["headers"];
    assert_eq!(h["narad-source-topic"], "orders", "{dead}");
    assert_eq!(h["narad-source-partition"], "0");
    assert_eq!(h["narad-source-offset"], "0");
    assert_eq!(h["narad-delivery-count"], "2");
    assert!(h["narad-produced-at"].as_str().unwrap().ends_with('Z'));
    assert!(h["narad-dead-lettered-at"].as_str().unwrap().ends_with('Z'));
    // The old handle is dead.
    assert_eq!(s.ack("orders", &handle(&m), "").await, StatusCode::GONE);
    // Counters are per process: only an in-process server's are exact.
    if narad_tests::external_url().is_none() {
        let metrics = s.metrics().await;
        assert!(metrics.contains("narad_dead_lettered_total 1"), "{metrics}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_dead_letter_topic_never_drops_the_message() {
    let s = Server::start().await;
    s.create_topic(
        "q",
        json!({"max_deliveries": 1, "dead_letter_topic": "q-dlq", "visibility_timeout_ms": 1000}),
    )
    .await;
    s.produce("q", "poison").await;
    let m = s.consume("q", "").await.unwrap();
    assert_eq!(
        s.ack("q", &handle(&m), "&extend=0").await,
        StatusCode::NO_CONTENT
    );
    // The dead-letter topic does not exist: the message stays parked, not dropped.
    assert!(s.consume("q", "").await.is_none());
    assert_eq!(s.topic("q").await["partitions"][0]["frontier"], 0);
    s.create_topic("q-dlq", json!({})).await;
    s.clock.advance(60_000); // the park lapses; the next consume moves it
    assert!(s.consume("q", "").await.is_none());
    assert_eq!(s.topic("q").await["partitions"][0]["frontier"], 1);
    assert_eq!(s.consume("q-dlq", "").await.unwrap()["payload"], "poison");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dead_letter_settings_are_validated() {
    let s = Server::start().await;
    for body in [
        json!({"max_deliveries": 3}),
        json!({"max_deliveries": 3, "dead_letter_topic": "t"}),
        json!({"max_deliveries": 3, "dead_letter_topic": "bad/name"}),
        json!({"max_deliveries": 1001, "dead_letter_topic": "x"}),
    ] {
        let r = s
            .req(Method::PUT, "/v1/topics/t")
            .body(body.to_string())
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{body}");
    }
    s.create_topic(
        "t",
        json!({"max_deliveries": 3, "dead_letter_topic": "t-dlq"}),
    )
    .await;
    let r = s
        .req(Method::PATCH, "/v1/topics/t")
        .body(r#"{"max_deliveries":0,"dead_letter_topic":""}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["settings"]["dead_letter_topic"], Value::Null);
}

/// Redrive moves dead letters back to their source topic (and partition), once: a second
/// redrive finds nothing, and a message that is not a dead letter stays where it is.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn redrive_moves_dead_letters_back_once() {
    let s = Server::start().await;
    s.create_topic("jobs-dlq", json!({})).await;
    s.create_topic(
        "jobs",
        json!({"partitions": 2, "max_deliveries": 1, "dead_letter_topic": "jobs-dlq", "visibility_timeout_ms": 1000}),
    )
    .await;
    let (p, _) = s.produce_q("jobs", "key=k1", "poison").await;
    let m = s.consume("jobs", "").await.unwrap();
    assert_eq!(
        s.ack("jobs", &handle(&m), "&extend=0").await,
        StatusCode::NO_CONTENT
    );
    // Its second lease parks it and moves it to the dead-letter topic.
    assert!(s.consume("jobs", "").await.is_none());
    s.produce("jobs-dlq", "not a dead letter").await;
    let redrive = |q: &'static str| {
        s.req(
            reqwest::Method::POST,
            &format!("/v1/topics/jobs-dlq/redrive{q}"),
        )
        .send()
    };
    let r = redrive("").await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v, json!({"moved": 1, "failed": 1}));
    let back = s.consume("jobs", "").await.unwrap();
    assert_eq!(back["payload"], "poison");
    assert_eq!(back["key"], "k1");
    assert_eq!(back["partition"], p, "back to its source partition");
    assert!(
        back.get("headers").is_none(),
        "the origin headers stay behind: {back}"
    );
    let r = redrive("?max=10").await.unwrap();
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v, json!({"moved": 0, "failed": 1}), "nothing moves twice");
    let left = s.consume("jobs-dlq", "").await.unwrap();
    assert_eq!(left["payload"], "not a dead letter");
    let r = redrive("?max=0").await.unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
}
