//! `/health`, `/metrics`, `/v1/whoami`, and the answers for unknown routes and methods.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use crate::http::auth::Caller;
use crate::http::{ApiError, AppState};

/// `GET /health`: 200 `{"status":"ok"}` (no auth).
pub(in crate::http) async fn health() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok"}))
}

/// The OpenAPI 3.1 document of this API (`http/openapi.json`; `tests/tests/openapi.rs`
/// checks it against [`crate::http::ROUTES`] and the router).
pub const OPENAPI: &str = include_str!("../openapi.json");

/// `GET /openapi.json`: the API's OpenAPI document (no auth).
pub(in crate::http) async fn openapi() -> Response {
    ([(header::CONTENT_TYPE, "application/json")], OPENAPI).into_response()
}

/// The web console's files (`http/console/`), embedded: (path, content type, body).
const CONSOLE: [(&str, &str, &str); 3] = [
    (
        "/console",
        "text/html; charset=utf-8",
        include_str!("../console/index.html"),
    ),
    (
        "/console/app.js",
        "application/javascript; charset=utf-8",
        include_str!("../console/app.js"),
    ),
    (
        "/console/style.css",
        "text/css; charset=utf-8",
        include_str!("../console/style.css"),
    ),
];

/// `GET /console`, `/console/app.js`, `/console/style.css`: the web console (no auth: it
/// asks for credentials and calls the public API with them). Nothing inline, so a strict
/// content security policy holds.
pub(in crate::http) async fn console(uri: axum::http::Uri) -> Response {
    let Some((_, kind, body)) = CONSOLE.iter().find(|(p, _, _)| *p == uri.path()) else {
        return not_found().await.into_response();
    };
    (
        [
            (header::CONTENT_TYPE, *kind),
            (
                header::CONTENT_SECURITY_POLICY,
                "default-src 'self'; img-src 'self' data:; frame-ancestors 'none'",
            ),
            (header::X_CONTENT_TYPE_OPTIONS, "nosniff"),
            (header::CACHE_CONTROL, "no-cache"),
        ],
        *body,
    )
        .into_response()
}

/// `GET /v1/whoami`: the caller's name and grants, so a client (the console) can offer
/// only what the server would allow. The server checks every request anyway.
pub(in crate::http) async fn whoami(Extension(caller): Extension<Caller>) -> Response {
    Json(serde_json::json!({
        "user": caller.0.name,
        "grants": caller.0.grants(),
    }))
    .into_response()
}

/// `GET /metrics`: Prometheus text format (auth like `/v1`; no payloads; per-topic series
/// only for the topics the caller holds a grant on).
pub(in crate::http) async fn metrics(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
) -> Response {
    let mut text = s.broker.metrics_text();
    text.push_str(&s.broker.topic_metrics(|t| caller.0.sees(t)));
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        text,
    )
        .into_response()
}

/// Any other route: 404 `not_found`.
pub(in crate::http) async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
}

/// A known route with another method: 405 `method_not_allowed`.
pub(in crate::http) async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method not allowed on this route",
    )
}
