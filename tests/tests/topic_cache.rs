//! Cached topic settings never make a request fail or lose a message after the topic was
//! deleted and created again by another process.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use narad_tests::{Options, Server};
use reqwest::{Method, StatusCode};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stale_cached_topic_is_reloaded_not_trusted() {
    let a = Server::start().await;
    let b = Server::start_on(a.store.clone(), None, Options::default(), a.clock.clone()).await;
    a.create_topic("c", json!({"partitions": 1})).await;
    b.produce("c", "old").await; // b now caches the 1-partition incarnation

    // Another process deletes the topic and creates it again, differently.
    assert_eq!(
        a.req(Method::DELETE, "/v1/topics/c")
            .send()
            .await
            .unwrap()
            .status(),
        StatusCode::NO_CONTENT
    );
    a.create_topic("c", json!({"partitions": 4})).await;

    // b's cache says 1 partition; the request is checked against fresh settings instead.
    assert_eq!(b.produce_q("c", "partition=3", "p3").await, (3, 0));
    // A produce without a partition is committed into the new incarnation, where a reader
    // on the other process finds it.
    let (p, o) = b.produce("c", "new").await;
    let m = a
        .consume("c", &format!("partition={p}&offset={o}"))
        .await
        .unwrap();
    assert_eq!(m["payload"], "new");
    // Nothing of the old incarnation is visible.
    let mut seen = Vec::new();
    while let Some(m) = a.consume("c", "").await {
        seen.push(m["payload"].as_str().unwrap().to_owned());
    }
    seen.sort();
    assert_eq!(seen, vec!["new", "p3"]);
    assert!(
        b.consume("c", "partition=3").await.is_none(),
        "p3 is leased through a already"
    );
}
