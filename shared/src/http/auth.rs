//! HTTP Basic auth for every `/v1` route. Credentials are compared as SHA-256 digests of
//! `user:password`, so the comparison takes the same time whoever is asking.

use axum::extract::{Request, State};
use axum::http::{header, StatusCode};
use axum::middleware::Next;
use axum::response::{IntoResponse, Response};
use base64::Engine;
use sha2::{Digest, Sha256};

use super::{ApiError, AppState};
use crate::config::Credential;

/// SHA-256 of each accepted `user:password`.
pub(super) fn digests(users: &[Credential]) -> Vec<[u8; 32]> {
    users
        .iter()
        .map(|c| Sha256::digest(format!("{}:{}", c.user, c.password).as_bytes()).into())
        .collect()
}

/// Middleware: 401 with `WWW-Authenticate` unless the request carries valid credentials.
pub(super) async fn require_auth(
    State(state): State<AppState>,
    req: Request,
    next: Next,
) -> Response {
    let ok = req
        .headers()
        .get(header::AUTHORIZATION)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| {
            v.strip_prefix("Basic ")
                .or_else(|| v.strip_prefix("basic "))
        })
        .and_then(|b| {
            base64::engine::general_purpose::STANDARD
                .decode(b.trim())
                .ok()
        })
        .map(|raw| {
            let h: [u8; 32] = Sha256::digest(&raw).into();
            state.credentials.contains(&h)
        })
        .unwrap_or(false);
    if ok {
        next.run(req).await
    } else {
        ApiError::new(
            StatusCode::UNAUTHORIZED,
            "unauthorized",
            "missing or invalid credentials",
        )
        .into_response()
    }
}
