//! narad-client's typed responses read what this server sends, field for field: nothing
//! it knows is left in `other` (a field renamed on one side would land there and read as
//! its default on the other) and the figures are the server's; and the operations it calls
//! are the OpenAPI document's, both ways.
#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeMap;

use narad_client::{Client, ConsumeOptions, GrantAction, Operation, ProduceOptions, Redriven};
use narad_tests::{Server, PASS, USER};
use serde_json::json;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_clients_types_read_every_field_the_server_sends() {
    let s = Server::start().await;
    let c = Client::new(&s.base, Some((USER, PASS))).unwrap();
    c.create_topic("typed-dlq", &json!({})).await.unwrap();
    let created = c
        .create_topic(
            "typed",
            &json!({"partitions": 2, "visibility_timeout_ms": 45_000, "max_deliveries": 3,
                    "dead_letter_topic": "typed-dlq"}),
        )
        .await
        .unwrap();
    assert!(created.created);
    assert!(
        created.value.settings.other.is_empty(),
        "{:?}",
        created.value.settings.other
    );
    let opts = ProduceOptions {
        partition: Some(1),
        ..ProduceOptions::default()
    };
    c.produce("typed", "one", &opts).await.unwrap();
    c.produce("typed", "two", &opts).await.unwrap();
    let leased = c
        .consume(
            "typed",
            &ConsumeOptions {
                partition: Some(1),
                ..ConsumeOptions::default()
            },
        )
        .await
        .unwrap();
    assert_eq!(leased.len(), 1);

    let t = c.get_topic("typed").await.unwrap();
    assert_eq!(t.settings.partitions, Some(2));
    assert_eq!(t.settings.max_deliveries, Some(3));
    assert_eq!(t.settings.dead_letter_topic.as_deref(), Some("typed-dlq"));
    assert_eq!(t.visibility_timeout().map(|d| d.as_millis()), Some(45_000));
    assert!(t.settings.other.is_empty(), "{:?}", t.settings.other);
    let p = t.partition(1).unwrap();
    assert!(
        p.other.is_empty(),
        "fields the client does not know: {:?}",
        p.other
    );
    assert_eq!((p.start_offset, p.frontier, p.next_offset), (0, 0, 2));
    assert_eq!((p.available, p.in_flight), (1, 1));
    assert!(p.version > 0 && p.segments > 0 && p.bytes > 0 && p.manifest_bytes > 0);
    assert!(p.oldest_unsettled_age_ms.is_some());

    let sub = c
        .create_subscription(
            "typed",
            "audit",
            &json!({"start": "earliest", "max_deliveries": 5}),
        )
        .await
        .unwrap();
    assert!(sub.created);
    assert_eq!(sub.value.settings.max_deliveries, Some(5));
    assert!(
        sub.value.settings.other.is_empty(),
        "{:?}",
        sub.value.settings.other
    );
    assert!(
        sub.value.effective.other.is_empty(),
        "{:?}",
        sub.value.effective.other
    );
    assert_eq!(sub.value.effective.visibility_timeout_ms, Some(45_000));
    let got = c.get_subscription("typed", "audit").await.unwrap();
    let parts = got.partitions.unwrap();
    assert_eq!(parts.len(), 2);
    let p1 = parts.iter().find(|p| p.partition == 1).unwrap();
    assert!(
        p1.other.is_empty(),
        "fields the client does not know: {:?}",
        p1.other
    );
    assert_eq!((p1.frontier, p1.next_offset, p1.available), (0, 2, 2));

    let me = c.whoami().await.unwrap();
    assert_eq!(me.user, USER);
    assert_eq!(me.grants.len(), 1);
    assert_eq!(me.grants[0].topics, "*");
    assert_eq!(
        me.grants[0].actions,
        [
            GrantAction::Produce,
            GrantAction::Consume,
            GrantAction::Admin
        ]
    );
    assert_eq!(
        c.redrive("typed-dlq", Some(10)).await.unwrap(),
        Redriven {
            moved: 0,
            failed: 0
        }
    );
}

/// Every operation narad-client calls is in the OpenAPI document with the same method and
/// path, and every `/v1` operation of the document is one the client calls.
#[test]
fn the_clients_operations_are_the_documents() {
    let doc: serde_json::Value = serde_json::from_str(narad_shared::http::OPENAPI).unwrap();
    let mut documented = BTreeMap::new();
    for (path, ops) in doc["paths"].as_object().unwrap() {
        if !path.starts_with("/v1/") {
            continue;
        }
        for (method, op) in ops.as_object().unwrap() {
            if let Some(id) = op.get("operationId").and_then(|v| v.as_str()) {
                documented.insert(id.to_owned(), (method.to_uppercase(), path.clone()));
            }
        }
    }
    let called: BTreeMap<String, (String, String)> = Operation::ALL
        .iter()
        .map(|o| {
            let (id, method, path) = o.spec();
            (id.to_owned(), (method.as_str().to_owned(), path.to_owned()))
        })
        .collect();
    assert_eq!(called, documented);
}
