//! Payloads an attacker (or an unlucky producer) would send: every consume response must
//! still parse in Python's `json` (and in serde_json, which stops at 128 levels), and no
//! response may outgrow the documented budget (docs/design.md §1, "Payload rendering").
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::io::Write;
use std::process::{Command, Stdio};

use narad_shared::http::limits::MAX_CONSUME_RESPONSE_BYTES;
use narad_tests::Server;
use serde_json::{json, Value};

/// Whether Python's `json` module parses `body` (skipped, with a note, without python3).
fn python_parses(body: &[u8]) -> bool {
    let Ok(mut child) = Command::new("python3")
        .args(["-c", "import json,sys; json.loads(sys.stdin.buffer.read())"])
        .stdin(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
    else {
        println!("python3 not found: checked with serde_json only");
        return true;
    };
    child.stdin.take().unwrap().write_all(body).unwrap();
    child.wait().unwrap().success()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deeply_nested_json_comes_back_as_text_every_parser_reads() {
    let s = Server::start().await;
    s.create_topic("deep", json!({})).await;
    let deep = format!("{}{}", "[".repeat(100_000), "]".repeat(100_000));
    s.produce("deep", deep.clone()).await;
    let r = s.consume_raw("deep", "").await;
    assert_eq!(r.status(), 200);
    let body = r.bytes().await.unwrap();
    assert!(
        python_parses(&body),
        "Python's json cannot parse the response"
    );
    let v: Value = serde_json::from_slice(&body).unwrap();
    assert_eq!(
        v["payload"].as_str(),
        Some(deep.as_str()),
        "the bytes, as text"
    );
    assert!(v.get("payload_encoding").is_none());
    // Shallow JSON is still embedded verbatim.
    s.produce("deep", r#"{"a":[[1.0]]}"#).await;
    let v = s.consume("deep", "").await.unwrap();
    assert_eq!(v["payload"], json!({"a": [[1.0]]}));
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn control_characters_cannot_amplify_a_response() {
    let s = Server::start().await;
    s.create_topic("amp", json!({"max_in_flight_per_partition": 100}))
        .await;
    let payload = vec![1u8; 1 << 20];
    for _ in 0..20 {
        s.produce("amp", payload.clone()).await;
    }
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..20 {
        let r = s.consume_raw("amp", "max=100").await;
        if r.status() == 204 {
            break;
        }
        assert_eq!(r.status(), 200);
        let body = r.bytes().await.unwrap();
        assert!(
            body.len() <= MAX_CONSUME_RESPONSE_BYTES,
            "a response of {} bytes",
            body.len()
        );
        assert!(python_parses(&body));
        let v: Value = serde_json::from_slice(&body).unwrap();
        for m in v["messages"].as_array().unwrap() {
            assert_eq!(m["payload_encoding"], "base64");
            assert_eq!(
                m["delivery_count"], 1,
                "a message given back for want of room is not counted as delivered"
            );
            assert!(
                seen.insert(m["offset"].as_u64().unwrap()),
                "delivered twice"
            );
        }
    }
    assert_eq!(
        seen.len(),
        20,
        "every message delivered, a few per response"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn messages_without_room_are_given_back_uncounted() {
    use base64::Engine;
    let s = Server::start().await;
    s.create_topic("mix", json!({"max_in_flight_per_partition": 100}))
        .await;
    // One segment of four big messages and four tiny ones: its average size misleads the
    // estimate, so the broker leases more than fits and must give some back.
    let big = base64::engine::general_purpose::STANDARD.encode(vec![1u8; 1 << 20]);
    let mut messages = Vec::new();
    for _ in 0..4 {
        messages.push(json!({"payload": big, "payload_encoding": "base64"}));
    }
    for i in 0..4 {
        messages.push(json!({ "payload": i }));
    }
    let r = s
        .req(reqwest::Method::POST, "/v1/topics/mix/produce-batch")
        .json(&json!({ "messages": messages }))
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), 200);
    let mut seen = std::collections::BTreeSet::new();
    let mut responses = 0;
    while let Some(v) = s.consume("mix", "max=100").await {
        responses += 1;
        assert!(responses <= 8, "consume never drains");
        let text = serde_json::to_vec(&v).unwrap();
        assert!(
            text.len() <= MAX_CONSUME_RESPONSE_BYTES,
            "{} bytes",
            text.len()
        );
        for m in v["messages"].as_array().unwrap() {
            assert_eq!(m["delivery_count"], 1, "offset {}", m["offset"]);
            assert!(
                seen.insert(m["offset"].as_u64().unwrap()),
                "delivered twice"
            );
        }
    }
    assert_eq!(seen.len(), 8);
    assert!(
        responses >= 2,
        "1.5 MiB per big message: they cannot share one response"
    );
}
