//! Three `narad serve` processes on one store (one bucket prefix on S3): consumers spread
//! over them, every ack sent to a different process than the consume that produced its
//! handle. Every message is delivered, none twice, and no request gets a 5xx.
//!
//! Against a Worker (external mode with its test hooks), the same checks run on three
//! Durable Objects serving one topic, each with a broker of its own on the one local R2
//! (`x-narad-test-object`): what three Worker instances would be.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::HashMap;
use std::sync::Arc;

use narad_tests::{free_port, serde_urlencoded_pair, test_store_url, Process, PASS, USER};
use reqwest::StatusCode;
use serde_json::Value;
use tokio::sync::Mutex;

const MESSAGES: usize = 150;
const CONSUMERS: usize = 6;

/// One of the servers the test spreads its requests over: a base URL, and the header that
/// picks a Worker's object.
#[derive(Clone)]
struct Endpoint {
    base: String,
    object: Option<&'static str>,
}

impl Endpoint {
    fn req(
        &self,
        http: &reqwest::Client,
        method: reqwest::Method,
        path: &str,
    ) -> reqwest::RequestBuilder {
        let r = http
            .request(method, format!("{}{path}", self.base))
            .basic_auth(USER, Some(PASS));
        match self.object {
            // A Worker object's test clock stands still unless a request moves it.
            Some(o) => r
                .header("x-narad-test-object", o)
                .header("x-narad-test-now", narad_tests::now_ms()),
            None => r,
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn three_processes_share_one_store() {
    if let Some(base) = narad_tests::worker_url() {
        let endpoints = ["a", "b", "c"].map(|o| Endpoint {
            base: base.clone(),
            object: Some(o),
        });
        let topic = format!("shared-{}", narad_tests::now_ms());
        return share_one_topic(&endpoints, &topic).await;
    }
    if narad_tests::skip_in_external_mode("narad serve processes of its own") {
        return;
    }
    let (url, _dir) = test_store_url();
    let mut procs = Vec::new();
    for _ in 0..3 {
        procs.push(Process::start(&url, free_port(), &[]).await);
    }
    let endpoints: Vec<Endpoint> = procs
        .iter()
        .map(|p| Endpoint {
            base: p.base.clone(),
            object: None,
        })
        .collect();
    share_one_topic(&endpoints, "shared").await;
    for p in procs {
        p.kill().await;
    }
}

/// Creates `topic` on the first endpoint, produces through all three at once, then
/// consumes with every ack sent to another endpoint than its consume; asserts that every
/// message is delivered once.
async fn share_one_topic(endpoints: &[Endpoint], topic: &str) {
    let bases: Arc<Vec<Endpoint>> = Arc::new(endpoints.to_vec());
    let http = reqwest::Client::new();
    let r = bases[0]
        .req(&http, reqwest::Method::PUT, &format!("/v1/topics/{topic}"))
        .body(r#"{"partitions":2,"visibility_timeout_ms":120000}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    // Producers on all three processes at once.
    let mut producers = Vec::new();
    for w in 0..3 {
        let bases = bases.clone();
        let topic = topic.to_owned();
        producers.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            for i in (w..MESSAGES).step_by(3) {
                let r = bases[w]
                    .req(
                        &http,
                        reqwest::Method::POST,
                        &format!("/v1/topics/{topic}/produce"),
                    )
                    .body(format!(r#"{{"n":{i}}}"#))
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), StatusCode::CREATED, "produce via process {w}");
            }
        }));
    }
    for p in producers {
        p.await.unwrap();
    }

    let seen: Arc<Mutex<HashMap<u64, usize>>> = Arc::default();
    let mut consumers = Vec::new();
    for c in 0..CONSUMERS {
        let (bases, seen, topic) = (bases.clone(), seen.clone(), topic.to_owned());
        consumers.push(tokio::spawn(async move {
            let http = reqwest::Client::new();
            let mut empty = 0;
            let mut round = c;
            while empty < 3 {
                round += 1;
                let consume_at = &bases[round % 3];
                let ack_at = &bases[(round + 1) % 3];
                let r = consume_at
                    .req(
                        &http,
                        reqwest::Method::GET,
                        &format!("/v1/topics/{topic}/consume?wait=200ms"),
                    )
                    .send()
                    .await
                    .unwrap();
                assert!(
                    !r.status().is_server_error() || r.status() == StatusCode::SERVICE_UNAVAILABLE,
                    "consume gave {}",
                    r.status()
                );
                match r.status() {
                    StatusCode::OK => empty = 0,
                    StatusCode::NO_CONTENT => {
                        empty += 1;
                        continue;
                    }
                    StatusCode::SERVICE_UNAVAILABLE => {
                        panic!("consume got 503: {}", r.text().await.unwrap_or_default())
                    }
                    other => panic!("consume answered {other}"),
                }
                let m: Value = r.json().await.unwrap();
                *seen
                    .lock()
                    .await
                    .entry(m["payload"]["n"].as_u64().unwrap())
                    .or_default() += 1;
                let q =
                    serde_urlencoded_pair("receipt_handle", m["receipt_handle"].as_str().unwrap());
                let r = ack_at
                    .req(
                        &http,
                        reqwest::Method::POST,
                        &format!("/v1/topics/{topic}/ack?{q}"),
                    )
                    .send()
                    .await
                    .unwrap();
                assert_eq!(r.status(), StatusCode::NO_CONTENT, "ack on another process");
            }
        }));
    }
    for c in consumers {
        c.await.unwrap();
    }
    let seen = seen.lock().await;
    let twice: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(twice.is_empty(), "delivered twice: {twice:?}");
    let lost: Vec<usize> = (0..MESSAGES)
        .filter(|i| !seen.contains_key(&(*i as u64)))
        .collect();
    assert!(lost.is_empty(), "never delivered: {lost:?}");
}
