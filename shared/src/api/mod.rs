//! The HTTP API (DESIGN.md §1): one axum [`Router`] used by `narad serve` and by the
//! Lambda function alike.
//!
//! Every route under `/v1` needs HTTP Basic auth; `/health` does not. Errors are JSON
//! (see [`error`]). Query parameters are parsed strictly: an unknown or repeated
//! parameter is a 400, so a typo never silently changes behaviour.

pub mod error;

use std::collections::HashMap;
use std::sync::Arc;
use std::time::Duration;

use axum::body::Body;
use axum::extract::rejection::PathRejection;
use axum::extract::{Path, RawQuery, Request, State};
use axum::http::{header, HeaderMap, StatusCode};
use axum::middleware::{self, Next};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post, put};
use axum::{Json, Router};
use base64::Engine;
use bytes::Bytes;
use http_body_util::BodyExt;
use serde::{Deserialize, Serialize};
use serde_json::value::RawValue;
use sha2::{Digest, Sha256};

pub use error::ApiError;

use crate::config::Credential;
use crate::engine::{
    Broker, BrokerError, Delivery, NewMessage, PartitionStats, Settle, Topic, MAX_CONSUME_BATCH,
};
use crate::payload;
use crate::settings::{SettingsInput, TopicSettings};

/// Largest settings body accepted.
const MAX_SETTINGS_BODY: usize = 64 * 1024;
/// Largest `key` accepted on produce.
const MAX_KEY_BYTES: usize = 1024;

#[derive(Clone)]
struct AppState {
    broker: Arc<Broker>,
    /// SHA-256 of each accepted `user:password`.
    credentials: Arc<Vec<[u8; 32]>>,
}

/// Builds the router over `broker`, admitting `users`.
pub fn router(broker: Arc<Broker>, users: &[Credential]) -> Router {
    let credentials = users
        .iter()
        .map(|c| Sha256::digest(format!("{}:{}", c.user, c.password).as_bytes()).into())
        .collect();
    let state = AppState {
        broker,
        credentials: Arc::new(credentials),
    };
    let v1 = Router::new()
        .route("/v1/topics", get(list_topics))
        .route(
            "/v1/topics/{topic}",
            put(create_topic)
                .get(get_topic)
                .patch(patch_topic)
                .delete(delete_topic),
        )
        .route("/v1/topics/{topic}/produce", post(produce))
        .route("/v1/topics/{topic}/produce-batch", post(produce_batch))
        .route("/v1/topics/{topic}/consume", get(consume))
        .route("/v1/topics/{topic}/ack", post(ack))
        .route_layer(middleware::from_fn_with_state(state.clone(), require_auth));
    Router::new()
        .route("/health", get(health))
        .route("/metrics", get(metrics))
        .merge(v1)
        .fallback(not_found)
        .method_not_allowed_fallback(method_not_allowed)
        .with_state(state)
}

async fn health() -> Json<serde_json::Value> {
    Json(serde_json::json!({"status": "ok"}))
}

/// `GET /metrics`: Prometheus text format (no auth; no topic names or payloads).
async fn metrics(State(s): State<AppState>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "text/plain; version=0.0.4; charset=utf-8",
        )],
        s.broker.metrics_text(),
    )
        .into_response()
}

async fn not_found() -> ApiError {
    ApiError::new(StatusCode::NOT_FOUND, "not_found", "no such route")
}

async fn method_not_allowed() -> ApiError {
    ApiError::new(
        StatusCode::METHOD_NOT_ALLOWED,
        "method_not_allowed",
        "method not allowed on this route",
    )
}

async fn require_auth(State(state): State<AppState>, req: Request, next: Next) -> Response {
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

// ----- request parsing ------------------------------------------------------------

fn topic_name(path: Result<Path<String>, PathRejection>) -> Result<String, ApiError> {
    path.map(|Path(t)| t).map_err(|_| {
        ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_topic_name",
            "invalid topic name in path",
        )
    })
}

