//! Message headers: sent on a single produce as `Narad-Header-<name>` HTTP headers and in
//! produce-batch as `"headers"`, returned on consume and replay as `"headers"` when present,
//! bounded and checked (docs/design.md §1).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use narad_tests::Server;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

async fn error_code(r: reqwest::Response) -> (StatusCode, String) {
    let status = r.status();
    let v: Value = r.json().await.unwrap();
    (
        status,
        v["error"]["code"].as_str().unwrap_or_default().to_owned(),
    )
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn headers_travel_with_their_message() {
    let s = Server::start().await;
    s.create_topic("h", json!({})).await;
    let r = s
        .req(Method::POST, "/v1/topics/h/produce")
        .header("Narad-Header-Trace-Id", "abc-123")
        .header("narad-header-tenant", "t1")
        .header("X-Other", "not a message header")
        .body("with headers")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let r = s
        .req(Method::POST, "/v1/topics/h/produce-batch")
        .body(
            json!({"messages": [
                {"payload": "batch one", "headers": {"source": "batch", "café": "ok"}},
                {"payload": "batch two"}
            ]})
            .to_string(),
        )
        .send()
        .await
        .unwrap();
    assert_eq!(
        error_code(r).await,
        (StatusCode::BAD_REQUEST, "invalid_request".into()),
        "names are a-z0-9._- only, and a bad message refuses the whole batch"
    );
    let r = s
        .req(Method::POST, "/v1/topics/h/produce-batch")
        .body(
            json!({"messages": [
                {"payload": "batch one", "headers": {"source": "batch", "note": "ünïcode ok"}},
                {"payload": "batch two"}
            ]})
            .to_string(),
        )
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["results"][0]["status"], 201, "{v}");

    let got: Value = s.consume("h", "max=10").await.unwrap();
    let msgs = got["messages"].as_array().unwrap();
    assert_eq!(msgs.len(), 3);
    assert_eq!(
        msgs[0]["headers"],
        json!({"tenant": "t1", "trace-id": "abc-123"})
    );
    assert_eq!(
        msgs[1]["headers"],
        json!({"note": "ünïcode ok", "source": "batch"})
    );
    assert!(
        msgs[2].get("headers").is_none(),
        "no headers, no field: {}",
        msgs[2]
    );
    let replayed = s.consume("h", "partition=0&offset=0").await.unwrap();
    assert_eq!(replayed["headers"]["trace-id"], "abc-123");
    // A repeated header is one value, joined by commas (as HTTP and API Gateway have it).
    // Behind a front the front decides (cargo lambda's emulator keeps only the first).
    if narad_tests::external_url().is_some() {
        return;
    }
    let r = s
        .req(Method::POST, "/v1/topics/h/produce")
        .header("Narad-Header-Twice", "1")
        .header("Narad-Header-Twice", "2")
        .body("twice")
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::CREATED);
    let m = s.consume("h", "").await.unwrap();
    assert_eq!(m["headers"]["twice"], "1,2");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn bad_headers_are_a_clear_400() {
    let s = Server::start().await;
    s.create_topic("hb", json!({})).await;
    let produce = |name: &str, value: &str| {
        s.req(Method::POST, "/v1/topics/hb/produce")
            .header(format!("Narad-Header-{name}"), value)
            .body("x")
            .send()
    };
    for (name, value, why) in [
        ("narad-source-topic", "x", "reserved prefix"),
        (&"n".repeat(65), "x", "name too long"),
        ("big", &"v".repeat(9000), "over 8 KiB"),
    ] {
        let r = produce(name, value).await.unwrap();
        assert_eq!(
            error_code(r).await,
            (StatusCode::BAD_REQUEST, "invalid_request".into()),
            "{why}"
        );
    }
    let mut many = s.req(Method::POST, "/v1/topics/hb/produce").body("x");
    for i in 0..33 {
        many = many.header(format!("Narad-Header-h{i}"), "v");
    }
    let r = many.send().await.unwrap();
    assert_eq!(
        error_code(r).await,
        (StatusCode::BAD_REQUEST, "invalid_request".into())
    );
    let r = s
        .req(Method::POST, "/v1/topics/hb/produce-batch")
        .body(json!({"messages": [{"payload": 1, "headers": {"a": "line\nbreak"}}]}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(
        error_code(r).await,
        (StatusCode::BAD_REQUEST, "invalid_request".into())
    );
    assert!(s.consume("hb", "").await.is_none(), "nothing was stored");
}
