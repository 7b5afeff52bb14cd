//! `/health`, `/metrics`, and the answers for unknown routes and methods.

use axum::extract::State;
use axum::http::{header, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::Json;

use crate::http::{ApiError, AppState};

/// `GET /health`: 200 `{"status":"ok"}` (no auth).
pub(in crate::http) async fn health() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok"}))
}

/// `GET /metrics`: Prometheus text format (auth like `/v1`; no topic names or payloads).
pub(in crate::http) async fn metrics(State(s): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.broker.metrics_text(),
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
