//! Narad's AWS Lambda functions. The binary `narad-api` (src/bin/narad-api.rs) serves the
//! HTTP API behind API Gateway; `narad-maintenance` (src/bin/narad-maintenance.rs) runs
//! garbage collection on a schedule. This library holds what they do per request and per
//! cold start, so both are tested without a network or the Lambda runtime.
//!
//! * [`handle`]: one API Gateway request through the shared router.
//! * [`require_users`]: the users the function admits (`NARAD_USERS`, `NARAD_USERS_FILE`
//!   or `NARAD_AUTH` is mandatory).
//! * [`init_tracing`]: JSON log lines on stdout, filtered by `NARAD_LOG`.

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use narad_shared::access::Users;
use narad_shared::config::Config;
use narad_shared::http::ClientAddr;
use tower::ServiceExt;

/// The allocator `narad serve` uses too (see `cli/src/main.rs`): both functions run the same
/// request path.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

/// The function's name, as used in logs and by `cargo lambda`.
pub const FUNCTION_NAME: &str = "narad-api";

/// Runs one request through `app` (the router from `narad_shared::http::router`).
///
/// The response body is collected into a [`Full`]: Lambda answers with a whole body anyway,
/// and a `Full` is `Sync`, as `lambda_http::run_concurrent` requires. `lambda_http` then
/// encodes it as text or base64 from its `Content-Type`.
///
/// Errors: only if the body cannot be read (the router itself never fails).
pub async fn handle(
    app: axum::Router,
    mut req: lambda_http::Request,
) -> Result<lambda_http::Response<Full<Bytes>>, lambda_http::Error> {
    // The failed-login throttle counts per client: API Gateway's view of its address.
    if let Some(ip) = source_ip(&req) {
        req.extensions_mut().insert(ClientAddr(ip));
    }
    let (parts, body) = app.oneshot(req).await?.into_parts();
    let bytes = body.collect().await?.to_bytes();
    Ok(lambda_http::Response::from_parts(parts, Full::new(bytes)))
}

/// The client address API Gateway saw, from the request context.
fn source_ip(req: &lambda_http::Request) -> Option<std::net::IpAddr> {
    use lambda_http::request::RequestContext;
    use lambda_http::RequestExt;
    match req.request_context_ref() {
        Some(RequestContext::ApiGatewayV2(c)) => c.http.source_ip.as_deref()?.parse().ok(),
        _ => None,
    }
}

/// The users the function admits. Unlike `narad serve`, the function never generates a
/// password: nobody would see it.
///
/// Errors: a message naming the variables when none is set, or the bad one.
pub fn require_users(cfg: &Config) -> Result<Users, String> {
    Users::from_config(cfg)
        .map_err(|e| e.to_string())?
        .ok_or_else(|| {
            "NARAD_USERS, NARAD_USERS_FILE or NARAD_AUTH must be set (the function never \
         generates credentials)"
                .to_owned()
        })
}

/// JSON log lines on stdout (Lambda ships them to CloudWatch Logs), filtered by `NARAD_LOG`
/// (default `info`), each with the fields of the request or commit span it was logged in.
pub fn init_tracing() {
    use tracing_subscriber::EnvFilter;
    tracing_subscriber::fmt()
        .json()
        .flatten_event(true)
        // Each line names its request or commit (`http::trace`, `commit_span`).
        .with_current_span(true)
        .with_span_list(false)
        .with_target(false)
        .with_env_filter(
            EnvFilter::try_from_env("NARAD_LOG").unwrap_or_else(|_| EnvFilter::new("info")),
        )
        .with_writer(std::io::stdout)
        .init();
}

#[cfg(test)]
mod tests {
    #![allow(clippy::unwrap_used, clippy::expect_used)]

    use std::sync::Arc;

    use base64::Engine;
    use lambda_http::IntoResponse;
    use narad_shared::broker::Broker;
    use narad_shared::clock::{ManualClock, RandomIds};
    use narad_shared::config::BrokerOptions;
    use serde_json::{json, Value};

    use super::*;

    const AUTH: &str = "Basic dGVzdGVyOnMzY3JldC1wYXNz"; // tester:s3cret-pass

    async fn app() -> axum::Router {
        let store = narad_shared::store::open("memory://").await.unwrap();
        let broker = Broker::new(
            store,
            Arc::new(ManualClock::new(1_795_953_600_000)),
            Arc::new(RandomIds),
            vec![b"test-receipt-key-0123456789".to_vec()],
            BrokerOptions::default(),
        )
        .await
        .unwrap();
        let users = Users::full_rights(&[narad_shared::config::Credential {
            user: "tester".into(),
            password: "s3cret-pass".into(),
        }]);
        narad_shared::http::router(Arc::new(broker), users, &Default::default())
    }