/// Parses the query string, refusing parameters not in `allowed` and repeated ones.
fn query(raw: Option<String>, allowed: &[&str]) -> Result<HashMap<String, String>, ApiError> {
    let pairs: Vec<(String, String)> = serde_urlencoded::from_str(raw.as_deref().unwrap_or(""))
        .map_err(|_| ApiError::bad_request("malformed query string"))?;
    let mut out = HashMap::new();
    for (k, v) in pairs {
        if !allowed.contains(&k.as_str()) {
            return Err(ApiError::bad_request(format!(
                "unknown query parameter {k:?}; allowed: {}",
                allowed.join(", ")
            )));
        }
        if out.insert(k.clone(), v).is_some() {
            return Err(ApiError::bad_request(format!(
                "query parameter {k:?} given twice"
            )));
        }
    }
    Ok(out)
}

fn parse_u32(q: &HashMap<String, String>, name: &str) -> Result<Option<u32>, ApiError> {
    q.get(name)
        .map(|v| {
            v.parse().map_err(|_| {
                ApiError::bad_request(format!("{name} must be a non-negative integer"))
            })
        })
        .transpose()
}

fn parse_u64(q: &HashMap<String, String>, name: &str) -> Result<Option<u64>, ApiError> {
    q.get(name)
        .map(|v| {
            v.parse().map_err(|_| {
                ApiError::bad_request(format!("{name} must be a non-negative integer"))
            })
        })
        .transpose()
}

/// `wait`: `0`, `500ms`, `10s`, `1m`; a bare number is seconds (as SQS's WaitTimeSeconds).
pub fn parse_wait(v: &str) -> Result<Duration, ApiError> {
    let v = v.trim();
    if let Ok(secs) = v.parse::<u64>() {
        return Ok(Duration::from_secs(secs.min(3600)));
    }
    humantime::parse_duration(v).map_err(|_| {
        ApiError::bad_request(format!("wait must look like 0, 500ms or 10s, got {v:?}"))
    })
}

/// Reads a body of at most `limit` bytes; 413 beyond it, before buffering it all.
async fn read_body(headers: &HeaderMap, body: Body, limit: usize) -> Result<Bytes, ApiError> {
    let too_large = || {
        ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "payload_too_large",
            format!("body exceeds {limit} bytes"),
        )
    };
    let declared = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.parse::<u64>().ok());
    if declared.is_some_and(|n| n > limit as u64) {
        return Err(too_large());
    }
    match http_body_util::Limited::new(body, limit).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(too_large()),
        Err(_) => Err(ApiError::bad_request("could not read the request body")),
    }
}

// ----- responses ------------------------------------------------------------------

#[derive(Serialize)]
struct TopicView {
    name: String,
    settings: TopicSettings,
    created_at: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    partitions: Option<Vec<PartitionStats>>,
}

impl TopicView {
    fn new(t: Topic, partitions: Option<Vec<PartitionStats>>) -> Self {
        Self {
            name: t.name,
            settings: t.settings,
            created_at: rfc3339_ms(t.created_at_ms),
            partitions,
        }
    }
}

#[derive(Serialize)]
struct MessageView {
    topic: String,
    partition: u32,
    offset: u64,
    key: Option<String>,
    payload: Box<RawValue>,
    #[serde(skip_serializing_if = "Option::is_none")]
    payload_encoding: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    receipt_handle: Option<String>,
    delivery_count: u32,
    produced_at: String,
}

#[derive(Serialize)]
struct MessageList {
    messages: Vec<MessageView>,
}

impl From<Delivery> for MessageView {
    fn from(d: Delivery) -> Self {
        let p = payload::render(&d.payload);
        Self {
            topic: d.topic,
            partition: d.partition,
            offset: d.offset,
            key: d.key,
            payload: p.json,
            payload_encoding: p.encoding,
            receipt_handle: d.receipt_handle,
            delivery_count: d.delivery_count,
            produced_at: rfc3339_ms(d.produced_at_ms),
        }
    }
}

/// `2026-11-29T12:00:00.000Z`.
pub fn rfc3339_ms(ms: u64) -> String {
    let t = std::time::UNIX_EPOCH + Duration::from_millis(ms);
    humantime::format_rfc3339_millis(t).to_string()
}

// ----- handlers -------------------------------------------------------------------

/// `GET /v1/topics`: every topic with its settings.
async fn list_topics(State(s): State<AppState>) -> Result<Response, ApiError> {
    let topics: Vec<TopicView> = s
        .broker
        .list_topics()
        .await?
        .into_iter()
        .map(|t| TopicView::new(t, None))
        .collect();
    Ok(Json(serde_json::json!({ "topics": topics })).into_response())
}

