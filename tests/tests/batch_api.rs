//! Batch APIs: produce many messages, consume up to N, settle many handles.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use narad_tests::Server;
use reqwest::{Method, StatusCode};
use serde_json::{json, Value};

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn produce_batch_keeps_payloads_order_and_reports_per_message() {
    let s = Server::start().await;
    s.create_topic("b", json!({"partitions": 2})).await;
    let body = r#"{"messages":[
        {"payload":{"z":1.0,"a":123456789012345678901234567890},"partition":1,"key":"k1"},
        {"payload":"plain text","partition":1},
        {"payload":"AP8Q","payload_encoding":"base64","partition":1},
        {"payload":[1,2],"partition":7},
        {"payload":42,"key":"customer-9"}
    ]}"#;
    let r = s
        .req(Method::POST, "/v1/topics/b/produce-batch")
        .body(body)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let v: Value = r.json().await.unwrap();
    let res = v["results"].as_array().unwrap();
    assert_eq!(res.len(), 5);
    assert_eq!(
        (
            res[0]["status"].as_u64(),
            res[0]["partition"].as_u64(),
            res[0]["offset"].as_u64()
        ),
        (Some(201), Some(1), Some(0))
    );
    assert_eq!(res[1]["offset"], 1);
    assert_eq!(res[2]["offset"], 2);
    assert_eq!(res[3]["status"], 400);
    assert_eq!(res[3]["error"]["code"], "invalid_partition");
    assert_eq!(res[4]["status"], 201);

    let text = s
        .consume_raw("b", "partition=1&offset=0")
        .await
        .text()
        .await
        .unwrap();
    assert!(
        text.contains(r#""payload":{"z":1.0,"a":123456789012345678901234567890}"#),
        "{text}"
    );
    assert!(text.contains(r#""key":"k1""#));
    let m = s.consume("b", "partition=1&offset=1").await.unwrap();
    assert_eq!(m["payload"], "plain text");
    let m = s.consume("b", "partition=1&offset=2").await.unwrap();
    assert_eq!(
        (m["payload"].as_str(), m["payload_encoding"].as_str()),
        (Some("AP8Q"), Some("base64"))
    );

    // A whole number written as a float is an integer (JSON Schema's reading; Python's
    // json writes 1.0 for a float that holds 1).
    let r = s
        .req(Method::POST, "/v1/topics/b/produce-batch")
        .body(r#"{"messages":[{"payload":7,"partition":1.0,"delay_ms":0.0}]}"#)
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(
        (&v["results"][0]["status"], &v["results"][0]["partition"]),
        (&json!(201), &json!(1)),
        "{v}"
    );

    for bad in [
        "",
        "{}",
        r#"{"messages":[{"payload":1,"partition":0.5}]}"#,
        r#"{"messages":[{"payload":1,"delay_ms":-1.0}]}"#,
        r#"{"messages":[{"payload":1,"partition":4294967296}]}"#,
        r#"{"messages":[]}"#,
        r#"{"messages":[{"payload":"x","payload_encoding":"rot13"}]}"#,
        r#"{"messages":[{"payload":1,"payload_encoding":"base64"}]}"#,
        r#"{"messages":[{"payload":"!!","payload_encoding":"base64"}]}"#,
        r#"{"messages":[{"payload":1,"extra":true}]}"#,
    ] {
        let r = s
            .req(Method::POST, "/v1/topics/b/produce-batch")
            .body(bad)
            .send()
            .await
            .unwrap();
        assert_eq!(r.status(), StatusCode::BAD_REQUEST, "{bad}");
    }
    let r = s
        .req(Method::POST, "/v1/topics/none/produce-batch")
        .body(r#"{"messages":[{"payload":1}]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::NOT_FOUND);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn consume_max_and_batch_ack() {
    let s = Server::start().await;
    s.create_topic("b", json!({"max_acked_ahead_per_partition": 2}))
        .await;
    let msgs: Vec<Value> = (0..10).map(|i| json!({"payload": {"i": i}})).collect();
    let r = s
        .req(Method::POST, "/v1/topics/b/produce-batch")
        .body(json!({"messages": msgs}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);

    // Payloads in a batch come back verbatim too.
    let raw = r#"{"z":1.0,"a":123456789012345678901234567890}"#;
    s.create_topic("verbatim", json!({})).await;
    s.produce("verbatim", raw).await;
    s.produce("verbatim", raw).await;
    let text = s
        .consume_raw("verbatim", "max=2")
        .await
        .text()
        .await
        .unwrap();
    assert_eq!(
        text.matches(&format!("\"payload\":{raw}")).count(),
        2,
        "{text}"
    );

    let v = s.consume("b", "max=4").await.unwrap();
    let got = v["messages"].as_array().unwrap();
    assert_eq!(got.len(), 4);
    let offsets: Vec<u64> = got.iter().map(|m| m["offset"].as_u64().unwrap()).collect();
    assert_eq!(offsets, vec![0, 1, 2, 3]);
    let handles: Vec<&str> = got
        .iter()
        .map(|m| m["receipt_handle"].as_str().unwrap())
        .collect();

    // Ack 1, 2, 3 (out of order: the window holds 2) plus a junk handle in one request.
    let body = json!({"receipt_handles": [handles[1], handles[2], handles[3], "junk"]});
    let r = s
        .req(Method::POST, "/v1/topics/b/ack")
        .body(body.to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::OK);
    let v: Value = r.json().await.unwrap();
    let st: Vec<u64> = v["results"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| r["status"].as_u64().unwrap())
        .collect();
    assert_eq!(st.iter().filter(|s| **s == 204).count(), 2, "{v}");
    assert_eq!(
        st.iter().filter(|s| **s == 503).count(),
        1,
        "the third out-of-order ack overflows: {v}"
    );
    assert_eq!(st[3], 400, "junk handle");

    // Nack the frontier message in a batch, then it comes back first.
    let r = s
        .req(Method::POST, "/v1/topics/b/ack")
        .body(json!({"receipt_handles": [handles[0]], "extend": 0}).to_string())
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["results"][0]["status"], 204);
    let again = s.consume("b", "max=1").await.unwrap();
    assert_eq!(again["messages"][0]["offset"], 0);
    assert_eq!(again["messages"][0]["delivery_count"], 2);
    // `extend` in the query applies to the body's handles; given in both, it is a 400.
    let h0 = again["messages"][0]["receipt_handle"].as_str().unwrap();
    let both = s
        .req(Method::POST, "/v1/topics/b/ack?extend=0")
        .body(json!({"receipt_handles": [h0], "extend": true}).to_string())
        .send()
        .await
        .unwrap();
    assert_eq!(both.status(), StatusCode::BAD_REQUEST);
    let r = s
        .req(Method::POST, "/v1/topics/b/ack?extend=0")
        .body(json!({"receipt_handles": [h0], "extend": null}).to_string())
        .send()
        .await
        .unwrap();
    let v: Value = r.json().await.unwrap();
    assert_eq!(v["results"][0]["status"], 204, "{v}");
    let again = s.consume("b", "max=1").await.unwrap();
    assert_eq!(again["messages"][0]["offset"], 0);
    assert_eq!(again["messages"][0]["delivery_count"], 3);

    // max bounds and shape.
    for q in ["max=0", "max=101", "max=x", "partition=0&offset=0&max=2"] {
        assert_eq!(
            s.consume_raw("b", q).await.status(),
            StatusCode::BAD_REQUEST,
            "{q}"
        );
    }
    let r = s
        .req(Method::POST, "/v1/topics/b/ack")
        .body(r#"{"receipt_handles":[]}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
    let r = s
        .req(Method::POST, "/v1/topics/b/ack")
        .body(r#"{"receipt_handles":["x"],"extend":"soon"}"#)
        .send()
        .await
        .unwrap();
    assert_eq!(r.status(), StatusCode::BAD_REQUEST);
}
