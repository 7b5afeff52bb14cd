//! `POST /v1/topics/{t}/consume` with acks piggybacked: the acks on the partition leased
//! from share the lease's commit, every handle is answered as `POST /ack` answers it, and
//! the request answers 200 with the new messages beside those results.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use narad_tests::{Options, Server};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

async fn consume_acking(s: &Server, topic: &str, query: &str, body: &str) -> reqwest::Response {
    s.req(Method::POST, &format!("/v1/topics/{topic}/consume?{query}"))
        .body(body.to_string())
        .send()
        .await
        .unwrap()
}

/// The 200 answer's messages and ack statuses.
async fn answered(s: &Server, topic: &str, query: &str, acks: &[&str]) -> (Vec<Value>, Vec<u64>) {
    let r = consume_acking(s, topic, query, &json!({ "ack": acks }).to_string()).await;
    assert_eq!(r.status(), StatusCode::OK);
    let v: Value = r.json().await.unwrap();
    let messages = v["messages"].as_array().unwrap().clone();
    let statuses = v["acks"]
        .as_array()
        .unwrap()
        .iter()
        .map(|a| a["status"].as_u64().unwrap())
        .collect();
    (messages, statuses)
}

fn handle(m: &Value) -> String {
    m["receipt_handle"].as_str().unwrap().to_string()
}

