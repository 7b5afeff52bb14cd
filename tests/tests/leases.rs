//! Leases, receipt handles, flow control, replay and retention: every behaviour the
//! consumer documentation promises. Time moves only through the injected clock.
//!
//! These tests go through HTTP. The same rules are unit-tested without I/O as pure
//! transitions in `shared/src/partition/` (`lease.rs`, `settle.rs`, `produce.rs`,
//! `batch.rs`): start there when a rule changes.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::time::Duration;

use tokio::time::Instant;

use narad_tests::{Options, Server};
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

fn handle(m: &Value) -> String {
    m["receipt_handle"].as_str().unwrap().to_owned()
}

async fn code(r: reqwest::Response) -> (StatusCode, String) {
    let st = r.status();
    let v: Value = r.json().await.unwrap();
    (
        st,
        v["error"]["code"].as_str().unwrap_or_default().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_200_then_204_and_ack_settles_forever() {
    let s = Server::start().await;
    s.create_topic("q", json!({"visibility_timeout_ms": 1000}))
        .await;
    assert!(s.consume("q", "").await.is_none(), "empty topic: 204");
    s.produce("q", r#"{"n":1}"#).await;
    let m = s.consume("q", "").await.unwrap();
    assert_eq!(m["payload"], json!({"n":1}));
    assert!(
        s.consume("q", "").await.is_none(),
        "in flight: invisible to others"
    );
    assert_eq!(s.ack("q", &handle(&m), "").await, StatusCode::NO_CONTENT);
    s.clock.advance(10_000);
    assert!(
        s.consume("q", "").await.is_none(),
        "acked: never redelivered"
    );
    assert_eq!(
        s.ack("q", &handle(&m), "").await,
        StatusCode::GONE,
        "second ack: lease no longer held"
    );
    let t = s.topic("q").await;
    assert_eq!(t["partitions"][0]["frontier"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn late_ack_gets_410_and_changes_nothing() {
    let s = Server::start().await;
    s.create_topic("q", json!({"visibility_timeout_ms": 1000}))
        .await;
    s.produce("q", "job").await;
    let first = s.consume("q", "").await.unwrap();
    s.clock.advance(1000); // deadline reached: the lease has lapsed
    let r = s.ack_raw("q", &handle(&first), "").await;
    assert_eq!(code(r).await, (StatusCode::GONE, "lease_gone".into()));
    // The message is available again, with its delivery count climbing.
    let second = s.consume("q", "").await.unwrap();
    assert_eq!(second["offset"], first["offset"]);
    assert_eq!(second["delivery_count"], 2);
    // The first consumer's handle stays dead: ack, extend and nack all get 410 and the
    // second consumer's lease is untouched.
    for extra in ["", "&extend=true", "&extend=0"] {
        assert_eq!(
            s.ack("q", &handle(&first), extra).await,
            StatusCode::GONE,
            "{extra}"
        );
    }
    assert!(
        s.consume("q", "").await.is_none(),
        "second lease still holds"
    );
    assert_eq!(
        s.ack("q", &handle(&second), "").await,
        StatusCode::NO_CONTENT
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_keeps_a_message_invisible() {
    let s = Server::start().await;
    s.create_topic("q", json!({"visibility_timeout_ms": 1000}))
        .await;
    s.produce("q", "slow job").await;
    let m = s.consume("q", "").await.unwrap();
    for _ in 0..5 {
        s.clock.advance(700);
        assert_eq!(
            s.ack("q", &handle(&m), "&extend=true").await,
            StatusCode::NO_CONTENT
        );
        assert!(
            s.consume("q", "").await.is_none(),
            "extended: still invisible"
        );
    }
    // 3.5 s after the consume, well past the 1 s timeout, the lease still holds.
    s.clock.advance(999);
    assert!(s.consume("q", "").await.is_none());
    assert_eq!(s.ack("q", &handle(&m), "").await, StatusCode::NO_CONTENT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_after_the_window_gets_410() {
    let s = Server::start().await;
    s.create_topic("q", json!({"visibility_timeout_ms": 1000}))
        .await;
    s.produce("q", "x").await;
    let m = s.consume("q", "").await.unwrap();
    s.clock.advance(1001);
    assert_eq!(
        s.ack("q", &handle(&m), "&extend=true").await,
        StatusCode::GONE
    );
    // The lapsed message is available to the next consumer.
    assert!(s.consume("q", "").await.is_some());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn nack_redelivers_at_once_and_kills_the_handle() {
    let s = Server::start().await;
    s.create_topic("q", json!({"visibility_timeout_ms": 30000}))
        .await;
    s.produce("q", "retry me").await;
    let m = s.consume("q", "").await.unwrap();
    assert_eq!(
        s.ack("q", &handle(&m), "&extend=0").await,
        StatusCode::NO_CONTENT
    );
    // No clock movement: redeliverable immediately.
    let again = s.consume("q", "").await.unwrap();
    assert_eq!(again["offset"], m["offset"]);
    assert_eq!(again["delivery_count"], 2);
    assert_eq!(
        s.ack("q", &handle(&m), "").await,
        StatusCode::GONE,
        "nacked handle is stale"
    );
    assert_eq!(
        s.ack("q", &handle(&again), "").await,
        StatusCode::NO_CONTENT
    );
    let r = s.ack_raw("q", &handle(&again), "&extend=maybe").await;
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn long_poll_waits_and_wakes() {
    let s = Server::start().await;
    s.create_topic("q", json!({})).await;
    // Nothing arrives: 204 after about the wait.
    let t = Instant::now();
    assert!(s.consume("q", "wait=300ms").await.is_none());
    assert!(
        t.elapsed() >= Duration::from_millis(280),
        "returned after {:?}",
        t.elapsed()
    );
    // A produce during the wait wakes the poller at once.
    let base = s.base.clone();
    let poll = tokio::spawn(async move {
        let c = reqwest::Client::new();
        let t = Instant::now();
        let r = c
            .get(format!("{base}/v1/topics/q/consume?wait=10s"))
            .basic_auth(narad_tests::USER, Some(narad_tests::PASS))
            .send()
            .await
            .unwrap();
        (r.status(), t.elapsed(), r.json::<Value>().await.unwrap())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    s.produce("q", "wake up").await;
    let (status, took, m) = poll.await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(m["payload"], "wake up");
    assert!(took < Duration::from_secs(5), "woke after {took:?}");
    // A nack wakes a waiting consumer too.
    let base = s.base.clone();
    let poll = tokio::spawn(async move {
        let c = reqwest::Client::new();
        let r = c
            .get(format!("{base}/v1/topics/q/consume?wait=10s"))
            .basic_auth(narad_tests::USER, Some(narad_tests::PASS))
            .send()
            .await
            .unwrap();
        (r.status(), r.json::<Value>().await.unwrap())
    });
    tokio::time::sleep(Duration::from_millis(200)).await;
    assert_eq!(
        s.ack("q", &handle(&m), "&extend=0").await,
        StatusCode::NO_CONTENT
    );
    let (status, again) = poll.await.unwrap();
    assert_eq!(status, StatusCode::OK);
    assert_eq!(again["offset"], m["offset"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn wait_is_capped_by_the_server() {
    let mut opts = Options::default();
    opts.broker.max_wait = Duration::from_millis(300);
    let Some(s) = Server::start_with_or_skip(opts).await else {
        return;
    };
    s.create_topic("q", json!({})).await;
    let t = Instant::now();
    assert!(s.consume("q", "wait=60s").await.is_none());
    assert!(
        t.elapsed() < Duration::from_secs(5),
        "cap ignored: {:?}",
        t.elapsed()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn in_flight_cap_answers_204_until_acks_arrive() {
    let s = Server::start().await;
    s.create_topic("q", json!({"max_in_flight_per_partition": 3}))
        .await;
    for i in 0..6 {
        s.produce("q", format!("m{i}")).await;
    }
    let mut got = Vec::new();
    for _ in 0..3 {
        got.push(s.consume("q", "").await.unwrap());
    }
    assert!(s.consume("q", "").await.is_none(), "at the cap: 204");
    assert_eq!(s.topic("q").await["partitions"][0]["in_flight"], 3);
    assert_eq!(
        s.ack("q", &handle(&got[1]), "").await,
        StatusCode::NO_CONTENT
    );
    let next = s.consume("q", "").await.unwrap();
    assert_eq!(next["offset"], 3);
    assert!(s.consume("q", "").await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn acked_ahead_window_503_and_frontier_only_consume() {
    let s = Server::start().await;
    s.create_topic(
        "q",
        json!({"max_acked_ahead_per_partition": 2, "visibility_timeout_ms": 5000}),
    )
    .await;
    for i in 0..6 {
        s.produce("q", format!("m{i}")).await;
    }
    let mut ms = Vec::new();
    for _ in 0..4 {
        ms.push(s.consume("q", "").await.unwrap());
    }
    // Offset 0 is the frontier and stays unacked; acks of 1 and 2 fill the window.
    assert_eq!(
        s.ack("q", &handle(&ms[1]), "").await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(
        s.ack("q", &handle(&ms[2]), "").await,
        StatusCode::NO_CONTENT
    );
    let r = s.ack_raw("q", &handle(&ms[3]), "").await;
    assert_eq!(r.status(), StatusCode::SERVICE_UNAVAILABLE);
    assert!(r.headers().get("retry-after").is_some());
    assert_eq!(code(r).await.1, "acked_ahead_full");
    // The refused ack changed nothing: offset 3 is still leased to us.
    assert_eq!(s.topic("q").await["partitions"][0]["acked_ahead"], 2);
    // While the window is full, consume serves only the frontier message: offsets 4 and
    // 5 are available but not handed out.
    assert!(s.consume("q", "").await.is_none());
    s.clock.advance(5000); // offsets 0 and 3 lapse
    let f = s.consume("q", "").await.unwrap();
    assert_eq!(f["offset"], 0, "frontier message first");
    assert!(
        s.consume("q", "").await.is_none(),
        "nothing but the frontier while full"
    );
    // Settling the frontier advances it past 1 and 2, emptying the window.
    assert_eq!(s.ack("q", &handle(&f), "").await, StatusCode::NO_CONTENT);
    let t = s.topic("q").await;
    assert_eq!(
        (
            t["partitions"][0]["frontier"].as_u64(),
            t["partitions"][0]["acked_ahead"].as_u64()
        ),
        (Some(3), Some(0))
    );
    let next = s.consume("q", "").await.unwrap();
    assert_eq!(next["offset"], 3);
    // The old handle for offset 3 lapsed; retrying it now gets 410, not 503.
    assert_eq!(s.ack("q", &handle(&ms[3]), "").await, StatusCode::GONE);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn replay_reads_without_reserving() {
    let s = Server::start().await;
    s.create_topic("q", json!({"partitions": 2})).await;
    s.produce_q("q", "partition=1&key=k", r#"{"v":0}"#).await;
    s.produce_q("q", "partition=1", "second").await;
    let r = s.consume("q", "partition=1&offset=0").await.unwrap();
    assert_eq!(r["payload"], json!({"v":0}));
    assert_eq!(r["key"], "k");
    assert!(
        r.get("receipt_handle").is_none(),
        "replay has no receipt handle"
    );
    // Replay again, and the message is still available to a real consume.
    assert!(s.consume("q", "partition=1&offset=0").await.is_some());
    let m = s.consume("q", "partition=1").await.unwrap();
    assert_eq!(m["offset"], 0);
    // Replay works on in-flight and settled messages alike.
    assert_eq!(
        s.consume("q", "partition=1&offset=0").await.unwrap()["delivery_count"],
        1
    );
    assert_eq!(s.ack("q", &handle(&m), "").await, StatusCode::NO_CONTENT);
    assert_eq!(
        s.consume("q", "partition=1&offset=0").await.unwrap()["payload"],
        json!({"v":0})
    );
    // Beyond the end: 204 (after the wait).
    assert!(s.consume("q", "partition=1&offset=2").await.is_none());
    assert!(s.consume("q", "partition=0&offset=0").await.is_none());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn retention_deletes_old_messages_and_replay_gets_410() {
    let s = Server::start().await;
    s.create_topic("retained", json!({"retention_ms": 60_000}))
        .await;
    s.produce("retained", "old-0").await;
    s.produce("retained", "old-1").await;
    let leased = s.consume("retained", "").await.unwrap();
    s.clock.advance(30_000);
    s.produce("retained", "newer").await;
    s.clock.advance(40_000); // the first two are now 70 s old
    s.produce("retained", "newest").await; // any write applies retention
    let r = s.consume_raw("retained", "partition=0&offset=0").await;
    assert_eq!(code(r).await, (StatusCode::GONE, "offset_expired".into()));
    let r = s.consume_raw("retained", "partition=0&offset=1").await;
    assert_eq!(r.status(), StatusCode::GONE);
    let t = s.topic("retained").await;
    assert_eq!(t["partitions"][0]["start_offset"], 2);
    assert_eq!(t["partitions"][0]["segments"], 2);
    // The expired lease is gone too.
    assert_eq!(
        s.ack("retained", &handle(&leased), "").await,
        StatusCode::GONE
    );
    // Consumers continue from the oldest retained message.
    assert_eq!(s.consume("retained", "").await.unwrap()["payload"], "newer");
    // Expired segment objects are deleted from the store: no segment still holds the
    // expired messages. Told by content, under a topic name no other test uses: servers
    // sharing one store (the Lambda run) may still cache an earlier test's incarnation of
    // a reused name, and a combinable segment such a process writes is left for garbage
    // collection.
    let mut held = Vec::new();
    for key in s.store.list("topics/retained/0/segments/").await.unwrap() {
        let Some(obj) = s.store.get(&key).await.unwrap() else {
            continue;
        };
        // Intents are empty objects, not segments.
        if let Ok(seg) = narad_shared::stored::Segment::decode(&obj.data) {
            held.extend(
                seg.messages
                    .iter()
                    .map(|m| String::from_utf8_lossy(&m.payload).into_owned()),
            );
        }
    }
    assert!(!held.iter().any(|p| p.starts_with("old-")), "{held:?}");
    assert!(
        held.iter().any(|p| p == "newer") && held.iter().any(|p| p == "newest"),
        "{held:?}"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forged_foreign_and_malformed_handles_never_5xx() {
    let s = Server::start().await;
    s.create_topic("a", json!({})).await;
    s.create_topic("b", json!({})).await;
    s.produce("a", "x").await;
    let m = s.consume("a", "").await.unwrap();
    let h = handle(&m);
    // Another topic's handle: 410.
    assert_eq!(s.ack("b", &h, "").await, StatusCode::GONE);
    // A tampered handle: 410 (bad signature) or 400 (does not parse), never 5xx.
    let mut chars: Vec<char> = h.chars().collect();
    let mid = chars.len() / 2;
    chars[mid] = if chars[mid] == 'A' { 'B' } else { 'A' };
    let tampered: String = chars.into_iter().collect();
    let st = s.ack("a", &tampered, "").await;
    assert!(
        st == StatusCode::GONE || st == StatusCode::BAD_REQUEST,
        "{st}"
    );
    for junk in [
        "",
        "x",
        "v1.a.b",
        "v1..",
        &"v1.".repeat(400),
        "v1.eyJrIjoiMDAwMDAwMDAiLCJ0IjoiYSIsInAiOjk5LCJvIjowLCJsIjoxfQ.AAAA",
    ] {
        let st = s.ack("a", junk, "").await;
        assert!(st.is_client_error(), "{junk:?} gave {st}");
    }
    // A handle signed by a different server key: 410. The other server always runs
    // in-process, beside an external server under test too.
    let other = Server::start_local_with(Options {
        receipt_keys: vec![b"another-key-0123456789abcdef".to_vec()],
        ..Options::default()
    })
    .await;
    other.create_topic("a", json!({})).await;
    other.produce("a", "y").await;
    let foreign = handle(&other.consume("a", "").await.unwrap());
    assert_eq!(s.ack("a", &foreign, "").await, StatusCode::GONE);
    // After all that, the real handle still works.
    assert_eq!(s.ack("a", &h, "").await, StatusCode::NO_CONTENT);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_servers_on_one_store_share_leases() {
    // Two brokers on one store act like two processes: a handle from one is accepted by
    // the other, and a message leased through one is invisible through the other.
    let a = Server::start().await;
    let b = Server::start_on(a.store.clone(), None, Options::default(), a.clock.clone()).await;
    a.create_topic("q", json!({})).await;
    a.produce("q", "one").await;
    let m = b.consume("q", "").await.unwrap();
    assert!(a.consume("q", "").await.is_none());
    assert_eq!(a.ack("q", &handle(&m), "").await, StatusCode::NO_CONTENT);
    let r = b.req(Method::GET, "/v1/topics/q").send().await.unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["partitions"][0]["frontier"], 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_handle_of_a_deleted_topic_is_gone_for_its_successor() {
    let s = Server::start().await;
    s.create_topic("r", json!({})).await;
    s.produce("r", "first life").await;
    let old = s.consume("r", "").await.unwrap();
    let r = s.req(Method::DELETE, "/v1/topics/r").send().await.unwrap();
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    // The same name again: same partition, offset and lease id as before.
    s.create_topic("r", json!({})).await;
    s.produce("r", "second life").await;
    let new = s.consume("r", "").await.unwrap();
    assert_eq!(
        (new["partition"].clone(), new["offset"].clone()),
        (old["partition"].clone(), old["offset"].clone())
    );
    assert_ne!(
        handle(&old),
        handle(&new),
        "a handle names its topic incarnation"
    );
    let r = s.ack_raw("r", &handle(&old), "").await;
    assert_eq!(code(r).await.0, StatusCode::GONE);
    assert_eq!(s.ack("r", &handle(&new), "").await, StatusCode::NO_CONTENT);
}

/// `GET /v1/topics/{t}` shows how old the backlog is: the oldest unsettled message (at the
/// frontier) and the oldest available one (no live lease), per partition.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn topic_stats_show_the_age_of_the_oldest_unsettled_and_available_messages() {
    let s = Server::start().await;
    s.create_topic("aged", json!({"visibility_timeout_ms": 60_000}))
        .await;
    let ages = |v: &serde_json::Value| {
        let p = &v["partitions"][0];
        (
            p["oldest_unsettled_age_ms"].clone(),
            p["oldest_available_age_ms"].clone(),
        )
    };
    assert_eq!(ages(&s.topic("aged").await), (json!(null), json!(null)));
    s.produce("aged", "first").await;
    s.clock.advance(3000);
    s.produce("aged", "second").await;
    s.clock.advance(2000);
    assert_eq!(ages(&s.topic("aged").await), (json!(5000), json!(5000)));
    let first = s.consume("aged", "").await.unwrap();
    assert_eq!(first["payload"], "first");
    // The first is in flight: still the oldest unsettled, no longer available.
    assert_eq!(ages(&s.topic("aged").await), (json!(5000), json!(2000)));
    assert_eq!(
        s.ack("aged", &handle(&first), "").await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(ages(&s.topic("aged").await), (json!(2000), json!(2000)));
    let second = s.consume("aged", "").await.unwrap();
    assert_eq!(ages(&s.topic("aged").await), (json!(2000), json!(null)));
    assert_eq!(
        s.ack("aged", &handle(&second), "").await,
        StatusCode::NO_CONTENT
    );
    assert_eq!(ages(&s.topic("aged").await), (json!(null), json!(null)));
}

/// `extend=<duration>` ("retry later", SQS's ChangeMessageVisibility): the lease ends that
/// long from now, the handle stays good until then, and the message then comes back with
/// its delivery counted. `extend=true` and `extend=0` keep their meaning.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn extend_with_a_duration_gives_the_message_back_that_much_later() {
    let s = Server::start().await;
    s.create_topic("later", json!({"visibility_timeout_ms": 5000}))
        .await;
    s.produce("later", "retry me").await;
    let m = s.consume("later", "").await.unwrap();
    assert_eq!(
        s.ack("later", &handle(&m), "&extend=30s").await,
        StatusCode::NO_CONTENT
    );
    s.clock.advance(29_999);
    assert!(
        s.consume("later", "").await.is_none(),
        "still invisible: the new end is 30 s away, past the 5 s timeout"
    );
    s.clock.advance(1);
    let again = s.consume("later", "").await.unwrap();
    assert_eq!(again["delivery_count"], 2);
    // A bare number is seconds, as with `wait`; 0 in any spelling is a nack.
    assert_eq!(
        s.ack("later", &handle(&again), "&extend=2").await,
        StatusCode::NO_CONTENT
    );
    s.clock.advance(1999);
    assert!(s.consume("later", "").await.is_none());
    s.clock.advance(1);
    let third = s.consume("later", "").await.unwrap();
    assert_eq!(
        s.ack("later", &handle(&third), "&extend=0ms").await,
        StatusCode::NO_CONTENT
    );
    let fourth = s.consume("later", "").await.unwrap();
    assert_eq!(fourth["delivery_count"], 4);
    for bad in ["13h", "soon", "-1s"] {
        let r = s
            .ack_raw("later", &handle(&fourth), &format!("&extend={bad}"))
            .await;
        assert_eq!(
            code(r).await,
            (StatusCode::BAD_REQUEST, "invalid_request".into()),
            "extend={bad}"
        );
    }
    assert_eq!(
        s.ack("later", &handle(&fourth), "").await,
        StatusCode::NO_CONTENT
    );
}

/// A paused topic delivers nothing (204 with `Narad-Paused: true`, after the consume's wait)
/// while produce, ack and replay go on; resuming wakes a waiting consumer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_paused_topic_delivers_nothing_until_resumed() {
    let s = Server::start().await;
    s.create_topic("p", json!({})).await;
    s.produce("p", "before").await;
    let held = s.consume("p", "").await.unwrap();
    let patch = |paused: bool| {
        s.req(reqwest::Method::PATCH, "/v1/topics/p")
            .body(json!({ "paused": paused }).to_string())
            .send()
    };
    let r = patch(true).await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["settings"]["paused"], true);
    // Other processes (Lambda instances) see settings within the topic cache's 1 s.
    tokio::time::sleep(std::time::Duration::from_millis(1100)).await;
    s.produce("p", "while paused").await;
    let r = s
        .req(reqwest::Method::PUT, "/v1/topics/p")
        .body("{}")
        .send()
        .await
        .unwrap();
    assert_eq!(
        r.status(),
        StatusCode::OK,
        "creating it again does not trip over the pause"
    );
    let r = s.consume_raw("p", "").await;
    assert_eq!(r.status(), StatusCode::NO_CONTENT);
    assert_eq!(r.headers()["narad-paused"], "true", "the 204 says why");
    assert_eq!(s.ack("p", &handle(&held), "").await, StatusCode::NO_CONTENT);
    let replayed = s.consume("p", "partition=0&offset=1").await.unwrap();
    assert_eq!(
        replayed["payload"], "while paused",
        "replay is read-only and still works"
    );
    // A long poll that waits through the pause gets the message once resumed.
    let waiting = {
        let url = s.url("/v1/topics/p/consume?wait=5s");
        let http = s.http.clone();
        tokio::spawn(async move {
            http.get(url)
                .basic_auth(narad_tests::USER, Some(narad_tests::PASS))
                .send()
                .await
                .unwrap()
        })
    };
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    assert_eq!(patch(false).await.unwrap().status(), StatusCode::OK);
    let r = waiting.await.unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let m: serde_json::Value = r.json().await.unwrap();
    assert_eq!(m["payload"], "while paused");
    assert!(s
        .consume_raw("p", "")
        .await
        .headers()
        .get("narad-paused")
        .is_none());
}

/// Purge removes every retained message, available and in flight: outstanding handles get
/// 410, replays of the old offsets 410, and new produces continue from the next offset.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn purge_removes_everything_retained_and_offsets_continue() {
    let s = Server::start().await;
    s.create_topic("purged", json!({"partitions": 2})).await;
    let mut last = std::collections::HashMap::new();
    for i in 0..6 {
        let (p, o) = s.produce("purged", format!("m{i}")).await;
        last.insert(p, o);
    }
    let held = s.consume("purged", "").await.unwrap();
    let r = s
        .req(reqwest::Method::POST, "/v1/topics/purged/purge")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let v: serde_json::Value = r.json().await.unwrap();
    assert_eq!(v["purged"], 6);
    assert_eq!(s.ack("purged", &handle(&held), "").await, StatusCode::GONE);
    assert!(
        s.consume("purged", "").await.is_none(),
        "nothing left to deliver"
    );
    let stats = s.topic("purged").await;
    for p in stats["partitions"].as_array().unwrap() {
        assert_eq!(p["start_offset"], p["next_offset"], "{p}");
        assert_eq!(
            (p["available"].as_u64(), p["in_flight"].as_u64()),
            (Some(0), Some(0))
        );
    }
    let r = s.consume_raw("purged", "partition=0&offset=0").await;
    assert_eq!(code(r).await, (StatusCode::GONE, "offset_expired".into()));
    let (p, o) = s.produce_q("purged", "partition=0", "after").await;
    assert_eq!((p, o), (0, last[&0] + 1), "offsets continue");
    let m = s.consume("purged", "").await.unwrap();
    assert_eq!(m["payload"], "after");
    let r = s
        .req(reqwest::Method::POST, "/v1/topics/nothing-here/purge")
        .send()
        .await
        .unwrap();
    assert_eq!(
        code(r).await,
        (StatusCode::NOT_FOUND, "topic_not_found".into())
    );
}