/// The JSON settings body of a create or change.
async fn read_settings(headers: &HeaderMap, body: Body) -> Result<SettingsInput, ApiError> {
    let body = read_body(headers, body, MAX_SETTINGS_BODY).await?;
    Ok(SettingsInput::parse(&body).map_err(BrokerError::from)?)
}

/// `PUT /v1/topics/{topic}`: 201 created, 200 when it exists with the same settings,
/// 409 when it exists with other settings.
async fn create_topic(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let name = topic_name(path)?;
    let input = read_settings(&headers, body).await?;
    let (created, topic) = s.broker.create_topic(&name, &input).await?;
    let status = if created {
        StatusCode::CREATED
    } else {
        StatusCode::OK
    };
    Ok((status, Json(TopicView::new(topic, None))).into_response())
}

/// `GET /v1/topics/{topic}`: settings and per-partition stats.
async fn get_topic(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let name = topic_name(path)?;
    let topic = s.broker.topic(&name).await?;
    let stats = s.broker.partition_stats(&topic).await?;
    Ok(Json(TopicView::new(topic, Some(stats))).into_response())
}

/// `PATCH /v1/topics/{topic}`: change the settings that can change.
async fn patch_topic(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let name = topic_name(path)?;
    let input = read_settings(&headers, body).await?;
    let topic = s.broker.patch_topic(&name, &input).await?;
    Ok(Json(TopicView::new(topic, None)).into_response())
}

/// `DELETE /v1/topics/{topic}`: 204.
async fn delete_topic(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
) -> Result<Response, ApiError> {
    let name = topic_name(path)?;
    s.broker.delete_topic(&name).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

/// `POST /v1/topics/{topic}/produce[?partition=N][&key=K]`: body = one message's bytes;
/// 201 `{"partition":P,"offset":O}` once committed. With an `Idempotency-Key` header, a
/// retry within the topic's `dedup_window_ms` answers the first produce's partition and
/// offset and appends nothing.
async fn produce(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let name = topic_name(path)?;
    let q = query(raw, &["partition", "key"])?;
    let partition = parse_u32(&q, "partition")?;
    let key = q.get("key").cloned();
    if key.as_ref().is_some_and(|k| k.len() > MAX_KEY_BYTES) {
        return Err(ApiError::bad_request(format!(
            "key exceeds {MAX_KEY_BYTES} bytes"
        )));
    }
    let payload = read_body(&headers, body, s.broker.options().max_message_bytes).await?;
    if payload.is_empty() {
        return Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "empty_payload",
            "the request body (the message) is empty",
        ));
    }
    let idempotency_key = match headers.get("idempotency-key") {
        None => None,
        Some(v) => match v.to_str() {
            Ok(k) if valid_idempotency_key(k) => Some(k.to_owned()),
            _ => {
                return Err(ApiError::bad_request(format!(
                    "Idempotency-Key must be 1 to {MAX_IDEMPOTENCY_KEY} visible ASCII characters"
                )))
            }
        },
    };
    let msg = NewMessage {
        partition,
        key,
        payload,
        idempotency_key,
    };
    let produced = s.broker.produce(&name, msg).await?;
    Ok((StatusCode::CREATED, Json(produced)).into_response())
}

/// `GET /v1/topics/{topic}/consume[?wait=10s][&partition=N[&offset=M]][&max=N]`: 200
/// with one message and its receipt handle, or 204; with `offset`, a read-only replay;
/// with `max`, up to that many messages as `{"messages":[...]}`.
async fn consume(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(raw): RawQuery,
) -> Result<Response, ApiError> {
    let name = topic_name(path)?;
    let q = query(raw, &["wait", "partition", "offset", "max"])?;
    let wait = q
        .get("wait")
        .map(|w| parse_wait(w))
        .transpose()?
        .unwrap_or(Duration::ZERO);
    let partition = parse_u32(&q, "partition")?;
    let offset = parse_u64(&q, "offset")?;
    let max = parse_u32(&q, "max")?;
    if max.is_some_and(|m| m == 0 || m as usize > MAX_CONSUME_BATCH) {
        return Err(ApiError::bad_request(format!(
            "max must be between 1 and {MAX_CONSUME_BATCH}"
        )));
    }
    let deliveries = match (partition, offset) {
        (p, None) => {
            s.broker
                .consume(&name, p, wait, max.unwrap_or(1) as usize)
                .await?
        }
        (Some(p), Some(o)) => {
            if max.is_some() {
                return Err(ApiError::bad_request("max does not apply to a replay"));
            }
            s.broker
                .replay(&name, p, o, wait)
                .await?
                .into_iter()
                .collect()
        }
        (None, Some(_)) => {
            return Err(ApiError::bad_request(
                "offset needs partition (replay is by partition and offset)",
            ))
        }
    };
    if deliveries.is_empty() {
        return Ok(StatusCode::NO_CONTENT.into_response());
    }
    let mut views: Vec<MessageView> = deliveries.into_iter().map(MessageView::from).collect();
    Ok(match max {
        // A typed body, not `json!`: payloads stay raw JSON text, byte for byte.
        Some(_) => Json(MessageList { messages: views }).into_response(),
        None => Json(views.swap_remove(0)).into_response(),
    })
}

