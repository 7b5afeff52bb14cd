//! The JSON bodies of the batch routes, parsed and checked in full before anything is
//! committed: `produce-batch` ([`parse_produce_batch`]) and the ack batch
//! ([`parse_ack_batch`]). Every field is strict (unknown fields are a 400), every message
//! passes the same checks as a single produce, and both are property-tested
//! (`tests/tests/properties.rs`).

use base64::Engine;
use bytes::Bytes;
use serde::Deserialize;
use serde_json::value::RawValue;

use super::extract::check_message;
use super::limits::MAX_BATCH_ENTRIES;
use super::ApiError;
use crate::broker::{NewMessage, Settle};

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
    #[serde(default, deserialize_with = "crate::settings::integral")]
    partition: Option<u32>,
    #[serde(default)]
    idempotency_key: Option<String>,
    #[serde(default)]
    headers: Option<crate::segment::Headers>,
    #[serde(default, deserialize_with = "crate::settings::integral")]
    delay_ms: Option<u64>,
}

impl BatchMessage {
    /// The payload bytes: the exact JSON text, or the decoded base64 string.
    fn payload(&self, i: usize) -> Result<Bytes, ApiError> {
        match self.payload_encoding.as_deref() {
            None => Ok(Bytes::copy_from_slice(self.payload.get().as_bytes())),
            Some("base64") => {
                let text: String = serde_json::from_str(self.payload.get()).map_err(|_| {
                    ApiError::bad_request(format!(
                        "messages[{i}]: a base64 payload must be a JSON string"
                    ))
                })?;
                let bytes = base64::engine::general_purpose::STANDARD
                    .decode(text.as_bytes())
                    .map_err(|_| {
                        ApiError::bad_request(format!("messages[{i}]: payload is not valid base64"))
                    })?;
                Ok(Bytes::from(bytes))
            }
            Some(other) => Err(ApiError::bad_request(format!(
                "messages[{i}]: payload_encoding must be \"base64\" or absent, got {other:?}"
            ))),
        }
    }
}

/// A `produce-batch` body's messages, each checked as a single produce would be.
///
/// Errors: 400 naming the first problem (bad JSON, an unknown field, no messages or over
/// [`MAX_BATCH_ENTRIES`], a bad base64 payload, a message that fails its checks).
pub fn parse_produce_batch(body: &[u8]) -> Result<Vec<NewMessage>, ApiError> {
    let batch: ProduceBatch = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid produce batch: {e}")))?;
    if batch.messages.is_empty() || batch.messages.len() > MAX_BATCH_ENTRIES {
        return Err(ApiError::bad_request(format!(
            "messages must hold 1 to {MAX_BATCH_ENTRIES} messages"
        )));
    }
    let mut messages = Vec::with_capacity(batch.messages.len());
    for (i, m) in batch.messages.into_iter().enumerate() {
        let payload = m.payload(i)?;
        check_message(
            Some(i),
            m.key.as_deref(),
            &payload,
            m.idempotency_key.as_deref(),
        )?;
        let headers = m.headers.unwrap_or_default();
        crate::http::extract::check_headers(&format!("messages[{i}]: "), &headers)?;
        let delay_ms = m.delay_ms.unwrap_or(0);
        if delay_ms > crate::http::extract::MAX_DELAY_MS {
            return Err(ApiError::bad_request(format!(
                "messages[{i}]: delay_ms must be at most 43200000 (12 h)"
            )));
        }
        messages.push(NewMessage {
            idempotency_key: m.idempotency_key,
            partition: m.partition,
            key: m.key,
            payload,
            headers,
            delay_ms,
        });
    }
    Ok(messages)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct AckBatch {
    receipt_handles: Vec<String>,
    #[serde(default)]
    extend: Option<serde_json::Value>,
}

/// An ack batch body's handles, each with the body's one action: its `extend`, or when it
/// has none (or null), `query_extend`, the query's (`?extend=true` with a body renews
/// every handle).
///
/// Errors: 400 for bad JSON, an unknown field, no handles or over [`MAX_BATCH_ENTRIES`],
/// or an `extend` other than `true` or `0`.
pub fn parse_ack_batch(
    body: &[u8],
    query_extend: Option<&str>,
) -> Result<Vec<(String, Settle)>, ApiError> {
    let batch: AckBatch = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid ack batch: {e}")))?;
    if batch.receipt_handles.is_empty() || batch.receipt_handles.len() > MAX_BATCH_ENTRIES {
        return Err(ApiError::bad_request(format!(
            "receipt_handles must hold 1 to {MAX_BATCH_ENTRIES} handles"
        )));
    }
    // The same values as the query parameter, as JSON `true`, `0` or strings.
    let body_extend = batch
        .extend
        .as_ref()
        .filter(|v| !v.is_null())
        .map(|v| match v {
            serde_json::Value::String(s) => s.clone(),
            other => other.to_string(),
        });
    let extend = match (body_extend, query_extend) {
        (Some(_), Some(_)) => {
            return Err(ApiError::bad_request(
                "extend is given in both the query and the body: give it once",
            ))
        }
        (Some(b), None) => Some(b),
        (None, q) => q.map(str::to_owned),
    };
    let action = parse_extend(extend.as_deref())?;
    let entries: Vec<(String, Settle)> = batch
        .receipt_handles
        .into_iter()
        .map(|h| (h, action))
        .collect();
    Ok(entries)
}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct ConsumeAcks {
    #[serde(default)]
    ack: Vec<String>,
}

/// The handles a consume's body acks: `{"ack":["h1","h2"]}` (`{}` or an empty list acks
/// none).
///
/// Errors: 400 for bad JSON, an unknown field or over [`MAX_BATCH_ENTRIES`] handles.
pub(crate) fn parse_consume_acks(body: &[u8]) -> Result<Vec<String>, ApiError> {
    let body: ConsumeAcks = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("invalid consume body: {e}")))?;
    if body.ack.len() > MAX_BATCH_ENTRIES {
        return Err(ApiError::bad_request(format!(
            "ack must hold at most {MAX_BATCH_ENTRIES} handles"
        )));
    }
    Ok(body.ack)
}

/// The longest `extend=<duration>`: the longest visibility timeout a topic may have.
pub(crate) const MAX_EXTEND: std::time::Duration = std::time::Duration::from_secs(12 * 3600);

/// `extend`: absent acks, `true` renews the lease for the visibility timeout, `0` gives the
/// message back, a duration (`30s`, `500ms`, `5m`; a bare number is seconds, as `wait`) ends
/// the lease that long from now ("retry later"), at most [`MAX_EXTEND`].
///
/// Errors: 400 for any other value.
pub(crate) fn parse_extend(v: Option<&str>) -> Result<Settle, ApiError> {
    let bad = |other: &str| {
        ApiError::bad_request(format!(
            "extend must be true (renew the lease), 0 (give the message back) or a duration \
             up to 12h like 30s (retry later), got {other:?}"
        ))
    };
    match v {
        None => Ok(Settle::Ack),
        Some("true") => Ok(Settle::Extend),
        Some("0") => Ok(Settle::Nack),
        Some(other) => {
            let d = crate::http::extract::parse_wait_uncapped(other).map_err(|_| bad(other))?;
            if d > MAX_EXTEND {
                return Err(bad(other));
            }
            Ok(match u64::try_from(d.as_millis()).unwrap_or(u64::MAX) {
                0 => Settle::Nack,
                ms => Settle::ExtendFor(ms),
            })
        }
    }
}
