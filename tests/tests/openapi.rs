//! The OpenAPI document (`GET /openapi.json`) and the router agree: the document names
//! exactly the routes of `narad_shared::http::ROUTES`, the router answers each of them (not
//! with its unknown-route 404 or a 405), and every other method on those paths gets 405.
//! Runs against every server mode, the Lambda function included. Whether the document is
//! valid OpenAPI 3.1, and whether responses match it, is checked by schemathesis in the test
//! command (`tests/schemathesis.sh`).

#![allow(clippy::unwrap_used, clippy::expect_used)]

use std::collections::BTreeSet;

use narad_shared::http::ROUTES;
use narad_tests::Server;
use reqwest::{Method, StatusCode};
use serde_json::Value;

const METHODS: [&str; 5] = ["GET", "PUT", "POST", "PATCH", "DELETE"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_openapi_document_names_exactly_the_routes_the_router_serves() {
    let s = Server::start().await;
    let r = reqwest::get(format!("{}/openapi.json", s.base))
        .await
        .unwrap();
    let status = r.status();
    let body = r.text().await.unwrap();
    // The body says whose error a failure is (Narad's errors are JSON with a code).
    let start: String = body.chars().take(300).collect();
    assert_eq!(
        status,
        StatusCode::OK,
        "served without credentials: {start}"
    );
    let doc: Value = serde_json::from_str(&body).unwrap();
    assert_eq!(doc["openapi"], "3.1.0");

    let documented: BTreeSet<(String, String)> = doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .unwrap()
                .keys()
                .filter(|m| METHODS.contains(&m.to_uppercase().as_str()))
                .map(move |m| (m.to_uppercase(), path.clone()))
        })
        .collect();
    let served: BTreeSet<(String, String)> = ROUTES
        .iter()
        .map(|(m, p)| ((*m).to_owned(), (*p).to_owned()))
        .collect();
    assert_eq!(
        documented, served,
        "the OpenAPI document and http::ROUTES must name the same routes"
    );

    // Each route is served: whatever its answer to this bare request, it is not the
    // router's "no such route" or "method not allowed".
    let concrete = |p: &str| p.replace("{topic}", "oa");
    for (m, p) in ROUTES {
        let method = Method::from_bytes(m.as_bytes()).unwrap();
        let r = s.req(method, &concrete(p)).send().await.unwrap();
        let status = r.status();
        let body = r.text().await.unwrap();
        let code = serde_json::from_str::<Value>(&body)
            .ok()
            .and_then(|v| v["error"]["code"].as_str().map(str::to_owned));
        assert!(
            status != StatusCode::METHOD_NOT_ALLOWED && code.as_deref() != Some("not_found"),
            "{m} {p}: {status} {body}"
        );
    }
    // Every other method on a served path is 405.
    let paths: BTreeSet<&str> = ROUTES.iter().map(|(_, p)| *p).collect();
    for p in paths {
        for m in METHODS {
            if ROUTES.contains(&(m, p)) {
                continue;
            }
            let method = Method::from_bytes(m.as_bytes()).unwrap();
            let r = s.req(method, &concrete(p)).send().await.unwrap();
            assert_eq!(r.status(), StatusCode::METHOD_NOT_ALLOWED, "{m} {p}");
        }
    }
}