/// `POST /v1/topics/{topic}/ack?receipt_handle=H[&extend=true|0]`: ack (204), extend
/// (`extend=true`, 204), nack (`extend=0`, 204); 410 when the lease is not yours any
/// more; 503 when the acked-ahead window is full.
///
/// Without `receipt_handle` in the query, the body is a batch:
/// `{"receipt_handles":["h1","h2"],"extend":true|0}` (extend optional), answered 200 with
/// `{"results":[{"status":204},{"status":410,"error":{...}}]}` in the same order.
async fn ack(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let name = topic_name(path)?;
    let q = query(raw, &["receipt_handle", "extend"])?;
    let Some(handle) = q.get("receipt_handle") else {
        if q.contains_key("extend") {
            return Err(ApiError::bad_request("receipt_handle is required"));
        }
        return ack_batch(s, name, headers, body).await;
    };
    let action = parse_extend(q.get("extend").map(String::as_str))?;
    s.broker.settle(&name, handle, action).await?;
    Ok(StatusCode::NO_CONTENT.into_response())
}

fn parse_extend(v: Option<&str>) -> Result<Settle, ApiError> {
    match v {
        None => Ok(Settle::Ack),
        Some("true") => Ok(Settle::Extend),
        Some("0") => Ok(Settle::Nack),
        Some(other) => Err(ApiError::bad_request(format!(
            "extend must be true (renew the lease) or 0 (give the message back), got {other:?}"
        ))),
    }
}

/// Largest batch body (API Gateway's own limit is 10 MB).
const MAX_BATCH_BODY: usize = 10 << 20;
/// Most entries in one batch request.
const MAX_BATCH_ENTRIES: usize = 1000;

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AckBatch {
    receipt_handles: Vec<String>,
    #[serde(default)]
    extend: Option<serde_json::Value>,
}

async fn ack_batch(
    s: AppState,
    name: String,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let body = read_body(&headers, body, MAX_BATCH_BODY).await?;
    if body.iter().all(u8::is_ascii_whitespace) {
        return Err(ApiError::bad_request(
            "receipt_handle is required (or a JSON body {\"receipt_handles\":[...]} to settle many)",
        ));
    }
    let batch: AckBatch = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid ack batch: {e}")))?;
    if batch.receipt_handles.is_empty() || batch.receipt_handles.len() > MAX_BATCH_ENTRIES {
        return Err(ApiError::bad_request(format!(
            "receipt_handles must hold 1 to {MAX_BATCH_ENTRIES} handles"
        )));
    }
    // The same values as the query parameter, as JSON `true`, `0` or strings.
    let extend = batch.extend.as_ref().map(|v| match v {
        serde_json::Value::String(s) => s.clone(),
        other => other.to_string(),
    });
    let action = parse_extend(extend.as_deref())?;
    let entries: Vec<(String, Settle)> = batch
        .receipt_handles
        .into_iter()
        .map(|h| (h, action))
        .collect();
    let results = s.broker.settle_batch(&name, &entries).await?;
    let out: Vec<serde_json::Value> = results
        .into_iter()
        .map(|r| match r {
            Ok(()) => serde_json::json!({"status": 204}),
            Err(e) => entry_error(e),
        })
        .collect();
    Ok(Json(serde_json::json!({ "results": out })).into_response())
}