/// (commits, conditional writes) the server has made so far.
async fn writes(s: &Server) -> (f64, f64) {
    let text = s.metrics().await;
    let puts = text
        .lines()
        .filter(|l| l.starts_with("narad_storage_requests_total{op=\"put_if_"))
        .filter_map(|l| l.rsplit_once(' ')?.1.parse::<f64>().ok())
        .sum();
    let commits = narad_tests::metric(&text, "narad_commits_total").unwrap_or(0.0);
    (commits, puts)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_ack_and_the_next_lease_share_one_commit() {
    if narad_tests::skip_in_external_mode("a fresh server process (exact per-process counters)") {
        return;
    }
    let s = Server::start().await;
    s.create_topic("one", json!({})).await;
    for i in 0..3 {
        s.produce("one", format!("m{i}")).await;
    }
    let first = s.consume("one", "").await.unwrap();
    let before = writes(&s).await;
    let (messages, acks) = answered(&s, "one", "", &[&handle(&first)]).await;
    let after = writes(&s).await;
    assert_eq!(acks, vec![204]);
    assert_eq!(messages.len(), 1);
    assert_eq!(messages[0]["offset"], 1);
    assert_eq!(messages[0]["payload"], "m1");
    assert_eq!(
        (after.0 - before.0, after.1 - before.1),
        (1.0, 1.0),
        "the ack and the lease land in one commit, one conditional write"
    );
    // The ack is final: the handle is spent, and the message is never delivered again.
    assert_eq!(
        s.ack("one", &handle(&first), "").await,
        StatusCode::GONE,
        "an acked handle is spent"
    );
    s.clock.advance(3_600_000);
    let (again, acks) = answered(&s, "one", "max=10", &[&handle(&messages[0])]).await;
    assert_eq!(acks, vec![410], "the lease lapsed: its ack changes nothing");
    let offsets: Vec<u64> = again
        .iter()
        .map(|m| m["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(
        offsets,
        vec![1, 2],
        "offset 0 stays acked; 1 comes back after its lease lapsed"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_batch_of_acks_frees_room_for_the_next_batch_in_the_same_commit() {
    if narad_tests::skip_in_external_mode("a fresh server process (exact per-process counters)") {
        return;
    }
    let s = Server::start().await;
    s.create_topic("flow", json!({"max_in_flight_per_partition": 5}))
        .await;
    for i in 0..10 {
        s.produce("flow", format!("m{i}")).await;
    }
    let first = s.consume("flow", "max=5").await.unwrap();
    let held: Vec<String> = first["messages"]
        .as_array()
        .unwrap()
        .iter()
        .map(handle)
        .collect();
    assert_eq!(held.len(), 5);
    assert!(
        s.consume_raw("flow", "").await.status() == StatusCode::NO_CONTENT,
        "five in flight: nothing more until some are settled"
    );
    let before = writes(&s).await;
    let refs: Vec<&str> = held.iter().map(String::as_str).collect();
    let (messages, acks) = answered(&s, "flow", "max=5", &refs).await;
    let after = writes(&s).await;
    assert_eq!(acks, vec![204; 5]);
    let offsets: Vec<u64> = messages
        .iter()
        .map(|m| m["offset"].as_u64().unwrap())
        .collect();
    assert_eq!(offsets, vec![5, 6, 7, 8, 9]);
    assert_eq!(
        after.0 - before.0,
        1.0,
        "five acks and five leases: one commit"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_handle_is_answered_as_post_ack_answers_it() {
    let s = Server::start().await;
    s.create_topic("mixed", json!({"partitions": 3})).await;
    let mut held = Vec::new();
    for p in 0..3 {
        s.produce_q("mixed", &format!("partition={p}"), "a").await;
        s.produce_q("mixed", &format!("partition={p}"), "b").await;
        held.push(s.consume("mixed", &format!("partition={p}")).await.unwrap());
    }
    let spent = s.consume("mixed", "partition=0").await.unwrap();
    assert_eq!(
        s.ack("mixed", &handle(&spent), "").await,
        StatusCode::NO_CONTENT
    );
    let forged = "not-a-receipt-handle";
    let mut handles: Vec<String> = held.iter().map(handle).collect();
    handles.push(handle(&spent));
    handles.push(forged.to_string());
    let refs: Vec<&str> = handles.iter().map(String::as_str).collect();
    // What POST /ack answers a forged handle on its own.
    let alone = s.ack("mixed", forged, "").await.as_u16() as u64;

    let (messages, acks) = answered(&s, "mixed", "partition=1&max=5", &refs).await;
    assert_eq!(
        acks,
        vec![204, 204, 204, 410, alone],
        "acks on every partition land, the spent and forged handles answer as alone"
    );
    assert_eq!(messages.len(), 1, "only partition 1 was asked for");
    assert_eq!(messages[0]["partition"], 1);
    assert_eq!(messages[0]["offset"], 1);
    // Nothing acked comes back once every lease has lapsed.
    s.clock.advance(3_600_000);
    let mut left = Vec::new();
    while let Some(m) = s.consume("mixed", "").await {
        left.push((
            m["partition"].as_u64().unwrap(),
            m["offset"].as_u64().unwrap(),
        ));
        assert_eq!(
            s.ack("mixed", &handle(&m), "").await,
            StatusCode::NO_CONTENT
        );
    }
    left.sort();
    assert_eq!(left, vec![(1, 1), (2, 1)]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_topic_still_takes_acks_and_says_why_nothing_came() {
    let s = Server::start().await;
    s.create_topic("paused", json!({})).await;
    s.produce("paused", "a").await;
    s.produce("paused", "b").await;
    let held = s.consume("paused", "").await.unwrap();
    pause_then_ack_with_a_consume(&s, &s, "paused", &held).await;
    assert_eq!(s.ack("paused", &handle(&held), "").await, StatusCode::GONE);
}

/// Pauses `topic` through `pauser`, waits out the topic cache's 1 s (other processes see
/// settings within it), then acks `held` with a consume through `consumer`: the ack lands,
/// nothing is leased, and the answer says the topic is paused.
async fn pause_then_ack_with_a_consume(
    pauser: &Server,
    consumer: &Server,
    topic: &str,
    held: &Value,
) {
    let r = pauser
        .req(Method::PATCH, &format!("/v1/topics/{topic}"))
        .body(json!({"paused": true}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    let body = json!({"ack": [handle(held)]}).to_string();
    let r = consume_acking(consumer, topic, "", &body).await;
    assert_eq!(r.status(), StatusCode::OK);
    assert_eq!(r.headers()["narad-paused"], "true");
    let v: Value = r.json().await.unwrap();
    assert_eq!(v, json!({"messages": [], "acks": [{"status": 204}]}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_pause_made_through_another_process_stops_its_leases_within_the_cache_period() {
    let a = Server::start().await;
    let b = Server::start_on(a.store.clone(), None, Options::default(), a.clock.clone()).await;
    a.create_topic("paused-elsewhere", json!({})).await;
    a.produce("paused-elsewhere", "a").await;
    a.produce("paused-elsewhere", "b").await;
    // `b` caches the topic as it is now, unpaused. The settles' longer 10 s must not carry
    // its lease along: it would deliver from a paused topic.
    let held = b.consume("paused-elsewhere", "").await.unwrap();
    pause_then_ack_with_a_consume(&a, &b, "paused-elsewhere", &held).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_acks_it_is_a_plain_consume_that_answers_200() {
    let s = Server::start().await;
    s.create_topic("plain", json!({})).await;
    for body in ["", "{}", r#"{"ack":[]}"#] {
        let r = consume_acking(&s, "plain", "", body).await;
        assert_eq!(r.status(), StatusCode::OK, "{body:?}");
        let v: Value = r.json().await.unwrap();
        assert_eq!(v, json!({"messages": [], "acks": []}));
    }
    s.produce("plain", "x").await;
    let (messages, acks) = answered(&s, "plain", "wait=1s", &[]).await;
    assert_eq!((messages.len(), acks.len()), (1, 0));
    assert_eq!(messages[0]["payload"], "x");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_poll_after_the_acks_gets_what_is_produced_meanwhile() {
    let s = Server::start().await;
    s.create_topic("poll", json!({})).await;
    s.produce("poll", "first").await;
    let first = s.consume("poll", "").await.unwrap();
    let body = json!({ "ack": [handle(&first)] }).to_string();
    let url = s.url("/v1/topics/poll/consume?wait=5s");
    let http = s.http.clone();
    let waiting = tokio::spawn(async move {
        http.post(url)
            .basic_auth(narad_tests::USER, Some(narad_tests::PASS))
            .body(body)
            .send()
            .await
            .unwrap()
    });
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    s.produce("poll", "second").await;
    let r = waiting.await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["acks"], json!([{"status": 204}]));
    assert_eq!(v["messages"][0]["payload"], "second");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_requests_get_400_and_settle_nothing() {
    let s = Server::start().await;
    s.create_topic("bad", json!({})).await;
    s.produce("bad", "x").await;
    let held = s.consume("bad", "").await.unwrap();
    let h = handle(&held);
    let too_many = json!({ "ack": vec![h.clone(); 1001] }).to_string();
    for (query, body) in [
        ("", "not json".to_string()),
        ("", json!({"ack": h}).to_string()),
        ("", json!({"ack": [h], "extend": "30s"}).to_string()),
        ("", json!({"ack": [1]}).to_string()),
        ("", too_many),
        ("max=0", json!({"ack": [h]}).to_string()),
        ("max=101", json!({"ack": [h]}).to_string()),
        ("offset=0", json!({"ack": [h]}).to_string()),
        ("partition=x", json!({"ack": [h]}).to_string()),
        ("wait=soon", json!({"ack": [h]}).to_string()),
    ] {
        let r = consume_acking(&s, "bad", query, &body).await;
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{query} {body:.80}");
        let v: Value = r.json().await.unwrap();
        assert!(v["error"]["code"].is_string(), "{v}");
    }
    let r = consume_acking(&s, "bad", "partition=7", &json!({"ack": [h]}).to_string()).await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST, "no partition 7");
    let r = consume_acking(&s, "missing", "", &json!({"ack": [h]}).to_string()).await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    assert_eq!(
        s.ack("bad", &h, "").await,
        StatusCode::NO_CONTENT,
        "no bad request settled the handle"
    );
}
