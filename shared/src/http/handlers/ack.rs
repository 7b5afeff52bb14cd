//! `POST /v1/topics/{topic}/ack`: ack, extend or nack one handle (query), or many (JSON
//! body). Handles are verified before any storage call.

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use crate::access::Action;
use crate::http::auth::{allow, Caller};
use crate::http::batch_body::{parse_ack_batch, parse_extend};
use crate::http::extract::{read_body, topic_name, Query};
use crate::http::limits::MAX_BATCH_BODY;
use crate::http::views::{BatchResults, EntryResult};
use crate::http::{ApiError, AppState};

/// `POST /v1/topics/{topic}/ack?receipt_handle=H[&extend=true|0]`: ack (204), extend
/// (`extend=true`, 204), nack (`extend=0`, 204); 410 when the lease is not yours any
/// more; 503 when the acked-ahead window is full.
///
/// Without `receipt_handle` in the query, the body is a batch:
/// `{"receipt_handles":["h1","h2"],"extend":true|0}` (extend optional, in the body or the
/// query), answered 200 with
/// `{"results":[{"status":204},{"status":410,"error":{...}}]}` in the same order.
pub(in crate::http) async fn ack(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let name = topic_name(path)?;
    allow(&caller, Action::Consume, &name)?;
    let q = Query::parse(raw, &["receipt_handle", "extend"])?;
    let Some(handle) = q.get("receipt_handle") else {
        return ack_batch(s, name, q.get("extend"), headers, body).await;
    };
    let action = parse_extend(q.get("extend"))?;
    s.broker.settle(&name, handle, action).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

async fn ack_batch(
    s: AppState,
    name: String,
    query_extend: Option<&str>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_body(&headers, body, MAX_BATCH_BODY).await?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request(
            "receipt_handle is required (or a JSON body {\"receipt_handles\":[...]} to settle many)",
        ));
    }
    let entries = parse_ack_batch(&body, query_extend)?;
    let results = s.broker.settle_batch(&name, &entries).await?;
    let results = results.into_iter().map(EntryResult::settled).collect();
    Ok(Json(BatchResults { results }).into_response())
}

/// `DELETE /v1/topics/{topic}/messages/{partition}/{offset}[?subscription=S]`: cancel one
/// retained message (204): settled for every subscription, or only for `S`; delayed ones
/// are never delivered, a live lease's handle then gets 410. 404 `message_not_found` when
/// the offset is not retained (or the partition does not exist). For every subscription it needs `produce` on the topic
/// (the producer takes back what it produced); for one, `consume` (as acking it would).
pub(in crate::http) async fn cancel(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    path: Result<Path<(String, String, String)>, PathRejection>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let Ok(Path((name, partition, offset))) = path else {
        return Err(ApiError::bad_request("invalid path"));
    };
    let q = Query::parse(raw, &["subscription"])?;
    let sub = q.get("subscription");
    let action = if sub.is_some() {
        Action::Consume
    } else {
        Action::Produce
    };
    allow(&caller, action, &name)?;
    let partition: u32 = partition
        .parse()
        .map_err(|_| ApiError::bad_request("partition must be a non-negative integer"))?;
    let offset: u64 = offset
        .parse()
        .map_err(|_| ApiError::bad_request("offset must be a non-negative integer"))?;
    s.broker.cancel(&name, partition, offset, sub).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}
