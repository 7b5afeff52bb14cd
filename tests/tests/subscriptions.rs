//! Subscriptions (issue 28): several independent sets of competing consumers on one
//! topic, each receiving every message produced after its creation, with its own leases
//! and acks; the default subscription unchanged.

#![allow(clippy::unwrap_used, clippy::expect_used)]

use narad_tests::Server;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

async fn put_sub(s: &Server, topic: &str, sub: &str, body: Value) -> (StatusCode, Value) {
    let r = s
        .req(
            Method::PUT,
            &format!("/v1/topics/{topic}/subscriptions/{sub}"),
        )
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

/// Another server process on `s`'s store and clock.
async fn second_process(s: &Server) -> Server {
    Server::start_on(
        s.store.clone(),
        None,
        narad_tests::Options::default(),
        s.clock.clone(),
    )
    .await
}

/// Consumes everything available for `sub` (one at a time), acking each; the payloads.
async fn drain(s: &Server, topic: &str, sub: &str) -> Vec<u64> {
    let mut got = Vec::new();
    while let Some(m) = s.consume(topic, &format!("subscription={sub}")).await {
        got.push(m["payload"]["n"].as_u64().unwrap());
        let h = m["receipt_handle"].as_str().unwrap();
        assert_eq!(s.ack(topic, h, "").await, StatusCode::NO_CONTENT, "{m}");
    }
    got.sort_unstable();
    got
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn each_subscription_gets_every_message_and_acks_on_its_own() {
    let s = Server::start().await;
    s.create_topic("fan", json!({"partitions": 2})).await;
    for n in 0..3 {
        s.produce("fan", json!({ "n": n }).to_string()).await;
    }
    let (status, v) = put_sub(&s, "fan", "billing", json!({})).await;
    assert_eq!(status, StatusCode::CREATED, "{v}");
    assert_eq!(v["start"], "latest");
    let (status, _) = put_sub(&s, "fan", "billing", json!({})).await;
    assert_eq!(status, StatusCode::OK, "the same again");
    let (status, v) = put_sub(&s, "fan", "billing", json!({"start": "earliest"})).await;
    assert_eq!(status, StatusCode::CONFLICT, "{v}");
    assert_eq!(v["error"]["code"], "subscription_exists");
    put_sub(&s, "fan", "search", json!({"visibility_timeout_ms": 1000})).await;
    for n in 3..8 {
        s.produce("fan", json!({ "n": n }).to_string()).await;
    }
    let (status, _) = put_sub(&s, "fan", "audit", json!({"start": "earliest"})).await;
    assert_eq!(status, StatusCode::CREATED);

    // A lease of one subscription is not settled by another's consumers, and its
    // handle names its subscription.
    let m = s.consume("fan", "subscription=billing").await.unwrap();
    let held = m["receipt_handle"].as_str().unwrap().to_owned();
    assert!(held.starts_with("v2."), "{held}");
    assert_eq!(drain(&s, "fan", "search").await, vec![3, 4, 5, 6, 7]);
    let mut rest = drain(&s, "fan", "billing").await;
    assert_eq!(s.ack("fan", &held, "").await, StatusCode::NO_CONTENT);
    assert_eq!(
        s.ack("fan", &held, "").await,
        StatusCode::GONE,
        "acked once"
    );
    rest.push(m["payload"]["n"].as_u64().unwrap());
    rest.sort_unstable();
    assert_eq!(rest, vec![3, 4, 5, 6, 7]);
    assert_eq!(drain(&s, "fan", "audit").await, (0..8).collect::<Vec<_>>());
    // The default subscription saw none of it: every message is still there.
    let mut default = Vec::new();
    while let Some(m) = s.consume("fan", "").await {
        default.push(m["payload"]["n"].as_u64().unwrap());
        let h = m["receipt_handle"].as_str().unwrap();
        assert!(h.starts_with("v1."));
        assert_eq!(s.ack("fan", h, "").await, StatusCode::NO_CONTENT);
    }
    default.sort_unstable();
    assert_eq!(default, (0..8).collect::<Vec<_>>());
    // New messages reach every subscription again.
    s.produce("fan", json!({ "n": 8 }).to_string()).await;
    for sub in ["billing", "search", "audit"] {
        assert_eq!(drain(&s, "fan", sub).await, vec![8], "{sub}");
    }

    let r = s
        .req(Method::GET, "/v1/topics/fan/subscriptions")
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    let names: Vec<&str> = v["subscriptions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["name"].as_str().unwrap())
        .collect();
    assert_eq!(names, ["audit", "billing", "search"]);
    assert_eq!(
        v["subscriptions"][2]["effective"]["visibility_timeout_ms"],
        1000
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_deleted_subscription_answers_404_and_its_handles_410() {
    let s = Server::start().await;
    s.create_topic("gone", json!({})).await;
    put_sub(&s, "gone", "a", json!({})).await;
    s.produce("gone", json!({ "n": 1 }).to_string()).await;
    let m = s.consume("gone", "subscription=a").await.unwrap();
    let h = m["receipt_handle"].as_str().unwrap().to_owned();
    let r = s
        .req(Method::DELETE, "/v1/topics/gone/subscriptions/a")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    let r = s.consume_raw("gone", "subscription=a").await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["error"]["code"], "subscription_not_found");
    assert_eq!(s.ack("gone", &h, "").await, StatusCode::GONE);
    // Created again under the same name: a new subscription, the old handle still 410.
    put_sub(&s, "gone", "a", json!({"start": "earliest"})).await;
    assert_eq!(s.ack("gone", &h, "").await, StatusCode::GONE);
    let m = s.consume("gone", "subscription=a").await.unwrap();
    assert_eq!(m["payload"]["n"], 1);
    for (query, code) in [
        ("subscription=a%20b", StatusCode::BAD_REQUEST),
        (
            "subscription=a&partition=0&offset=0",
            StatusCode::BAD_REQUEST,
        ),
    ] {
        let r = s.consume_raw("gone", query).await;
        assert_eq!(r.status(), code, "{query}");
    }
    let (status, v) = put_sub(&s, "gone", "b", json!({"strat": "earliest"})).await;
    assert_eq!(status, StatusCode::BAD_REQUEST, "{v}");
}

async fn cancel(s: &Server, topic: &str, p: u32, o: u64, query: &str) -> (StatusCode, Value) {
    let r = s
        .req(
            Method::DELETE,
            &format!("/v1/topics/{topic}/messages/{p}/{o}?{query}"),
        )
        .send()
        .await
        .unwrap();
    let status = r.status();
    (status, r.json().await.unwrap_or(Value::Null))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancelled_message_is_never_delivered_and_its_lease_is_gone() {
    let s = Server::start().await;
    s.create_topic("cx", json!({})).await;
    put_sub(&s, "cx", "a", json!({})).await;
    put_sub(&s, "cx", "b", json!({})).await;
    let (_, delayed) = s
        .produce_q("cx", "delay=1500ms", json!({ "n": 0 }).to_string())
        .await;
    let (_, one) = s.produce("cx", json!({ "n": 1 }).to_string()).await;
    s.produce("cx", json!({ "n": 2 }).to_string()).await;
    // The delayed message, for every subscription.
    assert_eq!(
        cancel(&s, "cx", 0, delayed, "").await.0,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        cancel(&s, "cx", 0, delayed, "").await.0,
        StatusCode::NO_CONTENT,
        "again: settled already"
    );
    // A leased message, for one subscription: its handle is gone, the others still get it.
    let m = s.consume("cx", "subscription=a").await.unwrap();
    assert_eq!(m["offset"], one);
    let h = m["receipt_handle"].as_str().unwrap().to_owned();
    let (status, v) = cancel(&s, "cx", 0, one, "subscription=a").await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{v}");
    assert_eq!(s.ack("cx", &h, "").await, StatusCode::GONE);
    assert_eq!(drain(&s, "cx", "a").await, vec![2]);
    assert_eq!(drain(&s, "cx", "b").await, vec![1, 2]);
    // Bad input.
    for (p, o, q, status, code) in [
        (0, 99, "", StatusCode::NOT_FOUND, "message_not_found"),
        (
            0,
            0,
            "subscription=zz",
            StatusCode::NOT_FOUND,
            "subscription_not_found",
        ),
        (3, 0, "", StatusCode::NOT_FOUND, "message_not_found"),
    ] {
        let (got, v) = cancel(&s, "cx", p, o, q).await;
        assert_eq!(
            (got, v["error"]["code"].as_str()),
            (status, Some(code)),
            "{v}"
        );
    }
    let r = s
        .req(Method::DELETE, "/v1/topics/cx/messages/x/0")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    // Past its delay, the cancelled message reaches nobody.
    tokio::time::sleep(std::time::Duration::from_millis(1700)).await;
    assert_eq!(drain(&s, "cx", "a").await, Vec::<u64>::new());
    assert_eq!(drain(&s, "cx", "b").await, Vec::<u64>::new());
    let mut default = Vec::new();
    while let Some(m) = s.consume("cx", "").await {
        default.push(m["payload"]["n"].as_u64().unwrap());
        let h = m["receipt_handle"].as_str().unwrap();
        assert_eq!(s.ack("cx", h, "").await, StatusCode::NO_CONTENT);
    }
    default.sort_unstable();
    assert_eq!(default, vec![1, 2]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_shows_its_own_backlog_per_partition() {
    let s = Server::start().await;
    s.create_topic("figures", json!({})).await;
    put_sub(&s, "figures", "a", json!({})).await;
    for n in 0..3 {
        s.produce("figures", json!({ "n": n }).to_string()).await;
    }
    s.produce_q("figures", "delay=1h", json!({ "n": 3 }).to_string())
        .await;
    let m = s.consume("figures", "subscription=a").await.unwrap();
    assert_eq!(m["offset"], 0);
    let r = s
        .req(Method::GET, "/v1/topics/figures/subscriptions/a")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let v: Value = r.json().await.unwrap();
    let p = &v["partitions"][0];
    assert_eq!(
        (
            &p["frontier"],
            &p["next_offset"],
            &p["available"],
            &p["in_flight"],
            &p["delayed"],
            &p["lost"]
        ),
        (
            &json!(0),
            &json!(4),
            &json!(2),
            &json!(1),
            &json!(1),
            &json!(0)
        ),
        "{v}"
    );
    assert!(p["oldest_available_age_ms"].is_u64(), "{v}");
    // The default subscription's figures are its own.
    let t = s.topic("figures").await;
    assert_eq!(t["partitions"][0]["available"], 3, "{t}");
    assert_eq!(t["partitions"][0]["in_flight"], 0, "{t}");
    // `/metrics` shows the subscription's figures as this process's commits left them
    // (per process: only an in-process server's are exact).
    if narad_tests::external_url().is_none() {
        let metrics = s.metrics().await;
        for line in [
            r#"narad_subscription_backlog_messages{topic="figures",subscription="a"} 2"#,
            r#"narad_subscription_in_flight_messages{topic="figures",subscription="a"} 1"#,
            r#"narad_subscription_delayed_messages{topic="figures",subscription="a"} 1"#,
            r#"narad_subscription_lost_messages{topic="figures",subscription="a"} 0"#,
        ] {
            assert!(metrics.lines().any(|l| l == line), "{line} in\n{metrics}");
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_purges_alone() {
    let s = Server::start().await;
    s.create_topic("purged", json!({"partitions": 2})).await;
    put_sub(&s, "purged", "a", json!({})).await;
    put_sub(&s, "purged", "b", json!({})).await;
    for n in 0..4 {
        s.produce("purged", json!({ "n": n }).to_string()).await;
    }
    let m = s.consume("purged", "subscription=a").await.unwrap();
    let h = m["receipt_handle"].as_str().unwrap().to_owned();
    let r = s
        .req(Method::POST, "/v1/topics/purged/purge?subscription=a")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["purged"], 4, "{v}");
    assert_eq!(s.ack("purged", &h, "").await, StatusCode::GONE);
    assert_eq!(drain(&s, "purged", "a").await, Vec::<u64>::new());
    assert_eq!(drain(&s, "purged", "b").await, vec![0, 1, 2, 3]);
    // The default subscription keeps every message (across Lambda instances a produce's
    // partition is any instance's sticky choice: count them all).
    let t = s.topic("purged").await;
    let available: u64 = t["partitions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|p| p["available"].as_u64().unwrap())
        .sum();
    assert_eq!(available, 4, "{t}");
    s.produce("purged", json!({ "n": 4 }).to_string()).await;
    assert_eq!(
        drain(&s, "purged", "a").await,
        vec![4],
        "new messages come again"
    );
    let r = s
        .req(Method::POST, "/v1/topics/purged/purge?subscription=zz")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_of_an_ordered_topic_keeps_each_keys_order() {
    let s = Server::start().await;
    s.create_topic("ordered", json!({"ordering": "key"})).await;
    put_sub(&s, "ordered", "a", json!({})).await;
    for (key, n) in [("acct-1", 0), ("acct-1", 1), ("acct-2", 2), ("acct-1", 3)] {
        s.produce_q(
            "ordered",
            &format!("key={key}"),
            json!({ "n": n }).to_string(),
        )
        .await;
    }
    let batch = |v: &Value| -> Vec<(u64, String)> {
        v["messages"]
            .as_array()
            .unwrap()
            .iter()
            .map(|m| {
                (
                    m["payload"]["n"].as_u64().unwrap(),
                    m["receipt_handle"].as_str().unwrap().to_owned(),
                )
            })
            .collect()
    };
    // 0 and 2 go out together; 1 and 3 wait behind 0 (same key).
    let got = batch(&s.consume("ordered", "subscription=a&max=10").await.unwrap());
    assert_eq!(got.iter().map(|g| g.0).collect::<Vec<_>>(), [0, 2]);
    assert!(s
        .consume("ordered", "subscription=a&max=10")
        .await
        .is_none());
    assert_eq!(
        s.ack("ordered", &got[0].1, "").await,
        StatusCode::NO_CONTENT
    );
    let next = batch(&s.consume("ordered", "subscription=a&max=10").await.unwrap());
    assert_eq!(next.iter().map(|g| g.0).collect::<Vec<_>>(), [1]);
    // The default subscription orders on its own.
    let own = s.consume("ordered", "max=10").await.unwrap();
    assert_eq!(own["messages"].as_array().unwrap().len(), 2, "{own}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cancel_through_a_process_that_has_not_seen_the_message_yet_holds() {
    let s = Server::start().await;
    let other = second_process(&s).await;
    s.create_topic("seen", json!({})).await;
    put_sub(&s, "seen", "a", json!({})).await;
    s.produce("seen", json!({ "n": 0 }).to_string()).await;
    // This process's ledger of `a` now knows a log of one message.
    assert_eq!(drain(&s, "seen", "a").await, vec![0]);
    // Another process appends one; this one cancels it for `a` before it saw it.
    let (_, offset) = other
        .produce_q("seen", "delay=1h", json!({ "n": 1 }).to_string())
        .await;
    let (status, v) = cancel(&s, "seen", 0, offset, "subscription=a").await;
    assert_eq!(status, StatusCode::NO_CONTENT, "{v}");
    let r = s
        .req(Method::GET, "/v1/topics/seen/subscriptions/a")
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        (
            &v["partitions"][0]["frontier"],
            &v["partitions"][0]["delayed"]
        ),
        (&json!(2), &json!(0)),
        "the cancel settled it for a: {v}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_subscription_created_through_another_process_is_found_at_once() {
    let s = Server::start().await;
    let other = second_process(&s).await;
    s.create_topic("elsewhere", json!({})).await;
    s.produce("elsewhere", json!({ "n": 0 }).to_string()).await;
    // The other process caches the topic as it is now, without subscriptions.
    assert!(other.consume("elsewhere", "").await.is_some());
    put_sub(&s, "elsewhere", "late", json!({"start": "earliest"})).await;
    let m = other.consume("elsewhere", "subscription=late").await;
    assert_eq!(m.unwrap()["payload"]["n"], 0);
    // A name neither process knows is still 404.
    let r = other.consume_raw("elsewhere", "subscription=never").await;
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_process_that_knows_an_old_log_but_no_ledger_still_finds_newer_messages() {
    let s = Server::start().await;
    let other = second_process(&s).await;
    s.create_topic("older", json!({})).await;
    // `other` knows the log as its own produce left it: one message.
    other.produce("older", json!({ "n": 0 }).to_string()).await;
    put_sub(&s, "older", "late", json!({})).await;
    for n in 1..3 {
        s.produce("older", json!({ "n": n }).to_string()).await;
    }
    // Its first consume of `late` reads a ledger it never knew, which finds nothing in
    // the log it knows: it must read the log again rather than answer empty (the Lambda
    // step's separate instances found this).
    assert_eq!(drain(&other, "older", "late").await, vec![1, 2]);
}

/// A dead letter of one subscription goes back to that subscription alone: the copy is held
/// while the redrive cancels it for the default subscription and every other one.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_redriven_dead_letter_goes_back_to_its_own_subscription_alone() {
    let s = Server::start().await;
    s.create_topic("work-dlq", json!({})).await;
    s.create_topic("work", json!({})).await;
    let strict = json!({"max_deliveries": 1, "dead_letter_topic": "work-dlq", "visibility_timeout_ms": 1000});
    put_sub(&s, "work", "strict", strict).await;
    put_sub(&s, "work", "other", json!({})).await;
    s.produce("work", json!({ "n": 0 }).to_string()).await;
    // Every group settles it; `strict` dead-letters it on its second lease.
    assert_eq!(drain(&s, "work", "other").await, vec![0]);
    let m = s.consume("work", "").await.unwrap();
    let h = m["receipt_handle"].as_str().unwrap();
    assert_eq!(s.ack("work", h, "").await, StatusCode::NO_CONTENT);
    let m = s.consume("work", "subscription=strict").await.unwrap();
    let h = m["receipt_handle"].as_str().unwrap();
    assert_eq!(s.ack("work", h, "&extend=0").await, StatusCode::NO_CONTENT);
    assert!(s.consume("work", "subscription=strict").await.is_none());

    let r = s
        .req(Method::POST, "/v1/topics/work-dlq/redrive")
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v, json!({"moved": 1, "failed": 0}));
    // Held, then `strict`'s alone.
    assert!(
        s.consume("work", "subscription=strict").await.is_none(),
        "held"
    );
    s.clock.advance(30_000);
    assert_eq!(drain(&s, "work", "strict").await, vec![0]);
    assert!(s.consume("work", "subscription=other").await.is_none());
    assert!(s.consume("work", "").await.is_none(), "not the default's");
    let r = s
        .req(Method::GET, "/v1/topics/work/subscriptions/other")
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    let p0 = &v["partitions"][0];
    assert_eq!(
        (&p0["frontier"], &p0["available"]),
        (&json!(2), &json!(0)),
        "settled for other: {v}"
    );
}