    /// An API Gateway HTTP API (payload 2.0) event, as API Gateway sends it.
    fn event(method: &str, path: &str, query: &str, auth: bool, body: Option<&[u8]>) -> String {
        let mut headers = json!({"host": "abc123.execute-api.eu-west-1.amazonaws.com"});
        if auth {
            headers["authorization"] = json!(AUTH);
        }
        let (body, b64) = match body {
            Some(b) => match std::str::from_utf8(b) {
                Ok(s) => (json!(s), false),
                Err(_) => (
                    json!(base64::engine::general_purpose::STANDARD.encode(b)),
                    true,
                ),
            },
            None => (Value::Null, false),
        };
        json!({
            "version": "2.0",
            "routeKey": "$default",
            "rawPath": path,
            "rawQueryString": query,
            "headers": headers,
            "requestContext": {
                "accountId": "123456789012",
                "apiId": "abc123",
                "domainName": "abc123.execute-api.eu-west-1.amazonaws.com",
                "http": {"method": method, "path": path, "protocol": "HTTP/1.1",
                         "sourceIp": "192.0.2.1", "userAgent": "curl/8"},
                "requestId": "r1",
                "routeKey": "$default",
                "stage": "$default",
                "time": "29/Nov/2026:12:00:00 +0000",
                "timeEpoch": 1_795_953_600_000u64
            },
            "body": body,
            "isBase64Encoded": b64
        })
        .to_string()
    }

    async fn call(app: &axum::Router, ev: String) -> (u16, Bytes) {
        let req = lambda_http::request::from_str(&ev).unwrap();
        let resp = handle(app.clone(), req).await.unwrap();
        let status = resp.status().as_u16();
        let (_, body) = resp.into_parts();
        (status, body.collect().await.unwrap().to_bytes())
    }

    #[tokio::test]
    async fn failed_logins_are_counted_per_api_gateway_source_ip() {
        let app = app().await;
        let from = |ip: &str| {
            event("GET", "/v1/topics", "", false, None)
                .replace("192.0.2.1", ip)
                .replace(
                    r#""headers":{"#,
                    r#""headers":{"authorization":"Basic dGVzdGVyOndyb25n","#,
                )
        };
        let mut statuses = Vec::new();
        for _ in 0..20 {
            statuses.push(call(&app, from("198.51.100.7")).await.0);
        }
        assert_eq!(statuses[..19], [401; 19]);
        assert_eq!(statuses[19], 429);
        // Another client of the same function is not throttled.
        assert_eq!(call(&app, from("203.0.113.9")).await.0, 401);
    }

    #[tokio::test]
    async fn api_gateway_events_reach_the_shared_router() {
        let app = app().await;
        assert_eq!(
            call(&app, event("GET", "/health", "", false, None)).await.0,
            200
        );
        let (status, body) = call(&app, event("GET", "/v1/topics", "", false, None)).await;
        assert_eq!(status, 401);
        assert!(String::from_utf8_lossy(&body).contains("unauthorized"));
        let put = event("PUT", "/v1/topics/orders", "", true, Some(b"{}"));
        assert_eq!(call(&app, put).await.0, 201);
        // A binary body arrives base64-encoded and is stored as the original bytes.
        let bytes: &[u8] = &[0x89, b'P', b'N', b'G', 0, 0xff];
        let produce = event("POST", "/v1/topics/orders/produce", "", true, Some(bytes));
        assert_eq!(call(&app, produce).await.0, 201);
        let consume = event("GET", "/v1/topics/orders/consume", "wait=0", true, None);
        let (status, body) = call(&app, consume).await;
        assert_eq!(status, 200);
        let m: Value = serde_json::from_slice(&body).unwrap();
        assert_eq!(m["payload_encoding"], "base64");
        let payload = base64::engine::general_purpose::STANDARD
            .decode(m["payload"].as_str().unwrap())
            .unwrap();
        assert_eq!(payload, bytes);
        // The query string is parsed strictly, as with narad serve.
        let typo = event("GET", "/v1/topics/orders/consume", "partiton=1", true, None);
        assert_eq!(call(&app, typo).await.0, 400);
    }

    #[tokio::test]
    async fn json_answers_go_back_to_api_gateway_as_text() {
        let app = app().await;
        let req =
            lambda_http::request::from_str(&event("GET", "/health", "", false, None)).unwrap();
        let resp = handle(app, req).await.unwrap().into_response().await;
        match resp.body() {
            lambda_http::Body::Text(t) => assert!(t.contains("ok"), "{t}"),
            other => panic!("expected a text body, got {other:?}"),
        }
    }

    #[tokio::test]
    async fn users_are_required() {
        let cfg = Config::from_lookup(|_| None).unwrap();
        assert!(require_users(&cfg).unwrap_err().contains("NARAD_AUTH"));
        let cfg = Config::from_lookup(|k| (k == "NARAD_AUTH").then(|| "a:b".to_owned())).unwrap();
        let users = require_users(&cfg).unwrap();
        assert_eq!(users.authenticate("a", "b").await.unwrap().name, "a");
    }
}