fn entry_error(e: BrokerError) -> serde_json::Value {
    let e = ApiError::from(e);
    serde_json::json!({"status": e.status.as_u16(), "error": {"code": e.code, "message": e.message}})
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ProduceBatch {
    messages: Vec<BatchMessage>,
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct BatchMessage {
    payload: Box<RawValue>,
    #[serde(default)]
    payload_encoding: Option<String>,
    #[serde(default)]
    key: Option<String>,
    #[serde(default)]
    partition: Option<u32>,
    #[serde(default)]
    idempotency_key: Option<String>,
}

/// Longest `Idempotency-Key` accepted.
const MAX_IDEMPOTENCY_KEY: usize = 128;

fn valid_idempotency_key(k: &str) -> bool {
    !k.is_empty() && k.len() <= MAX_IDEMPOTENCY_KEY && k.bytes().all(|b| b.is_ascii_graphic())
}

/// `POST /v1/topics/{topic}/produce-batch`: body
/// `{"messages":[{"payload":<JSON value>,"key":"k","partition":0},
///               {"payload":"aGk=","payload_encoding":"base64"}]}`.
/// A `payload` is stored as its exact JSON text (consumers get it back verbatim); with
/// `"payload_encoding":"base64"` it must be a string and its decoded bytes are stored.
/// Answers 200 `{"results":[{"status":201,"partition":P,"offset":O}, ...]}` in order;
/// messages for one partition are committed together with contiguous offsets.
async fn produce_batch(
    State(s): State<AppState>,
    path: Result<Path<String>, PathRejection>,
    RawQuery(raw): RawQuery,
    headers: HeaderMap,
    body: Body,
) -> Result<Response, ApiError> {
    let name = topic_name(path)?;
    query(raw, &[])?;
    let body = read_body(&headers, body, MAX_BATCH_BODY).await?;
    let batch: ProduceBatch = serde_json::from_slice(&body)
        .map_err(|e| ApiError::bad_request(format!("invalid produce batch: {e}")))?;
    if batch.messages.is_empty() || batch.messages.len() > MAX_BATCH_ENTRIES {
        return Err(ApiError::bad_request(format!(
            "messages must hold 1 to {MAX_BATCH_ENTRIES} messages"
        )));
    }
    let mut messages = Vec::with_capacity(batch.messages.len());
    for (i, m) in batch.messages.into_iter().enumerate() {
        if m.key.as_ref().is_some_and(|k| k.len() > MAX_KEY_BYTES) {
            return Err(ApiError::bad_request(format!(
                "messages[{i}]: key exceeds {MAX_KEY_BYTES} bytes"
            )));
        }
        let payload = match m.payload_encoding.as_deref() {
            None => Bytes::copy_from_slice(m.payload.get().as_bytes()),
            Some("base64") => {
                let text: String = serde_json::from_str(m.payload.get()).map_err(|_| {
                    ApiError::bad_request(format!(
                        "messages[{i}]: a base64 payload must be a JSON string"
                    ))
                })?;
                Bytes::from(
                    base64::engine::general_purpose::STANDARD
                        .decode(text.as_bytes())
                        .map_err(|_| {
                            ApiError::bad_request(format!(
                                "messages[{i}]: payload is not valid base64"
                            ))
                        })?,
                )
            }
            Some(other) => {
                return Err(ApiError::bad_request(format!(
                    "messages[{i}]: payload_encoding must be \"base64\" or absent, got {other:?}"
                )))
            }
        };
        if payload.is_empty() {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "empty_payload",
                format!("messages[{i}] is empty"),
            ));
        }
        if m.idempotency_key
            .as_ref()
            .is_some_and(|k| !valid_idempotency_key(k))
        {
            return Err(ApiError::bad_request(format!(
                "messages[{i}]: idempotency_key must be 1 to {MAX_IDEMPOTENCY_KEY} visible ASCII characters"
            )));
        }
        messages.push(NewMessage {
            idempotency_key: m.idempotency_key,
            partition: m.partition,
            key: m.key,
            payload,
        });
    }
    let results = s.broker.produce_batch(&name, messages).await?;
    let out: Vec<serde_json::Value> = results
        .into_iter()
        .map(|r| match r {
            Ok(p) => {
                serde_json::json!({"status": 201, "partition": p.partition, "offset": p.offset})
            }
            Err(e) => entry_error(e),
        })
        .collect();
    Ok(Json(serde_json::json!({ "results": out })).into_response())
}
