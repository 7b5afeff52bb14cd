//! `POST /v1/topics/{topic}/produce` (one message, the raw body) and
//! `POST /v1/topics/{topic}/produce-batch` (many, as JSON). Both check every message the
//! same way ([`check_message`]) and answer once the commit carrying it landed.

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, State};
use axum::http::{HeaderMap, StatusCode};
use axum::response::{IntoResponse, Response};
use axum::{Extension, Json};

use crate::access::Action;
use crate::broker::NewMessage;
use crate::http::auth::{allow, Caller};
use crate::http::batch_body::parse_produce_batch;
use crate::http::extract::{
    check_message, message_headers, parse_delay, read_body, topic_name, Query,
};
use crate::http::limits::MAX_BATCH_BODY;
use crate::http::views::{BatchResults, EntryResult};
use crate::http::{ApiError, AppState};

/// `POST /v1/topics/{topic}/produce[?partition=N][&key=K][&delay=D]`: body = one message's
/// bytes; 201 `{"partition":P,"offset":O}` once committed. With an `Idempotency-Key`
/// header, a retry within the topic's `dedup_window_ms` answers the first produce's
/// partition and offset and appends nothing. With `delay` (up to 12 h), the message is not
/// delivered before that long from now.
pub(in crate::http) async fn one(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let name = topic_name(path)?;
    allow(&caller, Action::Produce, &name)?;
    let q = Query::parse(raw, &["partition", "key", "delay"])?;
    let partition = q.number("partition")?;
    let delay_ms = q.get("delay").map(parse_delay).transpose()?.unwrap_or(0);
    let key = q.get("key").map(str::to_owned);
    let payload = read_body(&headers, body, s.broker.options().max_message_bytes).await?;
    // A header that is not visible ASCII is as invalid as an empty one.
    let idempotency_key = headers
        .get("idempotency-key")
        .map(|v| v.to_str().unwrap_or_default().to_owned());
    check_message(None, key.as_deref(), &payload, idempotency_key.as_deref())?;
    let msg = NewMessage {
        partition,
        key,
        payload,
        idempotency_key,
        headers: message_headers(&headers)?,
        delay_ms,
    };
    let produced = s.broker.produce(&name, msg).await?;
    Ok((StatusCode::CREATED, Json(produced)).into_response())
}

/// `POST /v1/topics/{topic}/produce-batch`: body
/// `{"messages":[{"payload":<JSON value>,"key":"k","partition":0,"delay_ms":30000},
///               {"payload":"aGk=","payload_encoding":"base64"}]}`.
/// A `payload` is stored as its exact JSON text (consumers get it back verbatim); with
/// `"payload_encoding":"base64"` it must be a string and its decoded bytes are stored.
/// Answers 200 `{"results":[{"status":201,"partition":P,"offset":O}, ...]}` in order;
/// messages for one partition are committed together with contiguous offsets.
pub(in crate::http) async fn batch(
    State(s): State<AppState>,
    Extension(caller): Extension<Caller>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let name = topic_name(path)?;
    allow(&caller, Action::Produce, &name)?;
    Query::parse(raw, &[])?;
    let body = read_body(&headers, body, MAX_BATCH_BODY).await?;
    let messages = parse_produce_batch(&body)?;
    let results = s.broker.produce_batch(&name, messages).await?;
    let results = results.into_iter().map(EntryResult::produced).collect();
    Ok(Json(BatchResults { results }).into_response())
}
