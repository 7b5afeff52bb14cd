//! Many consumers at once: every message delivered exactly once while no lease lapses.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::Arc;

use narad_tests::{serde_urlencoded_pair, Server, PASS, USER};
use reqwest::StatusCode;
use serde_json::{json, Value};
use tokio::sync::Mutex;

const MESSAGES: usize = 200;
const CONSUMERS: usize = 8;

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn eight_consumers_drain_200_messages_none_twice_none_lost() {
    let s = Server::start().await;
    s.create_topic(
        "jobs",
        json!({"partitions": 2, "visibility_timeout_ms": 600000}),
    )
    .await;
    for i in 0..MESSAGES {
        s.produce("jobs", format!(r#"{{"job":{i}}}"#)).await;
    }
    let seen: Arc<Mutex<HashMap<u64, usize>>> = Arc::default();
    let mut tasks = Vec::new();
    for _ in 0..CONSUMERS {
        let (base, seen) = (s.base.clone(), seen.clone());
        tasks.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut empty = 0;
            let mut acked = 0usize;
            while empty < 3 {
                let r = http
                    .get(format!("{base}/v1/topics/jobs/consume?wait=100ms"))
                    .basic_auth(USER, Some(PASS))
                    .send()
                    .await
                    .unwrap();
                match r.status() {
                    StatusCode::NO_CONTENT => {
                        empty += 1;
                        continue;
                    }
                    StatusCode::SERVICE_UNAVAILABLE => continue,
                    StatusCode::OK => empty = 0,
                    other => panic!("consume answered {other}"),
                }
                let m: Value = r.json().await.unwrap();
                let job = m["payload"]["job"].as_u64().unwrap();
                *seen.lock().await.entry(job).or_default() += 1;
                let q =
                    serde_urlencoded_pair("receipt_handle", m["receipt_handle"].as_str().unwrap());
                loop {
                    let st = http
                        .post(format!("{base}/v1/topics/jobs/ack?{q}"))
                        .basic_auth(USER, Some(PASS))
                        .send()
                        .await
                        .unwrap()
                        .status();
                    match st {
                        StatusCode::NO_CONTENT => break,
                        StatusCode::SERVICE_UNAVAILABLE => continue, // retry 503 acks, as the docs say
                        other => panic!("ack answered {other}"),
                    }
                }
                acked += 1;
            }
            acked
        }));
    }
    let mut acked = 0;
    for t in tasks {
        acked += t.await.unwrap();
    }
    let seen = seen.lock().await;
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "delivered more than once: {twice:?}");
    let lost: Vec<usize> = (0..MESSAGES)
        .filter(|i| !seen.contains_key(&(*i as u64)))
        .collect();
    assert!(lost.is_empty(), "never delivered: {lost:?}");
    assert_eq!(acked, MESSAGES);
    let t = s.topic("jobs").await;
    let frontier: u64 = t["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["frontier"].as_u64().unwrap())
        .sum();
    assert_eq!(frontier, MESSAGES as u64, "every message settled");
}
