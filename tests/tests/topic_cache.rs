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

/// A produce through a process whose cached topic and manifest predate a delete made by
/// another process is refused (404), not answered 201 into the deleted topic: its write to
/// the manifest it knew fails, and the one that would create the manifest again confirms
/// the topic record first (`commit/write.rs`).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_produce_through_a_process_that_missed_a_delete_is_refused() {
    let a = Server::start().await;
    let b = Server::start_on(a.store.clone(), None, Options::default(), a.clock.clone()).await;
    a.create_topic("d", json!({"partitions": 1})).await;
    b.produce("d", "kept").await; // b caches the topic and its manifest
    let status = a.req(Method::DELETE, "/v1/topics/d").send().await.unwrap();
    assert_eq!(status.status(), StatusCode::NO_CONTENT);

    let r = b
        .req(Method::POST, "/v1/topics/d/produce")
        .body("after the delete")
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::NOT_FOUND,
        "{}",
        r.text().await.unwrap()
    );
    let left = a.store.list("topics/d/").await.unwrap();
    assert!(
        !left.iter().any(|k| k.contains("manifest")),
        "no manifest was created for the deleted topic: {left:?}"
    );
    // Nor is the refused batch's segment left for garbage collection to find.
    assert!(
        !left.iter().any(|k| k.contains("/segments/")),
        "the refused write's segment is deleted: {left:?}"
    );
}

/// The same through a topic created again whose partition has a manifest already: the
/// stale process's write is refused by the new incarnation's manifest, and the produce is
/// retried into the new topic.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_produce_through_a_process_that_missed_a_new_incarnation_lands_in_it() {
    let a = Server::start().await;
    let b = Server::start_on(a.store.clone(), None, Options::default(), a.clock.clone()).await;
    a.create_topic("e", json!({"partitions": 1})).await;
    b.produce("e", "old").await;
    let status = a.req(Method::DELETE, "/v1/topics/e").send().await.unwrap();
    assert_eq!(status.status(), StatusCode::NO_CONTENT);
    a.create_topic("e", json!({"partitions": 1})).await;
    assert_eq!(a.produce("e", "first").await, (0, 0));

    assert_eq!(b.produce("e", "second").await, (0, 1));
    let mut seen = Vec::new();
    while let Some(m) = a.consume("e", "").await {
        seen.push(m["payload"].as_str().unwrap().to_owned());
    }
    assert_eq!(seen, vec!["first", "second"]);
    // The segment of the write the new incarnation refused is deleted, not left behind
    // beside the two that landed.
    let segments = a.store.list("topics/e/0/segments/").await.unwrap();
    assert_eq!(segments.len(), 2, "{segments:?}");
}

/// A process that created a topic a moment ago, which another process then deleted and
/// created again, produces into the new topic: its creating the record is no read of it
/// (the Lambda runtime suite, whose tests delete and create one topic name within
/// milliseconds, found a produce answered 201 into a manifest of the deleted topic, and a
/// later extend through another instance answered 410).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_just_created_a_topic_produces_into_the_one_created_again() {
    let a = Server::start().await;
    let b = Server::start_on(a.store.clone(), None, Options::default(), a.clock.clone()).await;
    a.create_topic("f", json!({"partitions": 1})).await; // a caches it, as its creator
    let status = b.req(Method::DELETE, "/v1/topics/f").send().await.unwrap();
    assert_eq!(status.status(), StatusCode::NO_CONTENT);
    b.create_topic("f", json!({"partitions": 1})).await;

    assert_eq!(a.produce("f", "new").await, (0, 0));
    let m = b
        .consume("f", "")
        .await
        .expect("the message is in the new topic");
    assert_eq!(m["payload"], "new");
    assert_eq!(
        a.ack("f", m["receipt_handle"].as_str().unwrap(), "&extend=true")
            .await,
        StatusCode::NO_CONTENT
    );
}
