//! Idempotent produce: a retried produce with the same `Idempotency-Key` appends nothing
//! and answers the first produce's partition and offset.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use narad_tests::{Options, Server};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

fn total(t: &Value) -> u64 {
    t["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["next_offset"].as_u64().unwrap())
        .sum()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retries_with_the_same_key_append_once() {
    let s = Server::start().await;
    s.create_topic("i", json!({"partitions": 4, "dedup_window_ms": 60000}))
        .await;
    let first = s.produce_idem("i", "order-1", "a").await;
    for _ in 0..3 {
        assert_eq!(
            s.produce_idem("i", "order-1", "a").await,
            first,
            "a retry answers the first offset"
        );
    }
    let other = s.produce_idem("i", "order-2", "b").await;
    assert_ne!(other, first);
    assert_eq!(total(&s.topic("i").await), 2, "nothing appended twice");

    // A batch: one new key twice, one old key, one without a key.
    let body = json!({"messages": [
        {"payload": 1, "idempotency_key": "order-3"},
        {"payload": 2, "idempotency_key": "order-3"},
        {"payload": 3, "idempotency_key": "order-1"},
        {"payload": 4}
    ]});
    let r = s
        .req(Method::POST, "/v1/topics/i/produce-batch")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    let res = v["results"].as_array().unwrap();
    let at = |i: usize| {
        (
            res[i]["partition"].as_u64().unwrap() as u32,
            res[i]["offset"].as_u64().unwrap(),
        )
    };
    assert_eq!(
        at(0),
        at(1),
        "the same key twice in one batch is one message"
    );
    assert_eq!(at(2), first);
    assert_eq!(total(&s.topic("i").await), 4);

    // After the window the key is forgotten.
    s.clock.advance(60_001);
    let again = s.produce_idem("i", "order-1", "a").await;
    assert_ne!(again, first);
    assert_eq!(total(&s.topic("i").await), 5);

    for bad in ["", "has space", &"k".repeat(129)] {
        let r = s
            .req(Method::POST, "/v1/topics/i/produce")
            .header("Idempotency-Key", bad)
            .body("x")
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{bad:?}");
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_same_key_through_two_processes_appends_once() {
    let a = Server::start().await;
    let b = Server::start_on(a.store.clone(), None, Options::default(), a.clock.clone()).await;
    a.create_topic("i", json!({"partitions": 2})).await;
    let mut tasks = Vec::new();
    for round in 0..10 {
        for srv in [&a, &b] {
            let req = srv
                .req(Method::POST, "/v1/topics/i/produce")
                .header("Idempotency-Key", format!("k-{round}"))
                .body(format!("m{round}"));
            tasks.push(tokio::spawn(async move {
                let v: Value = req.send().await.unwrap().json().await.unwrap();
                (
                    round,
                    v["partition"].as_u64().unwrap(),
                    v["offset"].as_u64().unwrap(),
                )
            }));
        }
    }
    let mut by_round = std::collections::HashMap::new();
    for t in tasks {
        let (round, p, o) = t.await.unwrap();
        let prev = by_round.insert(round, (p, o));
        if let Some(prev) = prev {
            assert_eq!(
                prev,
                (p, o),
                "both processes must answer the same offset for k-{round}"
            );
        }
    }
    assert_eq!(total(&a.topic("i").await), 10);
}
